"""Search-QA through the real training stack: generated questions, the BM25 retriever inside
the Ray env workers, the fleet, the Megatron trainer (one `seed train` update of a tiny
random policy), then `seed eval` of the trained model through the fleet.

The whole quick job on search and on Sokoban (`seed run --quick --env search|sokoban`,
about 3.5 and 3.2 minutes on 2 cores) is measured in docs/results.md rather than run here,
to keep the suite's time down.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from envs.search.env import INVALID_MESSAGE

REPO = Path(__file__).resolve().parents[2]


def _seed(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_seed.cli", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """Search tasks and a tiny random policy whose tokenizer knows their prompts.

    The corpus is read from the task files, not retrieved here: importing bm25s imports
    numba when it is installed, and numba's objects break vLLM's in-process engine start
    later in this process (docs/facts.md)."""
    from envs.spec import get_env
    from megatron_seed.models.tiny import make_tiny_policy
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("search_world")
    proc = _seed("games", "--env", "search", "--split", "train", "--n", "4", "--seed", "3",
                 "--out", str(root / "tasks"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    style = get_env("search").prompts("paper")
    corpus = [style.system_prompt or "", "<search> </search> <answer> </answer>", INVALID_MESSAGE]
    for task in sorted((root / "tasks" / "train").rglob("*.json")):
        question = json.loads(task.read_text())["question"]
        corpus.append(style.first(question, question, None))
    passages = [json.loads(x)["contents"] for x in (root / "tasks" / "corpus.jsonl").open()]
    corpus += [f"<information>Doc 1(Title: {p[:300]}</information>" for p in passages[:60]]
    make_tiny_policy(root / "model", build_tokenizer(corpus * 3, 1500))
    return root


def test_one_seed_train_update_and_seed_eval_on_search(world: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = {"rollout": {"max_steps": 4, "max_prompt_tokens": 1536},
              "fleet": {"max_model_len": 2048, "engines": 1}}  # fmt: skip
    proc = _seed("train", "--model", str(world / "model"), "--games", str(world / "tasks"),
                 "--out", str(out), "--recipe", "tiny", "--env", "search", "--updates", "1",
                 "--config-json", json.dumps(config))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/episodes"] == 4 and math.isfinite(row["train/loss/total"])
    assert row["analyze/n"] == 4 and 1 <= row["rollout/episode_length"] <= 4
    records = [json.loads(x) for x in (out / "trajectories" / "update_00000.jsonl").open()]
    assert {r["env"] for r in records} == {"search"} and {r["task_marker"] for r in records} == {
        "Question:"
    }
    for r in records:
        # the environment's own answers: search results from the retriever in the worker,
        # or its message for an invalid reply, never empty
        answers = [t["observation"] for t in r["turns"][1:]] + [r["final_observation"]]
        assert all(answers) and len(r["turns"]) <= 4
        for turn, answer in zip(r["turns"], answers, strict=True):
            if not turn["valid"]:
                assert answer == INVALID_MESSAGE
            elif turn["executed"].startswith("<search>"):
                assert answer.startswith("<information>Doc 1(Title: ")
            else:
                assert answer.startswith("Your answer is")
    result_path = tmp_path / "eval.json"
    proc = _seed("eval", "--env", "search", "--games", str(world / "tasks"), "--policy",
                 str(out / "final_hf"), "--recipe", "tiny", "--config-json", json.dumps(config),
                 "--out", str(result_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(result_path.read_text())
    assert result["episodes"] == 4 and len(result["episodes_played"]) == 4
    assert all(1 <= e["steps"] <= 4 for e in result["episodes_played"])
    assert sum(p["episodes"] for p in result["per_family"].values()) == 4
