"""Progress bars for phases whose steps are few and long (a batch of episodes can take half a
minute on 2 cores): the bar redraws itself every few seconds, so its elapsed time keeps
moving between steps and a slow step never looks like a hung job."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def live_bar(total: int, desc: str, every_s: float = 5.0, enabled: bool = True) -> Iterator[Any]:
    """A tqdm bar of `total` steps (`bar.update(n)` as they finish) redrawn every `every_s`
    seconds until the block ends; `enabled=False`: a silent bar."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, disable=not enabled)
    stop = threading.Event()

    def redraw() -> None:
        while not stop.wait(every_s):
            bar.refresh()

    ticker = threading.Thread(target=redraw, name=f"{desc} bar", daemon=True)
    if enabled:
        ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()
        bar.close()
