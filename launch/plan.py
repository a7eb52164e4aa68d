"""A validated launch: recipe + node count + overrides, and the job command as data.

`make_plan` applies the user's overrides to a recipe and checks everything that can be
checked without a cluster (recipe name, layout, memory); every failure is one line
(`PlanError`). The job is `JobCommand` data, rendered by the executors; by default it is
`python -m megatron_seed.cli train --recipe NAME [--config-json JSON]`, where JSON holds only
the differences from the recipe's config.

Contract with `seed train`: the trainer ranks are torchrun processes; the fleet's Ray
cluster is at `RAY_ADDRESS` (Slurm; unset for a local run, where the job starts its own
Ray). The fleet's shape reaches the job through the config (`--config-json`): the plan sets
`fleet.engines` (the fleet's GPUs / engine TP) and `fleet.gpus_per_engine` (= engine TP) from
the layout; on a node, fleet GPUs are the CUDA devices after the first
`trainer_ranks_per_node` (with `fleet.colocate`, all of a node's devices: engines and trainer
ranks share them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from launch.layout import NODE_TYPES, ClusterLayout, LayoutError, check_layout
from megatron_seed import recipes
from megatron_seed.config import SeedConfig


class PlanError(ValueError):
    """Bad launch input; one line, raised before anything is submitted."""


# What a cluster profile (`seed launch --cluster-profile`) may say about its nodes, besides
# its Slurm settings: a `launch.layout.NODE_TYPES` name and/or the host RAM in GiB.
PROFILE_NODE_KEYS = ("node_type", "host_memory_gib")


@dataclass(frozen=True)
class JobCommand:
    """What every trainer rank runs: a Python module (`-m`) or script, and its arguments."""

    target: str
    args: tuple[str, ...] = ()
    is_module: bool = True

    def argv(self) -> list[str]:
        """The command after `python` (or after torchrun's own flags)."""
        return [*(["-m"] if self.is_module else []), self.target, *self.args]

    def to_nemo_script(self) -> Any:
        """The `nemo_run.Script` that runs this command (under the executor's launcher)."""
        import nemo_run as run

        return run.Script(
            path=self.target, args=list(self.args), m=self.is_module, entrypoint="python"
        )


def train_command(recipe_name: str, overrides: dict[str, Any]) -> JobCommand:
    """`seed train --recipe NAME [--config-json JSON]`, as run under torchrun."""
    args: list[str] = ["train", "--recipe", recipe_name]
    if overrides:
        args += ["--config-json", json.dumps(overrides, sort_keys=True, separators=(",", ":"))]
    return JobCommand("megatron_seed.cli", tuple(args))


@dataclass(frozen=True)
class LaunchPlan:
    """Everything an executor needs; built only by `make_plan`, so always valid."""

    recipe: recipes.Recipe
    nodes: int
    config: SeedConfig
    layout: ClusterLayout

    @property
    def trainer_world(self) -> int:
        """Number of trainer ranks across all nodes."""
        return self.nodes * self.layout.trainer_ranks_per_node

    @property
    def dp(self) -> int:
        """Data-parallel size of the trainer."""
        return self.trainer_world // (self.config.parallel.tp * self.config.parallel.pp)

    @property
    def fleet_gpus(self) -> int:
        """GPUs of the fleet across all nodes."""
        return self.nodes * self.layout.fleet_gpus_per_node

    @property
    def overrides(self) -> dict[str, Any]:
        """The config's differences from the recipe (nested, JSON-ready)."""
        return _diff(self.recipe.config.to_dict(), self.config.to_dict())

    def job(self) -> JobCommand:
        """The default job: `seed train` of this plan."""
        return train_command(self.recipe.name, self.overrides)


def make_plan(
    recipe_name: str,
    nodes: int = 1,
    *,
    tp: int | None = None,
    pp: int | None = None,
    gpus_per_node: int | None = None,
    fleet_gpus: int | None = None,
    engine_tp: int | None = None,
    config_json: str | None = None,
    colocate: bool = False,
    node_type: str | None = None,
    host_memory_gib: float | None = None,
) -> LaunchPlan:
    """Apply overrides to a recipe and validate the result (`PlanError` on bad input).

    `fleet_gpus` is the fleet's total over all nodes; it must split evenly across nodes, and
    each node's remaining GPUs go to the trainer. `colocate`: the engines share every GPU
    with the trainer (`fleet.colocate` with the "ipc" transport; also set by the config).
    `node_type` (a `launch.layout.NODE_TYPES` name) sets the nodes' GPU and host memory,
    `host_memory_gib` their host RAM (both from a cluster profile; default: the recipe's).
    """
    try:
        recipe = recipes.get(recipe_name)
    except KeyError as err:
        raise PlanError(err.args[0]) from None
    config = _apply_json(recipe.config, config_json)
    if colocate:
        config = dataclasses.replace(
            config, fleet=dataclasses.replace(config.fleet, colocate=True, transport="ipc")
        )
    if engine_tp is not None:
        if engine_tp < 1:
            raise PlanError(f"--engine-tp must be >= 1, got {engine_tp}")
        config = dataclasses.replace(
            config, fleet=dataclasses.replace(config.fleet, engine_tp=engine_tp)
        )
    parallel = config.parallel
    if tp is not None or pp is not None:
        parallel = dataclasses.replace(
            parallel,
            tp=tp if tp is not None else parallel.tp,
            pp=pp if pp is not None else parallel.pp,
        )
        config = dataclasses.replace(config, parallel=parallel)
    if min(parallel.tp, parallel.pp) < 1:
        raise PlanError(f"TP and PP must be >= 1, got TP={parallel.tp} PP={parallel.pp}")
    base = recipe_layout(recipe)
    layout = _on_nodes(_layout(base, nodes, gpus_per_node, fleet_gpus), node_type, host_memory_gib)
    if config.fleet.colocate:
        if fleet_gpus is not None:
            raise PlanError(
                "--fleet-gpus does not apply to colocated engines (every GPU is shared)"
            )
        layout = layout.colocate()
    try:
        check_layout(recipe.model, config, layout, nodes)
    except LayoutError as err:
        hint = ""
        if layout == base and config == recipe.config and nodes >= 1:
            with contextlib.suppress(LayoutError):
                hint = f" (recipe {recipe.name} needs at least {min_nodes(recipe)} nodes)"
        raise PlanError(f"{err}{hint}") from None
    config = _with_fleet(config, layout, nodes)
    return LaunchPlan(recipe=recipe, nodes=nodes, config=config, layout=layout)


def recipe_layout(recipe: recipes.Recipe) -> ClusterLayout:
    """The recipe's per-node GPU split (`ClusterLayout()` with the recipe's changes)."""
    return dataclasses.replace(ClusterLayout(), **recipe.layout)


def min_nodes(recipe: recipes.Recipe, limit: int = 256) -> int:
    """The fewest nodes on which a recipe's layout is valid and fits memory."""
    layout = recipe_layout(recipe)
    for nodes in range(1, limit + 1):
        try:
            check_layout(recipe.model, recipe.config, layout, nodes)
        except LayoutError:
            continue
        return nodes
    raise LayoutError(f"recipe {recipe.name!r} fits on no cluster of up to {limit} nodes")


def _with_fleet(config: SeedConfig, layout: ClusterLayout, nodes: int) -> SeedConfig:
    """The config with the fleet the layout gives: one engine per `engine_tp` fleet GPUs,
    each reserving its GPUs in Ray (a layout without GPUs keeps the config's own fleet)."""
    if not layout.has_gpus:
        return config
    tp = config.fleet.engine_tp
    fleet = dataclasses.replace(
        config.fleet, engines=nodes * layout.fleet_gpus_per_node // tp, gpus_per_engine=float(tp)
    )
    return dataclasses.replace(config, fleet=fleet)


def _layout(
    base: ClusterLayout, nodes: int, gpus_per_node: int | None, fleet_gpus: int | None
) -> ClusterLayout:
    layout = base
    if gpus_per_node is not None and gpus_per_node != layout.gpus_per_node:
        if gpus_per_node < 1 or not layout.has_gpus:
            raise PlanError(f"--gpus-per-node {gpus_per_node} does not apply to this recipe")
        # Keep the recipe's fleet share of each node; the trainer takes the rest.
        fleet = gpus_per_node * layout.fleet_gpus_per_node // layout.gpus_per_node
        layout = dataclasses.replace(
            layout,
            gpus_per_node=gpus_per_node,
            fleet_gpus_per_node=fleet,
            trainer_ranks_per_node=gpus_per_node - fleet,
        )
    if fleet_gpus is not None:
        total = nodes * layout.gpus_per_node
        if fleet_gpus > total:
            raise PlanError(
                f"--fleet-gpus {fleet_gpus} is more than the cluster has "
                f"({max(nodes, 0)} node(s) × {layout.gpus_per_node} GPUs = {total})"
            )
        if fleet_gpus < 0 or nodes < 1 or fleet_gpus % nodes:
            raise PlanError(f"--fleet-gpus {fleet_gpus} does not split evenly over {nodes} node(s)")
        per_node = fleet_gpus // nodes
        layout = dataclasses.replace(
            layout,
            fleet_gpus_per_node=per_node,
            trainer_ranks_per_node=layout.gpus_per_node - per_node,
        )
    return layout


def _on_nodes(
    layout: ClusterLayout, node_type: str | None, host_memory_gib: float | None
) -> ClusterLayout:
    """The layout on the cluster's nodes: a node type's GPU and host memory, then an explicit
    host RAM."""
    if node_type is not None:
        if not isinstance(node_type, str) or node_type not in NODE_TYPES:
            raise PlanError(f"unknown node type {node_type!r}; known: {', '.join(NODE_TYPES)}")
        node = NODE_TYPES[node_type]
        if layout.gpus_per_node > node.gpus:
            raise PlanError(
                f"the layout uses {layout.gpus_per_node} GPUs per node, a {node_type} node "
                f"has {node.gpus}"
            )
        layout = dataclasses.replace(layout, **node.layout_changes())
    if host_memory_gib is not None:
        number = isinstance(host_memory_gib, int | float) and not isinstance(host_memory_gib, bool)
        if not number or host_memory_gib <= 0:
            raise PlanError(f"host_memory_gib must be a number of GiB > 0, got {host_memory_gib!r}")
        layout = dataclasses.replace(layout, host_memory_gib=float(host_memory_gib))
    return layout


def _apply_json(config: SeedConfig, config_json: str | None) -> SeedConfig:
    if not config_json:
        return config
    try:
        overrides = json.loads(config_json)
    except json.JSONDecodeError as err:
        raise PlanError(f"--config-json is not valid JSON: {err}") from None
    if not isinstance(overrides, dict):
        raise PlanError("--config-json must be a JSON object")
    try:
        return config.with_changes(overrides)
    except (TypeError, ValueError) as err:
        raise PlanError(f"--config-json: {err}") from None


def _diff(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            sub = _diff(base[key], value)
            if sub:
                out[key] = sub
        elif base.get(key) != value:
            out[key] = value
    return out
