"""Up-front validation of user-supplied checkpoints (fail loud before any compute)."""

from __future__ import annotations

from pathlib import Path

from megatron_seed.errors import CommandError
from megatron_seed.models.qwen import ModelConfigError, QwenSpec


def validate_hf_dir(path: str | Path, tp: int = 1, pp: int = 1, ep: int = 1) -> QwenSpec:
    """Check a HF checkpoint folder and the requested layout; raise CommandError (one line)."""
    from megatron_seed.models.convert import HFCheckpoint

    p = Path(path)
    if not p.is_dir():
        raise CommandError(f"{p} is not a directory")
    try:
        ckpt = HFCheckpoint(p)
        ckpt.spec.check_layout(tp, pp, ep)
    except ModelConfigError as err:
        raise CommandError(str(err)) from None
    return ckpt.spec
