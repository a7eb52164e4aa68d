"""A new environment through the protocol alone: a toy guessing game written here, with no
edit to the library, played by `EnvPool` + `AgentLoop` and trained for one `seed train`
update (`--env tests.e2e.test_toy_env:toy`).

The game: guess a hidden number in 1..5. Each reply is `<guess>N</guess>`; the environment
answers "higher" / "lower", lists the admissible guesses, and ends the episode on the right
number with a score of 1 / (number of guesses), a reward that is not just won/lost.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from envs.api import EnvSpec, Prompts

REPO = Path(__file__).resolve().parents[2]
NAME = "tests.e2e.test_toy_env:toy"  # how other processes find this environment
GUESSES = [str(n) for n in range(1, 6)]


class GuessEnv:
    """One episode at a time (`envs.api.Env`)."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def reset(self, task: str) -> tuple[str, dict]:
        self.target = json.loads(Path(task).read_text())["target"]
        self.steps = 0
        info = {"won": False, "admissible_actions": GUESSES, "task": "find the hidden number"}
        return "A number from 1 to 5 is hidden.", info

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self.steps += 1
        guess = int(action) if action in GUESSES else None
        won = guess == self.target
        if won:
            text = "Right!"
        elif guess is None:
            text = "That is not a number from 1 to 5."
        else:
            text = "Higher." if guess < self.target else "Lower."
        done = won or self.steps >= self.max_steps
        reward = 1.0 / self.steps if won else 0.0
        return text, reward, done, {"won": won, "admissible_actions": GUESSES}


def _first(goal: str, observation: str, admissible: list[str] | None) -> str:
    return f"Goal: {goal}.\n{observation} Options: {', '.join(admissible or [])}."


def _step(step: int, observation: str, admissible: list[str] | None) -> str:
    return f"{observation} (guess {step + 1})"


def _window(goal, history, observation, step, admissible) -> str:
    past = " ".join(f"[{a}: {o}]" for o, a in history)
    return f"{_first(goal, observation, admissible)} {past}"


def _parse(text: str) -> tuple[str | None, bool]:
    found = re.findall(r"<guess>\s*(\d)\s*</guess>", text or "")
    return (found[-1], True) if found else (None, False)


class ToyPrompt:
    """The toy game's prompt module: one style, the <guess> parser, a "Goal:" task line."""

    TASK_MARKER = "Goal:"

    def prompt_style(self, name: str) -> Prompts:
        return Prompts("Guess the number.", _first, _step, _window, False)

    def parse_action(self, text: str) -> tuple[str | None, bool]:
        return _parse(text)


def _list(root, split) -> list[Path]:
    base = Path(root) / (split or "")
    return sorted(base.rglob("*.json"))


def toy() -> EnvSpec:
    """The toy game's spec."""
    return EnvSpec(
        name="toy",
        make_env=GuessEnv,
        list_tasks=_list,
        family=lambda task: "odd" if json.loads(Path(task).read_text())["target"] % 2 else "even",
        prompt=ToyPrompt(),
        description="a number-guessing game",
        report_columns=(("odd", "Odd"), ("even", "Even")),
    )


def write_tasks(root: Path, n: int = 4) -> Path:
    (root / "train").mkdir(parents=True)
    for i in range(n):
        (root / "train" / f"task_{i}.json").write_text(json.dumps({"target": 1 + i % 5}))
    return root


class GuessUp:
    """A scripted engine: guesses 1, 2, 3, ... (one episode per prompt)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer

    def generate(self, prompts, spec):
        from megatron_seed.data.generation import Generation

        out = []
        for ids in prompts:
            n = self.tok.decode(ids).count("<|im_start|>assistant")  # the step, 1-based
            text = f"<guess>{n}</guess>" if n != 2 else "no idea"  # step 2: an invalid reply
            ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
            out.append(Generation(ids, [-0.5] * len(ids), text, "stop"))
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from megatron_seed.models.tiny import make_tiny_policy
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("toy")
    tasks = write_tasks(root / "tasks")
    corpus = [_first("find the hidden number", "A number from 1 to 5 is hidden.", GUESSES)]
    corpus += [f"<guess>{g}</guess> Higher. Lower. Right!" for g in GUESSES]
    tok = build_tokenizer(corpus * 8, 400)
    make_tiny_policy(root / "model", tok, hidden_size=64, heads=2, kv_heads=1)
    return root, tasks, tok


def test_env_pool_and_agent_loop_play_the_toy_game(world) -> None:
    import ray

    from envs.spec import get_env
    from envs.workers import EnvPool
    from megatron_seed.config import RolloutConfig
    from megatron_seed.rollout.agent_loop import AgentLoop, make_tasks

    _, tasks, tok = world
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_toy_"))
    try:
        env = get_env(NAME)
        pool = EnvPool(NAME, num_workers=2, max_steps=5)  # the workers look the name up
        loop = AgentLoop(GuessUp(tok), pool, tok, RolloutConfig(max_steps=5), env)
        games = [str(p) for p in env.list_tasks(tasks, "train")]
        played = loop.run(make_tasks(env, games), group_size=2, spec=None)
        records, stats = played.records, played.stats
        pool.close()
    finally:
        ray.shutdown()
    assert len(records) == 8 and stats.invalid_actions == sum(len(r.turns) >= 2 for r in records)
    by_target = {json.loads(Path(r.game).read_text())["target"]: r for r in records}
    # target 1: right at once (score 1); target 3: 1, invalid, 3 (score 1/3); target 4: 1,
    # invalid, 3, 4 (score 1/4)
    assert by_target[1].reward == 1.0 and len(by_target[1].turns) == 1
    assert by_target[3].reward == pytest.approx(1 / 3) and by_target[3].won
    assert by_target[4].reward == pytest.approx(1 / 4) and len(by_target[4].turns) == 4
    r = by_target[4]
    assert [t.executed for t in r.turns] == ["1", "no idea", "3", "4"]
    assert [t.valid for t in r.turns] == [True, False, True, True] and r.invalid_actions == 1
    assert [t.observation for t in r.turns[1:]] == [
        "Higher.",
        "That is not a number from 1 to 5.",
        "Higher.",
    ]
    assert r.final_observation == "Right!" and r.goal == "find the hidden number"
    assert r.env == NAME and r.task_marker == "Goal:" and r.family == "even"
    assert r.turns[0].user.startswith("Goal: find the hidden number.")


def test_one_seed_train_update_on_the_toy_game(world, tmp_path) -> None:
    root, tasks, _ = world
    out = tmp_path / "out"
    config = {  # packed micro-batches (the other e2e runs train on padded ones)
        "rollout": {"max_steps": 3},
        "fleet": {"max_model_len": 1024},
        "optim": {"micro_batch_tokens": 1024},
    }
    cmd = [
        sys.executable, "-m", "megatron_seed.cli", "train", "--model", str(root / "model"),
        "--games", str(tasks), "--out", str(out), "--recipe", "tiny", "--env", NAME,
        "--updates", "1", "--config-json", json.dumps(config),
        "--engines", "1",  # the environment is under test here, not the fleet
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["rollout/episodes"] == 4  # tiny: 2 tasks x 2
    assert math.isfinite(row["train/loss/total"]) and row["train/tokens"] > 0
    assert row["train/pad_frac"] < 0.2  # the padding the training forward ran on
    assert row["analyze/n"] == 4 and row["sync/bytes"] > 0
    records = [json.loads(x) for x in (out / "trajectories" / "update_00000.jsonl").open()]
    assert {r["env"] for r in records} == {NAME}
    assert all(t["observation"] for r in records for t in r["turns"])
    assert (out / "final_hf" / "config.json").is_file()
