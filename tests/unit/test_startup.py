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
