"""The registry that names environments (``--env NAME``), and the default one.

``get_env(name)`` takes a registered name (``alfworld``), ``package.module:ATTR`` naming an
`envs.api.EnvSpec` (or a function returning one) in any importable module, or
``path/to/file.py:ATTR`` in a Python file: how a new environment plugs in without editing this
file. A module that fails to import fails here, in one line naming its file and line. A spec
is checked when it is loaded (`EnvSpec.check`): a malformed one fails there, in one line.
Specs cross process boundaries by name: env workers and trainer processes look the name up
again (a file's path is made absolute in the config, `EnvConfig`, so that it means the same
file from any working folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType

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
ENV_HELP = f"environment: {', '.join(sorted(_BUILTIN))}, or module:ATTR or FILE.py:ATTR of a spec"
_FORMS = "module:ATTR or FILE.py:ATTR"
_LOADED: dict[str, EnvSpec] = {}  # this process's specs, by the name they were asked for


def get_env(name: str) -> EnvSpec:
    """The spec of ``name``: a built-in name, ``module:ATTR``, or ``path/to/file.py:ATTR``."""
    if name in _LOADED:
        return _LOADED[name]
    target = _BUILTIN.get(name, name)
    if ":" not in target:
        raise EnvSpecError(
            f"unknown environment {name!r}; choose from {sorted(_BUILTIN)} or {_FORMS}"
        )
    module_name, attr = target.rsplit(":", 1)
    try:
        module = _import(module_name)
    except EnvSpecError:
        raise
    except Exception as err:  # the module's own code failed: SyntaxError, NameError, ...
        where = _origin(err, _source(module_name))
        raise EnvSpecError(f"cannot load environment {name!r}: {where}{_reason(err)}") from None
    if not hasattr(module, attr):
        raise EnvSpecError(f"cannot load environment {name!r}: {module.__file__} has no {attr}")
    obj = getattr(module, attr)
    try:
        spec = obj() if callable(obj) and not isinstance(obj, EnvSpec) else obj
    except Exception as err:
        where = _origin(err, module.__file__ or module_name)
        raise EnvSpecError(f"{target}() failed: {where}{_reason(err)}") from None
    if not isinstance(spec, EnvSpec):
        raise EnvSpecError(f"{target} is not an EnvSpec (got {type(spec).__name__})")
    if spec.name != name:  # found by import path: remember it under that path too
        spec = dataclasses.replace(spec, name=name)
    try:
        spec.check()
    except TypeError as err:
        raise EnvSpecError(str(err)) from None
    except Exception as err:  # a plug-in's own code failed while it was checked
        raise EnvSpecError(f"{target}: {_reason(err)}") from None
    _LOADED[name] = spec
    return spec


def _import(module_name: str) -> ModuleType:
    """An importable module by name, or a Python file by its path (``*.py``: loaded once per
    process under a name made from its absolute path)."""
    if not module_name.endswith(".py"):
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name or module_name.startswith(f"{err.name}."):  # itself
                raise EnvSpecError(f"no module named {module_name!r}") from None
            raise
    path = Path(module_name).resolve()
    if not path.is_file():
        raise EnvSpecError(f"{path} is not a file (an environment spec's module expected)")
    unique = "seed_env_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if unique in sys.modules:
        return sys.modules[unique]
    found = importlib.util.spec_from_file_location(unique, path)
    module = importlib.util.module_from_spec(found)
    sys.modules[unique] = module  # classes defined there can be pickled by this name
    try:
        found.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique]
        raise
    return module


def _source(module_name: str) -> str:
    """The file of a module named by import path or file path (the name itself if unknown)."""
    if module_name.endswith(".py"):
        return str(Path(module_name).resolve())
    try:
        found = importlib.util.find_spec(module_name)
    except Exception:  # a parent package that fails to import
        return module_name
    return (found.origin if found else None) or module_name


def _origin(err: BaseException, source: str) -> str:
    """Where loading a spec failed, as ``FILE:LINE: ``: a syntax error's line, else the
    innermost frame of code outside this registry and importlib; ``source`` (the module's
    file) when the error has no frame of its own (a file holding NUL bytes)."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        return f"{err.filename}:{err.lineno}: "
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if "importlib" not in f.filename and f.filename != __file__]
    return f"{own[-1].filename}:{own[-1].lineno}: " if own else f"{source}: "


def _reason(err: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = (str(err).splitlines() or [""])[0]
    return f"{type(err).__name__}: {text}"[:200]
