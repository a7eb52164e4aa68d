"""Host memory per node in the launch plan (`launch.layout.node_host_memory_gib`): every term
against hand arithmetic on a made-up shape, the MoE recipes against the docstring's formulas,
one-line refusals, the dry run's table, and the checkpoint format the save term assumes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from launch import layout as lay
from launch.commands import host_memory_table
from launch.layout import ClusterLayout, LayoutError, check_layout, node_host_memory_gib
from launch.plan import PlanError, make_plan, recipe_layout
from megatron_seed import cli, recipes
from megatron_seed.config import SeedConfig
from megatron_seed.models.shapes import ModelShape

os.environ.setdefault("NEMORUN_HOME", tempfile.mkdtemp(prefix="nemorun-test-"))

GIB = 1024**3

# 4 layers, hidden 64, 4 query heads and 2 KV heads of 16, Qwen3 (q/k norms, no bias, untied),
# 8 experts of width 32 with 2 per token, vocabulary 1,000.
SHAPE = ModelShape(
    "made-up", 4, 64, 4, 2, 16, 128, 1000, False, qkv_bias=False, qk_norm=True,
    experts=8, top_k=2, expert_ffn=32,
)  # fmt: skip
# per layer: attention 64 x (64 + 2 x 32) + 64 x 64 = 12,288, q/k norms 2 x 16 = 32; experts
# 8 x 3 x 64 x 32 = 49,152 and the router 8 x 64 = 512; two norms 128: 62,112. Four layers,
# two 1,000 x 64 embeddings and the final norm: 4 x 62,112 + 128,000 + 64.
P = 4 * 62_112 + 128_000 + 64  # 376,512
E = 4 * 8 * 3 * 64 * 32  # 196,608 expert parameters
D = P - E  # 179,904: the rest


def _made_up_job(colocated: bool = True) -> tuple[SeedConfig, ClusterLayout]:
    """TP=2 x EP=2 with the distributed optimizer on 2 nodes of 4 GPUs (DP=4, expert DP=2),
    engines of TP=2; routing replay of 2 tasks x 2 episodes with teachers, 64-token context;
    3 env workers."""
    config = SeedConfig().with_changes(
        {
            "parallel": {"tp": 2, "ep": 2, "distributed_optimizer": True, "device": "cuda"},
            "fleet": {"engine_tp": 2, "max_model_len": 64},
            "rollout": {"tasks_per_update": 2, "group_size": 2},
            "algo": {"routing_replay": True, "use_opd": True},
            "env": {"workers": 3},
        }
    )
    layout = ClusterLayout(gpus_per_node=4, trainer_ranks_per_node=2, fleet_gpus_per_node=2)
    return config, layout.colocate() if colocated else layout


def test_every_host_term_of_a_made_up_shape_against_hand_arithmetic() -> None:
    assert (SHAPE.params, SHAPE.expert_params) == (P, E)
    config, layout = _made_up_job()
    phases = node_host_memory_gib(SHAPE, config, layout, nodes=2)
    r = f = 4  # colocated: 4 trainer ranks and 4 engine workers per node
    n = D / 2 + E / (2 * 2)  # a rank's parameters: dense over TP, experts over TP x EP
    n_opt = D / (2 * 4) + E / (2 * 2 * 2)  # Adam's shard: over DP, the experts' over DP/EP
    assert n_opt == P / 8
    # ranks 0..3 of the first node: tp = rank % 2, dense dp = rank // 2 (0, 0, 1, 1), expert
    # dp = rank // 4 (all 0): 2 gather their dense group's state, all 4 their experts'
    gathered = 12 * (2 * D / 2 + 4 * E / 4)
    assert gathered == 12 * P  # the first node gathers the whole model's state, once
    routes_tokens = 2 * 2 * 2 * 64  # (students + teachers) x 64 tokens
    expected = {
        "engines_asleep": f * 2 * P / 2,  # 2 engines of TP 2, the whole model's bf16 each
        "optimizer_offloaded": r * 12 * n_opt,
        "checkpoint_load": r * 12 * n,
        "checkpoint_save": 2 * gathered,  # the gathered buffer and the writer's copies
        "replay_copy": 2 * P,
        "routes": r * 2 * routes_tokens * 4 * 2,  # int16 x tokens x 4 layers x top-2
        "runtime": GIB * (4 * 6 + 4 * 6 + 2 * 4 + 4 + 2 * 0.5),  # env workers: 3 over 2 nodes
    }
    where = {
        "load": {"engines_asleep", "checkpoint_load"},
        "rollout": {"optimizer_offloaded", "replay_copy"},
        "train": {"engines_asleep", "optimizer_offloaded", "replay_copy", "routes"},
        "sync": {"optimizer_offloaded", "replay_copy", "routes"},
        "save": {"optimizer_offloaded", "checkpoint_save", "replay_copy"},
    }
    assert list(phases) == ["load", "rollout", "train", "sync", "save"]
    for phase, present in where.items():
        want = {k: (v if k in present | {"runtime"} else 0.0) for k, v in expected.items()}
        if phase == "sync":  # the committed copy beside the new one
            want["replay_copy"] = 2 * expected["replay_copy"]
        got = phases[phase]
        for term, value in want.items():
            assert got[term] == pytest.approx(value / GIB), (phase, term)
        assert got["total"] == pytest.approx(sum(want.values()) / GIB), phase
    # megatron-core's default all-gathers every group's state to every rank (only the first
    # rank's copy is written)
    default = node_host_memory_gib(SHAPE, config, layout, 2, mem_efficient=False)
    assert default["save"]["checkpoint_save"] == pytest.approx((r * 12 * n + gathered) / GIB)
    assert default["load"] == phases["load"]  # loading does not read the flag


def test_host_terms_that_depend_on_the_layout_and_the_config() -> None:
    config, colocated = _made_up_job()
    # engines on their own GPUs never sleep and the trainer keeps its optimizer on the GPU
    apart = node_host_memory_gib(SHAPE, config, _made_up_job(colocated=False)[1], 2)
    for terms in apart.values():
        assert terms["engines_asleep"] == terms["optimizer_offloaded"] == 0.0
    # 2 trainer ranks and 2 engine workers: ranks 0, 1 are dense dp 0, both expert dp 0
    assert apart["save"]["checkpoint_save"] == pytest.approx(24 * (2 * D / 2 + 2 * E / 4) / GIB)
    # the replay copy lives in Ray's object store: 30 % of the node's RAM at most
    tiny_ram = dataclasses.replace(colocated, host_memory_gib=0.002)
    capped = node_host_memory_gib(SHAPE, config, tiny_ram, 2)
    assert 2 * P / GIB > 0.3 * 0.002  # the copy would not fit
    assert capped["rollout"]["replay_copy"] == capped["sync"]["replay_copy"] == 0.3 * 0.002
    on_disk = config.with_changes({"fleet": {"replay": "disk"}})
    assert node_host_memory_gib(SHAPE, on_disk, colocated, 2)["sync"]["replay_copy"] == 0.0
    # routes: without replay only `route_check_rows` rows are read back, but the batch's
    # routes tensor has every student row (the rest padded); none without either, or
    # one-step-off, or in window mode one row per turn
    check = config.with_changes({"algo": {"routing_replay": False, "route_check_rows": 3}})
    routes = node_host_memory_gib(SHAPE, check, colocated, 2)["train"]["routes"]
    assert routes == pytest.approx(4 * 2 * (2 * 2) * 64 * 4 * 2 / GIB)
    for changes in (
        {"algo": {"routing_replay": False, "route_check_rows": 0}},
        {"rollout": {"one_step_off": True}, "algo": {"routing_replay": False}},
    ):
        none = node_host_memory_gib(SHAPE, config.with_changes(changes), colocated, 2)
        assert none["train"]["routes"] == 0.0, changes
    window = config.with_changes({"rollout": {"history_mode": "window", "max_steps": 5}})
    routes = node_host_memory_gib(SHAPE, window, colocated, 2)["sync"]["routes"]
    assert routes == pytest.approx(4 * 2 * (2 * 2 * 5 * 2) * 64 * 4 * 2 / GIB)
    # without the distributed optimizer: Adam's state is whole on every rank, loads into its
    # GPU tensors, and the save writes the first ranks' GPU state through host copies once
    plain_adam = config.with_changes({"parallel": {"distributed_optimizer": False}})
    whole = node_host_memory_gib(SHAPE, plain_adam, colocated, 2)
    n = D / 2 + E / 4
    assert whole["rollout"]["optimizer_offloaded"] == pytest.approx(4 * 12 * n / GIB)
    assert whole["load"]["checkpoint_load"] == 0.0
    assert whole["save"]["checkpoint_save"] == pytest.approx(12 * P / GIB)
    # a dense model has no routes, and no experts to gather
    dense = dataclasses.replace(SHAPE, experts=0, top_k=0, expert_ffn=0)
    no_ep = config.with_changes({"parallel": {"ep": 1}})
    plain = node_host_memory_gib(dense, no_ep, colocated, 2)
    assert plain["train"]["routes"] == 0.0
    assert plain["save"]["checkpoint_save"] == pytest.approx(24 * 2 * dense.params / 2 / GIB)


@pytest.mark.parametrize(
    ("name", "nodes", "ranks", "dense_gatherers"),
    [("qwen3-30b-a3b", 1, 8, 1), ("qwen3-235b-a22b", 8, 64, 4)],
)
def test_moe_recipes_host_memory_is_the_docstring_formulas(
    name: str, nodes: int, ranks: int, dense_gatherers: int
) -> None:
    """Colocated on DGX H200 nodes (8 GPUs, 2 TiB): 30B-A3B at EP=8 on one node (the first
    rank gathers the dense state, every rank its own experts: expert DP is 1), 235B-A22B at
    TP=4 x PP=2 x EP=8 on eight (ranks 0-3 are dense DP rank 0 of their TP group)."""
    recipe = recipes.get(name)
    model, config = recipe.model, recipe.config
    tp, pp, ep = config.parallel.tp, config.parallel.pp, config.parallel.ep
    plan = make_plan(name, nodes)
    assert plan.trainer_world == ranks and plan.layout.host_memory_gib == 2048.0
    dp = ranks // (tp * pp)
    params, experts = model.params, model.expert_params
    dense = params - experts
    n = dense / (tp * pp) + experts / (tp * pp * ep)
    phases = node_host_memory_gib(model, plan.config, plan.layout, nodes)
    t = plan.config.fleet.engine_tp
    gathered = 12 * (dense_gatherers * dense / (tp * pp) + 8 * experts / (tp * pp * ep))
    store = min(0.3 * 2048 * GIB, 200e9)
    # 8 trainer ranks, 8 engine workers, 8/t engines, Ray, the first node's env workers (of 2)
    runtime = 8 * 6 + 8 * 6 + 8 // t * 4 + 4 + 0.5 * math.ceil(2 / nodes)
    # int16 routes of the 16 x 8 student rows of 8,192 tokens, every layer, top-8 (only
    # `algo.route_check_rows` of them read back, the rest padding)
    routes = 8 * 2 * 16 * 8 * 8192 * model.layers * 8
    want = {
        "load": 8 * 2 * params / t + 8 * 12 * n,
        "rollout": 8 * 12 * params / (tp * pp * dp) + min(2 * params, store),
        "train": 8 * 2 * params / t
        + 8 * 12 * params / (tp * pp * dp)
        + min(2 * params, store)
        + routes,
        "sync": 8 * 12 * params / (tp * pp * dp) + min(4 * params, store) + routes,
        "save": 8 * 12 * params / (tp * pp * dp) + 2 * gathered + min(2 * params, store),
    }
    for phase, value in want.items():
        assert phases[phase]["total"] == pytest.approx(value / GIB + runtime), phase
    # the number: megatron-core's default gathers ~62 GB per rank at 30B-A3B
    if name == "qwen3-30b-a3b":
        assert 12 * n / 1e9 == pytest.approx(62.0, abs=0.1)
    # the save is the peak and fits the node's budget; half the RAM does not
    peak = max(phases, key=lambda k: phases[k]["total"])
    assert peak == "save" and phases["save"]["total"] < 0.9 * 2048
    assert phases["save"]["total"] > 0.9 * 1024
    with pytest.raises(PlanError, match="host memory: the save phase") as info:
        make_plan(name, nodes, host_memory_gib=1024)
    assert "\n" not in str(info.value) and "checkpoint_save ~" in str(info.value)


def test_a_layout_over_its_host_memory_is_refused_in_one_line_naming_phase_and_terms() -> None:
    recipe = recipes.get("qwen3-235b-a22b")
    small = dataclasses.replace(recipe_layout(recipe), host_memory_gib=1024.0)
    phases = node_host_memory_gib(recipe.model, recipe.config, small, 8)
    save = phases["save"]
    with pytest.raises(LayoutError) as info:
        check_layout(recipe.model, recipe.config, small, 8)
    message = str(info.value)
    assert "\n" not in message
    assert f"the save phase needs ~{save['total']:.0f} GiB" in message
    biggest = sorted((v, k) for k, v in save.items() if k != "total")[-3:][::-1]
    assert [k for _, k in biggest] == ["checkpoint_save", "optimizer_offloaded", "replay_copy"]
    assert ", ".join(f"{k} ~{v:.0f}" for v, k in biggest) in message
    assert "budget of 922 GiB (90% of 1024)" in message
    assert 'fleet.replay "disk"' not in message  # hints follow the two biggest terms
    # the peak phase is named: at qwen3-1.7b's DP=4 one rank of four gathers at save, while
    # every rank reads its whole share at load
    dense = recipes.get("qwen3-1.7b")
    tight = dataclasses.replace(recipe_layout(dense), host_memory_gib=100.0)
    load = node_host_memory_gib(dense.model, dense.config, tight, 1)["load"]["total"]
    with pytest.raises(LayoutError, match=f"the load phase needs ~{load:.0f} GiB"):
        check_layout(dense.model, dense.config, tight, 1)


def test_node_types_and_profiles_name_the_nodes_host_ram(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    h200 = lay.NODE_TYPES["dgx-h200"]
    moe = recipe_layout(recipes.get("qwen3-30b-a3b"))
    # the MoE recipes' nodes are DGX H200s, stated once in the table
    assert (moe.gpus_per_node, moe.gpu_memory_gib, moe.host_memory_gib) == (
        h200.gpus,
        h200.gpu_memory_gib,
        h200.host_memory_gib,
    )
    assert ClusterLayout().host_memory_gib == lay.NODE_TYPES["dgx-h100"].host_memory_gib
    plan = make_plan("qwen2.5-7b", 1, node_type="dgx-h200")
    assert (plan.layout.gpu_memory_gib, plan.layout.host_memory_gib) == (141.0, 2048.0)
    assert make_plan("qwen2.5-7b", 1, host_memory_gib=512).layout.host_memory_gib == 512.0
    for kwargs, message in (
        ({"node_type": "dgx-b9000"}, "unknown node type 'dgx-b9000'; known: dgx-h100"),
        ({"host_memory_gib": 0}, "host_memory_gib must be a number of GiB > 0"),
        ({"host_memory_gib": "lots"}, "host_memory_gib must be a number of GiB > 0"),
        ({"gpus_per_node": 16, "node_type": "dgx-h100"}, "a dgx-h100 node has 8"),
    ):
        with pytest.raises(PlanError, match=message):
            make_plan("qwen2.5-7b", 1, **kwargs)
    # a cluster profile names them; its Slurm settings still reach the script
    for var in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.setenv(var, f"/lustre/{var.lower()}")
    profile = tmp_path / "cluster.json"
    argv = ["launch", "qwen3-235b-a22b", "--executor", "slurm", "--nodes", "8", "--dryrun"]
    argv += ["--cluster-profile", str(profile)]
    profile.write_text(json.dumps({"host_memory_gib": 1024, "partition": "gpu"}))
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "host memory: the save phase" in err
    profile.write_text(json.dumps({"node_type": "dgx-h200", "partition": "gpu"}))
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert re.search(r"^#SBATCH --partition=gpu$", out, re.M)
    assert "2048 GiB of RAM, budget 1843" in err


def test_the_dry_run_prints_host_memory_per_node_by_phase(capsys, monkeypatch) -> None:
    for var in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.setenv(var, f"/lustre/{var.lower()}")
    argv = ["launch", "qwen3-235b-a22b", "--executor", "slurm", "--nodes", "8", "--dryrun"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    plan = make_plan("qwen3-235b-a22b", 8)
    phases = node_host_memory_gib(plan.recipe.model, plan.config, plan.layout, 8)
    for phase, terms in phases.items():
        line = re.search(rf"^#   {phase} +~(\d+) +(.*)$", err, re.M)
        assert line is not None, phase
        assert int(line.group(1)) == round(terms["total"])
        named = dict(re.findall(r"(\w+) ([\d.]+)", line.group(2)))
        assert set(named) == {k for k, v in terms.items() if k != "total" and v > 0}
    # 235B's replay copy (2 B x 235e9) outgrows Ray's default store (200 GB)
    assert "the replay copy (438 GiB; 876 while a sync commits) outgrows" in err
    # a CPU job has no table
    assert host_memory_table(make_plan("tiny", 1)) == []


def test_the_checkpoint_format_is_the_one_the_host_model_assumes() -> None:
    """`checkpoint.OPTIMIZER_FORMAT` asks megatron-core's `fully_reshardable` save to gather
    each DP group's state on its first rank only (over gloo), and its load reads the whole
    state on every rank whatever the flag: the save and load terms above. A misspelt key
    would be ignored silently; this drives megatron-core's own method with a recording
    stand-in for the gather."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from megatron_seed.train.checkpoint import OPTIMIZER_FORMAT

    calls: list[dict] = []
    stub = SimpleNamespace(get_parameter_state_dp_zero=lambda **kw: calls.append(kw))
    method = DistributedOptimizer.sharded_param_state_fully_reshardable
    for is_loading in (False, True):
        assert method(stub, {}, is_loading=is_loading, metadata=OPTIMIZER_FORMAT) is None
    saving, loading = calls
    assert saving == {"use_gloo_comm": True, "empty_data": False, "return_on_all_ranks": False}
    assert loading["return_on_all_ranks"] is True and loading["empty_data"] is True
    default = {"distrib_optim_sharding_type": "fully_reshardable"}
    method(stub, {}, is_loading=False, metadata=default)
    assert calls[-1]["return_on_all_ranks"] is True  # megatron-core's default: every rank
    # the launcher's model assumes this format by default
    flag = OPTIMIZER_FORMAT["distrib_optim_fully_reshardable_mem_efficient"]
    assert flag is True
    config, layout = _made_up_job()
    assert node_host_memory_gib(SHAPE, config, layout, 2) == node_host_memory_gib(
        SHAPE, config, layout, 2, mem_efficient=flag
    )
