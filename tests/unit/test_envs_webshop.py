"""WebShop: the reward against hand-computed values of the original's formula, the generated
catalogue and its near misses, pages and actions, the expert on every generated goal, the
random baseline, the official file formats, prompts, demonstrations, oracle and CLI."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from envs.spec import get_env
from envs.webshop.catalog import TYPES, build_catalog, check_types, price_upper_for
from envs.webshop.env import SEARCH_PLACEHOLDER, WebShopEnv
from envs.webshop.expert import DemoSettings, eval_hints, game_demos, random_reply, reply_text
from envs.webshop.official import convert_official
from envs.webshop.oracle import ORACLE, analyze_record
from envs.webshop.prompt import TASK_MARKER, parse_action, prompt_style
from envs.webshop.reward import (
    get_reward,
    normalize_color,
    nouns,
    option_matches,
    token_set_ratio,
    type_reward,
)
from envs.webshop.shop import ShopError, load_products
from envs.webshop.tasks import SPLITS, TaskError, list_tasks, load_task, shop_of, task_family
from megatron_seed.data.records import Status, TrajectoryRecord, Turn
from megatron_seed.skills.oracle import OracleAnalyzer
from megatron_seed.skills.parse import AnalysisRequest, ValidationRules, parse_reply

REPO = Path(__file__).resolve().parents[2]
N_PER_SPLIT = 20


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("webshop")
    for split in SPLITS:
        get_env("webshop").generate_tasks(root, split, N_PER_SPLIT, 3, targets_per_type=8)
    return root


@pytest.fixture(scope="module")
def tasks(root: Path) -> dict[str, list[Path]]:
    return {split: list_tasks(root, split) for split in SPLITS}


# ---- the reward ---------------------------------------------------------------------------


def test_token_set_ratio_hand_computed() -> None:
    # t0 = "fl oz" (5), t1 = "fl oz 8" (7), t2 = "fl oz 16" (8): 2*5/12 = 83.3 is the largest
    assert token_set_ratio("8 fl oz", "16 fl oz") == 83
    # t1 = "fl oz 16", t2 = "fl oz 6": LCS 7, 2*7/15 = 93.3: a near miss that matches
    assert token_set_ratio("16 fl oz", "6 fl oz") == 93
    assert token_set_ratio("large", "X-Large") == 100  # {large} within {x, large}
    # no shared token: the Indel ratio of the two words, LCS "e": 2*1/7 = 28.6
    assert token_set_ratio("red", "blue") == 29 and token_set_ratio("", "red") == 0
    assert token_set_ratio("Sulfate-Free", "sulfate free") == 100


def test_token_set_ratio_is_thefuzzs_on_the_shops_words() -> None:
    """The scorer the original imports (thefuzz, a test dependency here) on 3,000 pairs of
    the catalogue's attribute, option and colour words, in any case and order."""
    import random

    from thefuzz import fuzz

    from envs.webshop.reward import COLOR_SET

    words = [*COLOR_SET, *["x-large", "large", "8", "16", "6", "fl", "oz", "pack", "of", "2", "cotton", "sulfate-free", "usb-c", "wireless", "charger", "dress", "women", "men", "organic", "green", "tea", "100%", "natural"]]  # fmt: skip
    rng = random.Random(0)
    for _ in range(3000):
        a = " ".join(rng.choices(words, k=rng.randint(0, 5)))
        b = " ".join(rng.choices(words, k=rng.randint(0, 5)))
        if rng.random() < 0.3:
            b = f"{a.upper()} {rng.choice(words)}"
        assert token_set_ratio(a, b) == fuzz.token_set_ratio(a, b), (a, b)


def test_normalize_color_takes_the_first_colour_of_the_original_list() -> None:
    assert normalize_color("navy blue") == "blue"  # blue precedes navy in the list
    assert normalize_color("dark grey") == "dark" and normalize_color("16 fl oz") == "16 fl oz"
    assert option_matches(["navy blue"], ["navy"]) == 0
    assert option_matches(["light blue"], ["blue"]) == 1
    assert option_matches(["large", "red"], ["x-large", "red", "cotton"]) == 2


PRODUCT = {
    "asin": "B000000001",
    "name": "Acme Tea Tree Shampoo",
    "Title": "Acme Tea Tree Shampoo",
    "query": "shampoo",
    "product_category": "Beauty › Hair Care › Shampoo",
    "Attributes": ["sulfate free", "tea tree oil"],
    "BulletPoints": ["Paraben Free formula"],
    "Description": "Made for dry hair.",
}
GOAL = {
    "name": "Acme Tea Tree Shampoo",
    "query": "shampoo",
    "product_category": "Beauty › Hair Care › Shampoo",
    "attributes": ["sulfate free", "paraben free", "dry hair"],
    "goal_options": ["16 fl oz", "coconut"],
    "price_upper": 20.0,
}


def test_reward_full_and_partial_credit() -> None:
    right = {"size": "16 fl oz", "scent": "coconut"}
    # 3 attributes (fuzzy, features, description) + 2 options + price: 6 / (3 + 2 + 1)
    full = get_reward(PRODUCT, GOAL, 15.0, right)
    assert (full.total, full.won, full.attr_matches, full.option_matches) == (1.0, True, 3, 2)
    assert get_reward(PRODUCT, GOAL, 20.0, right).total == 1.0  # the cap itself is within
    wrong_option = get_reward(PRODUCT, GOAL, 15.0, {"size": "16 fl oz", "scent": "citrus"})
    assert wrong_option.total == pytest.approx(5 / 6) and not wrong_option.won
    over = get_reward(PRODUCT, GOAL, 20.01, right)
    assert over.total == pytest.approx(5 / 6) and not over.price_ok
    assert get_reward(PRODUCT, GOAL, 15.0, {}).total == pytest.approx(4 / 6)
    # "8 fl oz" scores 83 against "16 fl oz": no match; neither attribute is elsewhere
    bare = {**PRODUCT, "Attributes": ["tea tree oil"], "BulletPoints": [], "Description": ""}
    assert get_reward(bare, GOAL, 99.0, {"size": "8 fl oz"}).total == 0.0


def test_type_reward_levels() -> None:
    # nouns of the goal name: acme, tea, tree, shampoo
    assert nouns("Acme Tea Tree Shampoo") == ("acme", "tea", "tree", "shampoo")
    other = {"query": "lotion", "product_category": "Beauty › Skin Care › Lotion"}
    # 1 of 4 nouns (0.25 > 0.2) is a match by title: r_type 1
    assert type_reward({**other, "name": "Acme Body Lotion"}, GOAL)["r_type"] == 1.0
    # no query, no 2 shared category levels, title 1/5 = 0.2 (not > 0.2): 0.5
    goal5 = {**GOAL, "name": "Acme Tea Tree Oil Shampoo"}
    half = type_reward({**other, "name": "Zeno Shampoo Bar"}, goal5)
    assert (half["r_type"], half["title_score"], half["category_match"]) == (0.5, 0.2, False)
    # 1 of 11 nouns (< 0.1): 0.1, whatever else matches
    long_goal = {**GOAL, "name": "Acme Tea Tree Oil Hemp Argan Mint Jojoba Rose Sage Shampoo"}
    assert type_reward({**PRODUCT, "name": "Zeno Shampoo"}, long_goal)["r_type"] == 0.1
    # repeated nouns count in the denominator: 1 shared of ("tea", "tea", "shampoo")
    repeats = type_reward({**PRODUCT, "name": "Zeno Tea"}, {**GOAL, "name": "Tea Tea Shampoo"})
    assert repeats["title_score"] == pytest.approx(1 / 3)
    # no shared noun: 0, even with the same query and category
    zero = {**PRODUCT, "name": "Zeno Conditioner"}
    assert type_reward(zero, GOAL)["r_type"] == 0.0
    assert get_reward(zero, GOAL, 15.0, {"size": "16 fl oz", "scent": "coconut"}).total == 0.0
    # the wrong type at r_type 0.5: attributes none (bare text), options none, price ok
    lotion = {**PRODUCT, **other, "name": "Zeno Shampoo Bar", "Title": "Zeno Shampoo Bar",
              "Attributes": ["scented"], "BulletPoints": [], "Description": ""}  # fmt: skip
    assert get_reward(lotion, goal5, 10.0, {}).total == pytest.approx(0.5 * 1 / 6)


# ---- the catalogue -------------------------------------------------------------------------


def test_catalogue_fields_and_near_miss_pools() -> None:
    check_types()
    catalog = build_catalog(3, targets_per_type=2)
    assert len(catalog.items) == len(TYPES) * 2 * 5 and len(catalog.goals) == len(TYPES) * 2 * 2
    item = catalog.items[0]
    assert {"asin", "name", "category", "query", "product_category", "full_description",
            "small_description", "pricing", "customization_options"} <= set(item)  # fmt: skip
    assert build_catalog(3, 2).items == catalog.items  # deterministic
    assert price_upper_for(23.0, random.Random(0)) in (40.0, 50.0, 60.0)
    assert price_upper_for(985.0, random.Random(0)) == 1000000.0


def test_splits_and_near_misses(root: Path, tasks: dict[str, list[Path]]) -> None:
    assert all(len(tasks[s]) == N_PER_SPLIT for s in SPLITS)
    families = {task_family(t) for t in tasks["train"]}
    assert families == {"beauty", "electronics", "fashion", "furniture", "grocery"}
    products = {s: {load_task(t)["asin"] for t in tasks[s]} for s in SPLITS}
    assert not products["unseen"] & (products["train"] | products["seen"])  # held out
    assert products["seen"] & products["train"]  # seen: other goals on training products
    shop = shop_of(tasks["train"][0])
    assert len(shop.products) == len(TYPES) * 8 * 5
    for path in tasks["train"]:
        goal = load_task(path)
        target = shop.product(goal["asin"])
        for kind, asin in goal["near_misses"].items():
            miss = shop.product(asin)
            assert miss["query"] == target["query"]
            if kind == "budget":
                assert miss["price"] > goal["price_upper"] >= target["price"]
            if kind != "other":
                values = [v for vs in miss["options"].values() for v in vs]
                chosen = [v for v in values if v in goal["goal_options"]]
                assert get_reward(miss, goal, miss["price"], chosen).total < 1.0, (path, kind)


# ---- pages and actions ---------------------------------------------------------------------


def test_pages_actions_and_invalid_actions(tasks: dict[str, list[Path]]) -> None:
    game = tasks["train"][0]
    goal = load_task(game)
    env = WebShopEnv()
    obs, info = env.reset(game)
    assert obs == "WebShop [SEP] Search" and info["admissible_actions"] == [SEARCH_PLACEHOLDER]
    assert info["task"] == goal["instruction_text"] and not info["won"]
    # a click that is not on the page: the original's no-op
    same, reward, done, info = env.step("click[buy now]")
    assert (same, reward, done, info["invalid"], info["step"]) == (obs, 0.0, False, True, 1)
    assert env.step("buy it")[3]["invalid"] and env.step("search[]")[3]["invalid"]
    obs, _, _, info = env.step("search[" + goal["plan"][0][7:-1].upper() + "]")
    assert obs.startswith("Back to Search [SEP] Page 1 (Total results: ")
    adm = info["admissible_actions"]
    assert adm[:2] == ["click[back to search]", "click[next >]"] and len(adm) == 12
    assert f"click[{goal['asin'].lower()}]" in adm and "click[< prev]" not in adm
    obs2, _, _, info = env.step("click[next >]")
    assert "Page 2" in obs2 and info["admissible_actions"][1] == "click[< prev]"
    env.step("click[< prev]")
    obs, _, _, info = env.step(f"click[{goal['asin']}]")  # upper case: lower-cased first
    assert info["page"] == "item" and obs.endswith(
        "Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    env.step("click[features]")
    assert env.session is not None and env.session.page == "sub"
    env.step("click[< prev]")
    env.step(goal["plan"][2])
    assert env.session.options  # an option chosen
    env.step("click[< prev]")  # back to the results: the options are reset
    assert env.session.page == "results" and env.session.options == {}
    _, _, _, info = env.step("search[anything]")  # a search from any page
    assert info["page"] == "results" and not info["invalid"]
    # the step budget: 15 actions, reward 0
    env = WebShopEnv(max_steps=3)
    env.reset(game)
    results = [env.step("click[nothing]") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True] and results[-1][1] == 0.0
    with pytest.raises(RuntimeError):
        env.step("search[x]")


def _play(game: Path, actions: list[str], max_steps: int = 15) -> tuple[float, bool, int]:
    env = WebShopEnv(max_steps)
    env.reset(game)
    reward, info, steps = 0.0, {"won": False}, 0
    for action in actions:
        _, reward, done, info = env.step(action)
        steps += 1
        if done:
            break
    return reward, bool(info["won"]), steps


def test_expert_wins_every_generated_goal(tasks: dict[str, list[Path]]) -> None:
    spec = get_env("webshop")
    for split in SPLITS:
        for game in tasks[split]:
            plan = spec.expert_plan(str(game))
            assert plan and plan[0].startswith("search[") and plan[-1] == "click[buy now]"
            assert _play(game, plan) == (1.0, True, len(plan)), game


def test_wrong_clicks_earn_partial_credit(tasks: dict[str, list[Path]]) -> None:
    game = tasks["train"][1]
    goal = load_task(game)
    plan = goal["plan"]
    # the over-budget copy, with the right options: all but the price
    budget = goal["near_misses"]["budget"].lower()
    n = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    reward, won, _ = _play(game, [plan[0], f"click[{budget}]", *plan[2:]])
    assert (reward, won) == (pytest.approx((n - 1) / n), False)
    # the target without its options
    reward, won, _ = _play(game, [plan[0], plan[1], "click[buy now]"])
    assert reward == pytest.approx((n - len(goal["goal_options"])) / n) and not won


def test_random_policy_scores_near_zero(tasks: dict[str, list[Path]]) -> None:
    rng = random.Random(0)
    rewards, wins = [], 0
    for game in tasks["unseen"] + tasks["train"]:
        for _ in range(3):
            env = WebShopEnv()
            obs, info = env.reset(game)
            reward = 0.0
            for _ in range(15):
                action, _ = parse_action(
                    random_reply(info["task"], obs, info["admissible_actions"], rng)
                )
                obs, reward, done, info = env.step(action or "")
                if done:
                    break
            rewards.append(reward)
            wins += int(info["won"])
    mean = sum(rewards) / len(rewards)
    print(f"\nrandom policy: success {wins}/{len(rewards)}, score {100 * mean:.1f}")
    assert wins <= 1 and mean < 0.25


# ---- official files ------------------------------------------------------------------------


def _official(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    items = [
        {"asin": "B09AAA0001", "name": "Brightly Vegan Protein Shake", "category": "grocery",
         "query": "Protein Shake ", "product_category": "Grocery › Beverages › Protein Shakes",
         "full_description": "A plant based shake.", "small_description": "Gluten free",
         "pricing": "$24.99", "images": ["x.jpg"],
         "customization_options": {"Flavor Name": [{"value": "Vanilla", "image": None},
                                                   {"value": "Chocolate/Mocha", "image": None}],
                                   "Size": [{"value": "12 Count", "image": None}]}},
        {"asin": "B09AAA0002", "name": "Brightly Whey Protein Powder", "category": "grocery",
         "query": "protein powder", "product_category": "Grocery › Supplements › Protein",
         "full_description": "Whey.", "small_description": ["High protein"],
         "pricing": "$30.00$40.00", "images": [], "customization_options": None},
        {"asin": "nan", "name": "skipped", "category": "x", "query": "x", "product_category": "x",
         "pricing": "", "images": [], "customization_options": None},
    ]  # fmt: skip
    attrs = {"B09AAA0001": {"attributes": ["gluten free", "plant based"]}}
    human = {
        "B09AAA0001": [
            {"instruction": "i want a gluten free plant based protein shake in chocolate flavor.",
             "instruction_attributes": ["gluten free", "plant based"],
             "instruction_options": ["chocolate | mocha"]},
            {"instruction": "no attributes", "instruction_attributes": [], "instruction_options": []},
        ]
    }  # fmt: skip
    (folder / "items_shuffle_1000.json").write_text(json.dumps(items))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    (folder / "items_human_ins.json").write_text(json.dumps(human))
    return folder


def test_official_files_load_and_the_expert_wins(tmp_path: Path) -> None:
    data = _official(tmp_path / "data")
    products = load_products(data / "items_shuffle_1000.json", data / "items_ins_v2_1000.json")
    assert [p["asin"] for p in products] == ["B09AAA0001", "B09AAA0002"]
    shake, powder = products
    assert shake["options"] == {
        "flavor name": ["vanilla", "chocolate | mocha"],
        "size": ["12 count"],
    }
    assert shake["BulletPoints"] == ["Gluten free"] and shake["query"] == "protein shake"
    assert (shake["price"], shake["Price"]) == (24.99, "$24.99")
    assert powder["Attributes"] == ["DUMMY_ATTR"] and powder["Price"] == "$30.0 to $40.0"
    assert 30.0 <= powder["price"] <= 40.0
    paths = convert_official(data, tmp_path / "tasks", "all")
    assert len(paths) == 1 and task_family(paths[0]) == "grocery"  # one goal had no attributes
    goal = load_task(paths[0])
    assert goal["instruction_text"].startswith(
        "i want a gluten free plant based protein shake in chocolate flavor, and price lower than "
    )
    assert goal["price_upper"] in (40.0, 50.0, 60.0)
    assert goal["plan"][1:] == ["click[b09aaa0001]", "click[chocolate | mocha]", "click[buy now]"]
    assert _play(paths[0], goal["plan"]) == (1.0, True, 4)


def test_official_files_fail_loud(tmp_path: Path) -> None:
    data = _official(tmp_path / "data")
    with pytest.raises(TaskError, match="no goals in the train split"):
        convert_official(data, tmp_path / "t", "train")  # one goal: index 0, in "unseen"
    with pytest.raises(TaskError, match="unknown split 'dev'"):
        convert_official(data, tmp_path / "t", "dev")
    text = (data / "items_shuffle_1000.json").read_text()
    (data / "items_shuffle_1000.json").write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(TaskError, match=r"items_shuffle_1000.json: not a whole JSON item file"):
        convert_official(data, tmp_path / "t", "all")
    (data / "items_human_ins.json").unlink()
    with pytest.raises(TaskError, match="no human-instruction file"):
        convert_official(data, tmp_path / "t", "all")
    with pytest.raises(TaskError, match="no such folder"):
        convert_official(tmp_path / "nope", tmp_path / "t", "all")
    with pytest.raises(ShopError, match="no item file"):
        load_products(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text(json.dumps([{"asin": "B1", "name": "x"}]))
    with pytest.raises(
        ShopError, match=r"product 0 lacks \['category', 'query', 'product_category'\]"
    ):
        load_products(tmp_path / "bad.json")


def test_unknown_product_fails_loud(tasks: dict[str, list[Path]]) -> None:
    with pytest.raises(ShopError, match="unknown product 'B0NOPE'"):
        shop_of(tasks["train"][0]).product("B0NOPE")


# ---- prompts, demos, oracle ----------------------------------------------------------------


def test_parse_action() -> None:
    assert parse_action("<think>x</think><action>click[Buy  Now]</action>") == (
        "click[Buy Now]",
        True,
    )
    assert parse_action("<action>search[a]</action> <ACTION>search[red shoes]</ACTION>") == (
        "search[red shoes]", True,
    )  # fmt: skip
    for bad in ("click[buy now]", "<action>buy now</action>", "<action>click[]</action>", ""):
        assert parse_action(bad) == (None, False)


def test_prompts_have_one_task_line(tasks: dict[str, list[Path]]) -> None:
    game = tasks["seen"][0]
    env = WebShopEnv()
    obs, info = env.reset(game)
    for name in ("paper", "compact"):
        style = prompt_style(name)
        first = style.first(info["task"], obs, info["admissible_actions"])
        lines = [line for line in first.splitlines() if line.startswith(TASK_MARKER)]
        assert lines == [f"{TASK_MARKER} {info['task']}."]
        assert "search[<your query>]" in first
    nxt, _, _, info2 = env.step(load_task(game)["plan"][0])
    window = prompt_style("paper").window(
        info["task"], [(obs, "search[x]")], nxt, 1, info2["admissible_actions"]
    )
    assert "[Observation 1: 'WebShop [SEP] Search', Action 1: 'search[x]']" in window
    assert "'click[back to search]',\n'click[next >]'," in window
    compact = prompt_style("compact").window(
        info["task"], [(obs, "search[x]")], nxt, 1, info2["admissible_actions"]
    )
    assert "> search[x]\nback to search\npage 1 (total results:" in compact


def test_demos_are_deterministic_and_win(tasks: dict[str, list[Path]]) -> None:
    settings = DemoSettings(noisy_per_game=3, hinted_per_game=1, mistake_prob=0.6, max_mistakes=2,
                            max_demo_steps=15, seed=1)  # fmt: skip
    mistakes = 0
    for index, game in enumerate(tasks["train"][:8]):
        demos = game_demos(str(game), index, settings)
        assert demos == game_demos(str(game), index, settings)
        assert len(demos) == 4 and all(d.won for d in demos)
        assert demos[-1].actions == load_task(game)["plan"] and demos[-1].hint
        assert all(len(d.actions) == len(d.observations) == len(d.admissible) for d in demos)
        mistakes += sum(d.mistakes for d in demos)
    assert mistakes > 0
    hints = eval_hints([str(tasks["train"][0])])
    assert hints[str(tasks["train"][0])].startswith("Search '")
    assert reply_text("click[buy now]") == "<action>click[buy now]</action>"


def _record(game: Path, actions: list[str], max_steps: int = 15) -> TrajectoryRecord:
    env = WebShopEnv(max_steps)
    obs, info = env.reset(game)
    first = prompt_style("compact").first(info["task"], obs, info["admissible_actions"])
    turns, won = [], False
    for i, action in enumerate(actions):
        reply = reply_text(action) if action else "no tag"
        parsed, valid = parse_action(reply)
        executed = parsed if parsed is not None else reply
        turns.append(Turn(first if i == 0 else obs, reply, [1], [0.0], observation=obs,
                          executed=executed, valid=valid))  # fmt: skip
        obs, _, done, info = env.step(executed)
        won = bool(info["won"])
        if done:
            break
    status = Status.MAX_STEPS if not won and len(turns) >= max_steps else Status.OK
    return TrajectoryRecord(
        task_id=game.stem, group_id="g", game=str(game), family=task_family(game), turns=turns,
        reward=info["reward"], won=won, status=status, env="webshop", task_marker=TASK_MARKER,
        goal=info["task"], final_observation=obs,
    )  # fmt: skip


def _skill(record: TrajectoryRecord) -> str:
    (gen,) = OracleAnalyzer(ORACLE)([AnalysisRequest(0, "t", record, "record", [], [])])
    assert gen.error is None, gen.error
    parsed = parse_reply(gen.text, ValidationRules(), record.turns[0].user)
    assert parsed.valid, parsed.error
    assert parsed.skill is not None
    return parsed.skill


def test_oracle_success_and_failures(tasks: dict[str, list[Path]]) -> None:
    game = tasks["train"][2]
    goal = load_task(game)
    plan, asin = goal["plan"], goal["asin"].lower()
    budget = goal["near_misses"]["budget"].lower()
    ok = _skill(_record(game, [plan[0], f"click[{budget}]", "click[< prev]", *plan[1:]]))
    assert ok.startswith(f"Workflow: {plan[0]}, open {asin} (every asked attribute, under ")
    assert f"Skip opening {budget} (step 2)" in ok
    wrong = _skill(_record(game, [plan[0], f"click[{budget}]", "click[buy now]"]))
    assert wrong.startswith(f"Avoid buying {budget}, the wrong product (it costs ")
    assert f"Fix: {plan[0]}, open the product" in wrong
    bare = _skill(_record(game, [plan[0], plan[1], "click[buy now]"]))
    assert bare.startswith(
        f"Avoid buying with no options instead of {' and '.join(goal['goal_options'])}"
    )
    lost = _skill(_record(game, ["", *["click[next >]"] * 2], max_steps=3))
    assert lost.startswith("Avoid the invalid action 'a reply without an <action> tag' at step 1")
    miss = _skill(_record(game, ["search[zzz qqq]", "click[nothing]"], max_steps=2))
    assert miss.startswith("Avoid searching 'zzz qqq' at step 1, whose first page did not show")
    record = _record(game, [plan[0]], max_steps=1)
    assert analyze_record(record) == analyze_record(record)


def test_seed_games_cli(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "megatron_seed.cli", "games", "--env", "webshop", *args],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    out = ["--out", str(tmp_path)]
    proc = cli(*out, "--split", "unseen", "--n", "5", "--targets-per-type", "4")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote 5 unseen goals to {tmp_path / 'unseen'} in ")
    assert len(list_tasks(tmp_path, "unseen")) == 5
    for bad, message in (
        (["--split", "valid", "--n", "1"], "unknown split 'valid'"),
        (["--split", "train", "--n", "1", "--seed", "9"], "holds another catalogue"),
        (["--split", "train", "--n", "900", "--targets-per-type", "4"], "has only"),
        (["--split", "seen", "--n", "900", "--targets-per-type", "4"], "has only"),
        (["--split", "all", "--from-official", str(tmp_path / "none")], "no such folder"),
    ):
        proc = cli(*out, *bad)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert (
        not (tmp_path / "train").exists() and not (tmp_path / "seen").exists()
    )  # no partial split
