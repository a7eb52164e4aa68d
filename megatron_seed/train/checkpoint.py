"""Trainer checkpoints: model and optimizer as Megatron dist-checkpoints (loadable into
another TP/PP layout), trainer state as JSON, RNG states per rank.

  DIR/step_000012/
    hf/config.json          the architecture (and tokenizer files)
    model/                  dist-checkpoint of the policy
    optimizer/              dist-checkpoint of Adam's state (+ its step counts)
    trainer_state.json      step, data position, layout, extra
    rng/rank_00003.pt       torch/python/numpy RNG of each rank, and on CUDA the device RNG and
                            Megatron's CUDA RNG tracker (restored on the same layout)
  DIR/latest               the name of the newest *complete* checkpoint

A checkpoint is written to `step_X.tmp` and renamed when every rank has finished, so a
kill mid-save leaves the previous checkpoint as `latest`.
"""

from __future__ import annotations

import json
import random
import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import torch
import torch.distributed as dist

from megatron_seed.errors import CommandError
from megatron_seed.files import write_text
from megatron_seed.models.checkpoint import load_model, save_model
from megatron_seed.models.convert import save_hf_checkpoint
from megatron_seed.models.qwen import QwenSpec
from megatron_seed.train.trainer import SeedTrainer, TrainerState

# How the distributed optimizer writes its state: per parameter, in the model's layout
# (loadable into another TP/PP/EP/DP layout). megatron-core 0.16's default,
# "fully_sharded_model_space", makes flattened ShardedTensors that its own checkpointing then
# refuses ("flattened_range is not supported": the first GPU run's recipe mode).
# "mem_efficient": on save, each DP group's state is gathered over gloo into its first
# rank's host memory only; without it every rank all-gathers the whole group's state (NCCL,
# then host: ~62 GB per rank at Qwen3-30B-A3B) although only the first rank's copy is
# written (the others are not main replicas), so the files are the same. Loading ignores
# the flag: every rank reads its model-parallel share's whole state into host memory, then
# keeps its slice (`launch.layout.node_host_memory_gib`). Other optimizers ignore both keys.
OPTIMIZER_FORMAT = {
    "distrib_optim_sharding_type": "fully_reshardable",
    "distrib_optim_fully_reshardable_mem_efficient": True,
}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _layout() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
        "ep": ps.get_expert_model_parallel_world_size(),
    }


def _adam_states(trainer: SeedTrainer) -> list[dict]:
    """Adam's per-parameter states, of every optimizer (a mixture-of-experts model's expert
    parameters have one of their own: megatron-core chains it to the dense one)."""
    chained = getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer])
    return [state for opt in chained for state in opt.optimizer.state.values()]


def _adam_steps(trainer: SeedTrainer) -> list[int]:
    steps = []
    for state in _adam_states(trainer):
        step = state.get("step")
        steps.append(int(step.item() if torch.is_tensor(step) else step or 0))
    return steps


def save_checkpoint(
    trainer: SeedTrainer, root: str | Path, hf_config: dict, tokenizer_dir=None
) -> Path:
    """Write a complete checkpoint of the trainer at its current step; every rank calls it."""
    from megatron.core import dist_checkpointing

    root = Path(root)
    name = f"step_{trainer.state.step:06d}"
    tmp, final = root / f"{name}.tmp", root / name
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "optimizer").mkdir(parents=True)
        (tmp / "rng").mkdir()
    _barrier()
    trainer.sync_params()
    save_model(trainer.model.module, tmp, hf_config=hf_config, tokenizer_from=tokenizer_dir)
    model_sd = trainer.model.module.sharded_state_dict(prefix="")
    sharded = trainer.optimizer.sharded_state_dict(model_sd, metadata=OPTIMIZER_FORMAT)
    dist_checkpointing.save(sharded, str(tmp / "optimizer"))
    torch.save(rng_states(), tmp / "rng" / f"rank_{_rank():05d}.pt")
    _barrier()
    if _rank() == 0:
        state = {
            "step": trainer.state.step,
            "data_position": trainer.state.data_position,
            "extra": trainer.state.extra,
            "layout": _layout(),
            "adam_step": max(_adam_steps(trainer), default=0),
        }
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        write_text(root / "latest", name + "\n")
    _barrier()
    return final


def rng_states() -> dict[str, Any]:
    """This rank's RNG: CPU torch, Python, numpy, and on CUDA the device generators and
    Megatron's model-parallel CUDA RNG tracker (dropout, init); those two are None on CPU."""
    cuda, tracker = None, None
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        cuda = torch.cuda.get_rng_state_all()
        tracker = tensor_parallel.get_cuda_rng_tracker().get_states()
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": cuda,
        "cuda_tracker": tracker,
    }


def restore_rng(rng: dict[str, Any]) -> None:
    """Put back what `rng_states` saved (CUDA parts only where saved and CUDA is here)."""
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        if rng.get("cuda") is not None:
            torch.cuda.set_rng_state_all(rng["cuda"])
        if rng.get("cuda_tracker") is not None:
            tensor_parallel.get_cuda_rng_tracker().set_states(rng["cuda_tracker"])
    elif rng.get("cuda") is not None:
        warnings.warn(
            "checkpoint has CUDA RNG state but CUDA is absent: not restored", stacklevel=2
        )


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under `root`; None where none was written (no
    ``latest``). A ``latest`` that names no complete checkpoint is a damaged job folder:
    `CommandError` rather than a silent fresh start over it."""
    marker = Path(root) / "latest"
    if not marker.is_file():
        return None
    name = marker.read_text(errors="replace").strip()
    path = Path(root) / name
    if not name or "/" in name or not (path / "trainer_state.json").is_file():
        raise CommandError(f"{marker} names {name!r}, which is no complete checkpoint in {root}")
    return path


class _Layout(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True, extra="forbid")
    tp: int
    pp: int
    dp: int
    ep: int


class _TrainerState(pydantic.BaseModel):
    """trainer_state.json as `save_checkpoint` writes it."""

    model_config = pydantic.ConfigDict(strict=True, extra="forbid")
    step: int
    data_position: int
    extra: dict[str, Any]
    layout: _Layout
    adam_step: int


def check_checkpoint(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """A trainer checkpoint whole before a resumed run loads it: the model
    (`validate_megatron_dir`, at this layout) and the optimizer dist-checkpoints, the trainer
    state of its types, every rank's RNG file whole. Returns the model's spec; `CommandError`
    naming the file."""
    from megatron_seed.models.checks import (
        check_dist_checkpoint,
        first_error,
        validate_megatron_dir,
    )

    path = Path(path)
    spec = validate_megatron_dir(path, tp, pp, ep)
    check_dist_checkpoint(path / "optimizer")
    state = path / "trainer_state.json"
    try:
        saved = _TrainerState.model_validate_json(state.read_bytes())
    except pydantic.ValidationError as err:
        raise CommandError(f"{state}: {first_error(err)}") from None
    ranks = saved.layout.tp * saved.layout.pp * saved.layout.dp
    for rank in range(ranks):  # every rank of the run that wrote it saved its RNG
        rng = path / "rng" / f"rank_{rank:05d}.pt"
        if not rng.is_file():
            raise CommandError(f"{rng} is missing (the checkpoint was written by {ranks} ranks)")
        # torch.save writes a zip: its directory, at the end, shows a file cut short or
        # another kind of file without unpickling it
        if not zipfile.is_zipfile(rng):
            raise CommandError(f"{rng}: not a file torch.save wrote (cut short?)")
    return spec


def load_checkpoint(trainer: SeedTrainer, path: str | Path, load_optimizer: bool = True) -> None:
    """Restore weights, optimizer, trainer state and (on the same layout) RNG."""
    from megatron.core import dist_checkpointing

    path = Path(path)
    state = json.loads((path / "trainer_state.json").read_text())
    load_model(trainer.model.module, path)
    if load_optimizer:
        model_sd = trainer.model.module.sharded_state_dict(prefix="")
        sharded = trainer.optimizer.sharded_state_dict(
            model_sd, is_loading=True, metadata=OPTIMIZER_FORMAT
        )
        loaded = dist_checkpointing.load(sharded, str(path / "optimizer"))
        trainer.optimizer.load_state_dict(loaded)
        # Loading re-initialises Adam's state without its step count: put it back.
        for param_state in _adam_states(trainer):
            if "step" in param_state:
                step = param_state["step"]
                value = float(state["adam_step"])
                param_state["step"] = torch.tensor(value) if torch.is_tensor(step) else value
    trainer.state = TrainerState(state["step"], state["data_position"], state.get("extra", {}))
    rng_file = path / "rng" / f"rank_{_rank():05d}.pt"
    if state["layout"] == _layout() and rng_file.is_file():
        restore_rng(torch.load(rng_file, weights_only=False))
    elif _rank() == 0:
        warnings.warn(
            f"checkpoint layout {state['layout']} differs from {_layout()}: RNG not restored",
            stacklevel=2,
        )


def export_hf(trainer: SeedTrainer, path: Path, hf_config: dict, tokenizer_from: str) -> None:
    """The trainer's weights as a HF folder (for evaluation and serving), written by rank 0;
    a collective: every rank calls it."""
    stream = trainer.export_weights()
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_hf_checkpoint(stream, path, hf_config, tokenizer_from=tokenizer_from)
    else:
        for _ in stream:  # this rank's part of the gather
            pass
