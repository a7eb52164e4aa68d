"""A test's engine in a child process: ``run_json_worker`` writes the request as JSON, runs
``python -m MODULE REQUEST.json`` and reads back the JSON line the worker prints last.

An in-process vLLM engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) keeps global state that a
pytest process cannot shed, so the engine tests (``routes_worker``, ``moe_engine_worker``) run
it in a fresh interpreter and talk to it through one file and one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_json_worker(module: str, request: dict[str, Any], folder: Path, timeout: int) -> Any:
    """The last stdout line of ``python -m module FOLDER/request.json``, parsed as JSON; an
    assertion with the child's stderr tail when it exits non-zero."""
    path = folder / "request.json"
    path.write_text(json.dumps(request))
    proc = subprocess.run(
        [sys.executable, "-m", module, str(path)], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
