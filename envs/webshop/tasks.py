"""WebShop task folders: the shop files, the goal files, writing, listing and reading them.

Layout (the shop is shared by the splits):

    root/shop.json                    {"items": FILE, "attributes": FILE} (relative to root
                                      or absolute) and how they were made
    root/items.json, items_attrs.json the generated catalogue in the original's formats
    root/<split>/<category>/<goal_id>.json

A goal file holds the original's goal fields (``instruction_text``, ``attributes``,
``goal_options``, ``price_upper``, ``asin``, ``name``, ``query``, ``category``,
``product_category``), the expert ``plan`` (null where none reaches the product), and for
generated goals their ``near_misses`` (kind -> asin).

Generated splits: ``train`` holds goals on 4 in 5 target products (variant 0: the near misses
are built around it); ``seen`` other goals on the same products (variant 1: other attributes,
options, price cap); ``unseen`` goals on the held-out fifth of the products. A goal is kept
only if its expert plan, played in the shop, buys with reward 1.0 and each near miss bought
with the goal's options scores below 1.0 (variant 0).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from envs.api import check_types, checked_task_files
from envs.webshop.catalog import CATEGORIES, build_catalog
from envs.webshop.reward import get_reward, normalize_color, token_set_ratio
from envs.webshop.shop import PRODUCT_WINDOW, Session, Shop, ShopError, load_shop

SPLITS = ("train", "seen", "unseen")
SHOP_CONFIG = "shop.json"
ITEMS_NAME = "items.json"
ATTRS_NAME = "items_attrs.json"
DEFAULT_TARGETS_PER_TYPE = 30
GOAL_FIELDS = (
    "instruction_text", "attributes", "goal_options", "price_upper", "asin", "name", "query",
    "category", "product_category",
)  # fmt: skip


class TaskError(ValueError):
    """A task folder or goal file that cannot be used (one line)."""


# --------------------------------------------------------------------------- reading


def load_task(task: str | os.PathLike) -> dict[str, Any]:
    """A goal file's contents (checked: the goal fields)."""
    path = Path(task)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"no goal file {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TaskError(f"{path}: not JSON ({err})") from None
    missing = [k for k in GOAL_FIELDS if not isinstance(data, dict) or k not in data]
    if missing:
        raise TaskError(f"{path}: a WebShop goal needs {missing}")
    check_types(path, data, GOAL_TYPES)
    return data


# the goal fields' types, as the original's goal records hold them
GOAL_TYPES: dict[str, type | tuple[type, ...]] = {
    "instruction_text": str, "attributes": list, "goal_options": (list, dict),
    "price_upper": (int, float), "asin": str, "name": str, "query": str, "category": str,
    "product_category": str, "goal_id": str, "split": str, "plan": list, "near_misses": dict,
    "goal_options_by_name": dict,
}  # fmt: skip


def find_root(task: str | os.PathLike) -> Path:
    """The task folder holding ``shop.json`` above a goal file."""
    for folder in Path(task).resolve().parents:
        if (folder / SHOP_CONFIG).is_file():
            return folder
    raise TaskError(f"no {SHOP_CONFIG} above {task}: not a WebShop task folder")


def shop_files(root: str | os.PathLike) -> tuple[Path, Path | None]:
    """The item and attribute files ``root/shop.json`` names."""
    root = Path(root)
    try:
        config = json.loads((root / SHOP_CONFIG).read_text())
        items = root / config["items"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise TaskError(f"{root / SHOP_CONFIG}: unreadable ({err})") from None
    check_types(root / SHOP_CONFIG, config, {"attributes": str})
    attrs = root / config["attributes"] if config.get("attributes") else None
    return items, attrs


def shop_of(task: str | os.PathLike) -> Shop:
    """The shop a goal file's folder names (built once per process)."""
    return load_shop(*shop_files(find_root(task)))


def list_tasks(root: str | os.PathLike, split: str | None = None) -> list[Path]:
    """Goal files under ``root/<split>/<category>/``, sorted; every split if None. Checked
    before any episode: every goal file (`load_task`) and the shop its folder names
    (`check_shop`); `TaskError` or `ShopError` naming the file."""
    tasks = checked_task_files(root, split, load_task)
    if tasks:
        check_shop(Path(root))
    return tasks


# a catalogue up to this size is read through when its tasks are listed (the generated one,
# 2.5 MB); a larger one (the original's 1.2 M products) only has its two ends checked
READ_THROUGH_BYTES = 64 << 20


def check_shop(root: Path) -> None:
    """``root/shop.json`` and the product files it names: read through as the shop reads them
    (`load_products`) when small, else each file's JSON opens and closes as it must (a
    file cut short does not)."""
    from envs.webshop.shop import load_products

    items, attrs = shop_files(root)
    files = [(items, "[]"), *([(attrs, "{}")] if attrs else [])]
    if all(f.is_file() and f.stat().st_size <= READ_THROUGH_BYTES for f, _ in files):
        load_products(items, attrs)
        return
    for path, (first, last) in files:
        if not path.is_file():
            raise TaskError(f"no product file {path}")
        with path.open("rb") as f:
            head = f.read(64).lstrip()
            f.seek(max(0, path.stat().st_size - 64))
            tail = f.read().rstrip()
        if head[:1] != first.encode() or tail[-1:] != last.encode():
            raise TaskError(
                f"{path}: cut short or not a JSON {'list' if first == '[' else 'object'}"
            )


def task_family(task: str | os.PathLike) -> str:
    """The goal's product category: the name of its folder."""
    return Path(task).parent.name


def expert_plan(task: str | os.PathLike) -> list[str] | None:
    """The stored expert actions; None where no search reaches the product."""
    plan = load_task(task).get("plan")
    return list(plan) if plan else None


# --------------------------------------------------------------------------- the expert's plan


def option_clicks(product: dict[str, Any], goal_options: list[str]) -> list[str]:
    """For each option type of the product, the value that matches a goal option (the
    original's colour-normalised fuzzy match), in the product's option order."""
    wanted = [normalize_color(o) for o in goal_options]
    clicks = []
    for values in product["options"].values():
        for value in values:
            if any(token_set_ratio(normalize_color(value), w) > 85 for w in wanted):
                clicks.append(value)
                break
    return clicks


def plan_for(shop: Shop, goal: dict[str, Any], queries: list[str]) -> list[str] | None:
    """search[q] with the first query whose first results page shows the goal's product,
    its link, its matching options, Buy Now; None if no query shows it."""
    asin = goal["asin"]
    product = shop.product(asin)
    for query in queries:
        if asin in shop.search(query)[:PRODUCT_WINDOW]:
            clicks = option_clicks(product, list(goal["goal_options"]))
            return [f"search[{query}]", f"click[{asin.lower()}]"] + [
                f"click[{v}]" for v in clicks
            ] + ["click[buy now]"]  # fmt: skip
    return None


def play_plan(shop: Shop, goal: dict[str, Any], plan: list[str]) -> float:
    """The reward the plan earns (0.0 if it does not buy)."""
    session = Session(shop)
    for action in plan:
        kind, arg = action.split("[", 1)
        arg = arg[:-1]
        if kind == "search":
            session.search(arg)
        elif session.click(arg):
            product = session.product()
            return get_reward(product, goal, product["price"], session.options).total
    return 0.0


# --------------------------------------------------------------------------- writing


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def _write_if_same(path: Path, text: str) -> None:
    if path.exists() and path.read_text(encoding="utf-8") != text:
        raise TaskError(
            f"{path} holds another catalogue (other seed or size); write these tasks to another folder"
        )
    path.write_text(text, encoding="utf-8")


def ensure_catalog(root: Path, seed: int, targets_per_type: int) -> list[dict[str, Any]]:
    """Write the catalogue of (seed, targets_per_type) under ``root`` (or check the one there
    is it); its goal candidates."""
    catalog = build_catalog(seed, targets_per_type)
    root.mkdir(parents=True, exist_ok=True)
    _write_if_same(root / ITEMS_NAME, json.dumps(catalog.items, ensure_ascii=False) + "\n")
    _write_if_same(root / ATTRS_NAME, json.dumps(catalog.attributes, ensure_ascii=False) + "\n")
    config = {
        "items": ITEMS_NAME, "attributes": ATTRS_NAME,
        "generator": {"name": "envs.webshop.catalog", "seed": seed, "targets_per_type": targets_per_type},
    }  # fmt: skip
    _write_if_same(root / SHOP_CONFIG, _dump(config))
    return catalog.goals


def _in_split(goal: dict[str, Any], split: str) -> bool:
    if split == "unseen":
        return goal["held_out"] and goal["variant"] == 0
    return not goal["held_out"] and goal["variant"] == (0 if split == "train" else 1)


def _kept(shop: Shop, goal: dict[str, Any]) -> list[str] | None:
    """The goal's winning plan, if it has one and (variant 0) its near misses lose."""
    plan = plan_for(shop, goal, goal["search_queries"])
    if plan is None or play_plan(shop, goal, plan) != 1.0:
        return None
    if goal["variant"] == 0:
        for asin in (goal["near_misses"][k] for k in ("attrs", "options", "budget")):
            product = shop.product(asin)
            chosen = option_clicks(product, goal["goal_options"])
            if get_reward(product, goal, product["price"], chosen).total >= 1.0:
                return None
    return plan


def generate_tasks(
    root: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    targets_per_type: int = DEFAULT_TARGETS_PER_TYPE,
) -> list[Path]:
    """Write ``n`` goals of ``split`` (and the shared catalogue) under ``root``; their paths.

    The categories take turns (so any ``n`` is balanced); a smaller ``n`` writes a prefix of
    a larger one; the same arguments write byte-identical files."""
    if split not in SPLITS:
        raise TaskError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    if n < 1:
        raise TaskError(f"n must be >= 1, got {n}")
    root = Path(root)
    goals = ensure_catalog(root, seed, targets_per_type)
    shop = load_shop(*shop_files(root))
    pools = {
        c: [g for g in goals if g["category"] == c and _in_split(g, split)] for c in CATEGORIES
    }
    for category, pool in pools.items():  # the types of a category take turns at random
        random.Random(f"webshop-goals:{seed}:{split}:{category}").shuffle(pool)
    kept: list[tuple[dict[str, Any], list[str]]] = []
    cursor = dict.fromkeys(CATEGORIES, 0)
    exhausted: set[str] = set()
    while len(kept) < n and len(exhausted) < len(CATEGORIES):
        for category in CATEGORIES:
            if len(kept) >= n or category in exhausted:
                continue
            while cursor[category] < len(pools[category]):
                goal = pools[category][cursor[category]]
                cursor[category] += 1
                plan = _kept(shop, goal)
                if plan is not None:
                    kept.append((goal, plan))
                    break
            else:
                exhausted.add(category)
    if len(kept) < n:  # nothing written: a failed call leaves no partial split
        raise TaskError(
            f"the {split} split of this catalogue has only {len(kept)} goals; ask for fewer "
            f"or a larger --targets-per-type"
        )
    return [_write_goal(root, split, goal, plan) for goal, plan in kept]


def _write_goal(root: Path, split: str, goal: dict[str, Any], plan: list[str]) -> Path:
    data = {k: goal[k] for k in GOAL_FIELDS}
    data.update(
        goal_id=goal["goal_id"], split=split, plan=plan, near_misses=goal["near_misses"],
        goal_options_by_name=goal["goal_options_by_name"],
    )  # fmt: skip
    path = root / split / goal["category"] / f"{goal['goal_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(data), encoding="utf-8")
    return path


__all__ = [
    "SPLITS", "ShopError", "TaskError", "expert_plan", "find_root", "generate_tasks",
    "list_tasks", "load_task", "shop_of", "task_family",
]  # fmt: skip
