"""Where the rollout's time went: busy, idle and CPU seconds of each engine and env worker,
and the idle share of the machine that drives them, over one update's rollout and analysis."""

from __future__ import annotations

from typing import Any


def accounting(before: Any, after: Any, seconds: dict[str, float]) -> dict[str, float]:
    """The counts between two `usage()` snapshots (None: nothing counted) over the window
    of the `rollout` and `analyze` phases in `seconds`. A worker replaced meanwhile has no
    count and is left out."""
    if before is None or after is None:
        return {}
    window = sum(seconds.get(p, 0.0) for p in ("rollout", "analyze"))
    out: dict[str, float] = {}
    for kind in ("engine", "env"):
        for i, (b, a) in enumerate(zip(before[kind], after[kind], strict=False)):
            if b is None or a is None or a["busy_s"] < b["busy_s"] or a["cpu_s"] < b["cpu_s"]:
                continue
            busy = a["busy_s"] - b["busy_s"]
            out[f"busy/{kind}{i}_s"] = busy
            out[f"idle/{kind}{i}_s"] = max(0.0, window - busy)
            out[f"cpu/{kind}{i}_s"] = a["cpu_s"] - b["cpu_s"]
    busy, idle = (after["machine"][k] - before["machine"][k] for k in ("busy_s", "idle_s"))
    out["cpu/machine_busy_s"] = busy
    out["cpu/machine_idle_share"] = idle / (busy + idle) if busy + idle > 0 else 0.0
    return out
