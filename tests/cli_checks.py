"""What every refused command must look like: exit status 2 and one line on stderr,
``seed COMMAND: error: ...``, with no traceback."""

from __future__ import annotations

from typing import Any

from megatron_seed import cli


def refused_in_one_line(capsys: Any, argv: list[str], *needles: str) -> str:
    """Run ``seed ARGV``; assert it is refused in one line holding every needle; the line."""
    assert cli.main(argv) == 2
    _out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"seed {argv[0]}: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
