"""The real engine actor and the fake implement exactly the fleet's `EngineActor` surface:
the same public methods with the same parameters (names, kinds, defaults), no more."""

from __future__ import annotations

import inspect

import pytest

from megatron_seed.rollout.fleet import EngineActor, VLLMEngineActor
from megatron_seed.testbed.fake_engine import FakeEngineActor

# `ray.remote(cls)` rewrites the class's methods in place to take this keyword (tracing), so
# once any test has made an actor of the class, the signatures carry it.
RAY_TRACE_PARAM = "_ray_trace_ctx"


def _surface(cls: type, exclude: tuple[str, ...] = ()) -> dict[str, list[tuple]]:
    """Public methods (and `__init__`) of `cls` -> their parameters (name, kind, default)."""
    out = {}
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if (name.startswith("_") and name != "__init__") or name in exclude:
            continue
        params = inspect.signature(fn).parameters.values()
        out[name] = [(p.name, p.kind, p.default) for p in params if p.name != RAY_TRACE_PARAM]
    return out


def _mismatch(cls: type, exclude: tuple[str, ...] = ()) -> list[str]:
    """How `cls` departs from `EngineActor` (empty: it implements exactly it)."""
    want, got = _surface(EngineActor), _surface(cls, exclude)
    problems = [f"missing {n}" for n in sorted(want.keys() - got.keys())]
    problems += [f"extra {n}" for n in sorted(got.keys() - want.keys())]
    problems += [
        f"{n}: {got[n]} != {want[n]}" for n in sorted(want.keys() & got.keys()) if got[n] != want[n]
    ]
    return problems


def test_the_check_holds_after_ray_has_made_actors_of_the_classes() -> None:
    ray = pytest.importorskip("ray")
    ray.remote(VLLMEngineActor), ray.remote(FakeEngineActor)  # rewrites the methods in place
    assert RAY_TRACE_PARAM in inspect.signature(VLLMEngineActor.wake).parameters
    assert _mismatch(VLLMEngineActor) == []
    assert _mismatch(FakeEngineActor, exclude=FakeEngineActor.INSPECTION) == []


def test_the_protocol_is_the_fleets_surface() -> None:
    assert {"generate", "advance", "update_weights", "load_bucket", "wake"} <= _surface(
        EngineActor
    ).keys()


def test_the_vllm_actor_implements_exactly_the_protocol() -> None:
    assert _mismatch(VLLMEngineActor) == []


def test_the_fake_implements_exactly_the_protocol_plus_its_inspection_methods() -> None:
    assert not set(FakeEngineActor.INSPECTION) & _surface(EngineActor).keys()
    assert _mismatch(FakeEngineActor, exclude=FakeEngineActor.INSPECTION) == []


@pytest.mark.parametrize("change", ["missing", "extra", "signature"])
def test_the_check_sees_a_departure(change: str) -> None:
    members = dict(vars(VLLMEngineActor))
    if change == "missing":
        del members["wake"]
    elif change == "extra":
        members["pause"] = lambda self: None
    else:
        members["sleep"] = lambda self, level=2: None
    bad = type("Bad", (), members)
    assert [p.split()[0].rstrip(":") for p in _mismatch(bad)] == [
        {"missing": "missing", "extra": "extra", "signature": "sleep"}[change]
    ]
