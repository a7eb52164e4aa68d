"""Process groups for the Megatron trainer and a spawner for T x P x D CPU/GPU processes.

`init_parallel` works under torchrun (reads RANK/WORLD_SIZE/MASTER_ADDR) and under
`spawn` (which sets the same variables). CPU runs use gloo and `compat.enable_cpu_mode()`;
GPU runs use NCCL.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from megatron_seed.models.compat import enable_cpu_mode, megatron_without_te, model_parallel_seed


class DeviceError(RuntimeError):
    """The requested device is not what this machine offers; one line."""


RENDEZVOUS_FILE = "SEED_RENDEZVOUS_FILE"  # set by `spawn` for its ranks (CPU, gloo)


def resolve_device(requested: str = "auto") -> str:
    """The device plan: "cuda" or "cpu", decided once (`ParallelConfig.device`).

    "cuda" when CUDA is unusable and "cpu" when it is visible are errors, never a silent
    switch (a GPU job must not train at CPU speed because of a driver or
    CUDA_VISIBLE_DEVICES problem)."""
    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        build = torch.version.cuda or "none (a CPU build of torch)"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise DeviceError(
            f"parallel.device is 'cuda' but CUDA is unusable here (torch CUDA build: {build}; "
            f"CUDA_VISIBLE_DEVICES={visible!r}; devices seen: {torch.cuda.device_count()})"
        )
    if requested == "cpu" and available:
        raise DeviceError(
            "parallel.device is 'cpu' but CUDA is visible: run with CUDA_VISIBLE_DEVICES= "
            "to train on the CPU"
        )
    if requested not in ("cuda", "cpu"):
        raise DeviceError(f"parallel.device must be auto, cpu or cuda, got {requested!r}")
    return requested


def init_parallel(
    tp: int = 1, pp: int = 1, seed: int = 1234, device: str = "auto", ep: int = 1
) -> None:
    """Initialise torch.distributed (if needed) and Megatron's TP/PP/DP groups on the
    device `resolve_device(device)` plans; `ep` > 1: the experts of a mixture-of-experts
    model are split over `ep` ranks of each data-parallel group (expert TP = TP)."""
    from megatron.core import parallel_state as ps

    on_gpu = resolve_device(device) == "cuda"
    megatron_without_te()
    if on_gpu:
        # one hardware queue per device, before the CUDA context exists: Megatron's TP
        # communication overlap needs kernels to start in issue order
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    else:
        enable_cpu_mode()
    if not dist.is_initialized():
        backend = "nccl" if on_gpu else "gloo"
        kwargs: dict[str, Any] = {}
        if os.environ.get("SEED_NCCL_TIMEOUT_S"):  # launched jobs: a stuck collective fails
            kwargs["timeout"] = datetime.timedelta(seconds=int(os.environ["SEED_NCCL_TIMEOUT_S"]))
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        store = os.environ.pop(RENDEZVOUS_FILE, None)  # children of a rank do not inherit it
        if store:
            # `spawn`'s ranks meet through a file: a port picked free can be taken (by Ray, by
            # another job's server) before rank 0 listens on it
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            kwargs.update(init_method=f"file://{store}", rank=rank, world_size=world)
        else:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group(backend=backend, **kwargs)
    world = dist.get_world_size()
    model_parallel = tp * pp * ep
    if world % model_parallel:
        sizes = "TP*PP" if ep == 1 else "TP*PP*EP"
        raise ValueError(f"world size {world} is not divisible by {sizes} = {model_parallel}")
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
    )
    torch.manual_seed(seed)
    model_parallel_seed(seed)


def destroy_parallel() -> None:
    """Tear down Megatron's groups and the default process group."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def free_port() -> int:
    """An unused TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the ranks of a CPU `spawn` import before their function runs: a fork server imports
# them once per process, and each rank forks from it (2 ranks: ~7 s of imports -> ~0.3 s)
FORKSERVER_PRELOAD = [
    "megatron_seed.models.parallel",
    "megatron.core.models.gpt",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.auto.modeling_auto",
]


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a Slurm cpuset, `taskset`), not the
    node's count, so that ranks sharing a node with other jobs split only their own cores."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _start_context() -> Any:
    """How `spawn` starts its ranks: from a fork server on CPU; on a GPU machine as fresh
    interpreters (a server that imported torch may have touched the CUDA driver, which a
    forked process cannot use)."""
    if torch.cuda.is_available():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the server runs
    return ctx


def _worker(
    rank: int,
    world: int,
    store: str,
    state: tuple[dict[str, str], str, list[str]],
    call: bytes,
    queue: Any,
) -> None:
    environ, folder, path = state
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        {RENDEZVOUS_FILE: store},
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    os.chdir(folder)
    sys.path[:] = path
    torch.set_num_threads(max(1, usable_cpus() // world))
    try:
        fn, args = pickle.loads(call)
        result = fn(*args)
        # Plain pickle bytes: tensors sent through torch's shared-memory reducer would die
        # with this process before the parent reads them.
        queue.put((rank, "ok", pickle.dumps(result)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
        raise
    finally:
        with contextlib.suppress(Exception):
            destroy_parallel()
        _stop_own_ray()


def _stop_own_ray() -> None:
    """Shut down the Ray this rank started or joined (Stage 2's rollout session on rank 0).
    A spawned rank leaves through `os._exit`, so Ray's own exit hook never runs: without
    this, a Ray cluster the rank started loses its raylet abruptly and leaves its dashboard
    and runtime-env agents running, orphaned."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            ray.shutdown()


def spawn(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    """Run `fn(*args)` in `world_size` new processes; return each rank's result.

    On CPU the ranks fork from a server that has imported `FORKSERVER_PRELOAD` (one per
    calling process); with CUDA they are fresh interpreters. Either way a rank sees this
    process's environment variables, working folder and import path at the call.

    `fn` must be importable (module level). A failure in any rank raises `RuntimeError`
    carrying that rank's traceback. SIGTERM to this process is passed on to the ranks (they
    decide how to stop; Stage 2 checkpoints at the next update boundary).
    """
    ctx = _start_context()
    queue = ctx.Queue()
    # the ranks start in this process's state: its environment, folder and import path (a
    # forked server's are those of its own start), the function and arguments unpickled there
    state = (dict(os.environ), os.getcwd(), list(sys.path))
    call = pickle.dumps((fn, args))
    with tempfile.TemporaryDirectory(prefix="seed-spawn-") as folder:
        store = os.path.join(folder, "rendezvous")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, store, state, call, queue))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        with _forward_sigterm(procs):
            return _collect(procs, queue, world_size)


@contextlib.contextmanager
def _forward_sigterm(procs: list[Any]) -> Iterator[None]:
    """While the ranks run, SIGTERM to this process goes to each of them instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signum)

    old = signal.signal(signal.SIGTERM, forward)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _collect(procs: list[Any], queue: Any, world_size: int) -> list[Any]:
    """Each rank's result, in rank order; `RuntimeError` with the first failure."""
    results: dict[int, Any] = {}
    errors: list[str] = []
    while len(results) + len(errors) < world_size:
        if not any(p.is_alive() for p in procs) and queue.empty():
            codes = [p.exitcode for p in procs]
            errors.append(f"a worker exited without reporting (exit codes {codes})")
            break
        try:
            rank, status, payload = queue.get(timeout=1.0)
        except Exception:
            continue
        if status == "ok":
            results[rank] = pickle.loads(payload)
        else:
            errors.append(f"rank {rank}:\n{payload}")
            break
    for p in procs:
        p.join(timeout=5 if errors else None)
        if p.is_alive():
            p.terminate()
    if errors:
        raise RuntimeError("distributed run failed: " + errors[0])
    return [results[r] for r in range(world_size)]
