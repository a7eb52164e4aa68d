"""Launch: recipes, layout validation, and the generated Slurm scripts (dry run, no cluster).

The Slurm scripts are checked twice: as text (flags, order) and by running them under bash
with fake `srun`/`scontrol` on PATH, which records the steps in the order they start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from launch.commands import memory_summary, parse_job
from launch.layout import ClusterLayout, LayoutError, check_layout, trainer_memory_gib
from launch.plan import JobCommand, PlanError, make_plan, min_nodes, recipe_layout
from launch.ray_health import cluster_size, wait_for_cluster
from launch.slurm import SlurmOptions, render
from megatron_seed import cli, recipes
from megatron_seed.config import SeedConfig
from megatron_seed.models.shapes import SHAPES

# NeMo-Run reads NEMORUN_HOME when first imported (lazily, inside launch.*).
os.environ.setdefault("NEMORUN_HOME", tempfile.mkdtemp(prefix="nemorun-test-"))


pytestmark = pytest.mark.usefixtures("job_paths")  # as a user's shell exports them


IMAGE = "registry.example/seed:gpu"

# ---------------------------------------------------------------- recipes


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("qwen3-1.7b", 1.72),
        ("qwen2.5-3b", 3.09),
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-14b", 14.77),
        ("qwen2.5-32b", 32.76),
        ("qwen2.5-72b", 72.71),
    ],  # the Llama family's: test_qwen_shapes.py
)
def test_model_shapes_match_published_sizes(name: str, published_billions: float) -> None:
    params = recipes.get(name).model.params / 1e9
    assert params == pytest.approx(published_billions, rel=0.01)


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        ("tiny", 1),
        ("qwen3-1.7b", 1),
        ("qwen2.5-3b", 1),
        ("qwen2.5-7b", 1),
        ("qwen2.5-14b", 2),
        ("qwen2.5-32b", 4),
        ("qwen2.5-72b", 8),
        ("llama-3.1-8b", 1),
        ("llama-3.1-70b", 8),
    ],
)
def test_recipe_min_nodes_and_fit_on_80gb(name: str, nodes: int) -> None:
    recipe = recipes.get(name)
    assert min_nodes(recipe) == nodes
    plan = make_plan(name, nodes)
    if plan.layout.on_gpu:
        mem = trainer_memory_gib(recipe.model, plan.config.parallel, plan.dp, plan.layout)
        assert mem["total"] <= 0.9 * 80
        # the plan hands the job its fleet through the config
        fleet = plan.config.fleet
        assert fleet.engines * fleet.engine_tp == plan.fleet_gpus
        assert fleet.gpus_per_engine == fleet.engine_tp == recipe.config.fleet.engine_tp
    if nodes > 1:
        with pytest.raises(PlanError, match=f"at least {nodes} nodes"):
            make_plan(name, nodes - 1)


@pytest.mark.parametrize("name", ["qwen3-1.7b", "qwen2.5-3b", "qwen2.5-7b"])
def test_paper_backbones_use_table5_defaults(name: str) -> None:
    config = recipes.get(name).config
    default = SeedConfig()
    # Only the trainer layout differs from the defaults; the Table 5 values are the defaults.
    assert dataclasses.replace(config, parallel=default.parallel, fleet=default.fleet) == default
    assert (default.updates, default.rollout.group_size, default.optim.lr) == (150, 8, 1e-6)
    assert (default.algo.beta_opd, default.algo.lambda_opd, default.algo.beta_kl) == (
        5.0,
        0.01,
        0.01,
    )


def test_tiny_recipe_is_a_cpu_job_with_two_updates() -> None:
    recipe = recipes.get("tiny")
    assert recipe.config.updates == 2
    assert not recipe_layout(recipe).on_gpu
    assert recipe.config.parallel.precision == "fp32"


def test_memory_estimate_shrinks_with_dp_and_model_parallelism() -> None:
    model = recipes.get("qwen2.5-72b").model
    parallel = recipes.get("qwen2.5-72b").config.parallel
    layout = ClusterLayout()
    one, two = (trainer_memory_gib(model, parallel, dp, layout) for dp in (1, 2))
    assert two["optimizer_fp32"] == pytest.approx(one["optimizer_fp32"] / 2)
    assert two["weights_bf16"] == one["weights_bf16"]
    # 72.7e9 params / 16 GPUs * 2 bytes
    assert one["weights_bf16"] == pytest.approx(72.71e9 / 16 * 2 / 1024**3, rel=0.01)


def test_memory_estimate_reads_what_the_trainer_runs() -> None:
    model = recipes.get("qwen2.5-7b").model
    parallel = recipes.get("qwen2.5-7b").config.parallel
    assert (parallel.distributed_optimizer, parallel.recompute) == (True, "full")
    layout = ClusterLayout()
    ran = trainer_memory_gib(model, parallel, 4, layout)
    plain = dataclasses.replace(parallel, distributed_optimizer=False)
    assert trainer_memory_gib(model, plain, 4, layout)["optimizer_fp32"] == pytest.approx(
        4 * ran["optimizer_fp32"]
    )  # not sharded over DP=4
    kept = trainer_memory_gib(model, dataclasses.replace(parallel, recompute="none"), 4, layout)
    # no recompute: every layer's working set (34 s h) instead of its input (2 s h) + one
    assert kept["activations"] == pytest.approx(17 * ran["activations"])
    assert kept["recompute_layer"] == 0.0 and kept["total"] > ran["total"] + 10
    # the CPU recipes run what a CPU can: no distributed optimizer
    assert not recipes.get("tiny").config.parallel.distributed_optimizer
    # logits for one chunk of the output layer, or the whole micro-batch without chunking
    assert parallel.logit_chunk_tokens == 512 and layout.tokens_per_micro_batch == 8192
    whole = trainer_memory_gib(
        model, dataclasses.replace(parallel, logit_chunk_tokens=0), 4, layout
    )
    assert ran["logits_fp32"] == pytest.approx(8 * 512 * model.vocab / 2 / 1024**3)  # TP=2
    assert whole["logits_fp32"] == pytest.approx(16 * ran["logits_fp32"])


def test_moe_memory_terms_against_hand_arithmetic() -> None:
    """Qwen3-30B-A3B at TP=1 PP=1 EP=8 DP=8 (its recipe): 48 layers x 128 experts x 3 x 2048
    x 768 = 28.99e9 expert parameters split 8 ways, the other 1.54e9 on every rank; the
    experts' Adam state is not sharded (expert DP = DP / EP = 1), the rest over DP = 8; no
    reference model (beta_kl = 0); one MoE layer's dispatcher at s = 8192 tokens, k = 8."""
    recipe = recipes.get("qwen3-30b-a3b")
    model, parallel = recipe.model, recipe.config.parallel
    assert (parallel.tp, parallel.pp, parallel.ep, recipe.config.algo.beta_kl) == (1, 1, 8, 0)
    experts = 48 * 128 * 3 * 2048 * 768
    assert model.expert_params == experts == 28_991_029_248
    dense = model.params - experts  # attention, norms, routers, embeddings and output layer
    assert dense == pytest.approx(1.541e9, rel=1e-3)
    layout = recipe_layout(recipe)
    mem = trainer_memory_gib(model, parallel, 8, layout, reference=False)
    gib = 1024**3
    per_gpu = dense + experts / 8
    assert mem["weights_bf16"] == pytest.approx(2 * per_gpu / gib)
    assert mem["grads_fp32"] == pytest.approx(4 * per_gpu / gib)
    assert mem["optimizer_fp32"] == pytest.approx(12 * (dense / 8 + experts / 8) / gib)
    assert mem["reference_bf16"] == 0.0
    s, k, h, f = 8192, 8, 2048, 768
    assert mem["moe_dispatch"] == pytest.approx((4 * s * k * h + 6 * s * k * f) / gib)
    # with a reference model every rank holds another bf16 copy of its share
    ref = trainer_memory_gib(model, parallel, 8, layout)["reference_bf16"]
    assert ref == pytest.approx(mem["weights_bf16"])
    # twice the GPUs at the same EP: the experts' Adam state shards over 2 expert-DP ranks
    two = trainer_memory_gib(model, parallel, 16, layout, reference=False)
    assert two["optimizer_fp32"] == pytest.approx(12 * (dense / 16 + experts / 8 / 2) / gib)
    # TP=2 splits dense and expert weights alike (expert TP = TP) and the expert FFN columns
    tp2 = trainer_memory_gib(model, dataclasses.replace(parallel, tp=2, ep=4), 4, layout, False)
    assert tp2["weights_bf16"] == pytest.approx(2 * (dense / 2 + experts / 8) / gib)
    assert tp2["moe_dispatch"] == pytest.approx((4 * s * k * h + 3 * s * k * f) / gib)
    # a dense model has no MoE term
    dense_model = recipes.get("qwen2.5-7b")
    plain = trainer_memory_gib(dense_model.model, dense_model.config.parallel, 2, layout)
    assert plain["moe_dispatch"] == 0.0


@pytest.mark.parametrize(("name", "nodes", "line"), [
    ("qwen3-30b-a3b", 1, "TP=1 PP=1 DP=8 EP=8 (8 ranks); fleet 8 GPU(s), engine TP=4"),
    ("qwen3-235b-a22b", 8, "TP=4 PP=2 DP=8 EP=8 (64 ranks); fleet 64 GPU(s), engine TP=8"),
])  # fmt: skip
def test_moe_recipes_render_on_their_nodes_and_not_on_fewer(
    name, nodes, line, capsys, monkeypatch
) -> None:
    """Colocated on H200 nodes; the dry run prints the layout and its memory, and the job
    trains the recipe (EP with it); one node fewer (or 80 GiB GPUs) is refused in one line."""
    from megatron_seed.cli import main

    for var in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.setenv(var, f"/lustre/{var.lower()}")
    recipe = recipes.get(name)
    assert min_nodes(recipe) == nodes
    plan = make_plan(name, nodes)
    assert plan.layout.colocated and plan.layout.gpu_memory_gib == 141.0
    assert plan.config.parallel.ep == recipe.config.parallel.ep > 1
    assert line in memory_summary(plan)
    argv = ["launch", name, "--executor", "slurm", "--nodes", str(nodes), "--dryrun"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert line in captured.out + captured.err  # the memory summary
    assert f"--nnodes {nodes} --nproc-per-node 8" in out
    assert f"-m megatron_seed.cli train --recipe {name}" in out
    if nodes > 1:
        with pytest.raises(PlanError, match=f"at least {nodes} nodes"):
            make_plan(name, nodes - 1)
    small = dataclasses.replace(recipe_layout(recipe), gpu_memory_gib=80.0)
    with pytest.raises(LayoutError, match="GiB"):
        check_layout(recipe.model, recipe.config, small, nodes)


@pytest.mark.parametrize(("name", "nodes", "line", "refused", "why"), [
    ("llama-3.1-8b", 1, "TP=2 PP=1 DP=2 (4 ranks); fleet 4 GPU(s), engine TP=1",
     ["--tp", "1"], "needs ~90 GiB per GPU at TP=1 PP=1 DP=4 (budget 72 GiB)"),
    ("llama-3.1-70b", 8, "TP=4 PP=4 DP=2 (32 ranks); fleet 32 GPU(s), engine TP=4",
     ["--nodes", "4"], "needs ~89 GiB per GPU at TP=4 PP=4 DP=1 (budget 72 GiB)"),
])  # fmt: skip
def test_llama_recipes_render_with_their_memory_and_refuse_what_does_not_fit(
    name, nodes, line, refused, why, capsys
) -> None:
    """`seed launch NAME --dryrun` renders the Llama 3.1 recipes with the memory breakdown;
    a layout that does not fit is refused in one line, before any script."""
    argv = ["launch", name, "--executor", "slurm", "--nodes", str(nodes), "--dryrun"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert line in captured.out + captured.err and "optimizer_fp32" in captured.out + captured.err
    assert f"-m megatron_seed.cli train --recipe {name}" in captured.out
    bad = ["launch", name, "--executor", "slurm", *refused, "--dryrun"]
    assert cli.main(bad) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and why in err, err


def test_ep_must_divide_dp_and_the_experts() -> None:
    recipe = recipes.get("qwen3-30b-a3b")
    layout = recipe_layout(recipe)
    odd = dataclasses.replace(
        recipe.config, parallel=dataclasses.replace(recipe.config.parallel, ep=3)
    )
    with pytest.raises(LayoutError, match="EP=3 does not divide the data-parallel size 8"):
        check_layout(recipe.model, odd, layout, 1)
    dense = recipes.get("qwen2.5-7b")
    moe_on_dense = dataclasses.replace(
        dense.config, parallel=dataclasses.replace(dense.config.parallel, ep=2)
    )
    with pytest.raises(LayoutError, match="has no experts"):
        check_layout(dense.model, moe_on_dense, recipe_layout(dense), 1)


def test_cpu_memory_model_is_the_gpu_terms_at_float32() -> None:
    from launch.layout import (
        CPU_ENGINE_LOAD_FACTOR,
        CPU_ENGINE_RUNTIME_GIB,
        CPU_TRAINER_RUNTIME_GIB,
        CPU_WORKING_BYTES,
        cpu_engine_memory_gib,
        cpu_trainer_memory_gib,
    )
    from megatron_seed.config import ParallelConfig

    model, gib = SHAPES["qwen2.5-0.5b"], 1024**3
    p, h, v, s = model.params, model.hidden, model.vocab, 4096
    full = cpu_trainer_memory_gib(model, ParallelConfig(recompute="full"), s)
    assert full["weights_fp32"] == full["reference_fp32"] == pytest.approx(4 * p / gib)
    assert full["optimizer_fp32"] == pytest.approx(8 * p / gib)  # Adam m, v; no master copy
    assert full["activations"] == pytest.approx(4 * s * h * model.layers / gib)
    assert full["recompute_layer"] == pytest.approx(CPU_WORKING_BYTES * s * h / gib)
    assert full["logits_fp32"] == pytest.approx(8 * 512 * v / gib)  # one 512-token chunk
    assert full["vocab_grad_fp32"] == pytest.approx(4 * v * h / gib)
    parts = sum(x for k, x in full.items() if k != "total")
    assert full["total"] == pytest.approx(parts) and full["runtime"] == CPU_TRAINER_RUNTIME_GIB
    kept = cpu_trainer_memory_gib(model, ParallelConfig(recompute="none"), s)
    assert kept["activations"] == pytest.approx(model.layers * full["recompute_layer"])
    engine = cpu_engine_memory_gib(model, 1 << 30)
    assert full["sync_objstore"] == engine["sync_objstore"] == pytest.approx(4 * p / gib)
    assert engine["total"] == pytest.approx(
        (CPU_ENGINE_LOAD_FACTOR + 1) * 4 * p / gib + 1.0 + CPU_ENGINE_RUNTIME_GIB
    )


# ---------------------------------------------------------------- bad input, one line


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"recipe_name": "qwen9-400b"},
            r"unknown recipe 'qwen9-400b'; known: tiny, default, default-quick, pretrained-cpu, qwen3-1\.7b",
        ),
        ({"recipe_name": "qwen2.5-7b", "tp": 3}, r"TP×PP=3×1=3 does not divide the 4 trainer GPUs"),
        (
            {"recipe_name": "qwen2.5-32b", "nodes": 4, "pp": 3},
            r"TP×PP=4×3=12 does not divide the 16 trainer GPUs",
        ),
        (
            {"recipe_name": "qwen2.5-7b", "nodes": 2, "fleet_gpus": 24},
            r"--fleet-gpus 24 is more than the cluster has \(2 node\(s\) × 8 GPUs = 16\)",
        ),
        (
            {"recipe_name": "qwen2.5-7b", "nodes": 2, "fleet_gpus": 16},
            r"no GPU left for the trainer",
        ),
        ({"recipe_name": "qwen2.5-7b", "nodes": 2, "fleet_gpus": 3}, r"does not split evenly"),
        (
            {"recipe_name": "qwen2.5-7b", "tp": 8, "gpus_per_node": 16, "fleet_gpus": 8},
            r"28 attention heads are not divisible by 8",
        ),
        ({"recipe_name": "qwen2.5-72b", "nodes": 4}, r"needs ~\d+ GiB per GPU"),
        ({"recipe_name": "qwen2.5-7b", "config_json": '{"algo": {"beta": 1}}'}, r"unknown keys"),
        ({"recipe_name": "qwen2.5-7b", "config_json": "{nope"}, r"not valid JSON"),
    ],
)
def test_bad_input_is_one_line_error(kwargs: dict, message: str) -> None:
    with pytest.raises(PlanError, match=message) as info:
        make_plan(**kwargs)
    assert "\n" not in str(info.value)


def test_layout_checks_fleet_against_cluster() -> None:
    model = recipes.get("qwen2.5-7b").model
    config = recipes.get("qwen2.5-7b").config
    too_big = ClusterLayout(gpus_per_node=8, trainer_ranks_per_node=4, fleet_gpus_per_node=12)
    with pytest.raises(LayoutError, match="the fleet needs 12 GPUs but 1 node"):
        check_layout(model, config, too_big, 1)
    tp3 = config.with_changes({"fleet": {"engine_tp": 3}})
    with pytest.raises(LayoutError, match="engine TP=3 does not divide"):
        check_layout(model, tp3, ClusterLayout(), 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "no-such-recipe", "--dryrun"],
        ["launch", "qwen2.5-7b", "--executor", "slurm", "--tp", "3", "--dryrun"],
        ["launch", "qwen2.5-7b", "--executor", "slurm", "--fleet-gpus", "64", "--dryrun"],
        ["launch", "qwen2.5-7b", "--executor", "local", "--nodes", "2"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line_and_no_script(argv, capsys) -> None:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("seed launch: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("executor", ["local", "slurm"])
def test_a_job_without_its_paths_is_refused_before_anything_renders(
    executor, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("SEED_GAMES_DIR")
    monkeypatch.delenv("SEED_OUT_DIR")
    argv = ["launch", "qwen2.5-7b", "--executor", executor, "--dryrun"]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "--games (or $SEED_GAMES_DIR), --out (or $SEED_OUT_DIR)" in err
    assert "--model" not in err  # set in the shell
    assert cli.main([*argv, "--games", "/g", "--out", "/o"]) == 0  # flags are enough
    capsys.readouterr()
    assert cli.main([*argv, "--job", "my_job.py"]) == 0  # an own job reads its own paths


# ---------------------------------------------------------------- the job command is data


def test_job_command_carries_only_the_differences_from_the_recipe() -> None:
    plan = make_plan("qwen2.5-7b", 2, tp=4, config_json='{"updates": 20, "algo": {"beta_kl": 0.0}}')
    job = plan.job()
    assert job.target == "megatron_seed.cli" and job.is_module
    assert job.args[:3] == ("train", "--recipe", "qwen2.5-7b")
    overrides = json.loads(job.args[job.args.index("--config-json") + 1])
    # the user's changes, and the fleet the layout gives (2 nodes x 4 fleet GPUs, TP 1)
    assert overrides == {
        "parallel": {"tp": 4},
        "updates": 20,
        "algo": {"beta_kl": 0.0},
        "fleet": {"engines": 8, "gpus_per_engine": 1.0},
    }
    one = make_plan("qwen2.5-7b").job().args
    assert one[:3] == ("train", "--recipe", "qwen2.5-7b")
    assert json.loads(one[4]) == {"fleet": {"engines": 4, "gpus_per_engine": 1.0}}
    # a CPU job without GPU slots keeps the recipe's own fleet
    assert make_plan("default").job().args == ("train", "--recipe", "default")


def test_tiny_at_two_nodes_is_dp2_with_one_engine_per_node_on_gpu_slots() -> None:
    plan = make_plan("tiny", 2)
    assert (plan.trainer_world, plan.dp, plan.fleet_gpus) == (2, 2, 2)
    assert not plan.layout.on_gpu and plan.layout.has_gpus
    fleet = plan.config.fleet
    assert (fleet.engines, fleet.gpus_per_engine, fleet.engine_tp) == (2, 1.0, 1)
    script = render(plan, SlurmOptions(job_dir="/shared/jobs"))
    assert "--gpus-per-node=2" in script  # the GRES slots are requested like GPUs
    assert "--num-gpus=1" in script  # each node's Ray worker advertises its fleet slot
    assert "CUDA_VISIBLE_DEVICES" not in script  # nothing is pinned to a device
    # one head and one worker, whatever task count the allocation hands srun by default
    assert re.search(
        r"--nodes=1 --ntasks=1 -w \"\$head_node\" --output=\S+ ray start --head", script
    )
    assert re.search(r"--nodes=1 --ntasks=1 --exclude=\S+ --output=\S+ ray start --block", script)


def test_gpus_per_node_keeps_the_fleet_share_and_fleet_gpus_moves_it() -> None:
    four = make_plan("qwen2.5-3b", 2, gpus_per_node=4).layout
    assert (four.trainer_ranks_per_node, four.fleet_gpus_per_node) == (2, 2)
    moved = make_plan("qwen2.5-7b", 2, fleet_gpus=4)
    assert (moved.layout.trainer_ranks_per_node, moved.layout.fleet_gpus_per_node) == (6, 2)
    assert (moved.trainer_world, moved.dp, moved.fleet_gpus) == (12, 6, 4)


def test_parse_job() -> None:
    assert parse_job("megatron_seed.cli smoke --steps 2") == JobCommand(
        "megatron_seed.cli", ("smoke", "--steps", "2"), is_module=True
    )
    assert parse_job("/x/job.py 3").argv() == ["/x/job.py", "3"]


def test_memory_summary_names_the_layout() -> None:
    line = memory_summary(make_plan("qwen2.5-72b", 8))
    assert "TP=4 PP=4 DP=2 (32 ranks)" in line and "fleet 32 GPU(s), engine TP=4" in line


# ---------------------------------------------------------------- ray health wait


def test_ray_health_counts_alive_nodes_and_gpus() -> None:
    nodes = [
        {"Alive": True, "Resources": {"GPU": 4.0, "CPU": 64.0}},
        {"Alive": False, "Resources": {"GPU": 4.0}},
        {"Alive": True, "Resources": {"CPU": 8.0}},
    ]
    assert cluster_size(nodes) == (2, 4.0)


def test_ray_health_waits_then_succeeds_or_times_out() -> None:
    snapshots = iter(
        [[], [{"Alive": True, "Resources": {"GPU": 4}}]]
        + [[{"Alive": True, "Resources": {"GPU": 4}}, {"Alive": True, "Resources": {"GPU": 4}}]] * 5
    )
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    got = wait_for_cluster(
        lambda: next(snapshots), 2, 8, 60, poll_s=5, clock=lambda: now[0], sleep=sleep
    )
    assert got == (2, 8.0) and now[0] == 10.0
    with pytest.raises(TimeoutError, match=r"1/2 nodes and 4/8 GPUs after 12 s"):
        wait_for_cluster(
            lambda: [{"Alive": True, "Resources": {"GPU": 4}}],
            2,
            8,
            12,
            poll_s=5,
            clock=lambda: now[0],
            sleep=sleep,
        )


# ---------------------------------------------------------------- Slurm scripts


def _render(
    nodes: int,
    container: bool,
    recipe: str = "qwen2.5-7b",
    job_dir: str = "/lustre/seed",
    bundle: str | None = None,
) -> str:
    from launch.slurm import SlurmOptions, render

    opts = SlurmOptions(
        job_dir=job_dir,
        account="acct",
        partition="batch",
        container_image=IMAGE if container and not bundle else None,
        container_bundle=bundle,
        container_mounts=("/lustre:/lustre",) if container else (),
        env_setup=None if container else "source /lustre/venv/bin/activate",
        extra_env={"SEED_MODEL_DIR": "/lustre/qwen", "SEED_OUT_DIR": "/lustre/run1"},
    )
    return render(make_plan(recipe, nodes), opts)


@pytest.mark.parametrize("nodes", [1, 2])
def test_an_oci_bundle_runs_every_step_in_the_image(nodes: int) -> None:
    """--container-bundle: Slurm's own `--container` on every srun step (Ray head, health
    waits, workers, torchrun), no pyxis flags, the image's PATH first, the raylets named
    after their node, and the folder where every process records where it ran."""
    script = _render(nodes, True, bundle="/lustre/images/seed-bundle")
    lines = _lines(script)
    sruns = [ln for ln in lines if ln.startswith("srun ") and "hostname" not in ln]
    assert len(sruns) == (3 if nodes == 1 else 5)
    for ln in sruns:
        assert "--container=/lustre/images/seed-bundle" in ln, ln
    assert "--container-image" not in script and "--container-mounts" not in script
    path = _index(lines, "export PATH=")
    assert path < _index(lines, "ray start --head") and "/opt/venv/bin" in lines[path]
    for ln in lines:
        if "ray start" in ln:
            assert "python -m megatron_seed.hosts ray start" in ln, ln
    exported = dict(re.findall(r"^export (\w+)=(.*)$", script, re.M))
    assert exported["SEED_PROVENANCE_DIR"].strip("'\"") == "/lustre/seed/provenance"


def test_both_container_kinds_at_once_is_one_line(capsys) -> None:
    argv = ["launch", "qwen2.5-7b", "--executor", "slurm", "--nodes", "2", "--dryrun",
            "--model", "/m", "--games", "/g", "--out", "/o",
            "--container-image", IMAGE, "--container-bundle", "/b"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--container-image (pyxis) and --container-bundle (OCI): choose one")


def _lines(script: str) -> list[str]:
    return [ln for ln in script.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _index(lines: list[str], *needles: str) -> int:
    hits = [i for i, ln in enumerate(lines) if all(n in ln for n in needles)]
    assert len(hits) == 1, (needles, hits)
    return hits[0]


@pytest.fixture(scope="module")
def scripts() -> dict[tuple[int, bool], str]:
    return {(n, c): _render(n, c) for n in (1, 2, 4) for c in (True, False)}


@pytest.mark.parametrize("nodes", [1, 2, 4])
@pytest.mark.parametrize("container", [True, False])
def test_slurm_script_layout_and_order(scripts, nodes: int, container: bool) -> None:
    script = scripts[(nodes, container)]
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=?(.*)$", script, re.M))
    assert sbatch["nodes"] == str(nodes)
    assert sbatch["gpus-per-node"] == "8"
    assert sbatch["ntasks-per-node"] == "1"  # one torchrun agent per node
    assert sbatch["job-name"] == "seed-qwen2.5-7b-train"
    assert "exclusive" in sbatch

    lines = _lines(script)
    torchrun = _index(lines, "torchrun ")
    args = shlex.split(lines[torchrun].replace("$", "DOLLAR"))
    at = args.index("torchrun")
    flags = dict(zip(args[at + 1 :: 2], args[at + 2 :: 2], strict=False))
    assert flags["--rdzv-backend"] == "c10d"
    assert flags["--nnodes"] == str(nodes)
    assert flags["--nproc-per-node"] == "4"
    if nodes == 1:  # torchrun's single-node rendezvous (a free local port)
        assert (flags["--rdzv-endpoint"], flags["--node-rank"]) == ("localhost:0", "0")
    else:  # c10d store on the head node; each node's agent ranks itself by SLURM_NODEID
        assert flags["--rdzv-endpoint"] == "DOLLARhead_node_ip:29500"
        assert flags["--node-rank"] == "DOLLARSLURM_NODEID"
    assert args[-6:-2] == ["megatron_seed.cli", "train", "--recipe", "qwen2.5-7b"]
    assert json.loads(args[-1]) == {"fleet": {"engines": 4 * nodes, "gpus_per_engine": 1.0}}

    head = _index(lines, "ray start --head")
    final_wait = _index(lines, "launch.ray_health", f"--nodes {nodes} --gpus {4 * nodes}")
    workers = [i for i, ln in enumerate(lines) if "ray start" in ln and "--head" not in ln]
    assert lines[head].endswith("&") and "--overlap" in lines[head]
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in lines[head] and "--num-gpus=4" in lines[head]
    # the Ray steps hold the node's GPUs as a step (ConstrainDevices opens only a step's
    # own GRES); the health checks need none
    for i in (head, *workers):
        assert "--overlap" in lines[i] and "--gpus-per-node=8" in lines[i], lines[i]
    assert "--gpus-per-node" not in lines[final_wait]
    assert "exit 1" in lines[final_wait] and not lines[final_wait].endswith("&")
    if nodes == 1:
        assert workers == []
        assert head < final_wait < torchrun
    else:
        (worker,) = workers
        first_wait = _index(lines, "launch.ray_health", "--nodes 1 ")
        assert head < first_wait < worker < final_wait < torchrun
        assert f"--nodes={nodes - 1}" in lines[worker] and '--exclude="$head_node"' in lines[worker]
        assert '--address="$RAY_ADDRESS"' in lines[worker] and lines[worker].endswith("&")
    assert _index(lines, "export RAY_ADDRESS=") < head

    sruns = [ln for ln in lines if ln.startswith("srun ") and "hostname" not in ln]
    assert len(sruns) == (3 if nodes == 1 else 5)  # head, [wait, workers,] wait, torchrun
    if container:
        for ln in sruns:
            assert f"--container-image {IMAGE}" in ln, ln
            assert "--container-mounts /lustre:/lustre" in ln, ln
        assert "--container-workdir" in lines[torchrun]
        assert "source /lustre/venv" not in script
    else:
        assert "--container" not in script and "pyxis" not in script
        assert "--chdir" in lines[torchrun]
        assert _index(lines, "source /lustre/venv/bin/activate") < head


def test_slurm_script_is_valid_bash(scripts) -> None:
    for script in scripts.values():
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_slurm_script_config_overrides_survive_quoting() -> None:
    from launch.slurm import SlurmOptions, render

    plan = make_plan("qwen2.5-32b", 4, config_json='{"rollout": {"temperature": 0.7}}')
    script = render(plan, SlurmOptions(job_dir="/j"))
    line = next(ln for ln in script.splitlines() if "torchrun " in ln)
    args = shlex.split(line.replace("$", "DOLLAR"))
    # the fleet's shape travels in the config: 4 nodes x 4 fleet GPUs / engine TP 2
    assert json.loads(args[args.index("--config-json") + 1]) == {
        "rollout": {"temperature": 0.7},
        "fleet": {"engines": 8, "gpus_per_engine": 2.0},
    }
    assert "--nnodes 4" in line and "--nproc-per-node 4" in line
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in script and "--num-gpus=4" in script
    assert "SEED_ENGINE_TP" not in script and "SEED_FLEET_GPUS" not in script


# --- colocated engines: every GPU shared by a trainer rank and an engine ---------------------

UTIL_04 = '{"fleet": {"gpu_memory_utilization": 0.4}}'


def test_colocated_plan_shares_every_gpu_and_ray_gets_all_of_them() -> None:
    plan = make_plan("qwen2.5-7b", 2, colocate=True, config_json=UTIL_04)
    lay = plan.layout
    assert lay.colocated and (lay.trainer_ranks_per_node, lay.fleet_gpus_per_node) == (8, 8)
    assert (plan.trainer_world, plan.dp, plan.fleet_gpus) == (16, 8, 16)  # TP=2
    fleet = plan.config.fleet
    assert (fleet.engines, fleet.transport, fleet.colocate) == (16, "ipc", True)
    script = render(plan, SlurmOptions(job_dir="/j"))
    line = next(ln for ln in script.splitlines() if "torchrun " in ln)
    assert "--nproc-per-node 8" in line
    # the Ray worker sees the trainer's GPUs: the engines' placement groups share them
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in script and "--num-gpus=8" in script
    overrides = json.loads(shlex.split(line.replace("$", "D"))[-1])
    assert overrides["fleet"] == {
        "colocate": True,
        "transport": "ipc",
        "engines": 16,
        "gpus_per_engine": 1.0,
        "gpu_memory_utilization": 0.4,
    }


def test_colocated_memory_is_checked_per_phase_against_hand_arithmetic() -> None:
    from launch.layout import ENGINE_ASLEEP_GIB, colocated_memory_gib

    plan = make_plan("qwen2.5-7b", 1, colocate=True, config_json=UTIL_04)
    model, lay = plan.recipe.model, plan.layout
    mem = trainer_memory_gib(model, plan.config.parallel, plan.dp, lay)
    phases = colocated_memory_gib(model, plan.config.parallel, plan.dp, lay, 0.4)
    params = model.params / plan.config.parallel.tp
    resident = (2 * params + 2 * params) / 1024**3 + 4.0  # bf16 policy + reference + runtime
    assert phases["trainer_resident"] == pytest.approx(resident)
    assert phases["generate"] == pytest.approx(resident + 0.4 * 80)
    assert phases["train"] == pytest.approx(mem["total"] + ENGINE_ASLEEP_GIB)
    assert phases["start"] == pytest.approx(4.0 + 0.4 * 80)  # runtime + the engines' share
    # a sync: resident + a sleeping engine + its awake bf16 weights (engine TP 1) + the IPC
    # staging buffer, here the full bf16 embedding (152,064 x 3,584 > the 64 MiB bucket)
    embedding = 2 * model.vocab * model.hidden / 1024**3
    assert embedding > 64 / 1024
    sync = resident + ENGINE_ASLEEP_GIB + 2 * model.params / 1024**3 + embedding
    assert phases["sync"] == pytest.approx(sync)
    # the default 0.85 share leaves no room for the trainer: the error names what fits
    with pytest.raises(PlanError, match=r"gpu_memory_utilization <= (0\.\d\d)") as info:
        make_plan("qwen2.5-7b", 1, colocate=True)
    fits = float(re.search(r"<= (0\.\d\d)", str(info.value)).group(1))
    assert (0.9 * 80 - resident) / 80 - 0.01 < fits <= (0.9 * 80 - resident) / 80
    at = '{"fleet": {"gpu_memory_utilization": %s}}'
    make_plan("qwen2.5-7b", 1, colocate=True, config_json=at % fits)  # fits
    with pytest.raises(PlanError, match="exceed the budget"):
        make_plan("qwen2.5-7b", 1, colocate=True, config_json=at % round(fits + 0.02, 2))
    # a sync whose staging buffer does not fit beside the engines' weights fails by name
    big = json.dumps({"fleet": {"gpu_memory_utilization": 0.4, "sync_bucket_bytes": 40 << 30}})
    need = resident + ENGINE_ASLEEP_GIB + 2 * model.params / 1024**3 + 40
    with pytest.raises(PlanError, match=f"during a weight sync .* ~{need:.0f} GiB per GPU"):
        make_plan("qwen2.5-7b", 1, colocate=True, config_json=big)


def test_colocated_bad_input_is_one_line() -> None:
    with pytest.raises(PlanError, match="--fleet-gpus does not apply to colocated"):
        make_plan("qwen2.5-7b", 1, colocate=True, fleet_gpus=4, config_json=UTIL_04)
    with pytest.raises(PlanError, match="colocated engines share the trainer's GPUs"):
        make_plan("default", colocate=True)  # a CPU job without GPU slots
    with pytest.raises(LayoutError, match="a colocated layout shares every GPU"):
        bad = dataclasses.replace(ClusterLayout(), colocated=True)  # 4 + 4, not shared
        check_layout(recipes.get("qwen2.5-7b").model, recipes.get("qwen2.5-7b").config, bad, 1)


def test_cli_colocate_flag_reaches_the_script(capsys) -> None:
    argv = ["launch", "qwen2.5-7b", "--executor", "slurm", "--colocate", "--dryrun"]
    assert cli.main([*argv, "--config-json", UTIL_04]) == 0
    out, err = capsys.readouterr()
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in out
    assert "colocated: ~" in err and "generating (engines at 0.4)" in err


def test_a_local_fleet_on_cuda_takes_the_devices_after_the_trainer() -> None:
    from megatron_seed.rollout.session import fleet_devices

    assert fleet_devices(None, 8, 4, 4) == ["4", "5", "6", "7"]
    assert fleet_devices(None, 8, 0, 8) == [str(i) for i in range(8)]  # colocated
    assert fleet_devices("3,5,6,7", 4, 1, 2) == ["5", "6"]  # this process's view, mapped
    with pytest.raises(ValueError, match="needs 4 GPU\\(s\\) after the trainer's 2"):
        fleet_devices(None, 4, 2, 4)


# --- run the rendered script with fake Slurm commands that log each step ----------------

FAKE_SRUN = r"""#!/bin/bash
# Fake srun: logs "<what> <RAY_ADDRESS> <token set?>" per step; ray_health waits like the real one.
log="$FAKE_LOG"
args="$*"
case "$args" in
  *hostname*) echo "10.0.0.1 10.9.9.9"; exit 0 ;;
  *"ray start --head"*) echo "head $RAY_ADDRESS ${RAY_AUTH_TOKEN:+token}" >> "$log" ;;
  *"ray start"*) echo "workers $RAY_ADDRESS ${RAY_AUTH_TOKEN:+token}" >> "$log" ;;
  *ray_health*)
    want=$(echo "$args" | sed -E 's/.*--nodes ([0-9]+).*/\1/')
    if [ -n "$FAKE_HEALTH_FAILS" ]; then echo "health-failed" >> "$log"; exit 1; fi
    for _ in $(seq 50); do   # like the real check: wait until the nodes registered
      have=$(grep -c -E '^(head|workers)' "$log" 2>/dev/null)
      [ "$want" = 1 ] && [ "$have" -ge 1 ] && break
      [ "$have" -ge 2 ] && break
      [ "$NODES" = 1 ] && [ "$have" -ge 1 ] && break
      sleep 0.05
    done
    echo "health $want" >> "$log" ;;
  *torchrun*) echo "torchrun $RAY_ADDRESS" >> "$log" ;;
  *) echo "other $args" >> "$log" ;;
esac
"""


def _run_script(
    script: str, nodes: int, tmp_path: Path, health_fails: bool = False
) -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-0\necho node-1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    log = tmp_path / "steps.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "NODES": str(nodes),
        "SLURM_JOB_NODELIST": "node-[0-1]",
        "SLURM_JOB_ID": "42",
    }
    if health_fails:
        env["FAKE_HEALTH_FAILS"] = "1"
    proc = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    steps = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, steps


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("nodes", [1, 2])
def test_slurm_script_runs_steps_in_order_with_fake_slurm(nodes: int, tmp_path: Path) -> None:
    script = _render(nodes, container=True, job_dir=str(tmp_path / "jobs"))
    rc, steps = _run_script(script, nodes, tmp_path)
    assert rc == 0, steps
    addr = "10.0.0.1:6379"  # the first of the head's addresses
    if nodes == 1:
        assert steps == [f"head {addr} token", "health 1", f"torchrun {addr}"]
    else:
        assert steps == [
            f"head {addr} token",
            "health 1",
            f"workers {addr} token",
            "health 2",
            f"torchrun {addr}",
        ]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_slurm_script_stops_before_training_when_ray_is_unhealthy(tmp_path: Path) -> None:
    script = _render(2, container=False, job_dir=str(tmp_path / "jobs"))
    script = script.replace("source /lustre/venv/bin/activate", "true")
    rc, steps = _run_script(script, 2, tmp_path, health_fails=True)
    assert rc == 1
    assert not any(s.startswith(("torchrun", "workers")) for s in steps)
    assert steps[-1] == "health-failed"


# ---------------------------------------------------------------- submission (fake sbatch)


def _fake_slurm_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/sbatch.log\necho 4242\n')
    for tool in ("srun", "squeue", "sacct", "scontrol", "scancel"):
        (bin_dir / tool).write_text("#!/bin/bash\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir


def test_seed_launch_slurm_submits_the_rendered_script(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", f"{_fake_slurm_bin(tmp_path)}:{os.environ['PATH']}")
    argv = ["launch", "qwen2.5-7b", "--executor", "slurm", "--nodes", "2"]
    argv += ["--job-dir", str(tmp_path / "jobs"), "--container-image", IMAGE]
    assert cli.main(argv) == 0
    assert re.search(
        r"submitted job 4242 \(experiment seed-qwen2.5-7b_\d+; logs in ", capsys.readouterr().out
    )
    (call,) = (tmp_path / "sbatch.log").read_text().splitlines()
    script_path = Path(call.split()[-1])
    assert script_path.is_relative_to(tmp_path / "jobs")  # on the shared job folder
    lines = _lines(script_path.read_text())
    assert _index(lines, "ray start --head") < _index(lines, "torchrun ")


def test_nccl_settings_the_weight_port_and_paths_reach_every_step(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """A cluster profile and flags -> the sbatch script's exported environment (what every
    srun step, Ray's and torchrun's, inherits), also when the job is submitted over SSH."""
    profile = tmp_path / "cluster.json"
    profile.write_text(json.dumps({"partition": "gpu", "nccl_socket_ifname": "ib0",
                                   "nccl_ib_hca": "mlx5_0,mlx5_1", "nccl_timeout_s": 600}))  # fmt: skip
    monkeypatch.setenv("SEED_GAMES_DIR", "/lustre/games")  # from the shell unless a flag says
    argv = ["launch", "qwen2.5-7b", "--executor", "slurm", "--nodes", "2", "--dryrun",
            "--job-dir", "/lustre/jobs", "--cluster-profile", str(profile),
            "--model", "/lustre/qwen", "--out", "/lustre/run1"]  # fmt: skip
    assert cli.main(argv) == 0
    script = capsys.readouterr().out
    exported = dict(re.findall(r"^export (\w+)=(.*)$", script, re.M))
    for key, value in {
        "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "SEED_NCCL_TIMEOUT_S": "600",
        "SEED_WEIGHT_SYNC_PORT": "29650", "SEED_MODEL_DIR": "/lustre/qwen",
        "SEED_GAMES_DIR": "/lustre/games", "SEED_OUT_DIR": "/lustre/run1",
    }.items():  # fmt: skip
        assert exported.get(key, "").strip("'\"") == value, (key, exported.get(key))
    assert re.search(r"^#SBATCH --partition=gpu$", script, re.M)
    lines = _lines(script)  # exported before the first step
    assert _index(lines, "export SEED_MODEL_DIR") < _index(lines, "ray start --head")
    from launch.slurm import SlurmOptions, job_env

    exclusion = job_env(SlurmOptions(nccl_socket_ifname="^lo,docker"))
    assert exclusion["NCCL_SOCKET_IFNAME"] == "^lo,docker" and "GLOO_SOCKET_IFNAME" not in exclusion
    bad = tmp_path / "bad.json"
    bad.write_text('{"nccl_interface": "ib0"}')
    argv = [
        "launch",
        "qwen2.5-7b",
        "--executor",
        "slurm",
        "--dryrun",
        "--cluster-profile",
        str(bad),
    ]
    assert cli.main(argv) == 2
    assert "unknown keys ['nccl_interface']" in capsys.readouterr().err


def test_seed_launch_slurm_without_sbatch_is_a_one_line_error(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    argv = ["launch", "qwen2.5-7b", "--executor", "slurm", "--job-dir", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "sbatch not found" in capsys.readouterr().err
    assert not (tmp_path / "experiments").exists()


@pytest.mark.parametrize(
    ("profile", "needle"),
    [
        ({"extra_env": "A=1"}, "extra_env must be an object of strings, got 'A=1'"),
        ({"container_mounts": "/lustre:/lustre"}, "container_mounts must be a list of strings"),
        ({"ray_port": "6379"}, "ray_port must be an integer"),
        ({"package_code": "yes"}, "package_code must be true or false"),
        ({"host_memory_gib": "2 TiB"}, "host_memory_gib must be a number"),
        (["partition", "gpu"], "a JSON object expected"),
    ],
)
def test_a_cluster_profile_of_the_wrong_types_is_one_line(profile, needle, tmp_path) -> None:
    """Each value has its field's type before anything is rendered: a mounts string used to
    be split into characters, an `extra_env` string to reach `dict` and end in a traceback."""
    import dataclasses

    from launch.slurm import SlurmOptions, _profile_type, read_profile

    assert all(_profile_type(f.name) for f in dataclasses.fields(SlurmOptions))  # none unchecked
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="cluster profile") as info:
        read_profile(str(path))
    assert needle in str(info.value) and "\n" not in str(info.value)
