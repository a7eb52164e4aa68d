"""A phase's bar keeps redrawing its elapsed time while a long step runs."""

from __future__ import annotations

import time

from megatron_seed.progress import LiveBar


def test_the_bar_redraws_while_a_step_runs_and_stops_after(capsys):
    with LiveBar(2, "episodes", every_s=0.05) as bar:
        time.sleep(0.6)  # one slow step: about a dozen redraws
        bar.update(2)
    drawn = [s for s in capsys.readouterr().err.split("\r") if s.startswith("episodes")]
    assert len(drawn) >= 4
    assert "0/2" in drawn[1] and "2/2" in drawn[-1]
    time.sleep(0.2)  # the redraw thread is gone: nothing more is written
    assert capsys.readouterr().err == ""


def test_a_disabled_bar_writes_nothing(capsys):
    with LiveBar(1, "quiet", every_s=0.01, enabled=False) as bar:
        time.sleep(0.05)
        bar.update()
    assert capsys.readouterr().err == ""
