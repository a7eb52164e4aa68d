"""Megatron dist-checkpoints of the model (any TP x PP layout on save and on load).

Folder layout written by `save_model`:
  hf/        config.json (+ tokenizer files): what the model is
  model/     megatron.core.dist_checkpointing of the model's sharded state dict
The trainer adds `optimizer/` and `trainer_state.json` beside these (train/checkpoint.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from megatron_seed.data.tokenizer import TOKENIZER_FILES


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def save_model(
    model: Any,
    out_dir: str | Path,
    hf_config: dict[str, Any] | None = None,
    tokenizer_from: str | Path | None = None,
) -> Path:
    """Save this rank's shard; every rank of the job must call it."""
    from megatron.core import dist_checkpointing

    out = Path(out_dir)
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    if rank0:
        (out / "model").mkdir(parents=True, exist_ok=True)
        if hf_config is not None:
            (out / "hf").mkdir(parents=True, exist_ok=True)
            (out / "hf" / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
            if tokenizer_from is not None:
                for f in Path(tokenizer_from).iterdir():
                    if f.name.startswith(TOKENIZER_FILES):
                        shutil.copy(f, out / "hf" / f.name)
    _barrier()
    dist_checkpointing.save(_unwrap(model).sharded_state_dict(prefix=""), str(out / "model"))
    _barrier()
    return out


def load_model(model: Any, ckpt_dir: str | Path) -> None:
    """Load a dist-checkpoint into this rank's (possibly differently sharded) model."""
    from megatron.core import dist_checkpointing

    path = Path(ckpt_dir) / "model"
    if not path.is_dir():
        raise FileNotFoundError(f"no Megatron model checkpoint at {path}")
    inner = _unwrap(model)
    state = dist_checkpointing.load(inner.sharded_state_dict(prefix=""), str(path))
    inner.load_state_dict(state, strict=False)


def read_hf_config(ckpt_dir: str | Path) -> dict[str, Any]:
    """The HF config stored with a megatron-seed checkpoint."""
    path = Path(ckpt_dir) / "hf" / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{ckpt_dir} has no hf/config.json")
    return json.loads(path.read_text())
