"""The job side builds the fleet the launch plan printed: `seed launch qwen2.5-7b
--executor slurm --nodes 2 --dryrun` renders a torchrun line; the `seed train` it runs
resolves the same recipe and overrides and starts 8 engines of TP 1, one GPU each."""

from __future__ import annotations

import argparse
import shlex

import pytest

from megatron_seed import cli

pytestmark = pytest.mark.usefixtures("job_paths")  # as a user's shell exports them


def _train_args(capsys) -> list[str]:
    assert (
        cli.main(["launch", "qwen2.5-7b", "--executor", "slurm", "--nodes", "2", "--dryrun"]) == 0
    )
    script = capsys.readouterr().out
    line = next(ln for ln in script.splitlines() if "torchrun " in ln)
    args = shlex.split(line.replace("$", "DOLLAR"))
    return args[args.index("megatron_seed.cli") + 1 :]


def test_job_fleet_follows_the_printed_plan(capsys, monkeypatch, tmp_path) -> None:
    import json

    from megatron_seed.pipeline import commands_train
    from megatron_seed.rollout import fleet as fleet_module
    from megatron_seed.rollout.session import start_fleet

    argv = _train_args(capsys)
    assert argv[:3] == ["train", "--recipe", "qwen2.5-7b"]
    parser = argparse.ArgumentParser()
    commands_train.add_arguments(parser)
    cfg = commands_train.build_config(parser.parse_args(argv[1:]))
    # 2 nodes x 4 fleet GPUs, engine TP 1 (the recipe), each engine reserving its GPU
    assert (cfg.fleet.engines, cfg.fleet.engine_tp, cfg.fleet.gpus_per_engine) == (8, 1, 1.0)
    assert cfg.parallel.tp == 2 and cfg.parallel.distributed_optimizer

    started = {}

    class FakeFleet:
        def __init__(self, model_dir, spec):
            started["spec"] = spec

    monkeypatch.setattr(fleet_module, "Fleet", FakeFleet)
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    start_fleet(cfg, tmp_path)
    spec = started["spec"]
    assert spec.engines == 8 and spec.gpus_per_engine == 1.0
    assert spec.engine.tensor_parallel_size == 1
    assert spec.engine.max_model_len == 8192  # fleet.max_model_len caps it
    assert spec.transport == cfg.fleet.transport


@pytest.mark.parametrize("engine_tp", [2, 4])
def test_engine_tp_override_reaches_the_job(engine_tp: int) -> None:
    from launch.plan import make_plan

    plan = make_plan("qwen2.5-7b", 2, engine_tp=engine_tp)
    fleet = plan.config.fleet
    assert (fleet.engine_tp, fleet.engines, fleet.gpus_per_engine) == (
        engine_tp,
        8 // engine_tp,
        float(engine_tp),
    )
    # what the job rebuilds from the recipe and the command's overrides
    assert plan.recipe.config.with_changes(plan.overrides).fleet == fleet
