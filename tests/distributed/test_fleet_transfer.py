"""The fleet's weight transfer, placement and colocation against recording fake engines.

Ray runs with logical GPUs (this machine has none), so engines that reserve GPUs are placed
exactly as on GPU nodes. The fakes (`testbed.fake_engine`) are engines without vLLM: what is
tested is the fleet's own code, the client vLLM's trainer-side engine drives, deadlines,
restarts and the replay copy (the real engines' side is in test_fleet.py).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from megatron_seed.rollout.engine import EngineSpec
from megatron_seed.testbed.fake_engine import FakeEngineActor, Recorder


@pytest.fixture(scope="module")
def ray_gpus():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


def _weights(seed: int, n: int = 6) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    names = ["model.embed_tokens.weight"]
    names += [f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(n) for p in "qkv"]
    return [(name, torch.randn(16, 8, generator=g)) for name in names]


def _fleet(model_dir, tmp_path, engine=None, extra=None, **kw):
    """A fleet of fakes; `extra`: the fakes' options (`EngineSpec.extra`)."""
    from megatron_seed.rollout.fleet import Fleet, FleetSpec

    extra = {"fake_marks": str(tmp_path / "marks"), **(extra or {})}
    engine = replace(engine or EngineSpec(), extra=extra)
    return Fleet(model_dir, FleetSpec(engine=engine, **kw), actor_cls=FakeEngineActor)


def _engine_weights(ray, fleet):
    return ray.get([e.get_weights.remote() for e in fleet.actors])


def test_each_engine_gets_its_own_strict_pack_group_of_engine_tp_gpus(
    ray_gpus, model_dir, tmp_path
):
    ray = ray_gpus
    engine = EngineSpec(tensor_parallel_size=2, gpu_memory_utilization=0.7)
    fleet = _fleet(model_dir, tmp_path, engine=engine, gpus_per_engine=2.0)
    try:
        where = ray.get([e.placement.remote() for e in fleet.actors])
        groups = [w["placement_group"] for w in where]
        assert None not in groups and len(set(groups)) == 2  # one group per engine
        table = ray.util.placement_group_table()
        for g in groups:
            assert table[g]["strategy"] == "STRICT_PACK"
            assert list(table[g]["bundles"].values()) == [{"GPU": 1.0}, {"GPU": 1.0}]
        for w in where:  # vLLM's TP workers take the bundles; the engine gets the sizes
            assert w["tensor_parallel_size"] == 2 and w["gpu_memory_utilization"] == 0.7
            assert "GPU" not in w["resources"]
        assert ray.available_resources().get("GPU", 0) == 0  # 2 engines x 2 GPUs of 4
        assert fleet.on_gpu  # the overlapped rollout drives these engines freely
    finally:
        fleet.close()
    for _ in range(50):  # groups are released with the fleet (asynchronously)
        if ray.available_resources().get("GPU") == 4:
            break
        time.sleep(0.1)
    assert ray.available_resources().get("GPU") == 4
    fleet = _fleet(model_dir, tmp_path, engines=1, gpus_per_engine=1.0)
    try:  # TP=1: the engine is its own worker and holds its bundle's GPU
        (w,) = ray.get([e.placement.remote() for e in fleet.actors])
        assert w["resources"].get("GPU") == 1.0 and w["tensor_parallel_size"] == 1
    finally:
        fleet.close()


def test_a_sync_reaches_every_engine_through_vllms_trainer_engine(ray_gpus, model_dir, tmp_path):
    ray = ray_gpus
    fleet = _fleet(model_dir, tmp_path)
    try:
        weights = _weights(0)
        stats = fleet.update_weights(iter(weights), bucket_bytes=1500)
        assert stats.tensors == len(weights) and stats.restarts == 0
        assert stats.bytes == sum(t.numel() * 4 for _, t in weights)
        for held in _engine_weights(ray, fleet):
            assert held.keys() == dict(weights).keys()
            assert all(torch.equal(held[n], t) for n, t in weights)
    finally:
        fleet.close()


@pytest.mark.parametrize("replay", ["memory", "disk"])
def test_a_stalled_engine_is_dropped_within_the_timeout_and_restarted_with_the_sync(
    ray_gpus, model_dir, tmp_path, replay
):
    ray = ray_gpus
    fleet = _fleet(
        model_dir,
        tmp_path,
        extra={"fake_stall": {1: 60.0}},
        sync_timeout_s=2.0,
        replay=replay,
        replay_dir=str(tmp_path / "replay"),
    )
    try:
        weights = _weights(1)
        t0 = time.monotonic()
        stats = fleet.update_weights(iter(weights), bucket_bytes=1500)
        took = time.monotonic() - t0
        assert took < 20, took  # the 60 s stall did not hold the sync
        assert stats.restarts == 1 and fleet.restarts == [0, 1]
        for held in _engine_weights(ray, fleet):  # the restarted one from the replay copy
            assert all(torch.equal(held[n], t) for n, t in weights)
        if replay == "disk":
            files = list((tmp_path / "replay").rglob("*.safetensors"))
            assert files and stats.buckets == len(files)
            fleet.update_weights(iter(_weights(2)), bucket_bytes=1500)  # overrides all
            assert len(list((tmp_path / "replay").rglob("*.safetensors"))) == len(files)
    finally:
        fleet.close()


def test_an_engine_killed_during_a_sync_is_restarted_with_it(ray_gpus, model_dir, tmp_path):
    import threading

    ray = ray_gpus
    fleet = _fleet(model_dir, tmp_path, extra={"fake_stall": {1: 30.0}}, sync_timeout_s=30)
    try:
        weights = _weights(6)
        killer = threading.Timer(1.0, fleet.kill_engine, args=(1,))
        killer.start()
        t0 = time.monotonic()
        stats = fleet.update_weights(iter(weights), bucket_bytes=1500)
        killer.join()
        assert time.monotonic() - t0 < 20  # the death is seen at once, not after 30 s
        assert stats.restarts == 1 and fleet.restarts == [0, 1]
        for held in _engine_weights(ray, fleet):
            assert all(torch.equal(held[n], t) for n, t in weights)
    finally:
        fleet.close()


def test_a_failed_reload_restarts_the_engine_with_the_last_synced_weights(
    ray_gpus, model_dir, tmp_path
):
    ray = ray_gpus
    fleet = _fleet(model_dir, tmp_path, extra={"fake_fail": [0]})
    try:
        weights = _weights(3)
        stats = fleet.update_weights(iter(weights), bucket_bytes=1 << 20)
        assert stats.restarts == 1 and fleet.restarts == [1, 0]
        for held in _engine_weights(ray, fleet):
            assert all(torch.equal(held[n], t) for n, t in weights)
    finally:
        fleet.close()


def test_a_transfer_that_needs_every_engine_fails_naming_the_stalled_one(ray_gpus, tmp_path):
    """NCCL's broadcast needs every rank: the client raises instead of dropping."""
    ray = ray_gpus
    from megatron_seed.rollout.fleet import WeightSyncError
    from megatron_seed.rollout.fleet.sync import _SyncClient

    actor = ray.remote(FakeEngineActor)
    marks = str(tmp_path / "marks")
    extra = {"fake_stall": {1: 30.0}, "fake_marks": marks}
    engines = [actor.remote("x", EngineSpec(seed=i, extra=extra), 1) for i in range(2)]
    from megatron_seed.rollout.weight_sync import flatten_bucket

    ray.get([e.ready.remote() for e in engines])
    client = _SyncClient(engines, timeout_s=1.0, needs_all=True)
    client.start_weight_update()
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"engine 1 stalled: no answer within 1 s"):
        client.update_weights({"data": flatten_bucket(_weights(5))})
        client.finish_weight_update()
    assert time.monotonic() - t0 < 10
    for e in engines:
        ray.kill(e)


def test_nccl_engines_take_consecutive_ranks_of_one_group(ray_gpus, tmp_path):
    """vLLM's NCCL sender gives every worker rank_offset 1; engine i's TP workers must
    start at 1 + i * TP."""
    ray = ray_gpus
    from megatron_seed.rollout.fleet.sync import _SyncClient

    actor = ray.remote(FakeEngineActor)
    engines = [actor.remote("x", EngineSpec(seed=i), 1) for i in range(3)]
    client = _SyncClient(engines, timeout_s=30.0, needs_all=True, ranks_per_engine=2)
    client.init_weight_transfer_engine({"rank_offset": 1, "world_size": 7, "master_port": 1})
    infos = ray.get([e.get_init_info.remote() for e in engines])
    assert [i["rank_offset"] for i in infos] == [1, 3, 5]
    assert {i["world_size"] for i in infos} == {7}
    for e in engines:
        ray.kill(e)


def test_packed_buffers_fit_the_largest_tensor():
    from vllm.distributed.weight_transfer.base import ParamMeta

    from megatron_seed.rollout.fleet import packed_bytes

    meta = [ParamMeta("emb", torch.bfloat16, (152064, 3584)), ParamMeta("n", torch.float32, (8,))]
    assert packed_bytes(64 << 20, meta) == 152064 * 3584 * 2  # > 1 GiB: vLLM's default
    assert packed_bytes(64 << 20, None) == 64 << 20


def test_a_sync_that_fails_midway_leaves_every_engine_on_the_last_synced_weights(
    ray_gpus, model_dir, tmp_path
):
    ray = ray_gpus
    fleet = _fleet(model_dir, tmp_path)
    try:
        good = _weights(7)
        fleet.update_weights(iter(good), bucket_bytes=1500)

        def broken():
            yield from _weights(8)[:5]
            raise RuntimeError("the trainer's export failed")

        with pytest.raises(RuntimeError, match="export failed"):
            fleet.update_weights(broken(), bucket_bytes=1500)
        assert fleet.restarts == [0, 0]  # finished and replayed, not restarted
        for held in _engine_weights(ray, fleet):
            assert all(torch.equal(held[n], t) for n, t in good)
        ray.get([e.start_weight_update.remote() for e in fleet.actors])  # not stuck
    finally:
        fleet.close()


def test_a_stuck_transfer_raises_once_nothing_moves_for_the_timeout():
    import threading

    from megatron_seed.rollout.fleet import WeightSyncError
    from megatron_seed.rollout.fleet.sync import _watched

    never = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="stalled: nccl broadcast for 1 s"):
        _watched(never.wait, lambda: t0, 1.0, "nccl broadcast")
    assert time.monotonic() - t0 < 5
    _watched(lambda: None, time.monotonic, 1.0, "nothing")  # a finished call returns


def test_colocated_update_order(ray_gpus, model_dir, tmp_path, tiny_tokenizer):
    """engines sleep -> the trainer takes its optimizer state back -> train -> the trainer
    offloads optimizer state, gradients and cached activations -> engines wake their weights
    -> sync -> engines wake their KV cache: neither side takes memory before the other has
    given it (the start-up's order: tests/unit/test_gpu_readiness.py)."""
    ray = ray_gpus
    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.config import SeedConfig
    from megatron_seed.pipeline import stage2
    from megatron_seed.pipeline.metrics import PhaseTimer
    from megatron_seed.pipeline.roles import Leader

    recorder = ray.remote(Recorder).options(name="colocation-events").remote()
    fleet = _fleet(model_dir, tmp_path, extra={"fake_recorder": "colocation-events"})

    from megatron_seed.models.qwen import QwenSpec
    from megatron_seed.models.tiny import TINY_QWEN2

    class Trainer:
        seq_multiple, precision = 1, "fp32"
        spec = QwenSpec.from_hf_config(TINY_QWEN2)
        state = type("S", (), {"data_position": 0, "step": 0})()

        def train_step(self, pb, replay=None):
            stage2_record("trainer:train")
            return {"loss/total": 0.0}

        def export_weights(self, dtype=None):
            stage2_record("trainer:export")
            return iter(_weights(4))

        def release_memory(self):
            stage2_record("trainer:release")

        def reclaim_memory(self):
            stage2_record("trainer:reclaim")

    def stage2_record(event):
        ray.get(recorder.add.remote(event))

    # the config says colocated (its transport is "ipc"); the fake fleet sends by objstore
    cfg = SeedConfig().with_changes({"fleet": {"colocate": True, "transport": "ipc"}})
    session = type("Session", (), {"fleet": fleet})()
    job = stage2.Stage2Job(model_dir=model_dir, games=["g"], out_dir=str(tmp_path), cfg=cfg)
    side = Leader(job, session)
    run = stage2.Run(job, Trainer(), tiny_tokenizer, side, {}, False, None)
    try:
        records = synthetic_records(tiny_tokenizer, groups=1, group_size=2, turns=1)
        stage2.train_and_sync(run, records, PhaseTimer())
        events = ray.get(recorder.get.remote())
    finally:
        fleet.close()
    phases = []
    for e in events:  # collapse the two engines' copies of each step
        step = e.split(":", 1)[1] if e.startswith("engine") else e
        if step in ("update", "init"):
            continue
        if not phases or phases[-1] != step:
            phases.append(step)
    assert phases == [
        "sleep:1", "trainer:reclaim", "trainer:train", "trainer:release", "wake:weights",
        "trainer:export", "start", "finish", "wake:kv_cache",
    ], events  # fmt: skip


def _stream_all(stream, requests):
    """Submit (engine, key, ids) requests, drive the stream until idle: answers, failures."""
    import ray

    from megatron_seed.rollout.engine import SamplingSpec

    for engine, key, ids in requests:
        stream.submit(engine, key, ids, SamplingSpec(), 0)
    answers, failed = {}, {}
    while not stream.idle:
        stream.pump()
        ready, _ = ray.wait(stream.refs(), num_returns=1, timeout=30)
        assert ready, "a call never returned"
        done, lost = stream.collect(ready[0])
        for key, gen in done:
            assert key not in answers, f"{key} answered twice"
            answers[key] = gen
        failed.update(dict(lost))
    return answers, failed


def test_a_stream_resubmits_the_requests_of_an_engine_that_died(ray_gpus, model_dir, tmp_path):
    """Engine 1 dies on its 2nd call: it is restarted with the last synced weights and
    every request it held is answered once, by the new engine, from its own prompt."""
    from megatron_seed.rollout.overlap import FleetStream
    from megatron_seed.testbed.fake_engine import fake_reply

    fleet = _fleet(model_dir, tmp_path, extra={"fake_die_after": {"1": 2}})
    try:
        fleet.update_weights(iter(_weights(3)), bucket_bytes=1 << 10)
        requests = [(i % 2, ("act", i), list(range(i + 1))) for i in range(6)]
        answers, failed = _stream_all(FleetStream(fleet), requests)
        assert failed == {} and fleet.restarts == [0, 1]
        assert not fleet.on_gpu  # CPU engines: the overlapped rollout paces them
        assert answers == {key: fake_reply(ids) for _, key, ids in requests}
        want = dict(_weights(3))
        got = _engine_weights(ray_gpus, fleet)[1]
        assert all(torch.equal(got[n], t) for n, t in want.items())  # replayed before work
    finally:
        fleet.close()


def test_a_stream_fails_the_requests_of_an_engine_it_may_not_restart(ray_gpus, model_dir, tmp_path):
    """max_restarts=0: the dead engine's requests come back as failures naming the cause;
    the other engine's are answered."""
    from megatron_seed.rollout.overlap import FleetStream

    fleet = _fleet(model_dir, tmp_path, max_restarts=0, extra={"fake_die_after": {"1": 1}})
    try:
        requests = [(i % 2, ("act", i), [i, i]) for i in range(4)]
        answers, failed = _stream_all(FleetStream(fleet), requests)
        assert sorted(answers) == [("act", 0), ("act", 2)]
        assert sorted(failed) == [("act", 1), ("act", 3)]
        assert all("max_restarts=0" in why for why in failed.values())
    finally:
        fleet.close()
