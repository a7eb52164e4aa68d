"""Serve `leptonai.api.v1.*` from `leptonai.api.v2.*` (leptonai 0.47 removed api.v1).

nemo-run <= 0.11.1 imports its Lepton executor's types from leptonai.api.v1 at
`import nemo_run`; leptonai 0.47 keeps those modules, same names, under api.v2.
Loaded from leptonai_v1_compat.pth. Only names under leptonai.api.v1 are touched,
and nothing at all when the installed leptonai still has its own api.v1.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

_OLD, _NEW = "leptonai.api.v1", "leptonai.api.v2"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self):
        self._real_spec = {}

    def find_spec(self, name, path=None, target=None):
        if name != _OLD and not name.startswith(_OLD + "."):
            return None
        if name == _OLD and importlib.machinery.PathFinder.find_spec(name, path) is not None:
            return None  # an older leptonai with a real api.v1
        if name != _OLD and getattr(sys.modules.get(_OLD), "__name__", _OLD) == _OLD:
            return None  # its submodules: the real ones too
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        module = importlib.import_module(_NEW + spec.name[len(_OLD) :])
        self._real_spec[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamped the alias spec on the v2 module; give it its own back
        module.__spec__ = self._real_spec.pop(module.__spec__.name)


def install():
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
