"""The Megatron trainer: layout-independent updates, learning signals, checkpoint resume."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from megatron_seed.config import AlgoConfig, OptimConfig, SeedConfig
from megatron_seed.models.parallel import spawn
from megatron_seed.models.qwen import QwenSpec
from megatron_seed.train.checkpoint import OPTIMIZER_FORMAT, check_checkpoint, latest_checkpoint
from tests.distributed import workers

CFG = SeedConfig(
    algo=AlgoConfig(teacher_mode="live", lambda_opd=1.0, beta_kl=0.1),
    optim=OptimConfig(lr=1e-3, clip_grad=1e9, mini_batches_per_update=1, micro_batch_size=1),
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def test_update_identical_across_tp_pp_dp(tp_checkpoint):
    hf, tok = tp_checkpoint
    runs = {}
    for tp, pp, dp in [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)]:
        results = spawn(workers.update_and_grads, tp * pp * dp, hf, tok, tp, pp, CFG)
        assert all(r[0] == results[0][0] for r in results)  # every rank reports the same
        runs[(tp, pp, dp)] = results[0]
    base_metrics, base_grads = runs[(1, 1, 1)]
    assert abs(base_metrics["loss/total"]) > 1e-2 and base_metrics["opd/token_frac"] < 1
    # a term that cancels (OPD: teacher minus student log-probs) is compared at the loss's
    # own scale: float32 sums in another order differ by ~1e-8 of the summands
    scale = abs(base_metrics["loss/total"])
    for layout, (metrics, grads) in runs.items():
        # the norm clipping uses: TP shards summed over ranks, duplicates counted once
        assert metrics["grad_norm"] == pytest.approx(base_metrics["grad_norm"], rel=1e-5), layout
        for key in ("loss/total", "loss/policy", "loss/opd", "kl"):
            tol = 1e-5 * max(abs(base_metrics[key]), scale)
            assert abs(metrics[key] - base_metrics[key]) <= tol, (
                layout,
                key,
                metrics[key],
                base_metrics[key],
            )
        assert grads.keys() == base_grads.keys()
        worst = max(_rel(grads[k], base_grads[k]) for k in grads)
        assert worst <= 1e-5, (layout, worst)


def test_a_moe_update_is_the_same_with_experts_split_over_ranks(moe_checkpoint):
    """A tiny Qwen3-MoE (8 experts, top-2): the update at EP=2 (DP=2, tokens dispatched to
    the other rank's experts and back) and at TP=2 x EP=2 equals the update at EP=1 on one
    rank: losses, gradient norm, every gradient and every parameter after the step."""
    hf, tok = moe_checkpoint
    # Adam's first step moves a weight by lr * g / (|g| + eps): a gradient entry of float32
    # noise size (~1e-8, an expert few tokens reach) turns summation-order differences into
    # steps differing by O(lr) at eps 1e-8 (measured: 1.2e-5 at lr 1e-3); at eps 1e-6 the
    # comparison measures the layout, not noise divided by noise
    cfg = dataclasses.replace(CFG, optim=dataclasses.replace(CFG.optim, adam_eps=1e-6))
    runs = {}
    for tp, ep in [(1, 1), (1, 2), (2, 2)]:
        runs[(tp, ep)] = spawn(workers.moe_update, tp * ep, hf, tok, tp, ep, cfg)[0]
    base_metrics, base_grads, base_params = runs[(1, 1)]
    assert base_metrics["grad_norm"] > 0 and abs(base_metrics["loss/total"]) > 1e-3
    scale = abs(base_metrics["loss/total"])
    for layout, (metrics, grads, params) in runs.items():
        assert metrics["grad_norm"] == pytest.approx(base_metrics["grad_norm"], rel=1e-5), layout
        for key in ("loss/total", "loss/policy", "loss/opd", "kl"):
            assert abs(metrics[key] - base_metrics[key]) <= 1e-5 * scale, (layout, key)
        assert max(_rel(grads[k], base_grads[k]) for k in base_grads) <= 1e-5, layout
        assert params.keys() == base_params.keys()
        assert max(float((params[k] - base_params[k]).abs().max()) for k in params) <= 1e-5
    experts = [k for k in base_grads if ".mlp.experts." in k]
    assert len(experts) == 2 * 8 * 3 and all(base_grads[k].abs().max() > 0 for k in experts)


@pytest.fixture
def moe_checkpoint(tiny_tokenizer, tmp_path):
    """(model folder, tokenizer folder): a tiny Qwen3-MoE, 8 experts, top-2, 2 layers."""
    from megatron_seed.models.tiny import make_tiny_policy
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    tok = str(save_tokenizer(tiny_tokenizer, tmp_path / "tok"))
    hf = str(make_tiny_policy(tmp_path / "moe", tiny_tokenizer, hidden_size=64, heads=2,
                              kv_heads=2, model_type="qwen3_moe"))  # fmt: skip
    return hf, tok


def test_the_routers_load_balancing_loss_and_statistics(moe_checkpoint):
    """algo.moe_aux_loss = c adds c x the routers' load-balancing loss (mean over the
    update's micro-batches of their real tokens, summed over layers) to the update: its
    value and its gradient equal transformers' router logits put through the Switch formula
    by hand, and they are the same at EP=2 and TP2 x EP2 (where rows carry one more padding
    token: the routers count none). The routing statistics every MoE update logs match the
    same logits."""
    hf, tok = moe_checkpoint
    cfg = dataclasses.replace(CFG, algo=dataclasses.replace(CFG.algo, moe_aux_loss=1.0))
    (got,) = spawn(workers.moe_aux_loss_gradient, 1, hf, tok, cfg)
    assert got["aux_metric"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["reference"] > 1.0  # E * sum f P is 1 when balanced: one term per layer
    assert got["loss_equal"]  # the SEED loss is the same; the aux term is on its own
    ref = got["ref_grads"]
    router = [n for n in ref if n.endswith("mlp.gate.weight")]
    assert len(router) == 2 and all(ref[n].abs().max() > 0 for n in router)
    for name, g in ref.items():
        assert _rel(got["aux_grads"][name], g) <= 1e-3, name
    # the routing statistics of the update's training pass: tokens per expert (max / mean)
    # and the router's entropy, per layer, against the same router logits
    stats = got["reference_stats"]
    assert len(stats) == 4 and all(v > 0 for v in stats.values())
    for key, value in stats.items():
        assert got["metrics"][key] == pytest.approx(value, rel=1e-5), key
    runs = {
        layout: spawn(workers.moe_update, layout[0] * layout[1], hf, tok, *layout, cfg)[0]
        for layout in [(1, 1), (1, 2), (2, 2)]
    }
    base = runs[(1, 1)][0]["moe/aux_loss"]
    assert base == pytest.approx(got["aux_metric"], rel=1e-6)
    for layout, (metrics, grads, _) in runs.items():
        assert metrics["moe/aux_loss"] == pytest.approx(base, rel=1e-5), layout
        for key, value in stats.items():
            assert metrics[key] == pytest.approx(value, rel=1e-5), (layout, key)
        assert max(_rel(grads[k], runs[(1, 1)][1][k]) for k in grads) <= 1e-5, layout


def test_the_moe_refit_probe_is_scored_on_each_engines_routes(moe_checkpoint, tmp_path):
    """The refit check of a mixture of experts (routing replay off for training): two
    engines route the probe through other experts than the trainer's routers pick (random
    routes; their log-probs are transformers' with those routes forced). Scored on each
    engine's routes, the trainer agrees with both to float32 rounding; free routing, as the
    check scored before, would leave a gap far above the float32 tolerance (a false refit
    error); an engine with other weights is still named."""
    hf, tok = moe_checkpoint
    out = spawn(workers.moe_refit_probe, 1, hf, tok, CFG, str(tmp_path))[0]
    tolerance = CFG.fleet.refit_max_gap_fp32
    assert out["metrics"]["sync/probe_gap_max"] < 1e-5
    assert out["free_gap"] > 10 * tolerance
    assert out["error"] is not None and "update 3: engine 1 disagrees" in out["error"]


def test_routing_replay_routes_every_pass_as_given_in_every_layout(moe_checkpoint):
    """Routing replay (`algo.routing_replay`) on a tiny Qwen3-MoE with random routes (not the
    routers' own) on every student and teacher row, row 0's first 3 tokens left free: the
    log-probs of theta_old and of the teachers equal transformers' with its routers forced
    to those routes (the free tokens on their own top k), in padded rows, packed rows under
    full activation recompute, at TP2 x EP2 with 2 rows per micro-batch (sequence parallel:
    each rank replays its part of the sequence, sequence-major) and at PP2 under full
    recompute (the recomputation in backward replays the same routes while other
    micro-batches' forwards come in between). The update is the same in all four, and the
    reference replays too (no KL before the first step). Agreement with the routes is the
    share transformers' own routers give; with replay off the routes change nothing and
    agreement is that of the free routers."""
    hf, tok = moe_checkpoint
    on = dataclasses.replace(CFG.algo, routing_replay=True)
    layouts = {  # (tp, ep, pp, micro_batch_tokens, micro_batch_size, recompute, replay)
        (1, 1, 1, 0, 1, "none", True): 1,  # -> world size
        (1, 1, 1, 64, 1, "full", True): 1,
        (2, 2, 1, 0, 2, "none", True): 4,
        (1, 1, 2, 0, 1, "full", True): 2,
        (1, 1, 1, 0, 1, "none", False): 1,
    }
    runs = {}
    for layout, world in layouts.items():
        tp, ep, pp, tokens, mbs, recompute, replay = layout
        cfg = dataclasses.replace(
            CFG,
            algo=on if replay else CFG.algo,
            optim=dataclasses.replace(
                CFG.optim, adam_eps=1e-6, micro_batch_size=mbs, micro_batch_tokens=tokens
            ),
            parallel=dataclasses.replace(CFG.parallel, recompute=recompute),
        )
        runs[layout] = spawn(workers.moe_routing_replay, world, hf, tok, tp, ep, pp, cfg)[0]
    base = runs[(1, 1, 1, 0, 1, "none", True)]
    pb = base["pb"]
    forced, own = workers.hf_forced_logprobs(hf, pb.student)
    forced_teacher, _ = workers.hf_forced_logprobs(hf, pb.teacher)
    free_batch = dataclasses.replace(pb.student, routes=torch.full_like(pb.student.routes, -1))
    free, own_free = workers.hf_forced_logprobs(hf, free_batch)

    def gap(got: torch.Tensor, want: torch.Tensor, batch) -> float:
        real = torch.arange(got.shape[1])[None, :] < batch.lengths[:, None] - 1  # [b, s]
        w = want.shape[1]
        return float((got[:, :w] - want).abs()[real[:, :w]].max())

    assert gap(forced, free, pb.student) > 0.05  # the routes matter
    for layout, run in runs.items():
        want = forced if layout[-1] else free
        assert gap(run["old"], want, pb.student) <= 1e-5, layout
        if layout[-1]:
            assert gap(run["teacher"], forced_teacher, pb.teacher) <= 1e-5, layout
    # agreement, over (scored token, MoE layer) pairs with a given route
    routes = pb.student.routes.long().sort(-1).values
    scored = pb.student.loss_mask[..., None] & (routes[..., 0] >= 0)  # [b, s, layers]

    def agreement(picks: torch.Tensor) -> float:
        return float((picks.sort(-1).values == routes).all(-1)[scored].float().mean())

    assert 0 < agreement(own) < 0.2  # random routes: 1 in 28 pairs of 8 experts
    for layout, run in runs.items():
        m = run["metrics"]
        assert abs(m["kl"]) <= 1e-6, layout  # the reference routes as the policy does
        if layout[-1]:
            assert m["moe/routes_replayed"] == 1.0, layout
            assert m["moe/route_agreement"] == pytest.approx(agreement(own), abs=1e-9), layout
        else:  # the free routers' own choice, used and counted
            assert m["moe/route_agreement"] == pytest.approx(agreement(own_free), abs=1e-9)
            assert m["moe/routes_replayed"] == m["moe/route_agreement"]
    base_metrics, base_grads = base["metrics"], base["grads"]
    for layout, run in runs.items():
        if not layout[-1]:
            continue
        m, grads = run["metrics"], run["grads"]
        assert m["grad_norm"] == pytest.approx(base_metrics["grad_norm"], rel=1e-5), layout
        assert max(_rel(grads[k], base_grads[k]) for k in base_grads) <= 1e-5, layout


def test_activation_recompute_changes_memory_not_math(tp_checkpoint):
    """`parallel.recompute` full (TP=2) and selective (TP=1) give the update and gradients
    of no recompute; the distributed optimizer is refused on CPU in one line."""
    hf, tok = tp_checkpoint
    (base_metrics, base_grads), *_ = spawn(workers.update_and_grads, 1, hf, tok, 1, 1, CFG)
    for tp, mode in ((2, "full"), (1, "selective")):
        cfg = dataclasses.replace(CFG, parallel=dataclasses.replace(CFG.parallel, recompute=mode))
        metrics, grads = spawn(workers.update_and_grads, tp, hf, tok, tp, 1, cfg)[0]
        assert abs(metrics["loss/total"] - base_metrics["loss/total"]) <= 1e-5 * abs(
            base_metrics["loss/total"]
        ), (mode, metrics, base_metrics)
        assert max(_rel(grads[k], base_grads[k]) for k in grads) <= 1e-5, mode
    dist_opt = dataclasses.replace(
        CFG, parallel=dataclasses.replace(CFG.parallel, distributed_optimizer=True)
    )
    with pytest.raises(RuntimeError, match="distributed_optimizer needs GPUs"):
        spawn(workers.update_and_grads, 1, hf, tok, 1, 1, dist_opt)


def test_sequence_parallel_changes_memory_not_math(tp_checkpoint):
    """Sequence parallelism (on by default on GPUs at TP > 1) at TP=2 gives the update and
    gradients of TP=1 without it: the sequence split, its gathers and the norm gradients'
    all-reduce over TP are exact (checked here over gloo)."""
    hf, tok = tp_checkpoint
    (base_metrics, base_grads), *_ = spawn(workers.update_and_grads, 1, hf, tok, 1, 1, CFG)
    results = spawn(workers.update_and_grads_sequence_parallel, 2, hf, tok, 2, 1, CFG)
    metrics, grads = results[0]
    assert results[1][0] == metrics
    for key in ("loss/total", "loss/policy", "kl"):
        assert abs(metrics[key] - base_metrics[key]) <= 1e-5 * abs(base_metrics["loss/total"])
    assert grads.keys() == base_grads.keys()
    assert max(_rel(grads[k], base_grads[k]) for k in grads) <= 1e-5


def test_live_and_snapshot_teachers(tp_checkpoint):
    """They coincide with one mini-batch per update and differ with two (the second
    mini-batch's teacher sees the weights after the first step only in `live`)."""
    hf, tok = tp_checkpoint
    out = {}
    for k in (1, 2):
        for mode in ("live", "snapshot"):
            cfg = dataclasses.replace(
                CFG,
                optim=dataclasses.replace(CFG.optim, mini_batches_per_update=k),
                algo=dataclasses.replace(CFG.algo, teacher_mode=mode),
            )
            out[k, mode] = spawn(workers.update_and_grads, 1, hf, tok, 1, 1, cfg)[0][0]
    assert out[1, "live"] == out[1, "snapshot"]
    assert out[2, "live"]["loss/opd"] != out[2, "snapshot"]["loss/opd"]
    assert out[2, "live"]["loss/policy"] == out[2, "snapshot"]["loss/policy"]


def test_checkpoint_at_tp2_resumes_at_tp1(tp_checkpoint, tmp_path):
    hf, tok = tp_checkpoint
    cfg = dataclasses.replace(CFG, optim=dataclasses.replace(CFG.optim, mini_batches_per_update=1))
    full = spawn(workers.run_with_checkpoints, 2, hf, tok, 2, 1, cfg, 4, 2, str(tmp_path), False)[0]
    for rank in (0, 1):  # every rank's RNG file has the CUDA slots (None: written on a CPU)
        rng = torch.load(
            tmp_path / "step_000002" / "rng" / f"rank_{rank:05d}.pt", weights_only=False
        )
        assert {"torch", "python", "numpy", "cuda", "cuda_tracker"} <= set(rng)
        assert rng["cuda"] is None and rng["cuda_tracker"] is None
    # the checks a rerun makes before any process starts pass on a real checkpoint, at TP=1,
    # and find the model it holds; its latest marker names it
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"
    assert check_checkpoint(tmp_path / "step_000002", 1, 1, 1) == QwenSpec.from_pretrained(hf)
    resumed = spawn(
        workers.run_with_checkpoints, 1, hf, tok, 1, 1, cfg, 4, -1, str(tmp_path), True
    )[0]
    mask = full["mask"]
    diff = (resumed["start_logprobs"] - full["logprobs_at_save"])[mask].abs().max()
    assert diff <= 1e-5, diff
    for step in (3, 4):  # the step after the kill, and one more (Adam state restored)
        assert abs(resumed[step] - full[step]) <= 1e-5 * abs(full[step]), (step, resumed, full)
    assert 1 not in resumed and 2 not in resumed
    # saved and loaded in the distributed optimizer's layout-free format (megatron-core's
    # default fails to save: tests/unit/test_gpu_readiness.py)
    assert full["formats"] == resumed["formats"] == [OPTIMIZER_FORMAT]


def test_opd_lowers_its_loss_and_grpo_raises_the_winner(tp_checkpoint):
    hf, tok = tp_checkpoint
    # every group tied (all won): the OPD term alone, which only the paper's rule steps on
    opd_cfg = SeedConfig(
        algo=AlgoConfig(lambda_opd=1.0, beta_kl=0.0, no_signal="step"), optim=OptimConfig(lr=3e-4)
    )
    grpo_cfg = SeedConfig(algo=AlgoConfig(use_opd=False, beta_kl=0.0), optim=OptimConfig(lr=3e-4))
    out = spawn(workers.learning_curves, 1, hf, tok, opd_cfg, grpo_cfg, 4)[0]
    opd = out["opd"]
    assert all(b < a for a, b in itertools.pairwise(opd)), opd
    # tokens where the teacher was above the student: the gap closes
    assert out["gap"][1] < out["gap"][0], out["gap"]
    adv, before, after = out["adv"], out["before"], out["after"]
    winner = int(adv.argmax())
    assert adv[winner] > 0 and after[winner] > before[winner] + 0.1
    losers = adv < 0
    assert bool((after[losers] < before[losers]).all())


def test_epochs_per_update_repeat_the_batch_against_theta_old(tp_checkpoint):
    """Two epochs over a batch equal one epoch over the batch written twice (two
    mini-batches): the second pass steps again with ratios against theta_old, not anew."""
    hf, tok = tp_checkpoint
    out = spawn(workers.epochs_match_repeated_batch, 1, hf, tok, CFG)[0]
    (m_epochs, lp_epochs), (m_minis, lp_minis) = out["epochs"], out["minis"]
    mask = out["mask"]
    assert float((lp_epochs - out["before"])[mask].abs().max()) > 1e-3  # it trained
    assert float((lp_epochs - lp_minis)[mask].abs().max()) <= 1e-5
    for key in ("loss/total", "loss/policy", "loss/opd", "kl", "clip_frac"):
        assert abs(m_epochs[key] - m_minis[key]) <= 1e-5 * abs(m_minis[key]) + 1e-7, key


def test_rlsd_lambda_follows_the_update_index_and_opd_diagnostics_are_logged(
    tp_checkpoint, tmp_path
):
    """RLSD's lambda is rlsd_lambda(update) at update 0 and at update 1 after a resume; the
    OPD-condition diagnostics (Delta = l_T - l_old per record vs its advantage and success)
    reach metrics.jsonl through Stage 2's train phase."""
    import numpy as np

    from megatron_seed.algo import rlsd_lambda

    hf, tok = tp_checkpoint
    algo = AlgoConfig(advantage_reweight="rlsd", lambda_opd=0.0, beta_kl=0.0, rlsd_decay_updates=4)
    cfg = dataclasses.replace(CFG, algo=algo)
    out = spawn(workers.rlsd_update_index_and_diagnostics, 1, hf, tok, cfg, str(tmp_path))[0]
    assert out["second_update"] == 1
    lam = [rlsd_lambda(k, algo.rlsd_lambda0, algo.rlsd_decay_updates) for k in (0, 1)]
    assert lam == [0.5, 0.375]
    assert out["first"]["rlsd/lambda"] == pytest.approx(lam[0], rel=1e-6)
    assert out["second"]["train/rlsd/lambda"] == pytest.approx(lam[1], rel=1e-6)
    (row,) = out["log"]
    assert row["step"] == 1 and row["train/rlsd/lambda"] == pytest.approx(lam[1], rel=1e-6)
    for key in ("opd/delta_adv_corr", "opd/gated_frac_success", "opd/gated_frac_failure"):
        assert f"train/{key}" in row, key
    # update 0's values from its inputs, by record (numpy, independent of algo.diagnostics)
    delta, mask = (out["teacher"] - out["old"]).double(), out["mask"]
    index = out["record_index"]
    x, y = [], []
    for j in sorted(set(index.tolist())):
        rows = index == j
        x.append(float(delta[rows][mask[rows]].mean()))
        y.append(float(out["advantages"][rows][0]))
    first = out["first"]
    assert first["opd/delta_adv_corr"] == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-6)
    gated = (delta > 0) & mask  # beta_opd > 0: sigmoid(beta_opd Delta) > 1/2 iff Delta > 0
    won = out["won"][:, None]
    for side, rows in (("success", won), ("failure", ~won)):
        expected = int((gated & rows).sum()) / int((mask & rows).sum())
        assert 0 < expected < 1, side  # both kinds of token on both sides
        assert first[f"opd/gated_frac_{side}"] == pytest.approx(expected, abs=1e-12), side


def test_analyzer_replay_adds_its_weighted_nll_in_any_layout(tp_checkpoint):
    """With replay rows, the update's gradient is the plain update's plus replay_weight x the
    NLL step's on those rows (same weights), its loss the plain loss plus w x that NLL; the
    same at DP=2 (replay rows split over ranks, padding rows carrying nothing) and packed."""
    hf, tok = tp_checkpoint
    w = 0.5
    cfg = dataclasses.replace(CFG, algo=dataclasses.replace(CFG.algo, replay_weight=w))
    packed = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, micro_batch_tokens=512))
    runs = {}
    for name, layout_cfg, dp in (("padded", cfg, 1), ("dp2", cfg, 2), ("packed", packed, 1)):
        runs[name] = spawn(workers.replay_update_and_grads, dp, hf, tok, 1, 1, layout_cfg)[0]
    with_replay, without, nll, g_replay, g_plain, g_nll = runs["padded"]
    assert with_replay["loss/replay_nll"] == pytest.approx(nll["nll"], rel=1e-5)
    assert nll["nll"] > 1.0  # a random model: several nats per token
    assert with_replay["loss/total"] == pytest.approx(
        without["loss/total"] + w * nll["nll"], rel=1e-5
    )
    for key in ("loss/policy", "kl", "loss/opd"):
        assert with_replay[key] == pytest.approx(without[key], rel=1e-5, abs=1e-7), key
    worst = max(_rel(g_replay[k], g_plain[k] + w * g_nll[k]) for k in g_replay)
    assert worst <= 1e-5, worst
    moved = max(_rel(g_replay[k], g_plain[k]) for k in g_replay)
    assert moved > 1e-2  # the replay term is not negligible here
    for name in ("dp2", "packed"):
        metrics, grads = runs[name][0], runs[name][3]
        assert metrics["loss/total"] == pytest.approx(with_replay["loss/total"], rel=1e-5), name
        assert metrics["loss/replay_nll"] == pytest.approx(nll["nll"], rel=1e-5), name
        worst = max(_rel(grads[k], g_replay[k]) for k in grads)
        assert worst <= 1e-5, (name, worst)


def test_a_batch_without_outcome_signal_does_not_move_the_default_jobs_policy(tp_checkpoint):
    """The default job's recipe (SEED: OPD + KL, Adam at its lr) on a batch whose groups are
    all tied, one all lost and one all won: no step, the policy bitwise unchanged (the rule
    `algo.no_signal = "skip"`). Under the paper's rule ("step", the recipe before it) the
    same batch moves every sampled token's log-prob by an lr-sized Adam step of OPD + KL
    alone; one group with a signal makes the step."""
    from megatron_seed import recipes

    hf, tok = tp_checkpoint
    recipe = recipes.get("default").config
    assert recipe.algo.no_signal == "skip" and recipe.algo.use_opd and recipe.algo.beta_kl > 0
    tied = spawn(workers.no_signal_update, 1, hf, tok, recipe, [0.0, 0.0, 1.0, 1.0])[0]
    mask = tied["before"] != 0
    assert torch.equal(tied["before"], tied["after"])
    assert tied["metrics"]["steps"] == 0 and tied["metrics"]["steps_skipped"] == 1
    paper = recipe.with_changes({"algo": {"no_signal": "step"}})
    stepped = spawn(workers.no_signal_update, 1, hf, tok, paper, [0.0, 0.0, 1.0, 1.0])[0]
    moved = (stepped["after"] - stepped["before"])[mask].abs()
    assert float(moved.mean()) > 1e-3, float(moved.mean())  # an lr-sized step, lambda_opd or not
    assert stepped["metrics"]["grad/rl"] == 0 and stepped["metrics"]["grad/distill"] > 0
    signal = spawn(workers.no_signal_update, 1, hf, tok, recipe, [0.0, 1.0, 1.0, 1.0])[0]
    assert signal["metrics"]["steps"] == 1 and signal["metrics"]["grad/rl"] > 0
    assert not torch.equal(signal["before"], signal["after"])
