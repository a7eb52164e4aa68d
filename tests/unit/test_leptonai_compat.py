"""The leptonai alias that lets nemo-run 0.11.1 import next to leptonai 0.47."""

import importlib
import sys


def test_v1_names_are_the_v2_modules() -> None:
    v1 = importlib.import_module("leptonai.api.v1.types.affinity")
    v2 = importlib.import_module("leptonai.api.v2.types.affinity")
    assert v1 is v2
    assert v1.__spec__.name == "leptonai.api.v2.types.affinity"  # its own spec, not the alias
    assert sys.modules["leptonai.api.v1.types.affinity"] is v2


def test_nemo_run_imports_its_lepton_executor() -> None:
    import nemo_run

    assert nemo_run.LeptonExecutor.__module__.startswith("nemo_run.core.execution")


def test_other_modules_untouched() -> None:
    import leptonai_v1_compat

    finder = next(f for f in sys.meta_path if isinstance(f, leptonai_v1_compat._Alias))
    assert finder.find_spec("leptonai.api.v2.types") is None
    assert finder.find_spec("json") is None
