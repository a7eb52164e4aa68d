"""What the first GPU run needs, checked on the CPU: batches reach the model on its device,
no TransformerConfig field is dropped silently, and checkpoints carry the CUDA RNG slots."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from megatron_seed.models import logprobs
from megatron_seed.models.compat import filter_kwargs
from megatron_seed.train.checkpoint import restore_rng, rng_states

SENTINEL = torch.device("meta")  # a device no CPU tensor is on


def _tiny_spec():
    from megatron_seed.models.qwen import QwenSpec

    return QwenSpec(
        model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=True, max_position_embeddings=512, qkv_bias=True,
        qk_norm=False,
    )  # fmt: skip


class _RecordingModel:
    """Stands in for a GPTModel chunk: records the devices of what it is given."""

    def __init__(self) -> None:
        self.devices: list[torch.device] = []

    def __call__(self, input_ids, position_ids, attention_mask, labels):
        self.devices += [input_ids.device, position_ids.device, labels.device]
        return torch.zeros(input_ids.shape, device=input_ids.device)  # nll [b, s]


def test_every_batch_tensor_reaches_the_model_and_the_loss_on_the_model_device(monkeypatch):
    monkeypatch.setattr(logprobs, "_device", lambda: SENTINEL)
    seen = []

    def loss_fn(batch, nll):
        seen.extend(t.device for t in batch.values())
        return nll.sum(), {}

    ids = torch.tensor([[3, 4, 5, 6]])  # [1, 4], on the CPU as collate builds it
    batch = {
        "input_ids": ids,
        "labels": logprobs.shifted_labels(ids),
        "mask": torch.ones(1, 4, dtype=torch.bool),
        "old": torch.zeros(1, 4),
    }
    model = _RecordingModel()
    output, loss_func = logprobs.make_forward_step(loss_fn)(iter([batch]), model)
    loss_func(output)
    assert model.devices and all(d == SENTINEL for d in model.devices), model.devices
    assert seen and all(d == SENTINEL for d in seen), seen


def test_a_packed_micro_batch_reaches_the_model_with_its_segments_on_the_device(monkeypatch):
    """A packed row's `cu_seqlens` go to the model inside `PackedSeqParams` on the model's
    device (TE's thd kernels read them there); `max_seqlen` stays a Python int."""
    from megatron_seed.data.packing import pack

    monkeypatch.setattr(logprobs, "_device", lambda: SENTINEL)
    seen = {}

    def model(input_ids, position_ids, attention_mask, labels, packed_seq_params):
        seen.update(ids=input_ids.device, pos=position_ids.device, params=packed_seq_params)
        return torch.zeros(input_ids.shape, device=input_ids.device)

    plan = pack([3, 2], capacity=8, multiple=8)
    ids = torch.tensor([[3, 4, 5], [6, 7, 0]])
    batch = {
        "input_ids": plan.pack_tensor(ids),
        "labels": plan.pack_tensor(logprobs.shifted_labels(ids)),
        "position_ids": plan.position_ids(),
        "cu_seqlens": plan.cu_seqlens[0],
        "max_seqlen": plan.max_seqlen(0),
    }
    logprobs.make_forward_step(lambda b, nll: (nll.sum(), {}))(iter([batch]), model)
    params = seen["params"]
    assert seen["ids"] == seen["pos"] == SENTINEL and params.qkv_format == "thd"
    for cu in (params.cu_seqlens_q, params.cu_seqlens_kv, params.cu_seqlens_q_padded):
        assert cu.device == SENTINEL and cu.dtype == torch.int32
    assert params.max_seqlen_q == params.max_seqlen_kv == 3
    with pytest.raises(ValueError, match="a packed micro-batch is one row, got 2"):
        logprobs.model_forward(model, {**batch, "input_ids": ids})


def test_a_dropped_config_field_is_an_error_unless_it_is_an_off_switch():
    def old_config(num_layers: int = 1, bf16: bool = False, bias_dropout_fusion: bool = False):
        return None

    kwargs = {"num_layers": 2, "bf16": True, "fp8_recipe": "tensorwise", "apply_rope_fusion": False}
    with pytest.raises(ValueError, match="does not accept fp8_recipe"):
        filter_kwargs(old_config, kwargs, frozenset({"apply_rope_fusion"}))
    del kwargs["fp8_recipe"]
    kept = filter_kwargs(old_config, kwargs, frozenset({"apply_rope_fusion"}))
    assert kept == {"num_layers": 2, "bf16": True}


def test_the_transformer_config_builds_with_nothing_dropped():
    from megatron_seed.models.qwen import transformer_config

    spec = _tiny_spec()
    config = transformer_config(spec, precision="bf16", recompute="full")
    assert config.bf16 and config.recompute_granularity == "full"


def test_rng_states_carry_cuda_slots_and_restore_on_cpu():
    state = rng_states()
    assert state["cuda"] is None and state["cuda_tracker"] is None  # no CUDA here
    first = (torch.rand(3), random.random(), np.random.rand())
    restore_rng(state)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]
    old_format = {k: state[k] for k in ("torch", "python", "numpy")}  # written before CUDA slots
    restore_rng(old_format)
    assert torch.equal(torch.rand(3), first[0])


def test_the_device_plan_fails_fast_instead_of_falling_back(monkeypatch):
    from megatron_seed import recipes
    from megatron_seed.config import SeedConfig
    from megatron_seed.models.parallel import DeviceError, resolve_device

    assert resolve_device("auto") == resolve_device("cpu") == "cpu"  # this machine: no CUDA
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError, match=r"CUDA is unusable.*CUDA_VISIBLE_DEVICES=''"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == resolve_device("cuda") == "cuda"
    with pytest.raises(DeviceError, match="CUDA is visible"):
        resolve_device("cpu")
    assert recipes.get("qwen2.5-7b").config.parallel.device == "cuda"  # GPU recipes insist
    assert recipes.get("tiny").config.parallel.device == "auto"
    with pytest.raises(ValueError, match="device"):
        SeedConfig().with_changes({"parallel": {"device": "tpu"}})


def test_seed_train_asked_for_cuda_on_a_cpu_machine_is_one_line(tmp_path, capsys):
    from megatron_seed import cli

    argv = ["train", "--model", str(tmp_path), "--games", str(tmp_path), "--out", str(tmp_path)]
    argv += ["--config-json", '{"parallel": {"device": "cuda"}}']
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "parallel.device is 'cuda' but CUDA is unusable" in err[0]


@pytest.mark.parametrize(
    ("recipe", "block"),
    [(None, 1), ("delayed", 16), ("tensorwise", 16), ("mxfp8", 32), ("blockwise", 128)],
)
def test_fp8_pads_student_and_teacher_batches_to_the_recipe_block(recipe, block, tiny_tokenizer):
    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.models.fp8 import seq_multiple
    from megatron_seed.train.batch import build_policy_batch

    assert seq_multiple(recipe) == block
    records = synthetic_records(
        tiny_tokenizer, groups=2, group_size=2, turns=2, valid_skill_every=1
    )
    pb = build_policy_batch(records, tiny_tokenizer, pad_to_multiple_of=block)
    plain = build_policy_batch(records, tiny_tokenizer)
    assert pb.teacher is not None
    for padded, base in ((pb.student, plain.student), (pb.teacher, plain.teacher)):
        s, s0 = padded.input_ids.shape[1], base.input_ids.shape[1]
        assert s % block == 0 and s0 <= s < s0 + block
        assert torch.equal(padded.loss_mask[:, :s0], base.loss_mask)  # padding adds no loss token
        assert not padded.loss_mask[:, s0:].any()


def _config(fp8=None, tp=1, sp=False):
    return SimpleNamespace(
        fp8="hybrid" if fp8 else None,
        fp8_recipe=fp8,
        tensor_model_parallel_size=tp,
        sequence_parallel=sp,
    )


def test_the_schedule_refuses_micro_batches_off_the_block():
    logprobs.check_seq_multiple(_config(), 37)
    logprobs.check_seq_multiple(_config("tensorwise"), 64)
    with pytest.raises(ValueError, match="multiple of 32 tokens, got 48"):
        logprobs.check_seq_multiple(_config("mxfp8"), 48)
    # sequence parallelism splits the sequence over TP ranks: the block on every shard
    assert logprobs.token_multiple(_config(tp=4)) == 1
    assert logprobs.token_multiple(_config(tp=4, sp=True)) == 4
    assert logprobs.token_multiple(_config("delayed", tp=3, sp=True)) == 48
    with pytest.raises(ValueError, match=r"sequence parallelism at TP=3 needs .* of 3 tokens"):
        logprobs.check_seq_multiple(_config(tp=3, sp=True), 64)


def test_fp8_recipes_are_checked_against_the_gpu_and_te():
    from megatron_seed.config import SeedConfig
    from megatron_seed.models.fp8 import check_fp8_support

    check_fp8_support(None, None, False)
    check_fp8_support("tensorwise", (9, 0), True)  # H100/H200
    check_fp8_support("blockwise", (9, 0), True)
    with pytest.raises(ValueError, match=r"mxfp8.*10\.0\+.*Blackwell.*this GPU is 9\.0"):
        check_fp8_support("mxfp8", (9, 0), True)
    with pytest.raises(ValueError, match=r"8\.9\+"):
        check_fp8_support("delayed", (8, 0), True)  # A100: no FP8
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        check_fp8_support("tensorwise", None, False)
    with pytest.raises(ValueError, match="needs Transformer Engine"):
        check_fp8_support("tensorwise", (9, 0), False)
    with pytest.raises(ValueError, match="fp8_recipe"):
        SeedConfig().with_changes({"parallel": {"fp8_recipe": "fp4"}})


def test_loaded_models_skip_random_init_and_gpu_ranks_get_one_cuda_queue(monkeypatch):
    from megatron_seed.models import parallel
    from megatron_seed.models.qwen import transformer_config

    spec = _tiny_spec()
    assert transformer_config(spec).perform_initialization
    assert not transformer_config(spec, initialize=False).perform_initialization
    # init_parallel on a CUDA plan sets CUDA_DEVICE_MAX_CONNECTIONS before any CUDA call
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29999"), ("RANK", "0")):
        monkeypatch.setenv(key, value)  # restored afterwards, whatever init_parallel sets
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(parallel, "resolve_device", lambda _d: "cuda")

    class Stop(Exception):
        pass

    def first_cuda_call(*_a):
        assert parallel.os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        raise Stop

    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", first_cuda_call)
    with pytest.raises(Stop):
        parallel.init_parallel(1, 1, device="cuda")


def test_tp_ranks_read_only_their_shard_and_get_what_the_whole_tensor_gives(tmp_path):
    from megatron_seed.models.convert import HFCheckpoint, hf_tensor_for, interleave_qkv
    from megatron_seed.models.tiny import make_tiny_qwen

    make_tiny_qwen(tmp_path)  # 6 query heads in 2 KV groups: one group per TP rank
    ckpt = HFCheckpoint(tmp_path)
    spec, tp = ckpt.spec, 2
    whole = {}
    ckpt_get = ckpt.get
    ckpt.get = lambda name: whole.setdefault(name, ckpt_get(name))  # records full reads
    names = [
        "embedding.word_embeddings.weight",
        "decoder.layers.0.self_attention.linear_qkv.weight",
        "decoder.layers.0.self_attention.linear_qkv.bias",
        "decoder.layers.0.self_attention.linear_proj.weight",
        "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.0.mlp.linear_fc2.weight",
    ]
    shards = {(n, r): hf_tensor_for(n, ckpt, r, tp, 0) for n in names for r in range(tp)}
    assert whole == {}  # nothing was read whole
    layer = "model.layers.0."
    full_qkv = interleave_qkv(spec, *(ckpt_get(f"{layer}self_attn.{p}_proj.weight") for p in "qkv"))
    for r in range(tp):
        assert torch.equal(shards[names[1], r], full_qkv.chunk(tp, dim=0)[r])
        o_proj = ckpt_get(f"{layer}self_attn.o_proj.weight").chunk(tp, dim=1)[r]
        assert torch.equal(shards[names[3], r], o_proj)
        embed = ckpt_get("model.embed_tokens.weight").chunk(tp, dim=0)[r]
        assert torch.equal(shards[names[0], r], embed)


def test_gpu_switches_turn_on_the_fused_and_overlapped_paths_only_on_gpus(monkeypatch):
    from megatron.core.tensor_parallel import layers
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_seed.models.qwen import gpu_switches, transformer_config

    assert not any(gpu_switches(False, 4, True, main_grad=True).values())
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)  # APEX's extension
    on = gpu_switches(True, 2, True, main_grad=True)
    assert all(on.values()), on
    assert not gpu_switches(True, 1, True)["sequence_parallel"]  # nothing to split at TP=1
    # TE's fused RoPE and wgrad accumulation need TE; the accumulation, DDP's main_grad
    assert not gpu_switches(True, 2, False, main_grad=True)["apply_rope_fusion"]
    assert not gpu_switches(True, 2, True, main_grad=False)["gradient_accumulation_fusion"]
    # megatron-core accepts every switch that needs no TE (a dropped one would raise)
    cfg = transformer_config(_tiny_spec(), tp=2, switches=gpu_switches(True, 2, False))
    assert isinstance(cfg, TransformerConfig)
    assert cfg.sequence_parallel and cfg.bias_dropout_fusion and cfg.bias_activation_fusion
    assert not transformer_config(_tiny_spec(), tp=2).sequence_parallel  # CPU default: off


def test_weights_are_gathered_before_anything_reads_them(monkeypatch):
    """With the distributed optimizer's overlapped gather, an optimizer step leaves the
    weights un-gathered until the next forward: an export must gather them first."""
    from megatron_seed.models import convert
    from megatron_seed.train.trainer import SeedTrainer

    calls = []

    class FakeDDP:
        module = object()
        ddp_config = SimpleNamespace(overlap_param_gather=True)

        def start_param_sync(self, force_sync=False):
            calls.append(("gather", force_sync))

    def fake_export(module, spec, dtype):
        calls.append(("export", dtype))
        yield from ()

    monkeypatch.setattr(convert, "export_hf_weights", fake_export)
    trainer = object.__new__(SeedTrainer)
    trainer.model, trainer.spec = FakeDDP(), None
    list(trainer.export_weights(torch.bfloat16))
    assert calls == [("gather", True), ("export", torch.bfloat16)]
    calls.clear()
    trainer.model.ddp_config.overlap_param_gather = False  # no overlap: already gathered
    list(trainer.export_weights())
    assert calls == [("export", None)]


def test_colocated_trainer_hands_its_optimizer_and_grads_to_the_engines(monkeypatch):
    """release_memory: optimizer state to host, grad buffers freed (megatron-core's RL
    offload), once; reclaim_memory brings both back; nothing happens on the CPU."""
    from megatron_seed.train.trainer import SeedTrainer

    calls = []
    optimizer = object()

    class Host:
        def release(self, opt, device):
            calls.append(f"optimizer->host from {device}" if opt is optimizer else "?")

        def reclaim(self, opt, device):
            calls.append(f"optimizer->{device.type}" if opt is optimizer else "?")

    class Model:
        def offload_grad_buffers(self):
            calls.append("grads freed")

        def restore_grad_buffers(self):
            calls.append("grads back")

    trainer = object.__new__(SeedTrainer)
    trainer.optimizer, trainer.model, trainer._released = optimizer, Model(), False
    trainer._host = Host()
    trainer.release_memory()  # CPU: nothing to hand over
    assert calls == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("cache emptied"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    trainer.release_memory()
    trainer.release_memory()  # idempotent
    trainer.reclaim_memory()
    trainer.reclaim_memory()
    assert calls == [
        "optimizer->host from cuda",
        "grads freed",
        "cache emptied",
        "optimizer->cuda",
        "grads back",
    ]


def test_the_hand_over_reuses_its_host_buffers_and_adam_continues_exactly():
    """The colocated hand-over's host copy (`train.offload.PinnedHostOffload`, here between
    CPU memory): every master weight and Adam moment moves into a host buffer and back with
    the same bits; a second release reuses the first's buffers (megatron-core's offload
    allocated fresh pageable memory each time: 1.5 GiB/s on the H200); Adam's next step
    after a release and reclaim equals the step without one."""
    from megatron_seed.train.offload import PinnedHostOffload

    def adam():
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
        opt = torch.optim.Adam(params, lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            sum((p**2).sum() for p in params).backward()
            opt.step()
        return params, opt

    params, opt = adam()
    before = [p.detach().clone() for p in params]
    moments = [opt.state[p]["exp_avg"].clone() for p in params]
    host = PinnedHostOffload(pin=False)
    moved = host.release(opt, "cpu")
    # 2 parameters + their exp_avg and exp_avg_sq (Adam's 0-dim step stays): 3 x 17 floats
    assert moved == host.nbytes == 3 * 17 * 4
    buffers = {k: v.data_ptr() for k, v in host.buffers.items()}
    assert {p.data.data_ptr() for p in params} <= set(buffers.values())
    assert host.release(opt, "cpu") == 0  # already released: nothing moves twice
    assert host.reclaim(opt, "cpu") == moved
    assert not {p.data.data_ptr() for p in params} & set(buffers.values())
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))
    assert all(
        torch.equal(m, opt.state[p]["exp_avg"]) for m, p in zip(moments, params, strict=True)
    )
    host.release(opt, "cpu")  # the second hand-over: the same buffers, none made
    assert {k: v.data_ptr() for k, v in host.buffers.items()} == buffers
    host.reclaim(opt, "cpu")
    opt.zero_grad()
    sum((p**2).sum() for p in params).backward()
    opt.step()
    ref_params, ref_opt = adam()
    ref_opt.zero_grad()
    sum((p**2).sum() for p in ref_params).backward()
    ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params, strict=True))


def test_wgrad_fusion_only_where_megatron_core_can_run_it(monkeypatch):
    """megatron-core's ColumnParallelLinear (the output layer) raises at construction when
    `gradient_accumulation_fusion` is on and APEX's `fused_weight_gradient_mlp_cuda` does not
    import (megatron-core 0.16.1 tensor_parallel/layers.py): the switch follows that check."""
    from megatron.core.tensor_parallel import layers

    from megatron_seed.models.qwen import gpu_switches

    monkeypatch.setattr(layers, "_grad_accum_fusion_available", False)  # no APEX (the image)
    assert not gpu_switches(True, 2, True, main_grad=True)["gradient_accumulation_fusion"]
    assert gpu_switches(True, 2, True, main_grad=True)["apply_rope_fusion"]  # TE's, no APEX
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    assert gpu_switches(True, 2, True, main_grad=True)["gradient_accumulation_fusion"]
    # the check is megatron-core's own: the layer refuses the switch without the extension
    source = Path(layers.__file__).read_text()
    assert "import fused_weight_gradient_mlp_cuda" in source
    assert "gradient_accumulation_fusion and not _grad_accum_fusion_available" in source


def _te_accepts(s: int, recipe: str | None, tp: int, sp: bool) -> bool:
    """Transformer Engine's rule, written from its checks: `assert_dim_for_fp8_exec`
    (pytorch/utils.py) wants an FP8 GEMM input's rows, the product of its leading dims, a
    multiple of 8, and TE's layernorm_linear (read in 2.20.2; the check predates 2.11) applies it to the rank's own input,
    which under sequence parallelism is its s / TP rows of the sequence; the recipes' blocks
    (`models.fp8`: 16, 32, 128) are multiples of TE's 8 and stand in for it here."""
    block = {None: 1, "delayed": 16, "tensorwise": 16, "mxfp8": 32, "blockwise": 128}[recipe]
    if sp and s % tp:
        return False  # the sequence does not split evenly over the ranks
    rows = s // tp if sp else s
    return rows % block == 0


@pytest.mark.parametrize("recipe", [None, "delayed", "mxfp8", "blockwise"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_token_multiple_is_what_te_accepts_on_every_rank(recipe, tp):
    """At TP 4 with FP8 (the 32B and 72B recipes), s = 48 is a multiple of lcm(16, 4) but
    gives each rank 12 rows, which TE refuses: the check agrees with TE's rule for every s."""
    for sp in (False, True):
        config = _config(recipe, tp=tp, sp=sp)
        for s in range(1, 2 * 128 * tp + 1):
            try:
                logprobs.check_seq_multiple(config, s)
                ours = True
            except ValueError:
                ours = False
            assert ours == _te_accepts(s, recipe, tp, sp), (recipe, tp, sp, s)


def test_colocated_start_builds_the_trainer_while_the_engines_sleep(tmp_path):
    """A recording fleet and trainer: the engines (started, their share sized) sleep before
    the trainer allocates, and wake only after it gave back its grads and optimizer state
    (each update's order: tests/distributed/test_fleet_transfer.py::test_colocated_update_order)."""
    from types import SimpleNamespace

    from megatron_seed.pipeline.colocation import build_beside_engines
    from megatron_seed.pipeline.job import Stage2Job
    from megatron_seed.pipeline.roles import Follower, Leader

    calls: list[str] = []

    class Fleet:
        def sleep(self, level: int = 1) -> None:
            calls.append("engines sleep")

        def wake(self, tags=None) -> None:
            calls.append(f"engines wake {tags or 'all'}")

    class Trainer:
        def release_memory(self) -> None:
            calls.append("trainer releases")

    job = Stage2Job(model_dir="m", games=["g"], out_dir=str(tmp_path))
    trainer, side = Trainer(), Leader(job, SimpleNamespace(fleet=Fleet()))

    def build():
        calls.append("trainer allocates")
        return trainer, None  # (the trainer, the checkpoint it resumed)

    assert build_beside_engines(side, build) == (trainer, None)
    assert calls == ["engines sleep", "trainer allocates", "trainer releases", "engines wake all"]
    calls.clear()  # a rank other than 0 has no fleet: it builds and releases
    assert build_beside_engines(Follower(), build) == (trainer, None)
    assert calls == ["trainer allocates", "trainer releases"]


def test_the_refit_probe_is_scored_without_fp8_and_the_switch_comes_back():
    """FP8 recipes: the trainer scores the refit probe with every TransformerConfig's fp8
    off (the engines compute in bf16, and the bf16 tolerance applies), then the recipe's
    FP8 is back for training, also when scoring fails."""
    from types import SimpleNamespace

    from megatron.core.transformer import TransformerConfig

    from megatron_seed.pipeline import stage2
    from megatron_seed.pipeline.roles import Follower
    from megatron_seed.train.trainer import SeedTrainer

    def config() -> TransformerConfig:
        c = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
        c.fp8 = "hybrid"  # as build_gpt_model sets it for an FP8 recipe
        return c

    shared, own = config(), config()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model.config, model[0].config, model[1].config = shared, shared, own  # DDP, block, layer
    seen: list[list[str | None]] = []

    def score(batch):
        seen.append([shared.fp8, own.fp8])
        return torch.zeros(1, 4)

    trainer = object.__new__(SeedTrainer)
    trainer.model, trainer.score, trainer.precision = model, score, "bf16"
    trainer.spec, trainer._routes = SimpleNamespace(is_moe=False), None
    probe = SimpleNamespace(input_ids=torch.zeros(1, 4, dtype=torch.long))
    run = SimpleNamespace(probe=probe, trainer=trainer, side=Follower(), step=1)
    assert stage2.verify_refit(run) == {}  # rank != 0: no engines to compare with here
    assert seen == [[None, None]] and (shared.fp8, own.fp8) == ("hybrid", "hybrid")
    with pytest.raises(RuntimeError, match="boom"), trainer.without_fp8():
        raise RuntimeError("boom")
    assert (shared.fp8, own.fp8) == ("hybrid", "hybrid")


def test_delayed_fp8_warms_each_models_first_batch_with_grad_enabled(monkeypatch):
    """Delayed scaling: before a model's first FP8-scored batch counts, one micro-batch of it
    runs forward with autograd on (Transformer Engine updates delayed scales only when an
    autocast exits with grad enabled: a warm pass under `no_grad`, as before, left update 0
    scoring with every scale at 1.0). Later batches, passes without FP8 and the other
    recipes are scored once, under `no_grad`."""
    from types import SimpleNamespace

    from megatron_seed.models import logprobs
    from megatron_seed.train import trainer as trainer_mod
    from megatron_seed.train.trainer import SeedTrainer

    passes: list[str] = []

    def token_logprobs(model, ids, micro_batch_size, extra):
        passes.append(f"score {model.name} fp8={model.config.fp8} grad={torch.is_grad_enabled()}")
        return torch.zeros(ids.shape)

    def run_schedule(model, batches, loss_fn, forward_only):
        rows = batches[0]["input_ids"].shape[0]
        grad = torch.is_grad_enabled()
        passes.append(f"warm {model.name} fp8={model.config.fp8} grad={grad} rows={rows}")
        return []

    monkeypatch.setattr(trainer_mod, "token_logprobs", token_logprobs)
    monkeypatch.setattr(logprobs, "run_schedule", run_schedule)
    monkeypatch.setattr(SeedTrainer, "dp", property(lambda self: (0, 1)))
    batch = SimpleNamespace(input_ids=torch.ones(4, 16, dtype=torch.long), routes=None)
    for recipe, want in (
        (
            "delayed",
            [
                "score policy fp8=None grad=False",  # the refit probe without FP8
                "warm policy fp8=hybrid grad=True rows=2",  # the first FP8 batch: warm ...
                "score policy fp8=hybrid grad=False",  # ... then scored
                "score policy fp8=hybrid grad=False",  # warm from now on
                "warm reference fp8=hybrid grad=True rows=2",  # the reference's own scales
                "score reference fp8=hybrid grad=False",
            ],
        ),
        (
            "tensorwise",
            ["score policy fp8=None grad=False"]
            + ["score policy fp8=hybrid grad=False"] * 2
            + ["score reference fp8=hybrid grad=False"],
        ),
    ):
        passes.clear()
        trainer = object.__new__(SeedTrainer)
        trainer.cfg = SimpleNamespace(
            parallel=SimpleNamespace(fp8_recipe=recipe),
            optim=SimpleNamespace(micro_batch_tokens=0, micro_batch_size=2),
        )
        trainer._fp8_warm = set()

        def model(name, fp8, recipe=recipe):
            config = SimpleNamespace(
                fp8=fp8, fp8_recipe=recipe, sequence_parallel=False, tensor_model_parallel_size=1
            )
            return SimpleNamespace(name=name, config=config, training=False, eval=lambda: None)

        policy, reference = model("policy", None), model("reference", "hybrid")
        trainer.model = policy
        trainer.score(batch)  # as inside without_fp8
        policy.config.fp8 = "hybrid"
        trainer.score(batch)
        trainer.score(batch)
        trainer.score(batch, reference)
        assert passes == want, recipe


def test_the_moe_router_runs_without_te_on_any_device():
    """megatron-core's router GEMM reads `te_general_gemm`, undefined without Transformer
    Engine: the first GPU run without TE died at its first routed token with a NameError.
    `init_parallel` defines it whatever the device (here with the CPU patches switched off,
    as on a GPU); the router's gating then takes the torch path."""
    import subprocess
    import sys

    code = """
import torch
import megatron.core.transformer.moe.moe_utils as m
assert not hasattr(m, "te_general_gemm")
import megatron_seed.models.parallel as parallel
parallel.enable_cpu_mode = lambda: False  # as on a GPU: no CPU patches
parallel.init_parallel(1, 1)
x, w = torch.randn(5, 8), torch.randn(3, 8)
logits = m.router_gating_linear(x, w, None, torch.float32)
assert torch.allclose(logits, x @ w.t(), atol=1e-6), logits
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-1500:]


def test_the_distributed_optimizer_saves_in_a_format_megatron_core_accepts():
    """megatron-core 0.16's distributed optimizer defaults to "fully_sharded_model_space",
    whose flattened ShardedTensors its own checkpointing refuses (the first GPU run's recipe
    mode died saving); the trainer's checkpoints ask for "fully_reshardable", which also
    loads into another layout."""
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    from megatron_seed.train.checkpoint import OPTIMIZER_FORMAT

    whole = ShardedTensor.from_rank_offsets("w", torch.zeros(2, 3))
    with pytest.raises(CheckpointingException, match="flattened_range is not supported"):
        dataclasses.replace(whole, flattened_range=slice(0, 6))  # as that format builds it
    chosen = OPTIMIZER_FORMAT["distrib_optim_sharding_type"]
    assert chosen in DistributedOptimizer.checkpoint_fully_reshardable_formats
