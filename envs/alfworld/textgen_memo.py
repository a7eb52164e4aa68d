"""A memo for TextWorld's text-grammar parser, which ALFWorld's engine calls at every step.

`textworld.envs.pddl.textgen` turns each feedback template into symbols with a tatsu parser
before it fills them in (`ContextSensitiveGrammar.derive`), and an ALFWorld step derives a
few dozen templates: parsing them again is most of a step's time (~86 ms a step on 2 cores).
The templates are a game's fixed text, so the parse of one is kept and a deep copy handed
out each time (`derive` writes each symbol's context onto what it gets). The text a game
prints is the same with and without the memo (tests/unit/test_envs_alfworld.py).
"""

from __future__ import annotations

import copy
from typing import Any

_MEMO_MARK = "_seed_memo"


def install() -> None:
    """Put the memo in front of textgen's parser (once per process; idempotent)."""
    from textworld.envs.pddl import textgen

    parse = textgen._parse_and_convert
    if getattr(parse, _MEMO_MARK, False):
        return
    cache: dict[tuple, Any] = {}

    def memoized(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("trace"):  # TextWorld's own grammar tracing: not memoised
            return parse(*args, **kwargs)
        kwargs.pop("trace", None)
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = parse(*args, **kwargs)
        return copy.deepcopy(cache[key])

    setattr(memoized, _MEMO_MARK, True)
    memoized.uncached = parse  # type: ignore[attr-defined]
    textgen._parse_and_convert = memoized
