"""Progress bars for phases whose steps are few and long (a batch of episodes or a Stage-2
update can take half a minute on 2 cores): the bar redraws itself every few seconds, so its
elapsed time keeps moving between steps and a slow step never looks like a hung job."""

from __future__ import annotations

import threading
from typing import Any


class LiveBar:
    """A tqdm bar of `total` steps (`update(n)` as they finish; `initial`: steps done
    before) redrawn every `every_s` seconds until `close()` (or the end of a `with` block);
    `write(line)` prints a line above it. `enabled=False`: a silent bar; by default the
    bar is drawn by one process of a distributed group only (`draws_bars`)."""

    def __init__(
        self,
        total: int,
        desc: str,
        every_s: float = 5.0,
        enabled: bool | None = None,
        initial: int = 0,
    ) -> None:
        from tqdm import tqdm

        enabled = draws_bars() if enabled is None else enabled

        self._bar = tqdm(total=total, desc=desc, initial=initial, disable=not enabled)
        self._stop = threading.Event()
        self._ticker = threading.Thread(
            target=self._redraw, args=(every_s,), name=f"{desc} bar", daemon=True
        )
        if enabled:
            self._ticker.start()

    def _redraw(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self._bar.refresh()

    def update(self, n: int = 1) -> None:
        """`n` more steps are done."""
        self._bar.update(n)

    def write(self, line: str) -> None:
        """Print `line` (stdout) above the bar."""
        self._bar.write(line)

    def close(self) -> None:
        """Stop redrawing and leave the bar's last state on the terminal."""
        self._stop.set()
        if self._ticker.is_alive():
            self._ticker.join()
        self._bar.close()

    def __enter__(self) -> LiveBar:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def draws_bars() -> bool:
    """Whether this process draws progress bars: any process outside torch.distributed, and
    the first of a distributed group (the others would draw the same bar again)."""
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0
