"""What an update logs about itself and the rules that shape it: the learning-rate schedule,
the no-signal rule, the per-term gradient split, the tied-group shares, the permuted-advantage
control and `--set`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from megatron_seed.algo import seed_loss
from megatron_seed.algo.losses import term_grad_sq, term_gradients
from megatron_seed.config import AlgoConfig, ConfigError, OptimConfig, assignments
from megatron_seed.data import Status, TrajectoryRecord, Turn
from megatron_seed.train.batch import PolicyBatch, outcome_signal, permute_advantages
from megatron_seed.train.schedule import lr_at
from megatron_seed.train.trainer import carries_signal
from tests.fixtures import random_loss_inputs


def test_lr_schedule_hand_computed():
    warm = OptimConfig(lr=1e-3, lr_warmup_updates=3)
    assert [lr_at(warm, k, 10) for k in range(5)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3]
    )
    cos = OptimConfig(lr=1e-3, lr_decay="cosine", lr_min_ratio=0.1)
    # p = k / 4 over 5 updates: lr (0.1 + 0.9 (1 + cos(pi p)) / 2)
    expected = [1e-3 * (0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2) for k in range(5)]
    assert [lr_at(cos, k, 5) for k in range(5)] == pytest.approx(expected)
    assert lr_at(cos, 4, 5) == pytest.approx(1e-4)
    lin = OptimConfig(lr=1e-3, lr_warmup_updates=1, lr_decay="linear")
    assert [lr_at(lin, k, 4) for k in range(4)] == pytest.approx([5e-4, 1e-3, 5e-4, 0.0])
    assert lr_at(OptimConfig(lr=2e-4), 7, 8) == 2e-4
    with pytest.raises(ValueError, match="update >= 0"):
        lr_at(warm, -1, 4)


def test_no_signal_rule():
    zeros, some = torch.zeros(4), torch.tensor([0.0, 0.0, 1.0, -1.0])
    assert not carries_signal(AlgoConfig(), zeros)  # the default: skip
    assert carries_signal(AlgoConfig(), some)
    assert carries_signal(AlgoConfig(no_signal="step"), zeros)  # the paper's
    assert carries_signal(AlgoConfig(policy_weight=0.0), zeros)  # OPSD has no L_rl to wait for
    with pytest.raises(ConfigError, match="no_signal"):
        AlgoConfig(no_signal="sometimes")


@pytest.mark.parametrize(
    "cfg",
    [
        AlgoConfig(lambda_opd=0.5, beta_kl=0.1),
        AlgoConfig(use_opd=False, beta_kl=0.1),
        AlgoConfig(advantage_reweight="rlsd", lambda_opd=0.0, beta_kl=0.1),
        AlgoConfig(policy_weight=0.0, beta_kl=0.0),
        AlgoConfig(distill="iw_reverse_kl", teacher_mode="snapshot"),
    ],
)
def test_term_gradients_add_up_to_the_loss_gradient(cfg):
    """Each term's gradient at the log-probs, recomputed alone: they add up to the whole
    loss's (so the split is of the step actually taken), a term not in the loss is 0, and
    the logged squared norms are theirs."""
    inputs = random_loss_inputs(seed=3)
    x = inputs["logp"].clone().requires_grad_(True)
    args = (inputs["old_logp"], inputs["advantages"], inputs["mask"])
    kw = dict(ref_logp=inputs["ref_logp"], teacher_logp=inputs["teacher_logp"], update=3)
    kw["opd_mask"] = inputs["opd_mask"]
    loss, _ = seed_loss(cfg, x, *args, **kw)
    (total,) = torch.autograd.grad(loss, x)
    parts = term_gradients(cfg, inputs["logp"], *args, **kw)
    assert torch.allclose(parts["rl"] + parts["kl"] + parts["distill"], total, atol=1e-7)
    assert bool(parts["rl"].any()) == (cfg.policy_weight != 0)
    assert bool(parts["kl"].any()) == (cfg.beta_kl != 0)
    weight = cfg.lambda_iw if cfg.distill == "iw_reverse_kl" else cfg.lambda_opd
    assert bool(parts["distill"].any()) == (cfg.use_opd and weight != 0)  # RLSD: lambda 0
    sq = term_grad_sq(cfg, inputs["logp"], *args, **kw)
    assert float(sq["grad_sq/rl"]) == pytest.approx(float(parts["rl"].pow(2).sum()))
    # plain GRPO's KL gradient by hand: d/dl beta (e^(r-l) - (r-l) - 1) / n = beta (1 - e^(r-l)) / n
    if cfg.beta_kl and not cfg.use_opd:
        m = inputs["mask"].bool()
        r, lp = inputs["ref_logp"], inputs["logp"]
        hand = torch.where(m, cfg.beta_kl * (1 - torch.exp(r - lp)) / m.sum(), 0.0)
        assert torch.allclose(parts["kl"], hand, atol=1e-7)


def _record(group: str, reward: float, status: Status = Status.OK) -> TrajectoryRecord:
    turn = Turn("Your task is to: put a mug in desk.", "look", [5], [-0.1])
    return TrajectoryRecord(task_id=group, group_id=group, game=group, family="pick",
                            turns=[turn], won=reward > 0, reward=reward, status=status)  # fmt: skip


def test_outcome_signal_counts_tied_groups():
    records = [_record("a", 1.0), _record("a", 1.0), _record("b", 0.0), _record("b", 0.0)]
    records += [_record("c", 1.0), _record("c", 0.0), _record("d", 0.0)]
    records += [_record("d", 1.0, Status.ENV_ERROR)]  # not trainable: d is a tied lost group
    assert outcome_signal(records) == {
        "batch/groups": 4.0,
        "batch/tied_won_frac": 0.25,
        "batch/tied_lost_frac": 0.5,
        "batch/signal_frac": 0.25,
    }
    assert outcome_signal([]) == {}


def test_permuted_advantages_keep_the_multiset_and_each_records_rows_together():
    adv = torch.tensor([1.0, 1.0, -1.0, 0.5, 0.5, 0.5, 0.0])  # records 0,0,1,2,2,2,3
    index = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    pb = PolicyBatch(None, None, torch.zeros(7, dtype=torch.bool), adv, index)  # type: ignore[arg-type]
    out = permute_advantages(pb, torch.Generator().manual_seed(0))
    per_record = {int(i): float(a) for i, a in zip(index, out.advantages, strict=True)}
    for i, a in zip(index.tolist(), out.advantages.tolist(), strict=True):
        assert per_record[i] == a  # a record's rows share one advantage
    assert sorted(per_record.values()) == [-1.0, 0.0, 0.5, 1.0]
    again = permute_advantages(pb, torch.Generator().manual_seed(0))
    assert torch.equal(out.advantages, again.advantages)  # seeded: the same on every rank
    moved = [permute_advantages(pb, torch.Generator().manual_seed(s)).advantages for s in range(8)]
    assert any(not torch.equal(m, adv) for m in moved)


def test_set_assignments():
    changes = assignments(["optim.lr=1e-4", "rollout.tasks_per_update=4", "algo.no_signal=step"])
    assert changes == {
        "optim": {"lr": 1e-4},
        "rollout": {"tasks_per_update": 4},
        "algo": {"no_signal": "step"},
    }
    assert assignments(["updates=3", "algo.use_opd=false"]) == {
        "updates": 3,
        "algo": {"use_opd": False},
    }
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        assignments(["optim.lr"])
    with pytest.raises(ConfigError, match="given a value and fields"):
        assignments(["optim=1", "optim.lr=2"])


def test_set_is_checked_before_anything_runs_and_recorded(tmp_path, capsys):
    from megatron_seed.cli import main

    code = main(["compare", "--set", "optim.lrr=1", "--out", str(tmp_path / "c")])
    assert code == 2
    assert "lrr" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_merge_refuses_comparisons_of_other_settings(tmp_path):
    from megatron_seed.compare.report import merge_summaries
    from megatron_seed.errors import CommandError

    for name, settings in (("a", ["optim.lr=1e-4"]), ("b", [])):
        (tmp_path / name).mkdir()
        summary = {"results": {}, "seeds": [0], "settings": settings}
        (tmp_path / name / "compare.json").write_text(json.dumps(summary))
    assert merge_summaries([tmp_path / "a", tmp_path / "a"])["settings"] == ["optim.lr=1e-4"]
    with pytest.raises(CommandError, match="merge only comparisons of one config"):
        merge_summaries([tmp_path / "a", tmp_path / "b"])
    (tmp_path / "a2").mkdir()  # the same setting written otherwise merges
    summary = {"results": {}, "seeds": [1], "settings": ["optim.lr=0.0001"]}
    (tmp_path / "a2" / "compare.json").write_text(json.dumps(summary))
    assert merge_summaries([tmp_path / "a", tmp_path / "a2"])["seeds"] == [0, 1]


def test_fixed_curve_reads_the_evaluated_updates_and_tables_them(tmp_path):
    from megatron_seed.compare.report import fixed_curve, fixed_curve_table

    rows = [{"step": 1, "rollout/success": 0.1}, {"step": 2, "evaluate/success": 0.25}]
    rows += [{"step": 3}, {"step": 4, "evaluate/success": 0.5}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert fixed_curve(path) == [[2, 0.25], [4, 0.5]]
    base = [{"train": {"success": 0.2}}, {"train": {"success": 0.3}}]
    runs = {"GRPO": [[[2, 0.25], [4, 0.5]], [[2, 0.35], [4, 0.7]]]}
    table = fixed_curve_table(runs, {"GRPO": base})
    assert table.splitlines()[0] == "| method | update 0 | update 2 | update 4 |"
    assert table.splitlines()[2] == (
        "| GRPO | 25.0 [20.0, 30.0] | 30.0 [25.0, 35.0] | 60.0 [50.0, 70.0] |"
    )
    assert fixed_curve_table({"GRPO": [[]]}) == ""
    # SEED starts Stage 2 from its Stage-1 model: update 0 is that model's evaluation
    from megatron_seed.compare.report import _curve_starts

    stage1 = [{"train": {"success": 0.1}}]
    starts = _curve_starts({"Base (Vanilla)": base, "Stage-1 SFT": stage1}, {"SEED": 0, "GRPO": 0})
    assert starts == {"SEED": stage1, "GRPO": base}


def test_evaluation_counts_each_games_wins():
    from megatron_seed.pipeline.evaluate import summarize

    records = [_record("g1", 1.0), _record("g1", 0.0), _record("g2", 0.0), _record("g1", 1.0)]
    out = summarize(records)
    assert out["per_game"] == {"g1": [2, 3], "g2": [0, 1]}
    assert out["success"] == 0.5


def test_stage2_evaluation_samples_fixed_draws_when_asked(tmp_path):
    """`Stage2Job.eval_episodes`: the engines' streams restart at `eval_seed` before every
    evaluation and each game plays that many sampled episodes (0: one greedy episode)."""
    from types import SimpleNamespace

    from megatron_seed.pipeline.job import Stage2Job
    from megatron_seed.pipeline.roles import Leader

    calls: list = []

    class Session:
        fleet = SimpleNamespace(reseed=lambda seed: calls.append(("reseed", seed)))

        def tasks(self, games):
            return games

        def sampling(self, greedy=False, seed=None):
            return ("greedy" if greedy else "sampled", seed)

        def play(self, tasks, n, spec, update):
            calls.append(("play", tuple(tasks), n, spec))
            return SimpleNamespace(records=[_record(g, 1.0) for g in tasks for _ in range(n)])

    from megatron_seed.config import SeedConfig
    from megatron_seed.rollout.engine import SamplingSpec

    job = Stage2Job("m", ["g"], str(tmp_path), eval_games=["a", "b"], eval_every=2)
    assert Leader(job, Session()).evaluate()["evaluate/success"] == 1.0
    assert calls == [("play", ("a", "b"), 1, ("greedy", None))]
    calls.clear()
    job.eval_episodes, job.eval_seed = 4, 77
    out = Leader(job, Session()).evaluate()
    # the final evaluation's draws (`evaluate_policies`): rollout temperature, top_p 1
    spec = SamplingSpec(
        temperature=1.0, max_tokens=SeedConfig().rollout.max_response_tokens, seed=77
    )
    assert calls == [("reseed", 77), ("play", ("a", "b"), 4, spec)]
    assert out["evaluate/episodes"] == 8


def test_set_keeps_text_fields_text_and_leaves_flags_to_flags(tmp_path, capsys):
    from megatron_seed.cli import main

    assert assignments(["env.name=123", "algo.no_signal=step", "optim.lr=1"]) == {
        "env": {"name": "123"},
        "algo": {"no_signal": "step"},
        "optim": {"lr": 1},
    }
    for flag, owner in (("seed=3", "--seed"), ("updates=2", "--updates"), ("env.name=x", "--env")):
        assert main(["compare", "--set", flag, "--out", str(tmp_path / "c")]) == 2
        assert owner in capsys.readouterr().err
    assert main(["compare", "--curve-every", "-1", "--out", str(tmp_path / "c")]) == 2
    assert "at least 0" in capsys.readouterr().err
    assert main(["compare", "--merge", str(tmp_path), "--set", "optim.lr=1"]) == 2
    assert "--merge runs nothing" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_job_folder_refuses_another_config(tmp_path):
    from megatron_seed.compare.job import _games_key, check_same_config
    from megatron_seed.config import SeedConfig
    from megatron_seed.errors import CommandError

    cfg = SeedConfig()
    check_same_config(tmp_path, cfg)
    check_same_config(tmp_path, cfg)  # a resume of the same job
    other = cfg.with_changes({"optim": {"lr": 1e-4}, "algo": {"use_opd": False}})
    with pytest.raises(CommandError, match=r"another config \(algo.use_opd, optim.lr differ\)"):
        check_same_config(tmp_path, other)
    games = {"train": ["a"], "seen": ["b"], "unseen": ["c"]}
    hot = cfg.with_changes({"rollout": {"temperature": 0.5}})
    assert _games_key(games, 8, 4, cfg) != _games_key(games, 8, 4, hot)
    assert _games_key(games, 8, 4, cfg) == _games_key(games, 8, 4, other)  # same play


def test_a_merged_comparison_names_the_size_its_inputs_ran(tmp_path, capsys):
    """`seed compare --merge` titles the table with the size the inputs recorded (a merge of
    quick runs was titled "full size", the command's default), and refuses mixed sizes."""
    from megatron_seed.cli import main

    for name, size, seed in (("q0", "quick", 0), ("q1", "quick", 1), ("f2", "full", 2)):
        (tmp_path / name).mkdir()
        summary = {"results": {}, "seeds": [seed], "settings": [], "size": size}
        (tmp_path / name / "compare.json").write_text(json.dumps(summary))
    merged = tmp_path / "merged"
    assert main(["compare", "--merge", str(tmp_path / "q0"), str(tmp_path / "q1"),
                 "--out", str(merged)]) == 0  # fmt: skip
    assert "(quick size, seeds [0, 1])" in (merged / "compare.md").read_text()
    assert json.loads((merged / "compare.json").read_text())["size"] == "quick"
    capsys.readouterr()
    assert main(["compare", "--merge", str(tmp_path / "q0"), str(tmp_path / "f2"),
                 "--out", str(tmp_path / "mixed")]) == 2  # fmt: skip
    assert "merge only comparisons of one size" in capsys.readouterr().err
