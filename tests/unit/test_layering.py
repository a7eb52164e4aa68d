"""Dependencies point one way: the library never imports the CPU test bed, environments never
import the library (their shared API module imports nothing of the project), and nothing
outside `envs/alfworld/` imports ALFWorld code or knows its task marker."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_seed.cli import COMMANDS, DEFAULT_JOB

REPO = Path(__file__).resolve().parents[2]
LIBRARY = ("megatron_seed", "envs", "launch")


def _modules(exclude: str) -> list[str]:
    names = []
    for package in LIBRARY:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts).removesuffix(".__init__")
            if not name.startswith(exclude):
                names.append(name)
    return names


def _python_importing(modules: list[str], code: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that imports `modules`, then runs `code`."""
    code = (
        f"import importlib, sys\nfor name in {modules!r}:\n    importlib.import_module(name)\n"
        + code
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def _loads_test_bed(modules: dict[str, str]) -> list[str]:
    """The keys of ``modules`` (label -> module) whose import, in a fresh process one after
    another, loads a module of the test bed."""
    code = (
        "import importlib, json, sys\n"
        "bad = []\n"
        f"for label, module in {modules!r}.items():\n"
        "    importlib.import_module(module)\n"
        "    if any(m.startswith('megatron_seed.testbed') for m in sys.modules):\n"
        "        bad.append(label)\n"
        "        for m in [m for m in sys.modules if m.startswith('megatron_seed.testbed')]:\n"
        "            del sys.modules[m]\n"
        "print(json.dumps(bad))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def into_test_bed() -> list[str]:
    """Every `seed` command's module but the default job's (labelled ``seed NAME``), then
    every library module outside the test bed: those that load the test bed."""
    commands = {f"seed {n}": m for n, (m, _) in COMMANDS.items() if n != DEFAULT_JOB}
    library = {name: name for name in _modules("megatron_seed.testbed")}
    return _loads_test_bed({**commands, **library})


def test_the_library_never_imports_the_test_bed(into_test_bed: list[str]) -> None:
    modules = _modules("megatron_seed.testbed")
    assert "megatron_seed.pipeline.stage2" in modules and len(modules) > 50
    assert into_test_bed == []


def test_no_command_but_the_default_job_lives_in_the_test_bed(into_test_bed: list[str]) -> None:
    """`seed compare`, `seed bench`, `seed smoke`, ...: product code; `seed run` alone is
    the test bed's (the routing table names each command's module)."""
    assert COMMANDS[DEFAULT_JOB][0].startswith("megatron_seed.testbed.")
    assert {"compare", "bench", "smoke", "train", "eval"} <= set(COMMANDS)
    assert [label for label in into_test_bed if label.startswith("seed ")] == []


def test_the_checker_sees_a_test_bed_import(tmp_path: Path, monkeypatch) -> None:
    """The same check names the command and the module that do import the test bed, and
    only those."""
    (tmp_path / "bad_module.py").write_text("import megatron_seed.testbed.profiles\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    modules = {
        "seed games": "megatron_seed.pipeline.commands_games",
        "seed run": COMMANDS[DEFAULT_JOB][0],
        "seed compare": "megatron_seed.compare.commands",
        "bad": "bad_module",
    }
    assert _loads_test_bed(modules) == ["seed run", "bad"]


ALFWORLD_IMPORT = re.compile(
    r"^\s*(?:from|import)\s+(?:alfworld|textworld|envs\.alfworld)\b", re.MULTILINE
)
MARKER = "Your task is " + "to"  # ALFWorld's task line, split so this file does not hold it


def _outside_alfworld() -> list[Path]:
    files = []
    for package in (*LIBRARY, "tools"):
        for path in (REPO / package).rglob("*.py"):
            if "envs/alfworld" not in path.relative_to(REPO).as_posix():
                files.append(path)
    return files


def test_alfworld_lives_in_its_own_package() -> None:
    files = _outside_alfworld()
    assert any(p.name == "stage2.py" for p in files)
    offenders = [
        str(p.relative_to(REPO))
        for p in files
        if ALFWORLD_IMPORT.search(p.read_text()) or MARKER in p.read_text()
    ]
    assert offenders == []
    # and the patterns do find what they look for
    assert ALFWORLD_IMPORT.search((REPO / "envs/alfworld/env.py").read_text())
    assert MARKER in (REPO / "envs/alfworld/prompt.py").read_text()


WEBSHOP_IMPORT = re.compile(r"^\s*(?:from|import)\s+envs\.webshop\b", re.MULTILINE)
WEBSHOP_MARKER = "Your shopping " + "task:"  # WebShop's task line, split as MARKER is


def test_webshop_lives_in_its_own_package() -> None:
    """Outside `envs/webshop/` WebShop is a registry name (`envs.spec`) and a test-bed
    profile: no library module imports its package or knows its task line."""
    files = [
        p
        for package in (*LIBRARY, "tools")
        for p in (REPO / package).rglob("*.py")
        if "envs/webshop" not in p.relative_to(REPO).as_posix()
    ]
    assert any(p.name == "stage2.py" for p in files)
    offenders = [
        str(p.relative_to(REPO))
        for p in files
        if WEBSHOP_IMPORT.search(p.read_text()) or WEBSHOP_MARKER in p.read_text()
    ]
    assert offenders == []
    assert WEBSHOP_IMPORT.search((REPO / "envs/webshop/__init__.py").read_text())
    assert WEBSHOP_MARKER in (REPO / "envs/webshop/prompt.py").read_text()


def _rank_tests(source: str) -> list[str]:
    """The functions of `source` that branch on which trainer rank they run on (a
    comparison with `rank()` / `get_rank()`), outside a nested `role` chooser."""
    found = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                if child.name != "role":
                    visit(child, child.name)
                continue
            if isinstance(child, ast.Compare):
                calls = [n for n in ast.walk(child) if isinstance(n, ast.Call)]
                names = {getattr(c.func, "attr", getattr(c.func, "id", None)) for c in calls}
                if names & {"rank", "get_rank", "_rank"}:
                    found.append(fn)
            visit(child, fn)

    visit(ast.parse(source), "<module>")
    return sorted(set(found))


def test_stage2_phases_never_test_the_rank() -> None:
    """Roles are objects (`pipeline.roles`): only the choice of this rank's role (`role`
    inside `_setup`) may branch on the rank."""
    stage2 = (REPO / "megatron_seed/pipeline/stage2.py").read_text()
    assert len(stage2.splitlines()) <= 300
    offenders = {}
    for path in sorted((REPO / "megatron_seed/pipeline").glob("*.py")):
        if found := _rank_tests(path.read_text()):
            offenders[path.name] = found
    assert offenders == {}
    # and the checker finds one
    assert _rank_tests("def phase(run):\n    if rank() == 0:\n        pass\n") == ["phase"]


PROJECT = ("megatron_seed", "envs", "launch", "tools", "tests")


def _imports(source: str) -> set[str]:
    """Every module a source imports (at any depth: function-level imports included)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _offenders(files: list[Path], banned: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{p.relative_to(REPO) if p.is_relative_to(REPO) else p.name}: {name}"
        for p in files
        for name in _imports(p.read_text())
        if name.split(".")[0] in banned
    )


def test_environments_import_nothing_of_the_library() -> None:
    files = sorted((REPO / "envs").rglob("*.py"))
    assert any(p.name == "oracle.py" for p in files) and len(files) > 30
    assert _offenders(files, ("megatron_seed", "launch", "tools", "tests")) == []
    # the API module imports nothing of the project, not even another environment module
    assert _offenders([REPO / "envs" / "api.py"], PROJECT) == []


def test_the_import_checker_sees_a_library_import(tmp_path: Path) -> None:
    """The same check fails for an environment module that imports the library, also from
    inside a function."""
    bad = tmp_path / "bad_env.py"
    bad.write_text("def f():\n    from megatron_seed.skills import prompt\n")
    assert _offenders([bad], ("megatron_seed",)) == ["bad_env.py: megatron_seed.skills"]
    api_like = tmp_path / "api_like.py"
    api_like.write_text("import json\nfrom envs.spec import get_env\n")
    assert _offenders([api_like], PROJECT) == ["api_like.py: envs.spec"]


def test_training_and_the_sft_sequences_never_import_the_rollout_side() -> None:
    """The trainer and Stage 1's SFT sequences (also Stage 2's replay batch) tokenise with
    `data/`; the same process then imports the analyzer, so the check sees a rollout import."""
    train = [m for m in _modules("megatron_seed.testbed") if m.startswith("megatron_seed.train")]
    assert "megatron_seed.train.trainer" in train
    code = (
        "from megatron_seed.pipeline.stage1 import sft_sequence\n"
        "from megatron_seed.benchmarks.synthetic import annotated_record\n"
        "from megatron_seed.models.tiny_tokenizer import build_tokenizer\n"
        "tok = build_tokenizer(['hello world'], 300)\n"
        "record = annotated_record('g', True, 'open the drawer before taking the key')\n"
        "for layout in ('record', 'continuation'):\n"
        "    assert sft_sequence(tok, record, layout).input_ids\n"
        "def rollout():\n"
        "    return sorted(m for m in sys.modules if m.startswith('megatron_seed.rollout'))\n"
        "print(rollout())\n"
        "import megatron_seed.rollout.analyzer\n"
        "print(rollout())\n"
    )
    proc = _python_importing(train, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = proc.stdout.strip().splitlines()[-2:]
    assert before == "[]", before
    assert "megatron_seed.rollout.analyzer" in after


def _imports_named(source: str) -> set[str]:
    """`_imports`, plus each `from PACKAGE import NAME` as PACKAGE.NAME (a module or not)."""
    names = _imports(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_models_import_no_recipe() -> None:
    """Model code (shapes, specs, conversion, checkpoints) never reads the named configs:
    shapes and their parameter arithmetic live in `models/shapes.py`, and the recipes pair
    them with training configs (also from inside a function)."""
    files = sorted((REPO / "megatron_seed" / "models").rglob("*.py"))
    assert any(p.name == "shapes.py" for p in files)
    recipes = "megatron_seed.recipes"
    bad = sorted(
        f"{p.name}: {name}"
        for p in files
        for name in _imports_named(p.read_text())
        if name == recipes or name.startswith(recipes + ".")
    )
    assert bad == []
    assert _imports_named("def f():\n    from megatron_seed import recipes\n") >= {recipes}


def _module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports: at module and function level, and those only
    a type checker reads (under `if TYPE_CHECKING:`: a dependency all the same). `from
    PACKAGE import MODULE` is an edge to the module; `from PACKAGE import NAME`, to the
    package's `__init__`."""
    files: dict[str, Path] = {}
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    edges.add(sub if sub in files else node.module)
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_between_files() -> None:
    """No module imports, however indirectly and if only for its types, a module that imports
    it (the rollout's weight transfer and its worker extension used to, through the CPU MoE
    re-pack, now in `rollout/cpu_moe.py`; the Stage-2 helpers and the driver did, for the run
    state, now in `pipeline/run_state.py` and handed to the driver's phases only)."""
    graph = _module_graph(("megatron_seed", "envs", "launch"))
    assert len(graph) > 150
    assert _cycles(graph) == []
    # the check finds one, through a function-level import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
