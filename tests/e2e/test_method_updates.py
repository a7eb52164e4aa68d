"""Every method name through the real Stage-2 driver: one update each on the tiny world (the
fleet, the ALFWorld env workers, the Megatron trainer), each logging its own metrics; then
the base evaluated with the library's skill (Skill-Prompt*). One spawned process runs them
all on one fleet (about two minutes)."""

from __future__ import annotations

import pytest

from megatron_seed.methods import METHODS
from megatron_seed.models.parallel import spawn
from megatron_seed.skills.library import SkillLibrary
from tests.distributed import workers

GENERAL = "Look around first, then check each receptacle one by one."
PICK = "Take the object from where it lies and move it to the target receptacle."
# the Stage-2 runs; grpo first (its trajectories become the Stage-1 annotations)
RUNS = [
    "grpo", "grpo-shuffled", "skill-grpo", "opsd", "opsd-paper", "grpo-opsd", "skill-sd", "rlsd", "sdar",
    "seed", "seed-replay", "static-skills", "seed+overlap", "seed+uncertain",
    "seed-replay+one_step_off",
]  # fmt: skip
# methods whose Stage 2 is another's (their difference is Stage 1 or no training at all)
SAME_STAGE2 = {"no-sft": "seed", "no-opd": "grpo", "vanilla": None, "skill-prompt": None}


@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    root = tmp_path_factory.mktemp("methods")  # the session's games and model, read-only
    for name in ("games", "model"):
        (root / name).symlink_to(tiny_world / name, target_is_directory=True)
    SkillLibrary(GENERAL, {"pick": PICK}).save(root / "library")
    return spawn(workers.methods_one_update, 1, str(root), RUNS)[0]


def _row(runs, name):
    return runs[name]["row"]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 * max(1.0, abs(a), abs(b))


def _check(name: str, runs: dict) -> None:
    """The method's own metrics (and none of the others')."""
    row, run = _row(runs, name), runs[name]
    assert row["step"] == 1 and row["rollout/episodes"] == 4
    assert "train/loss/total" in row and "train/grad_norm" in row
    if name in ("grpo", "grpo-shuffled", "skill-grpo"):
        assert "train/loss/opd" not in row and "analyze/n" not in row and not run["sources"]
    if name == "grpo":
        assert "[Hindsight skill]" not in run["first_user"]
    if name == "skill-grpo":  # the library's skill is in the rollout prompt the trainer scores
        assert f"[Hindsight skill]\n{GENERAL}" in run["first_user"]
    if name in ("opsd", "grpo-opsd", "skill-sd", "rlsd", "sdar"):
        assert run["sources"] == ["library"] and row["analyze/valid_rate"] == 1.0
        assert all(s.startswith(GENERAL) for s in run["skills"])  # general.md comes first
        assert row["train/opd/token_frac"] == 1.0
    if name in ("opsd", "grpo-opsd", "skill-sd", "sdar"):  # a teacher term moves the weights
        assert row["train/grad_norm"] > 0  # (GRPO's and RLSD's may not: all 4 episodes lost)
    if name == "opsd":  # no policy term in the loss: KL + lambda * L_opd
        total = 0.01 * row["train/kl"] + 0.01 * row["train/loss/opd"]
        assert _close(row["train/loss/total"], total)
    if name == "grpo-opsd":  # beta_opd = 0: every gate is exactly 1/2
        assert row["train/opd/gate_mean"] == 0.5
    if name == "sdar":
        assert 0.0 < row["train/opd/gate_mean"] < 1.0
    if name == "skill-sd":  # L = L_grpo + KL + lambda_iw * L_iw
        assert "train/loss/opd" not in row
        total = (
            row["train/loss/policy"] + 0.01 * row["train/kl"] + 0.001 * row["train/loss/distill"]
        )
        assert _close(row["train/loss/total"], total)
    if name == "rlsd":
        assert row["train/rlsd/lambda"] == 0.5  # update 0 of its schedule
    if name == "opsd-paper":
        assert run["sources"] == ["expert_plan"]
        assert all(s.startswith("An expert solves this task") for s in run["skills"])
        total = 0.01 * row["train/kl"] + 0.01 * row["train/loss/distill"]
        assert _close(row["train/loss/total"], total)
    if name in ("seed", "seed-replay"):
        assert run["sources"] == ["analyzer"] and row["analyze/n"] == 4
        assert "analyze/degenerate_rate" in row and "train/opd/token_frac" in row
    if name == "seed":
        assert "train/loss/replay_nll" not in row
    if name == "seed-replay":
        assert row["train/loss/replay_nll"] > 0
    if name == "static-skills":
        assert run["sources"] == ["stage1_library"] and row["analyze/valid_rate"] > 0


def test_seed_with_overlapped_phases_and_with_selective_analysis(runs):
    """`rollout.overlap`: every trajectory analysed as it ended, the driver's waits and each
    engine's and env worker's busy/idle seconds logged; `skill.select=uncertain`: one of
    each group's two trajectories analysed (the lower mean log-prob)."""
    row = _row(runs, "seed+overlap")
    assert runs["seed+overlap"]["sources"] == ["analyzer"] and row["analyze/n"] == 4
    assert row["analyze/selected_share"] == 1.0 and "time/analyze" not in row
    assert row["overlap/episodes_s"] > 0 and row["overlap/analysis_tail_s"] >= 0
    assert row["busy/engine0_s"] > 0 and row["busy/env0_s"] > 0
    window = row["time/rollout"]
    assert row["busy/engine0_s"] + row["idle/engine0_s"] == pytest.approx(window, rel=0.05)
    # the actors' own CPU seconds; the machine's busy time holds theirs and more
    actors = [v for k, v in row.items() if k.startswith(("cpu/engine", "cpu/env"))]
    assert "cpu/engine0_s" in row and "cpu/env0_s" in row
    assert all(0 < cpu <= 2 * window for cpu in actors), actors
    assert row["cpu/machine_busy_s"] >= 0.9 * sum(actors)
    assert 0 <= row["cpu/machine_idle_share"] < 1
    sync = _row(runs, "seed")
    assert "time/analyze" in sync and sync["rollout/engine_wait_s"] > 0
    uncertain = _row(runs, "seed+uncertain")
    assert uncertain["analyze/n"] == 2 and uncertain["analyze/selected_share"] == 0.5
    assert len(runs["seed+uncertain"]["analysed_groups"]) == 2  # one per group


def _behaviour_logprobs(model_dir, record) -> tuple[list[float], list[float]]:
    """(the log-probs a record stores, those the HF model at `model_dir` gives its actions)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from megatron_seed.data.sequences import build_sequences

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    (pair,) = build_sequences(record, tokenizer, "task_line", with_teacher=False)
    ids = torch.tensor([pair.student.input_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)  # [n - 1, V]
    mask = torch.tensor(pair.student.action_mask[1:])
    scored = logp.gather(-1, ids[0, 1:, None])[:, 0][mask]
    stored = [x for t in record.turns for x in t.logprobs]
    return stored, scored.tolist()


def test_one_step_off_lags_theta_old_by_exactly_one_update(runs, tmp_path_factory):
    """Update k trains on episodes the weights of update k-1 played (analyzer replay moves
    the weights every update): update 1's were played by theta_0, the initial model
    (the engine's log-probs are its), update 2's by theta_1, which is not theta_0. The
    staleness metric is 0 where the lag is 0 (update 0)."""
    run = runs["seed-replay+one_step_off"]
    rows, updates = run["rows"], run["updates"]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [{x.policy_version for x in u} for u in updates] == [{0}, {0}, {1}]
    assert [r["staleness/lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert rows[0]["staleness/delta_abs_mean"] == 0.0 and rows[0]["staleness/bound"] == 0.0
    assert "ahead/rollout_s" in rows[1] and "ahead/analyze_s" in rows[1]
    assert all(r["train/loss/replay_nll"] > 0 for r in rows)  # the weights move
    model = str(run["model_dir"])
    gaps = []  # per update: the largest gap between its stored log-probs and theta_0's
    for k in (1, 2):
        stored, theta0 = _behaviour_logprobs(model, updates[k][0])
        gaps.append(max(abs(a - b) for a, b in zip(stored, theta0, strict=True)))
    assert gaps[0] < 1e-4  # update 1 was played by theta_0
    assert gaps[1] > max(2e-4, 10 * gaps[0])  # update 2 by other weights: theta_1


@pytest.mark.parametrize("name", list(METHODS))
def test_one_update_of_each_method(runs, name):
    method = METHODS[name]
    if name in SAME_STAGE2:
        other = SAME_STAGE2[name]
        if other is None:  # trains nothing: the base policy, evaluated (with skills for *)
            assert not method.trains
            if method.eval_skill_label:
                evaluation = runs["evaluation"]["train"]
                assert evaluation["episodes"] == 6  # greedy, one per game of the tiny world
                assert sum(evaluation["per_family_episodes"].values()) == 6
            return
        from megatron_seed import recipes

        cfg = recipes.get("tiny").config
        assert method.config(cfg) == METHODS[other].config(cfg)
        assert method.stage1 != METHODS[other].stage1
        name = other
    _check(name, runs)
