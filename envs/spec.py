"""The registry that names environments (``--env NAME``), and the default one.

``get_env(name)`` takes a registered name (``alfworld``) or ``package.module:ATTR`` naming an
`envs.api.EnvSpec` (or a function returning one) in any importable module: how a new
environment plugs in without editing this file. A spec is checked when it is loaded
(`EnvSpec.check`): a malformed one fails there, in one line. Specs cross process boundaries
by name: env workers and trainer processes look the name up again.
"""

from __future__ import annotations

import dataclasses
import importlib

from envs.api import EnvSpec

DEFAULT_ENV = "alfworld"  # the environment a command plays when none is named


class EnvSpecError(ValueError):
    """An unknown environment name or a malformed spec."""


# name -> "module:attribute" of a spec (or of a function returning one); imported on demand
_BUILTIN: dict[str, str] = {
    "alfworld": "envs.alfworld:spec",
    "search": "envs.search:spec",
    "sokoban": "envs.sokoban:spec",
    "webshop": "envs.webshop:spec",
}
ENV_HELP = f"environment: {', '.join(sorted(_BUILTIN))}, or module:ATTR of a spec"
_LOADED: dict[str, EnvSpec] = {}  # this process's specs, by the name they were asked for


def get_env(name: str) -> EnvSpec:
    """The spec of ``name``: a built-in name, or ``module:ATTR``."""
    if name in _LOADED:
        return _LOADED[name]
    target = _BUILTIN.get(name, name)
    if ":" not in target:
        raise EnvSpecError(
            f"unknown environment {name!r}; choose from {sorted(_BUILTIN)} or module:ATTR"
        )
    module_name, attr = target.split(":", 1)
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise EnvSpecError(f"cannot load environment {name!r}: {err}") from None
    spec = obj() if callable(obj) and not isinstance(obj, EnvSpec) else obj
    if not isinstance(spec, EnvSpec):
        raise EnvSpecError(f"{target} is not an EnvSpec (got {type(spec).__name__})")
    if spec.name != name:  # found by import path: remember it under that path too
        spec = dataclasses.replace(spec, name=name)
    try:
        spec.check()
    except TypeError as err:
        raise EnvSpecError(str(err)) from None
    _LOADED[name] = spec
    return spec
