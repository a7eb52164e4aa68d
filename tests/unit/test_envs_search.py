"""The search environment (envs/search): Search-R1's protocol against hand-computed
observations and rewards, the retrievers (BM25 with its on-disk cache; a local HTTP server
speaking both request shapes, failing and recovering), the generated tasks (every kept gold
chain retrieves its passages in the top 3; the expert wins every task; random rarely does),
the official parquet path, demos, the oracle's skills, prompts and `seed games`."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envs.search import REPORT_COLUMNS, expert, spec
from envs.search.env import INVALID_MESSAGE, SearchEnv, exact_match, normalize_answer
from envs.search.retriever import (
    BM25Retriever,
    Doc,
    HttpRetriever,
    RetrieverError,
    RetrieverUnavailable,
    write_config,
)
from envs.search.tasks import SPLITS, TaskError, generate_tasks, list_tasks, load_task
from megatron_seed.data.records import Status, TrajectoryRecord, Turn
from megatron_seed.data.sequences import insert_skill
from megatron_seed.skills.oracle import oracle_analyzer
from megatron_seed.skills.parse import AnalysisRequest, ValidationRules, parse_reply

REPO = Path(__file__).resolve().parents[2]
N_PER_SPLIT = 21  # three tasks of each of the seven data sources

TINY_CORPUS = [
    {"id": "d1", "contents": '"Lusk"\nLusk is a city in Norland, founded in 1843.'},
    {"id": "d2", "contents": '"Veran Kosti"\nVeran Kosti is a cartographer born in Lusk.'},
    {"id": "d3", "contents": '"The Glass Orchard"\nThe Glass Orchard is a novel by Veran Kosti.'},
    {"id": "d4", "contents": '"Mardel Institute"\nThe Mardel Institute is a research body.'},
    {"id": "d5", "contents": '"Mardel Press"\nThe Mardel Press prints maps.'},
    {"id": "d6", "contents": '"Mardel Works"\nThe Mardel Works builds boats.'},
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Generated tasks: 21 per split, one shared corpus."""
    out = tmp_path_factory.mktemp("search_tasks")
    for split in SPLITS:
        start = time.perf_counter()
        generate_tasks(out, split, N_PER_SPLIT, seed=0)
        print(f"generated {N_PER_SPLIT} {split} tasks in {time.perf_counter() - start:.2f}s")
    return out


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    """A hand-made task folder: four passages, one 2-hop question."""
    _write_jsonl(tmp_path / "corpus.jsonl", TINY_CORPUS)
    write_config(tmp_path, {"backend": "bm25", "corpus": "corpus.jsonl"})
    task = {
        "question": "In which country is the birthplace of the author of The Glass Orchard?",
        "golden_answers": ["Norland", "the Kingdom of Norland"],
        "data_source": "musique",
        "gold_queries": ["The Glass Orchard", "Veran Kosti", "Lusk"],
        "gold_doc_ids": ["d3", "d2", "d1"],
        "gold_titles": ['"The Glass Orchard"', '"Veran Kosti"', '"Lusk"'],
        "hops": 3,
        "shape": "chain",
    }
    path = tmp_path / "train" / "musique" / "q1.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(task))
    return tmp_path


def _task(tiny_root: Path) -> str:
    return str(tiny_root / "train" / "musique" / "q1.json")


# --------------------------------------------------------------------------- reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   Apple, a day ", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),  # "the" only as a whole word
        ("", ""),
    ],
)
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match() -> None:
    assert exact_match("the Mardel Institute.", ["Mardel Institute"])
    assert exact_match("NORLAND", "Norland")
    assert exact_match("kingdom of norland", ["Norland", "The Kingdom of Norland"])
    assert not exact_match("Norland city", ["Norland"])  # no partial credit
    assert not exact_match("1843", ["1842"])


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<search> Veran   Kosti </search>", ("<search>Veran Kosti</search>", True)),
        ("<think>who?</think>\n<answer>Lusk</answer>", ("<answer>Lusk</answer>", True)),
        ("<ANSWER>Lusk</ANSWER>", ("<answer>Lusk</answer>", True)),
        ("<search>a</search><search>b</search>", (None, False)),  # several tags
        ("<search>a</search> <answer>b</answer>", (None, False)),  # both kinds
        ("<search>  </search>", (None, False)),  # empty
        ("Lusk", (None, False)),  # none
        ("<search>Lusk", (None, False)),  # unclosed
        ("<answer>Lusk</answer></search>", (None, False)),  # a stray closing tag
        ("<search><answer>x</answer></search>", (None, False)),  # nested
        ("<search>" + "x" * 300 + "</search>", (None, False)),  # over-long
    ],
)
def test_parse_action(reply: str, expected: tuple) -> None:
    assert spec().parse_action(reply) == expected


# --------------------------------------------------------------------------- the env


def test_env_against_hand_computed_observations(tiny_root: Path) -> None:
    env = SearchEnv()
    obs, info = env.reset(_task(tiny_root))
    assert obs == info["task"] and obs.startswith("In which country")
    assert info["won"] is False and "admissible_actions" not in info
    obs, reward, done, info = env.step("<search>The Glass Orchard</search>")
    assert obs.startswith(
        '<information>Doc 1(Title: "The Glass Orchard") The Glass Orchard is a novel by Veran '
        "Kosti.\nDoc 2(Title: "
    )
    assert obs.endswith("</information>") and obs.count("\nDoc ") == 2
    assert (reward, done, info["invalid"], info["doc_ids"][0]) == (0.0, False, False, "d3")
    obs, reward, done, info = env.step("<search>x</search><answer>y</answer>")
    assert (obs, reward, done, info["invalid"]) == (INVALID_MESSAGE, 0.0, False, True)
    obs, reward, done, info = env.step("<answer> the kingdom of Norland. </answer>")
    assert (reward, done, info["won"]) == (1.0, True, True)
    with pytest.raises(RuntimeError):
        env.step("<answer>Norland</answer>")


def test_wrong_answer_and_step_budget(tiny_root: Path) -> None:
    env = SearchEnv(max_steps=4)
    env.reset(_task(tiny_root))
    assert env.step("<answer>Lusk</answer>")[1:3] == (0.0, True)
    env.reset(_task(tiny_root))
    for i in range(4):  # invalid replies count as steps
        _, reward, done, info = env.step("no tags" if i % 2 else "<search>Lusk</search>")
        assert reward == 0.0 and done == (i == 3)
    assert info["won"] is False and info["step"] == 4


# --------------------------------------------------------------------------- BM25


def test_bm25_cache_reused_and_rebuilt(tmp_path: Path) -> None:
    corpus = _write_jsonl(tmp_path / "wiki.jsonl", TINY_CORPUS)
    first = BM25Retriever(corpus)
    assert first.built and first.search("Veran Kosti cartographer", 1)[0].id == "d2"
    stamp = (first.index_dir / "params.index.json").stat().st_mtime_ns
    code = (
        "from envs.search.retriever import BM25Retriever\n"
        f"r = BM25Retriever({str(corpus)!r})\n"
        "print(r.built, r.search('Mardel research', 1)[0].id)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.split() == ["False", "d4"], proc.stderr[-2000:]  # loaded, not rebuilt
    assert (first.index_dir / "params.index.json").stat().st_mtime_ns == stamp
    _write_jsonl(corpus, TINY_CORPUS[:3])  # truncated: a new key, a new index
    again = BM25Retriever(corpus)
    assert again.built and again.index_dir != first.index_dir and len(again.docs) == 3
    assert not first.index_dir.exists()  # the stale index is removed


def test_malformed_corpus_line_is_one_line_error(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(json.dumps(TINY_CORPUS[0]) + "\n{not json\n")
    with pytest.raises(RetrieverError, match=r"bad\.jsonl:2: not JSON") as err:
        BM25Retriever(corpus)
    assert "\n" not in str(err.value)
    corpus.write_text('{"id": "x"}\n')
    with pytest.raises(RetrieverError, match=r"bad\.jsonl:1: expected an object"):
        BM25Retriever(corpus)


# --------------------------------------------------------------------------- HTTP


class _Server:
    """A Search-R1-style /retrieve server on 127.0.0.1 (port 0) in a thread.

    ``accepts``: the request shapes it answers ("query", "queries"); others get 422.
    ``fail_first``: that many requests get HTTP 500 first. ``scores``: whether result items
    are ``{"document", "score"}`` (else plain documents)."""

    def __init__(self, accepts=("query", "queries"), fail_first=0, scores=True, port=0):
        self.accepts, self.fail_left, self.scores = set(accepts), fail_first, scores
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                if outer.fail_left > 0:
                    outer.fail_left -= 1
                    return self._send(500, {"error": "busy"})
                shape = "queries" if "queries" in body else "query"
                if self.path != "/retrieve" or shape not in outer.accepts:
                    return self._send(422, {"detail": "unprocessable"})
                queries = body["queries"] if shape == "queries" else [body["query"]]
                result = [outer.answer(q, body["topk"]) for q in queries]
                self._send(200, {"result": result})

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, query: str, k: int) -> list[dict]:
        docs = [{"id": f"h{i}", "contents": f'"{query} {i}"\nAbout {query}.'} for i in range(k)]
        return (
            [{"document": d, "score": 1.0 / (i + 1)} for i, d in enumerate(docs)]
            if self.scores
            else docs
        )

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("style", ["query", "queries"])
def test_http_retriever_speaks_both_shapes(style: str) -> None:
    server = _Server(accepts=(style,))
    try:
        docs = HttpRetriever(server.url, style=style).search("Lusk", 3)
        assert docs[0] == Doc("h0", '"Lusk 0"\nAbout Lusk.', 1.0) and len(docs) == 3
        assert server.requests == [
            {style: "Lusk" if style == "query" else ["Lusk"], "topk": 3, "return_scores": True}
        ]
    finally:
        server.close()


def test_http_auto_falls_back_and_remembers() -> None:
    server = _Server(accepts=("queries",), scores=False)
    try:
        retriever = HttpRetriever(server.url, style="auto", backoff_s=0.01)
        docs = retriever.search("Lusk", 2)
        assert [d.id for d in docs] == ["h0", "h1"] and docs[0].score is None
        assert retriever.style == "queries" and len(server.requests) == 2  # 422, then ok
        retriever.search("Kosti", 2)
        assert len(server.requests) == 3 and "queries" in server.requests[-1]
    finally:
        server.close()


def test_http_recovers_from_500s_within_retries() -> None:
    server = _Server(fail_first=2)
    try:
        docs = HttpRetriever(server.url, retries=3, backoff_s=0.01).search("Lusk", 3)
        assert len(docs) == 3 and len(server.requests) == 3
    finally:
        server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_recovers_from_refused_connections() -> None:
    port = _free_port()
    started: list[_Server] = []
    timer = threading.Timer(0.3, lambda: started.append(_Server(port=port)))
    timer.start()
    try:  # refused until the server starts 0.3 s later; backoff 0.1, 0.2, 0.4, 0.8 s
        url = f"http://127.0.0.1:{port}/retrieve"
        docs = HttpRetriever(url, timeout_s=2, retries=4, backoff_s=0.1).search("Lusk", 1)
        assert [d.id for d in docs] == ["h0"]
    finally:
        timer.join()
        for server in started:
            server.close()


def test_http_down_is_retriever_unavailable() -> None:
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    with pytest.raises(RetrieverUnavailable, match="unavailable after 3 attempts") as err:
        HttpRetriever(url, timeout_s=1, retries=2, backoff_s=0.01).search("Lusk")
    assert url in str(err.value) and "\n" not in str(err.value)
    server = _Server(fail_first=10**6)  # answers, but only 500s
    try:
        with pytest.raises(RetrieverUnavailable, match="HTTP 500"):
            HttpRetriever(server.url, retries=1, backoff_s=0.01).search("Lusk")
    finally:
        server.close()


def test_env_over_http_retriever(tiny_root: Path) -> None:
    server = _Server()
    try:
        write_config(tiny_root, {"backend": "http", "url": server.url, "backoff_s": 0.01})
        env = SearchEnv()
        env.reset(_task(tiny_root))
        obs = env.step("<search>Lusk</search>")[0]
        assert obs.startswith('<information>Doc 1(Title: "Lusk 0") About Lusk.\nDoc 2(')
    finally:
        server.close()


# --------------------------------------------------------------------------- generated tasks


def test_generated_layout_and_families(root: Path) -> None:
    s = spec()
    tasks = s.list_tasks(root, None)
    assert len(tasks) == 3 * N_PER_SPLIT
    for split in SPLITS:
        listed = s.list_tasks(root, split)
        families = sorted(s.family(str(t)) for t in listed)
        assert families == sorted([f for f, _ in REPORT_COLUMNS] * 3)
    assert [label for _, label in s.report_columns] == [
        "NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no 'valid' split"):
        s.list_tasks(root, "valid")
    task = load_task(tasks[0])
    assert {
        "question",
        "golden_answers",
        "data_source",
        "gold_queries",
        "gold_doc_ids",
        "hops",
    } <= set(task)


def test_every_gold_chain_retrieves_its_passages_in_top3(root: Path) -> None:
    """Recomputed with a fresh retriever over the corpus file the tasks name."""
    bm25 = BM25Retriever(root / "corpus.jsonl", cache_dir=root / ".fresh")
    assert bm25.built
    contents = {doc_id: text for doc_id, text in bm25.docs}
    hops = []
    for path in list_tasks(root):
        task = load_task(path)
        assert len(task["gold_queries"]) == len(task["gold_doc_ids"]) == task["hops"]
        for query, doc_id in zip(task["gold_queries"], task["gold_doc_ids"], strict=True):
            assert doc_id in [d.id for d in bm25.search(query, 3)], (path, query)
        if task["shape"] != "comparison":  # the answer is written in the last gold passage
            assert any(a in contents[task["gold_doc_ids"][-1]] for a in task["golden_answers"])
        hops.append(task["hops"])
    assert set(hops) == {1, 2, 3}


def test_kept_filter_drops_a_chain_whose_passage_is_not_in_top3() -> None:
    from envs.search import corpus, tasks

    world = corpus.build_world(0, 100)
    question = corpus.candidates(world, "bamboogle", "A", 3)[0]
    top = {e.name: {e.doc_id} for e in world.entities}
    assert tasks._kept(world, [question], top) == [question]
    second = world.by_key[question.entities[1]]
    top[second.name] = {"not-this-passage"}
    assert tasks._kept(world, [question], top) == []


def test_splits_share_the_corpus_and_do_not_share_facts(root: Path) -> None:
    by_split = {s: [load_task(p) for p in list_tasks(root, s)] for s in SPLITS}
    chains = {s: {(*t["gold_doc_ids"], t["question"]) for t in ts} for s, ts in by_split.items()}
    assert not chains["train"] & chains["seen"]
    unseen_docs = {d for t in by_split["unseen"] for d in t["gold_doc_ids"]}
    seen_docs = {d for s in ("train", "seen") for t in by_split[s] for d in t["gold_doc_ids"]}
    assert not unseen_docs & seen_docs  # held-out entities


def test_generate_is_reproducible_and_the_corpus_fails_loud(root: Path, tmp_path: Path) -> None:
    again = generate_tasks(tmp_path, "seen", N_PER_SPLIT, seed=0)
    for path in again:
        original = root / path.relative_to(tmp_path)
        assert path.read_bytes() == original.read_bytes()
    assert (tmp_path / "corpus.jsonl").read_bytes() == (root / "corpus.jsonl").read_bytes()
    prefix = generate_tasks(tmp_path / "p", "seen", 7, seed=0)
    assert [p.name for p in prefix] == [p.name for p in again[:7]]
    with pytest.raises(TaskError, match="seed=0 corpus_size=600, not seed=1"):
        generate_tasks(tmp_path, "train", 7, seed=1)
    with pytest.raises(TaskError, match="corpus_size=700"):
        generate_tasks(tmp_path, "train", 7, seed=0, corpus_size=700)
    other = generate_tasks(tmp_path / "s1", "seen", 7, seed=1)
    assert [p.name for p in other] != [p.name for p in prefix]


def _play(env: SearchEnv, task, policy) -> tuple[bool, int]:
    obs, info = env.reset(task)
    done, steps = False, 0
    while not done:
        obs, _, done, info = env.step(policy(info["task"], obs))
        steps += 1
    return bool(info["won"]), steps


def test_expert_wins_every_task_of_every_split(root: Path) -> None:
    env, s = SearchEnv(max_steps=4), spec()
    for split in SPLITS:
        tasks = s.list_tasks(root, split)
        wins = 0
        for task in tasks:
            plan = iter(s.expert_plan(str(task)))
            won, steps = _play(env, task, lambda goal, obs, plan=plan: next(plan))
            wins += won
            assert steps == load_task(task)["hops"] + 1
        print(f"expert {split}: {wins}/{len(tasks)}")
        assert wins == len(tasks) == N_PER_SPLIT


def test_random_policy_rarely_wins(root: Path) -> None:
    env, rng = SearchEnv(max_steps=4), random.Random(0)
    tasks = list_tasks(root)
    episodes = 420
    wins = sum(
        _play(env, tasks[i % len(tasks)], lambda g, o: expert.random_reply(g, o, None, rng))[0]
        for i in range(episodes)
    )
    print(f"random policy: {wins}/{episodes} = {wins / episodes:.3f}")
    assert wins / episodes < 0.05


# --------------------------------------------------------------------------- demos


def test_demos_are_deterministic_winning_and_replayable(root: Path) -> None:
    settings = expert.DemoSettings(
        noisy_per_game=3, hinted_per_game=1, mistake_prob=0.5, max_demo_steps=20, seed=3
    )  # the test bed's max_demo_steps (ALFWorld's 20): demos keep the reference's 4 steps
    tasks = [str(t) for t in list_tasks(root, "train")]
    env = SearchEnv(max_steps=4)
    mistakes = 0
    for index, task in enumerate(tasks):
        demos = expert.game_demos(task, index, settings)
        assert demos == expert.game_demos(task, index, settings)
        assert len(demos) == 4 and [d.hint is None for d in demos] == [True, True, True, False]
        for demo in demos:
            assert demo.won and len(demo.actions) <= 4
            assert demo.admissible == [None] * len(demo.actions)
            obs, _ = env.reset(task)  # every demo replays in the real env
            for seen, action in zip(demo.observations, demo.actions, strict=True):
                assert seen == obs
                obs, _, done, info = env.step(action)
            assert done and info["won"] and obs == demo.final_observation
            mistakes += demo.mistakes
            for action in demo.actions:
                assert spec().parse_action(expert.reply_text(action)) == (action, True)
    assert mistakes > 0
    hint = expert.eval_hints(tasks[3:4])[tasks[3]]
    assert hint.startswith(f"Search for '{load_task(tasks[3])['gold_queries'][0]}'")


def test_random_reply_shapes() -> None:
    rng = random.Random(1)
    for _ in range(50):
        reply = expert.random_reply(
            "where was veran kosti born", "<information>x y</information>", None, rng
        )
        action, valid = spec().parse_action(reply)
        assert valid and 1 <= len(action.split(">")[1].split("<")[0].split()) <= 4


# --------------------------------------------------------------------------- oracle


def _record(task: str, actions: list[str], max_steps: int = 4) -> TrajectoryRecord:
    """Play ``actions`` (replies) in the env and record them as the agent loop does."""
    env = SearchEnv(max_steps=max_steps)
    obs, info = env.reset(task)
    goal, turns, done, won = info["task"], [], False, False
    for reply in actions:
        action, valid = spec().parse_action(reply)
        executed = action if action is not None else reply
        turns.append(Turn(obs, reply, [1], [0.0], observation=obs, executed=executed, valid=valid))
        obs, _, done, info = env.step(executed)
        won = info["won"]
        if done:
            break
    status = Status.OK if done and (won or len(turns) < max_steps) else Status.MAX_STEPS
    return TrajectoryRecord(
        task_id="q", group_id="g", game=task, family="musique", turns=turns, reward=float(won),
        won=won, status=status, env="search", goal=goal, final_observation=obs,
        task_marker="Question:",
    )  # fmt: skip


def _skill(record: TrajectoryRecord) -> str:
    request = AnalysisRequest(0, "t", record, "record", [], [])  # type: ignore[arg-type]
    (gen,) = oracle_analyzer(spec())([request])
    parsed = parse_reply(gen.text, ValidationRules(), prompt_text=record.turns[0].user)
    assert parsed.valid, (gen.text, parsed.error)
    assert 10 <= len(parsed.skill.split()) <= 80, parsed.skill
    return parsed.skill


def test_oracle_success_and_failures(tiny_root: Path) -> None:
    task = _task(tiny_root)
    plan = spec().expert_plan(task)
    ok = _skill(_record(task, ["<search>Mardel</search>", *plan], max_steps=5))
    assert ok.startswith(
        "Workflow: search 'The Glass Orchard', then search 'Veran Kosti', then search 'Lusk', "
        'then answer with the exact words of the "Lusk" passage.'
    )
    assert "Skip searches like 'Mardel' (step 1)" in ok
    fix = "Fix: search 'The Glass Orchard', then search 'Veran Kosti', then search 'Lusk'"
    cases = {
        "<answer>Lusk</answer>": "Avoid answering 'Lusk' at step 1 without searching first.",
        "oops": "Avoid a reply at step 1 without exactly one <search>",
        "<search>Mardel</search>": "Avoid searching 'Mardel' at step 1, which missed the \"The Glass Orchard\" passage",
    }  # fmt: skip
    for first, expected in cases.items():
        skill = _skill(_record(task, [first, "<answer>Lusk</answer>"]))
        assert skill.startswith(expected) and fix in skill, skill
        assert "Norland" not in skill  # the answer is never written, only where it is
    wrong = _skill(_record(task, [*plan[:3], "<answer>Veran Kosti</answer>"]))
    assert wrong.startswith(
        "Avoid answering 'Veran Kosti' at step 4, an entity the passages do not give"
    )
    early = _skill(_record(task, [plan[0], "<answer>Lusk</answer>"]))
    assert 'before reading the "Lusk" passage' in early
    out = _skill(_record(task, [*plan[:3], "<search>The Glass Orchard</search>"]))
    assert out.startswith(
        "Avoid searching 'The Glass Orchard' at step 4, which found no new passage"
    )
    bad = AnalysisRequest(0, "t", _record(task, plan), "record", [], [])  # type: ignore[arg-type]
    bad.record.game = str(tiny_root / "missing.json")
    assert oracle_analyzer(spec())([bad])[0].error.startswith("search oracle failed")


def test_oracle_on_generated_demos(root: Path) -> None:
    for task in [str(t) for t in list_tasks(root, "unseen")][::5]:
        plan = spec().expert_plan(task)
        assert _skill(_record(task, plan)).startswith("Workflow: search")
        assert _skill(_record(task, plan[:1])).startswith("Avoid using all 1 turns")


# --------------------------------------------------------------------------- prompts


@pytest.mark.parametrize("style", ["paper", "compact"])
def test_prompts_have_one_task_line(style: str) -> None:
    s = spec()
    prompts = s.prompts(style)
    goal = "where was veran kosti born"
    first = prompts.first(goal, goal, None)
    assert [ln for ln in first.splitlines() if ln.startswith(s.task_marker)] == [
        f"Question: {goal}"
    ]
    history = [
        (goal, "<search>Veran Kosti</search>"),
        ("<information>Doc 1</information>", "<search>Lusk</search>"),
    ]
    window = prompts.window(goal, history, "<information>Doc 2</information>", 2, None)
    assert sum(ln.startswith(s.task_marker) for ln in window.splitlines()) == 1
    assert window.endswith("<search>Lusk</search>\n<information>Doc 2</information>")
    assert (
        prompts.step(1, "<information>Doc 1</information>", None)
        == "<information>Doc 1</information>"
    )
    hinted = insert_skill(
        first, "Search for 'Veran Kosti', then answer.", "task_line", s.task_marker
    )
    assert f"Question: {goal}\n[Hindsight skill]\nSearch for" in hinted
    with pytest.raises(ValueError):
        s.prompts("fancy")


def test_prompt_styles_content() -> None:
    paper, compact = spec().prompts("paper"), spec().prompts("compact")
    assert paper.system_prompt is None  # Search-R1 uses the chat template's default
    first = paper.first("Who wrote X?", "Who wrote X?", None)
    assert first.startswith("Answer the given question. You must conduct reasoning inside <think>")
    assert first.endswith("<answer> Beijing </answer>.\nQuestion: Who wrote X?")
    assert compact.system_prompt.count("\n") == 0
    assert compact.first("Who wrote X?", "Who wrote X?", None) == "Question: Who wrote X?"
    assert spec().task_marker != "Your task is " + "to"


# --------------------------------------------------------------------------- official data


def _official_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _official_rows() -> list[dict]:
    def row(i: int, source: str, question: str, answers: list[str]) -> dict:
        return {
            "id": f"{source}_{i}", "question": question, "golden_answers": answers,
            "data_source": source, "ability": "fact-reasoning",
            "reward_model": {"ground_truth": {"target": [*answers, answers[0].upper()]}, "style": "rule"},
        }  # fmt: skip

    return [
        row(0, "nq", "where was veran kosti born", ["Lusk"]),
        row(1, "nq", "who wrote the glass orchard", ["Veran Kosti"]),
        row(
            0, "hotpotqa", "In which country was the author of The Glass Orchard born?", ["Norland"]
        ),
    ]


def test_official_parquet_to_tasks(tmp_path: Path) -> None:
    from envs.search.official import convert_parquet

    parquet = _official_parquet(tmp_path / "test.parquet", _official_rows())
    corpus = _write_jsonl(tmp_path / "wiki-18.jsonl", TINY_CORPUS)
    out = tmp_path / "official"
    paths = convert_parquet(parquet, out, "test", n=2, corpus=corpus)
    assert [p.relative_to(out).as_posix() for p in paths] == [
        "test/nq/nq_0.json",
        "test/hotpotqa/hotpotqa_0.json",
    ]
    task = load_task(paths[0])
    assert task["golden_answers"] == ["Lusk", "LUSK"] and task["gold_queries"] is None
    assert spec().expert_plan(str(paths[0])) is None
    config = json.loads((out / "retriever.json").read_text())
    assert config == {"backend": "bm25", "corpus": str(corpus.resolve())}
    env = SearchEnv()
    env.reset(paths[0])
    assert '(Title: "Veran Kosti")' in env.step("<search>Veran Kosti</search>")[0]
    assert env.step("<answer>lusk</answer>")[1] == 1.0
    http = convert_parquet(
        parquet, tmp_path / "h", "test", retriever_url="http://127.0.0.1:1/retrieve"
    )
    assert len(http) == 3
    assert json.loads((tmp_path / "h" / "retriever.json").read_text())["backend"] == "http"


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megatron_seed.cli", "games", "--env", "search", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_seed_games_cli(tmp_path: Path) -> None:
    out = tmp_path / "games"
    proc = _cli("--out", str(out), "--split", "unseen", "--n", "14", "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote 14 unseen tasks to {out}/unseen in ")
    assert "  musique: 2" in proc.stdout and len(list_tasks(out, "unseen")) == 14
    for bad, needle in [
        (["--split", "valid", "--n", "3"], "unknown split 'valid'"),
        (["--split", "train", "--n", "3", "--corpus-size", "5"], "corpus_size must be in"),
        (["--split", "train", "--n", "3", "--seed", "6"], "holds a corpus built from seed=5"),
    ]:
        proc = _cli("--out", str(out), *bad)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("seed games: error: ") and needle in proc.stderr


def test_seed_games_cli_from_parquet(tmp_path: Path) -> None:
    rows = _official_rows()
    parquet = _official_parquet(tmp_path / "train.parquet", rows)
    corpus = _write_jsonl(tmp_path / "wiki.jsonl", TINY_CORPUS)
    proc = _cli("--from-parquet", str(parquet), "--corpus", str(corpus), "--split", "train",
                "--out", str(tmp_path / "o"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "  hotpotqa: 1\n  nq: 2" in proc.stdout
    broken = _official_parquet(
        tmp_path / "b.parquet", [{k: v for k, v in r.items() if k != "reward_model"} for r in rows]
    )
    proc = _cli("--from-parquet", str(broken), "--corpus", str(corpus), "--split", "train",
                "--out", str(tmp_path / "o2"))  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "lacks the columns ['reward_model']" in proc.stderr
