"""Fleet pieces that need no engine: bucketing, flat buckets, transport names and argument
checks, the objstore backend in vLLM's factories, the synced-weights store, chunking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_seed.rollout import weight_sync as ws
from megatron_seed.rollout.fleet.client import _balanced_chunks
from megatron_seed.rollout.fleet.replay import _FleetState


def _stream(num_layers: int = 3, h: int = 64) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(n, torch.randn(8, h, generator=g)) for n in _names(num_layers)]


def _names(num_layers: int) -> list[str]:
    out = ["model.embed_tokens.weight"]
    for i in range(num_layers):
        p = f"model.layers.{i}."
        out += [p + "input_layernorm.weight"]
        out += [p + f"self_attn.{x}_proj.{k}" for x in "qkv" for k in ("weight", "bias")]
        out += [p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight"]
        out += [p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")]
    return [*out, "model.norm.weight", "lm_head.weight"]


def test_fusion_keys():
    assert (
        ws.fusion_key("model.layers.3.self_attn.k_proj.bias") == "model.layers.3.self_attn.qkv_proj"
    )
    assert ws.fusion_key("model.layers.3.mlp.up_proj.weight") == "model.layers.3.mlp.gate_up_proj"
    assert ws.fusion_key("model.layers.3.mlp.down_proj.weight") == "model.layers.3.mlp.down_proj"
    assert ws.fusion_key("lm_head.weight") == "lm_head"
    # every expert of a layer is one vLLM FusedMoE module; the router is a module of its own
    expert = "model.layers.3.mlp.experts.17.down_proj.weight"
    assert ws.fusion_key(expert) == "model.layers.3.mlp.experts"
    assert ws.fusion_key("model.layers.3.mlp.gate.weight") == "model.layers.3.mlp.gate"


def test_buckets_never_split_the_experts_of_an_moe_layer():
    """Qwen3-MoE's export order (`hf_names`): at any bucket size, one layer's experts travel
    in one bucket (vLLM's reload of a split layer gives garbage), dense tensors still split."""
    from megatron_seed.models.convert import hf_names
    from megatron_seed.models.qwen import QwenSpec
    from megatron_seed.models.tiny import TINY_QWEN3_MOE

    spec = QwenSpec.from_hf_config({**TINY_QWEN3_MOE, "num_hidden_layers": 3})
    stream = [(n, torch.zeros(4, 4)) for n in hf_names(spec)]
    buckets = list(ws.iter_buckets(iter(stream), 1))
    experts = [b for b in buckets if any(".mlp.experts." in n for n, _ in b)]
    assert len(experts) == 3  # one per layer, each with all 8 experts x gate/up/down
    assert all(len(b) == 8 * 3 for b in experts)
    assert len(buckets) > len(experts) + 3 * 5


@pytest.mark.parametrize("bucket_bytes", [1, 2048, 4096, 1 << 30])
def test_buckets_keep_fused_modules_together_and_cover_the_stream_once(bucket_bytes):
    stream = _stream()
    buckets = list(ws.iter_buckets(iter(stream), bucket_bytes))
    flat = [n for b in buckets for n, _ in b]
    assert flat == [n for n, _ in stream]
    seen: dict[str, int] = {}
    for i, b in enumerate(buckets):
        for n, _ in b:
            assert seen.setdefault(ws.fusion_key(n), i) == i, f"{n} split across buckets"
    one = 8 * 64 * 4
    if bucket_bytes == 1:  # one fused module per bucket: q,k,v (+biases) = 6 tensors
        assert max(len(b) for b in buckets) == 6
    if bucket_bytes == 4096:  # closes at >= 4096 bytes, overshoot at most one fused module
        assert all(sum(ws.tensor_bytes(t) for _, t in b) < 4096 + 6 * one for b in buckets)
        assert len(buckets) > 3
    if bucket_bytes == 1 << 30:
        assert len(buckets) == 1


def test_buckets_reject_bad_sizes_and_scattered_fused_tensors():
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(ws.iter_buckets(iter([]), 0))
    t = torch.zeros(4, 4)
    scattered = [
        ("model.layers.0.self_attn.q_proj.weight", t),
        ("model.layers.0.mlp.down_proj.weight", t),
        ("model.layers.0.self_attn.k_proj.weight", t),
    ]
    with pytest.raises(ValueError, match="adjacent"):
        list(ws.iter_buckets(iter(scattered), 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_flat_bucket_round_trip(dtype):
    tensors = [
        ("a", torch.arange(12).reshape(3, 4).to(dtype)),
        ("b", torch.ones(5).to(dtype)),
        ("c", torch.zeros(0).to(dtype)),
    ]
    flat = ws.flatten_bucket(tensors)
    assert isinstance(flat.data, np.ndarray) and flat.nbytes == sum(
        ws.tensor_bytes(t) for _, t in tensors
    )
    flat.data.setflags(write=False)  # as read from the object store
    back = ws.unflatten_bucket(flat)
    for (n, t), (m, u) in zip(tensors, back, strict=True):
        assert n == m and u.dtype == t.dtype and torch.equal(u, t)


def test_transports_are_vllm_backends_and_objstore_is_registered_in_both_factories():
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from megatron_seed.rollout import transfer

    assert [transfer.vllm_backend(t) for t in ("objstore", "ipc", "nccl")] == [
        transfer.OBJSTORE, "ipc", "nccl",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown weight transport 'shm'"):
        transfer.vllm_backend("shm")
    transfer.register()
    transfer.register()  # idempotent
    assert WeightTransferEngineFactory._registry[transfer.OBJSTORE]() is transfer.ObjectStoreEngine
    trainer = WeightTransferTrainerFactory._registry[transfer.OBJSTORE]()
    assert trainer is transfer.ObjectStoreTrainerEngine


def test_export_source_casts_tees_and_counts():
    from megatron_seed.rollout.transfer import ExportSource

    seen = []
    src = ExportSource(iter(_stream(1)), dtype=torch.bfloat16, tee=lambda n, t: seen.append(n))
    out = list(src)
    assert all(t.dtype == torch.bfloat16 for _, t in out) and seen == [n for n, _ in out]
    assert src.tensors == len(out) and src.bytes == sum(t.numel() * 2 for _, t in out)
    with pytest.raises(ValueError, match="metadata up front"):
        src.metadata()


def test_export_meta_matches_the_export(tmp_path):
    from megatron_seed.models.convert import HFCheckpoint
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.rollout.transfer import export_meta

    ckpt = HFCheckpoint(make_tiny_qwen(tmp_path / "m"))
    meta = export_meta(ckpt.spec, torch.bfloat16)
    assert [m.name for m in meta] == sorted(ckpt.names(), key=[m.name for m in meta].index)
    assert {m.name: m.shape for m in meta} == {n: ckpt.shape(n) for n in ckpt.names()}
    assert {m.dtype for m in meta} == {torch.bfloat16}


def test_engine_sleep_is_gpu_only_on_cpu():
    from megatron_seed.rollout.engine import VLLMEngine

    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    with pytest.raises(NotImplementedError, match="GPU-only"):
        VLLMEngine("/nonexistent", enable_sleep_mode=True)
    engine = object.__new__(VLLMEngine)
    engine.on_gpu = False
    with pytest.raises(NotImplementedError, match="GPU"):
        engine.sleep()
    with pytest.raises(NotImplementedError, match="GPU"):
        engine.wake()
    # the guards of a GPU engine (no vLLM call is reached)
    engine.on_gpu, engine.sleep_mode, engine._asleep = True, False, set()
    engine._updating, engine._paused = False, False
    with pytest.raises(RuntimeError, match="enable_sleep_mode=True"):
        engine.sleep()
    engine._asleep = {"weights", "kv_cache"}
    with pytest.raises(RuntimeError, match="weights are asleep"):
        engine.start_weight_update()
    with pytest.raises(RuntimeError, match="weights are asleep"):
        engine.update_weights([("w", torch.zeros(1))])
    with pytest.raises(RuntimeError, match="asleep"):
        engine._check_ready()
    engine._asleep = set()
    with pytest.raises(RuntimeError, match="outside a weight update"):
        engine.receive({})


def test_fleet_needs_ray_and_a_model_dir(tmp_path):
    import ray

    from megatron_seed.rollout.fleet import Fleet, FleetError

    if not ray.is_initialized():
        with pytest.raises(FleetError, match=r"ray.init\(\)"):
            Fleet(str(tmp_path))


def test_state_replays_partially_overridden_syncs_in_order():
    import ray

    started = not ray.is_initialized()
    if started:  # the state keeps its buckets in Ray's object store
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        _state_replays(ray)
    finally:
        if started:
            ray.shutdown()


def _state_replays(ray):
    state = _FleetState()

    def bucket(names, value):  # (names, [ref]) as the sender stages a bucket
        flat = ws.flatten_bucket([(n, torch.full((2,), float(value))) for n in names])
        return names, [ray.put(flat)]

    state.stage(*bucket(["a", "b"], 1))
    state.stage(*bucket(["c"], 1))
    state.commit()
    state.stage(*bucket(["b"], 2))  # partial sync: only b changes
    state.commit()
    replay = {}
    for b in state.kept:
        replay.update(dict(ws.unflatten_bucket(ray.get(b.ref))))
    assert {k: float(v[0]) for k, v in replay.items()} == {"a": 1.0, "b": 2.0, "c": 1.0}
    assert len(state.kept) == 3
    state.stage(*bucket(["a", "b", "c"], 3))  # full sync drops everything older
    state.commit()
    assert len(state.kept) == 1
    state.stage(*bucket(["a"], 9))
    state.abort()  # a failed sync leaves the last committed weights
    assert len(state.kept) == 1 and state.syncs == 3
    state.stage_file(["a", "b", "c"], "/replay/x.safetensors")
    assert state.commit() == []  # the in-memory bucket it overrode has no file
    state.stage_file(["a", "b", "c"], "/replay/y.safetensors")
    assert state.commit() == ["/replay/x.safetensors"]  # overridden: delete it


def test_a_sync_holds_at_most_one_replay_bucket_twice(monkeypatch):
    """The state actor copies each replay bucket into an object of its own (it must outlive
    the sender); the sender's object is dropped once that copy is made, and the sender waits
    for it before putting more than `MAX_STAGING` buckets ahead, so a sync never holds the
    replay copy twice. A slow fake actor: a copy happens when its ack is awaited."""
    import ray

    from megatron_seed.rollout.fleet.replay import _Replay

    live: set[str] = set()  # the sender's objects not yet copied by the state
    most = [0]

    class Ack:
        def __init__(self, work):
            self.work, self.done, self.value = work, False, None

        def result(self):
            if not self.done:
                self.value, self.done = self.work(), True
            return self.value

    def put(value):
        ref = f"sender{len(puts)}"
        puts.append(ref)
        live.add(ref)
        most[0] = max(most[0], len(live))
        return ref

    def get(x, timeout=None):
        return [a.result() for a in x] if isinstance(x, list) else x.result()

    class State:  # the actor handle: a method call is queued until its ack is awaited
        def __init__(self):
            self.copies: list[str] = []
            self.stage = type("M", (), {"remote": self._stage})()
            self.commit = type("M", (), {"remote": lambda _: Ack(lambda: [])})()

        def _stage(self, names, refs):
            def copy():
                (ref,) = refs
                live.discard(ref)  # the actor's copy is made; the sender's goes
                self.copies.append(ref)
                return len(self.copies)

            return Ack(copy)

    puts: list[str] = []
    monkeypatch.setattr(ray, "put", put)
    monkeypatch.setattr(ray, "get", get)
    state = State()
    replay = _Replay(state, "memory", None, bucket_bytes=1)  # one bucket per fused module
    for name, tensor in _stream(2):
        replay.add(name, tensor)
    replay.commit()
    assert len(puts) > 5 and state.copies == puts  # every bucket copied once, in order
    assert live == set() and most[0] == _Replay.MAX_STAGING + 1 == 2, most[0]  # of >5


def test_balanced_chunks_are_contiguous_and_cover_all():
    for costs, parts in [
        ([1] * 10, 2),
        ([1] * 3, 4),
        ([50, 1, 1, 1, 1, 1], 2),
        ([5, 5, 5, 5, 5, 5, 5], 3),
    ]:
        chunks = _balanced_chunks(costs, parts)
        assert len(chunks) == parts
        assert [i for c in chunks for i in c] == list(range(len(costs)))
    assert _balanced_chunks([1] * 10, 2) == [list(range(5)), list(range(5, 10))]


def test_an_engine_lost_with_its_node_fails_at_once_when_no_gpu_is_free(monkeypatch):
    """No restart that could only hang: the node is gone and no other node has a free GPU."""
    import ray

    from megatron_seed.rollout.fleet import FleetError
    from megatron_seed.rollout.fleet.placement import check_node

    n1, n2 = ("n1", "id-1"), ("n2", "id-2")
    alive = [{"NodeID": "id-1", "Alive": True}, {"NodeID": "id-2", "Alive": False}]
    monkeypatch.setattr(ray, "nodes", lambda: alive)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 2.0})
    check_node(0, n1, 1.0, "died")  # its node is alive: a restart may proceed
    with pytest.raises(FleetError, match="engine 1 was lost with node n2"):
        check_node(1, n2, 1.0, "ActorDiedError")
    monkeypatch.setattr(ray, "available_resources", lambda: {"GPU": 1.0})
    check_node(1, n2, 1.0, "ActorDiedError")  # another node has a free GPU: restart there
    monkeypatch.setattr(ray, "available_resources", lambda: {})
    check_node(1, n2, 0.0, "ActorDiedError")  # a CPU engine needs no GPU to restart


def test_engines_do_not_inherit_the_trainers_single_cuda_queue(monkeypatch):
    """A trainer rank sets CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's TP overlap); engines
    started from it run with CUDA's default, through the runtime environment their vLLM TP
    workers inherit."""
    from megatron_seed.rollout.fleet import engine_env

    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    env = engine_env(3)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "3"
