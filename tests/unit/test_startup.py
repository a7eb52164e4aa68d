"""A `seed` process filters the known third-party warnings, for itself and its children,
and nothing else; a Ray cluster it starts gets a token in the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from megatron_seed.startup import QUIET, quiet_third_party, ray_auth_env

CHILD = (
    "import warnings\n"
    "warnings.warn('Apex is not installed. Falling back to Torch Norm', UserWarning)\n"
    "warnings.warn('Transformer Engine and Apex are not installed. Falling back', UserWarning)\n"
    "warnings.warn('something this project should hear about', UserWarning)\n"
)


def test_known_warnings_are_filtered_here_and_in_children_and_others_still_show(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")  # the user's own
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # every warning shows, unless filtered after this
        quiet_third_party()
        warnings.warn(
            "Apex is not installed. Falling back to Torch Norm", UserWarning, stacklevel=1
        )
        warnings.warn(
            "full scope is deprecated. Use empty cuda_graph_scope", UserWarning, stacklevel=1
        )
        warnings.warn("Apex is not installed", DeprecationWarning, stacklevel=1)  # another category
    assert [str(w.message) for w in seen] == ["Apex is not installed"]
    env = os.environ["PYTHONWARNINGS"].split(",")
    assert env[0] == "default::DeprecationWarning" and len(env) == 1 + len(QUIET)
    quiet_third_party()  # twice: nothing added twice
    assert os.environ["PYTHONWARNINGS"].split(",") == env
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert child.returncode == 0
    assert "Apex" not in child.stderr and "should hear about" in child.stderr


def test_a_started_ray_gets_its_own_token_unless_the_user_chose():
    env = ray_auth_env({})
    assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 32
    assert env["RAY_AUTH_TOKEN"] != ray_auth_env({})["RAY_AUTH_TOKEN"]
    assert ray_auth_env({"RAY_AUTH_MODE": "disabled"}) == {}
    assert ray_auth_env({"RAY_AUTH_TOKEN": "abc"}) == {}


# Ray imported first (as every job does before its fleet starts), then a cluster started here
RAY_AFTER_IMPORT = """
import os, pathlib, tempfile
import ray
from megatron_seed.startup import use_own_ray_token
use_own_ray_token()
ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="seed-ray-"))
assert ray.get(ray.remote(lambda: 6 * 7).remote()) == 42
assert os.environ["RAY_AUTH_MODE"] == "token"
assert not (pathlib.Path.home() / ".ray").exists()
print("started")
"""


def test_a_cluster_started_after_ray_was_imported_takes_its_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {
        "HOME": str(tmp_path)
    }
    child = subprocess.run(
        [sys.executable, "-c", RAY_AFTER_IMPORT], capture_output=True, text=True, env=env,
        timeout=240,
    )  # fmt: skip
    assert child.returncode == 0 and "started" in child.stdout, child.stderr[-2000:]
