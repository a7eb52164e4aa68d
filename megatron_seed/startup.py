"""What a `seed` process sets before its libraries load, for itself and every process it
starts (Ray workers, torchrun ranks inherit the environment).

Third-party warnings that say nothing to this project's user are filtered one by one, each
with its reason; every other warning still shows. A Ray cluster this process starts
authenticates with a token of its own, held in the environment, instead of a token Ray
would write into the home folder.
"""

from __future__ import annotations

import os
import re
import secrets
import warnings
from collections.abc import Mapping

# (start of the message, category, why it says nothing here)
QUIET: tuple[tuple[str, type[Warning], str], ...] = (
    (
        "Apex is not installed",
        UserWarning,
        "megatron-core falls back to torch's norm; the project never uses Apex",
    ),
    (
        "Transformer Engine and Apex are not installed",
        UserWarning,
        "megatron-core on a CPU node (no TE there by design) falls back to torch's optimizer "
        "kernels; GPU images have TE",
    ),
    (
        "`torch.distributed.all_gather_into_tensor` is deprecated",
        FutureWarning,
        "megatron-core's MoE token dispatcher calls it (once per rank); torch still runs it",
    ),
    (
        "full scope is deprecated",
        UserWarning,
        "megatron-core warns about its own default cuda_graph_scope; CUDA graphs are off",
    ),
)


def quiet_third_party() -> None:
    """Filter `QUIET` here and, through PYTHONWARNINGS, in every child process."""
    entries = []
    for prefix, category, _why in QUIET:
        warnings.filterwarnings("ignore", message=re.escape(prefix), category=category)
        entries.append(f"ignore:{prefix}:{category.__name__}")
    given = os.environ.get("PYTHONWARNINGS", "")
    missing = [e for e in entries if e not in given.split(",")]
    if missing:
        os.environ["PYTHONWARNINGS"] = ",".join([given, *missing] if given else missing)


def use_own_ray_token() -> None:
    """Before `ray.init` starts a cluster here: give it a token of its own (`ray_auth_env`)
    and make this process use it too.

    Ray reads its auth mode into a cached config when `ray` is first imported; a mode set in
    the environment afterwards reaches the cluster's processes but not this one, which then
    cannot connect ("InvalidAuthToken ... RAY_AUTH_MODE is currently 'disabled'"). So the
    cache is refreshed here the way Ray's own token set-up refreshes it."""
    env = ray_auth_env(os.environ)
    if not env:
        return
    os.environ.update(env)
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ray_auth_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a Ray cluster started here needs: token authentication with a fresh
    token in the environment (children joining the cluster inherit it), unless the user
    chose a mode (`RAY_AUTH_MODE`) or a token (`RAY_AUTH_TOKEN`)."""
    if "RAY_AUTH_MODE" in environ or "RAY_AUTH_TOKEN" in environ:
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
