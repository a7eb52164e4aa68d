"""Where engines run and how a slot is (re)started.

An engine that reserves GPUs gets its own placement group of `engine_tp` one-GPU bundles
(`STRICT_PACK`: never across nodes), made once per slot: a restarted engine returns to it,
and Ray moves it if its node is lost; vLLM's TP workers use its bundles. Ray never restarts
an engine itself (it would reload the original checkpoint): the fleet does, then replays the
last synced weights into it."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from megatron_seed.rollout.fleet.actor import engine_env
from megatron_seed.rollout.fleet.errors import FleetError

if TYPE_CHECKING:
    from megatron_seed.rollout.fleet.spec import FleetSpec

log = logging.getLogger(__name__)


class EngineSlots:
    """The engine actors of a fleet, one per slot, with their nodes and placement groups.

    `actors` given: a connected client's view of another process's engines (never started
    or restarted here)."""

    def __init__(
        self,
        name: str,
        model_dir: str,
        spec: FleetSpec,
        actor_cls: type,
        actors: list[Any] | None = None,
    ) -> None:
        import ray

        self.name, self.model_dir, self.spec, self.actor_cls = name, model_dir, spec, actor_cls
        self.tp = spec.engine.tensor_parallel_size
        self.groups: list[Any] = [None] * spec.engines
        if actors is None:
            actors = [self._start(i) for i in range(spec.engines)]
            self.actors = actors
            self.wait_ready(list(range(spec.engines)))
        self.actors = list(actors)
        # (node name, Ray node id) of every engine: logged, and checked when one dies
        self.nodes: list[tuple[str, str]] = ray.get([e.node.remote() for e in self.actors])

    def _start(self, index: int) -> Any:
        import ray

        s = self.spec
        engine = replace(
            s.engine,
            seed=index if s.engine.seed is None else s.engine.seed,  # distinct streams
            weight_transfer=s.transport,
        )
        options: dict[str, Any] = dict(
            max_restarts=0,  # restarts are ours: Ray's would reload the original checkpoint
            runtime_env={"env_vars": engine_env(s.threads_per_engine)},
            num_cpus=s.cpus_per_engine,
            num_gpus=s.gpus_per_engine,
        )
        if s.gpus_per_engine:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group(index),
                placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True,  # vLLM's TP workers land in it
            )
            # TP=1: the engine is its own worker on bundle 0's GPU; TP>1: vLLM's Ray
            # workers take the bundles' GPUs and the actor itself none
            options["num_gpus"] = s.gpus_per_engine / self.tp if self.tp == 1 else 0
        actor_cls = ray.remote(self.actor_cls)
        return actor_cls.options(**options).remote(self.model_dir, engine, s.threads_per_engine)

    def _placement_group(self, index: int) -> Any:
        """Slot `index`'s placement group: `engine_tp` one-GPU bundles on one node."""
        import ray
        from ray.util.placement_group import placement_group

        if self.groups[index] is None:
            s = self.spec
            per_gpu = s.gpus_per_engine / self.tp
            bundle = {"GPU": per_gpu, **({"CPU": c} if (c := s.cpus_per_engine) else {})}
            group = placement_group(
                [dict(bundle) for _ in range(self.tp)],
                strategy="STRICT_PACK",
                name=f"{self.name}-engine-{index}",
            )
            try:
                ray.get(group.ready(), timeout=s.start_timeout_s)
            except Exception as exc:
                ray.util.remove_placement_group(group)
                raise FleetError(
                    f"engine {index}: no node has {self.tp} x {per_gpu:g} free GPUs "
                    f"(placement group not ready in {s.start_timeout_s:g} s: {exc})"
                ) from exc
            self.groups[index] = group
        return self.groups[index]

    def wait_ready(self, indices: list[int]) -> None:
        """`FleetError` unless the engines of `indices` start within `start_timeout_s`."""
        import ray

        refs = [self.actors[i].ready.remote() for i in indices]
        try:
            ray.get(refs, timeout=self.spec.start_timeout_s)
        except Exception as exc:
            raise FleetError(
                f"engine(s) {indices} failed to start from {self.model_dir}: {exc}"
            ) from exc

    def replace(self, index: int, attempt: int, reason: str) -> None:
        """Kill slot `index`'s actor and start a fresh one (the original checkpoint)."""
        import ray

        check_node(index, self.nodes[index], self.spec.gpus_per_engine, reason)
        log.warning("restarting engine %d (restart %d): %s", index, attempt, reason)
        with contextlib.suppress(Exception):
            ray.kill(self.actors[index], no_restart=True)
        self.actors[index] = self._start(index)
        self.wait_ready([index])
        self.nodes[index] = ray.get(self.actors[index].node.remote())

    def close(self) -> None:
        """Stop every engine and free the placement groups."""
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        for group in self.groups:
            if group is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(group)


def check_node(index: int, node: tuple[str, str], gpus: float, reason: str) -> None:
    """`FleetError` at once when engine `index` went down with its `node` (name, Ray id) and
    no node has the `gpus` to restart it (waiting would only hang until `start_timeout_s`)."""
    import ray

    name, node_id = node
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    if node_id in alive:
        return
    free = float(ray.available_resources().get("GPU", 0.0))
    if float(gpus) > free:
        raise FleetError(
            f"engine {index} was lost with node {name} (it left the Ray cluster), and "
            f"no node has the {float(gpus):g} free GPU(s) to restart it; last failure: {reason}"
        )


def is_death(exc: BaseException) -> bool:
    """Whether `exc` is an engine actor's death or a missed deadline."""
    import ray.exceptions as rex

    return isinstance(exc, rex.RayActorError | rex.GetTimeoutError)
