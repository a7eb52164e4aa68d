"""Functions run inside spawned gloo processes by the distributed trainer tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _setup(hf_dir, tok_dir, tp, pp, cfg, ep=1, **records_kw):
    from transformers import AutoTokenizer

    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    init_parallel(tp, pp, ep=ep)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    trainer = SeedTrainer(cfg, hf_dir)
    records = synthetic_records(tok, **records_kw)
    return trainer, records, build_policy_batch(records, tok)


def update_and_grads(hf_dir, tok_dir, tp, pp, cfg):
    """One update; returns its metrics and the last mini-batch's gradients by HF name."""
    trainer, _, pb = _setup(
        hf_dir, tok_dir, tp, pp, cfg, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    metrics = trainer.train_step(pb)
    return metrics, trainer.grads_by_hf_name()


def moe_update(hf_dir, tok_dir, tp, ep, cfg):
    """One update of a mixture-of-experts model at TP x EP (DP = world / TP): its metrics,
    the gradients and the parameters after the step, by HF name (every expert gathered)."""
    from transformers import AutoTokenizer

    from megatron_seed.models.convert import export_hf_weights
    from megatron_seed.train.batch import build_policy_batch

    trainer, records, _ = _setup(
        hf_dir, tok_dir, tp, 1, cfg, ep=ep, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)  # a MoE model at TP > 1 splits the sequence
    pb = build_policy_batch(records, tok, pad_to_multiple_of=trainer.seq_multiple)
    metrics = trainer.train_step(pb)
    grads = trainer.grads_by_hf_name()
    params = {k: v.clone() for k, v in export_hf_weights(trainer.model.module, trainer.spec)}
    return metrics, grads, params


def random_routes(batch, layers, experts, k, seed):
    """Per row of `batch`, `[n, layers, k]` distinct experts drawn at random (seeded), for
    routing replay to follow; row 0's first 3 tokens get none (`NO_ROUTE`: routed freely)."""
    from megatron_seed.data.collate import NO_ROUTE

    g = torch.Generator().manual_seed(seed)
    out = []
    for n in batch.lengths.tolist():
        out.append(torch.rand(n, layers, experts, generator=g).argsort(-1)[..., :k])
    out[0][:3] = NO_ROUTE
    return out


def moe_routing_replay(hf_dir, tok_dir, tp, ep, pp, cfg):
    """A tiny Qwen3-MoE trainer at TP x EP x PP with `random_routes` on every student and
    teacher row: theta_old's log-probs of the students (counting agreement), the teachers'
    log-probs, then one update: its metrics and gradients by HF name."""
    from transformers import AutoTokenizer

    from megatron_seed.train.batch import build_policy_batch, with_routes

    trainer, records, _ = _setup(
        hf_dir, tok_dir, tp, pp, cfg, ep=ep, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    pb = build_policy_batch(records, tok, pad_to_multiple_of=trainer.seq_multiple)
    spec = trainer.spec
    shape = (spec.num_layers, spec.num_experts, spec.top_k)
    pb.student = with_routes(pb.student, random_routes(pb.student, *shape, seed=1))
    pb.teacher = with_routes(pb.teacher, random_routes(pb.teacher, *shape, seed=2))
    old = trainer.score(pb.student)
    teacher = trainer.score(pb.teacher)
    metrics = trainer.train_step(pb)
    return {
        "old": old, "teacher": teacher, "metrics": metrics,
        "grads": trainer.grads_by_hf_name(), "pb": pb,
    }  # fmt: skip


def hf_forced_logprobs(hf_dir, batch):
    """Per-token log-probs `[b, s]` of `batch`'s rows from transformers' Qwen3-MoE with every
    router made to pick `batch.routes` (its own top k where a token has `NO_ROUTE`): softmax
    over all experts, the given ones' probabilities, renormalised (`norm_topk_prob`). Also
    the routers' own top k on the way, `[b, s, layers, k]`."""
    from transformers import AutoModelForCausalLM

    from megatron_seed.models.logprobs import hf_token_logprobs

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    out = torch.zeros(batch.input_ids.shape)
    own = torch.zeros(batch.routes.shape, dtype=torch.long)
    for row, n in enumerate(batch.lengths.tolist()):
        routes = batch.routes[row, :n].long()  # [n, layers, k]
        for layer, block in enumerate(hf.model.layers):
            block.mlp.gate.forward = _forced_router(
                block.mlp.gate, routes[:, layer], own[row, :n, layer]
            )
        out[row, :n] = hf_token_logprobs(hf, batch.input_ids[row : row + 1, :n])[0]
    return out, own


def _forced_router(gate, routes, own_out):
    """`Qwen3MoeTopKRouter.forward` with the top k replaced by `routes` (`[n, k]`); writes
    its own top k into `own_out`."""
    import torch.nn.functional as F

    def forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, gate.hidden_dim)
        logits = F.linear(hidden_states, gate.weight)  # [n, E]
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        own = torch.topk(probs, gate.top_k, dim=-1).indices
        own_out.copy_(own)
        picked = torch.where(routes[:, :1] >= 0, routes, own)  # [n, k]
        value = probs.gather(1, picked)
        if gate.norm_topk_prob:
            value = value / value.sum(-1, keepdim=True)
        return logits, value.to(logits.dtype), picked

    return forward


def moe_aux_loss_gradient(hf_dir, tok_dir, cfg):
    """One process, EP=1: the SEED update's gradients with `cfg.algo.moe_aux_loss` = c and
    with 0 on the same batch, and the routers' load-balancing loss computed independently
    from transformers' router logits: R = mean over the micro-batches (one row each, its T
    real tokens) of sum over layers of E / (k T^2) * sum_e (sum_t softmax_te) *
    (top-k count_e), with its gradient by HF name."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from megatron_seed.train.trainer import SeedTrainer

    c = cfg.algo.moe_aux_loss
    trainer, _, pb = _setup(
        hf_dir, tok_dir, 1, 1, cfg, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    metrics = trainer.train_step(pb)
    with_aux = trainer.grads_by_hf_name()
    off = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, moe_aux_loss=0.0))
    plain = SeedTrainer(off, hf_dir)
    plain_metrics = plain.train_step(pb)
    without = plain.grads_by_hf_name()

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    hf.train()
    experts, k = hf.config.num_experts, hf.config.num_experts_per_tok
    rows = pb.student.input_ids  # [B, s]: each row is one micro-batch
    total = 0.0
    layers = hf.config.num_hidden_layers
    load = torch.zeros(layers, experts)  # routing statistics over every real token
    entropy, tokens = torch.zeros(layers), 0
    for r in range(rows.shape[0]):
        real = rows[r : r + 1, : int(pb.student.lengths[r])]  # the routers count no padding
        logits = hf(real, output_router_logits=True).router_logits
        for i, layer in enumerate(logits):  # [T, E]
            probs = torch.softmax(layer.float(), dim=-1)
            chosen = torch.zeros_like(probs).scatter(1, probs.topk(k, dim=-1).indices, 1.0)
            t = probs.shape[0]
            total = total + experts / (k * t * t) * (probs.sum(0) * chosen.sum(0)).sum()
            load[i] += chosen.sum(0).detach()
            entropy[i] += -(probs * probs.log()).sum().detach()
        tokens += real.shape[1]
    reference = total / rows.shape[0]
    stats = {f"moe/load_max_mean/layer_{i}": float(load[i].max() / load[i].mean())
             for i in range(layers)}  # fmt: skip
    stats |= {f"moe/router_entropy/layer_{i}": float(entropy[i] / tokens) for i in range(layers)}
    reference.backward()
    ref_grads = {}
    for name, param in hf.named_parameters():  # transformers fuses each layer's experts
        grad = torch.zeros_like(param) if param.grad is None else param.grad.detach().clone()
        prefix = name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):  # [E, 2F, H], gate first
            f = grad.shape[1] // 2
            for e in range(grad.shape[0]):
                ref_grads[f"{prefix}.{e}.gate_proj.weight"] = grad[e, :f]
                ref_grads[f"{prefix}.{e}.up_proj.weight"] = grad[e, f:]
        elif name.endswith("experts.down_proj"):  # [E, H, F]
            for e in range(grad.shape[0]):
                ref_grads[f"{prefix}.{e}.down_proj.weight"] = grad[e]
        else:
            ref_grads[name] = grad
    return {
        "metrics": metrics,
        "reference_stats": stats,
        "aux_metric": metrics["moe/aux_loss"],
        "reference": float(reference),
        "loss_equal": metrics["loss/total"] == plain_metrics["loss/total"],
        "aux_grads": {n: (with_aux[n] - without[n]) / c for n in with_aux},
        "ref_grads": ref_grads,
    }


def update_and_grads_sequence_parallel(hf_dir, tok_dir, tp, pp, cfg):
    """`update_and_grads` with sequence parallelism (a GPU switch) turned on, on the CPU;
    batches padded to the trainer's token multiple (TP)."""
    import megatron_seed.models.qwen as qwen
    from megatron_seed.train.batch import build_policy_batch

    real = qwen.gpu_switches

    def with_sp(on_gpu, tp, use_te, main_grad=False):
        return {**real(on_gpu, tp, use_te, main_grad), "sequence_parallel": tp > 1}

    qwen.gpu_switches = with_sp
    trainer, records, _ = _setup(
        hf_dir, tok_dir, tp, pp, cfg, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    assert trainer.model.module.config.sequence_parallel and trainer.seq_multiple == tp
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    pb = build_policy_batch(records, tok, pad_to_multiple_of=trainer.seq_multiple)
    assert pb.student.input_ids.shape[1] % tp == 0
    metrics = trainer.train_step(pb)
    return metrics, trainer.grads_by_hf_name()


def run_with_checkpoints(hf_dir, tok_dir, tp, pp, cfg, steps, save_at, root, resume):
    """Train `steps` updates on a fixed batch, saving at `save_at` or resuming from `root`."""
    from megatron_seed.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    trainer, _, pb = _setup(
        hf_dir, tok_dir, tp, pp, cfg, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    formats = []  # the optimizer state format every save and load asks for
    sharded_state_dict = trainer.optimizer.sharded_state_dict

    def recording(*args, **kwargs):
        formats.append(kwargs.get("metadata"))
        return sharded_state_dict(*args, **kwargs)

    trainer.optimizer.sharded_state_dict = recording
    if resume:
        load_checkpoint(trainer, latest_checkpoint(root))
    start_logprobs = trainer.score(pb.student)
    losses = {}
    while trainer.state.step < steps:
        step = trainer.state.step + 1
        losses[step] = trainer.train_step(pb)["loss/total"]
        if trainer.state.step == save_at:
            hf_config = json.loads(Path(hf_dir, "config.json").read_text())
            save_checkpoint(trainer, root, hf_config)
            losses["logprobs_at_save"] = trainer.score(pb.student)
    losses["start_logprobs"] = start_logprobs
    losses["mask"] = pb.student.loss_mask
    losses["formats"] = formats
    return losses


def rlsd_update_index_and_diagnostics(hf_dir, tok_dir, cfg, root):
    """Update 0 of a trainer, a checkpoint, then update 1 of the trainer resumed from it run
    through Stage 2's train phase and metrics log. Returns both updates' metrics, the rows
    of metrics.jsonl, and update 0's inputs (theta_old and teacher log-probs, batch)."""
    from transformers import AutoTokenizer

    from megatron_seed.pipeline.metrics import MetricsLog, PhaseTimer
    from megatron_seed.pipeline.roles import Follower
    from megatron_seed.pipeline.stage2 import Run, Stage2Job, policy_batch, train
    from megatron_seed.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from megatron_seed.train.trainer import SeedTrainer

    trainer, records, pb = _setup(
        hf_dir, tok_dir, 1, 1, cfg, groups=2, group_size=3, turns=2, valid_skill_every=1
    )
    old = trainer.score(pb.student)
    teacher = trainer.teacher_logprobs(pb, torch.arange(pb.rows))
    first = trainer.train_step(pb)
    hf_config = json.loads(Path(hf_dir, "config.json").read_text())
    save_checkpoint(trainer, Path(root) / "checkpoints", hf_config)
    resumed = SeedTrainer(cfg, hf_dir)
    load_checkpoint(resumed, latest_checkpoint(Path(root) / "checkpoints"))
    job = Stage2Job(model_dir=hf_dir, games=[], out_dir=root, cfg=cfg)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    run = Run(job, resumed, tok, Follower(), hf_config, need_sync=False)
    step = run.step
    second = train(run, policy_batch(run, records, PhaseTimer()))
    log = MetricsLog(root, tensorboard=False)
    log.write(step, second)
    return {
        "first": first,
        "second": second,
        "second_update": step,
        "log": log.read(),
        "old": old,
        "teacher": teacher,
        "mask": pb.student.loss_mask & pb.has_teacher[:, None],
        "advantages": pb.advantages,
        "record_index": pb.record_index,
        "won": pb.won,
    }


def learning_curves(hf_dir, tok_dir, cfg_opd, cfg_grpo, updates):
    """(a) tied rewards, SEED: OPD loss per update and the student-teacher gap;
    (b) GRPO only: summed log-prob of positive- and negative-advantage rows."""
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    trainer, records, _ = _setup(hf_dir, tok_dir, 1, 1, cfg_opd, groups=2, group_size=2, turns=3)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    for r in records:
        r.reward = 1.0
    pb = build_policy_batch(records, tok)
    rows = torch.arange(pb.rows)
    mask = pb.student.loss_mask
    teacher0 = trainer.teacher_logprobs(pb, rows)
    above = mask & (teacher0 > trainer.score(pb.student))
    opd, gap = [], []
    for _ in range(updates):
        gap.append(float((teacher0 - trainer.score(pb.student))[above].mean()))
        opd.append(trainer.train_step(pb)["loss/opd"])
    gap.append(float((teacher0 - trainer.score(pb.student))[above].mean()))

    grpo = SeedTrainer(cfg_grpo, hf_dir)
    pb = build_policy_batch(records[:0] + _with_rewards(records, [1.0, 0.0, 0.0, 0.0]), tok)
    before = (grpo.score(pb.student) * pb.student.loss_mask).sum(-1)
    for _ in range(updates):
        grpo.train_step(pb)
    after = (grpo.score(pb.student) * pb.student.loss_mask).sum(-1)
    return {"opd": opd, "gap": gap, "adv": pb.advantages, "before": before, "after": after}


def _with_rewards(records, rewards):
    out = []
    for r, reward in zip(records, rewards, strict=False):
        r.reward = reward
        r.group_id = "g0"
        out.append(r)
    return out


def epochs_match_repeated_batch(hf_dir, tok_dir, cfg):
    """`epochs_per_update=2` on a batch vs one epoch of two mini-batches over the batch
    written twice: the same Adam steps on the same rows against the same theta_old."""
    import dataclasses

    from megatron_seed.train.batch import PolicyBatch, select_rows
    from megatron_seed.train.trainer import SeedTrainer

    two_epochs = dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, epochs_per_update=2, mini_batches_per_update=1)
    )
    trainer, _, pb = _setup(
        hf_dir, tok_dir, 1, 1, two_epochs, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    metrics_epochs = trainer.train_step(pb)
    after_epochs = trainer.score(pb.student)

    idx = torch.cat([torch.arange(pb.rows), torch.arange(pb.rows)])
    teacher_row = torch.cumsum(pb.has_teacher.long(), 0) - 1
    twice = PolicyBatch(
        student=select_rows(pb.student, idx),
        teacher=select_rows(pb.teacher, teacher_row[idx][pb.has_teacher[idx]]),
        has_teacher=pb.has_teacher[idx],
        advantages=pb.advantages[idx],
        record_index=pb.record_index[idx],
        won=pb.won[idx],
    )
    two_minis = dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, epochs_per_update=1, mini_batches_per_update=2)
    )
    other = SeedTrainer(two_minis, hf_dir)
    metrics_minis = other.train_step(twice)
    return {
        "epochs": (metrics_epochs, after_epochs),
        "minis": (metrics_minis, other.score(pb.student)),
        "before": SeedTrainer(two_minis, hf_dir).score(pb.student),
        "mask": pb.student.loss_mask,
    }


def attention_paths_agree(hf_dir, tp, seq):
    """The same Megatron model built with Megatron's DotProductAttention and with
    SdpaDotProductAttention (same weights): max |NLL diff|, max |grad diff| over all
    parameters, and how many layers took the fused path."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from megatron_seed.models import qwen
    from megatron_seed.models.attention import SdpaDotProductAttention
    from megatron_seed.models.logprobs import model_forward, shifted_labels
    from megatron_seed.models.parallel import init_parallel

    init_parallel(tp, 1)
    spec = qwen.QwenSpec.from_pretrained(hf_dir)
    local = qwen.layer_spec(spec, use_te=False)
    assert local.submodules.self_attention.submodules.core_attention is SdpaDotProductAttention
    fused_calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        fused_calls.append(1)
        return original(*args, **kwargs)

    torch.manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (3, seq))
    batch = {"input_ids": ids, "labels": shifted_labels(ids)}
    outputs, weights = {}, None
    for cls in (DotProductAttention, SdpaDotProductAttention):
        model = qwen.build_gpt_model(spec, use_te=False, core_attention=cls)
        if weights is None:
            weights = model.state_dict()
        model.load_state_dict(weights)
        torch.nn.functional.scaled_dot_product_attention = counting
        try:
            nll = model_forward(model, batch)
            (nll * torch.linspace(0.5, 1.5, seq)).sum().backward()
        finally:
            torch.nn.functional.scaled_dot_product_attention = original
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        outputs[cls.__name__] = (nll.detach(), grads)
    (nll_a, grads_a), (nll_b, grads_b) = outputs.values()
    return {
        "nll_diff": (nll_a - nll_b).abs().max().item(),
        "grad_diff": max((grads_a[n] - grads_b[n]).abs().max().item() for n in grads_a),
        "grad_scale": max(g.abs().max().item() for g in grads_a.values()),
        "fused_calls": len(fused_calls),
    }


def packed_matches_separate(hf_dir, tp, lengths, sequence_parallel=False):
    """Sequences of `lengths` packed into one `[1, T]` row (thd, `PackedSeqParams`) vs each
    run alone as `[1, n]`, same weights: max |NLL diff| over the real tokens, max |grad
    diff| of a weighted NLL sum, and the gradient scale."""
    from megatron_seed.data.packing import pack
    from megatron_seed.models import qwen
    from megatron_seed.models.logprobs import model_forward, shifted_labels
    from megatron_seed.models.parallel import init_parallel

    init_parallel(tp, 1)
    spec = qwen.QwenSpec.from_pretrained(hf_dir)
    torch.manual_seed(0)
    model = qwen.build_gpt_model(spec, use_te=False, sequence_parallel=sequence_parallel)
    seqs = [torch.randint(0, spec.vocab_size, (1, n)) for n in lengths]
    weights = [torch.linspace(0.5, 1.5, n)[None] for n in lengths]

    nll_sep = []
    for ids, w in zip(seqs, weights, strict=True):
        n = ids.shape[1]
        alone = torch.cat([ids, ids[:, -1:].expand(1, n % 2)], 1)  # even: causal, unchanged
        nll = model_forward(model, {"input_ids": alone, "labels": shifted_labels(alone)})
        (nll[:, : n - 1] * w[:, :-1]).sum().backward()  # the last token has no target
        nll_sep.append(nll.detach()[:, :n])  # [1, n]
    grads_sep = _full_grads(model)
    model.zero_grad()

    s = max(lengths)
    ids = torch.zeros(len(lengths), s, dtype=torch.long)
    wts = torch.zeros(len(lengths), s)
    for i, (x, w) in enumerate(zip(seqs, weights, strict=True)):
        ids[i, : x.shape[1]] = x[0]
        wts[i, : x.shape[1] - 1] = w[0, :-1]
    plan = pack(torch.tensor(lengths), capacity=sum(lengths), multiple=2)
    assert plan.rows == 1 and plan.width > sum(lengths) - 2
    batch = {
        "input_ids": plan.pack_tensor(ids),
        "labels": plan.pack_tensor(shifted_labels(ids)),
        "position_ids": plan.position_ids(),
        "cu_seqlens": plan.cu_seqlens[0],
        "max_seqlen": plan.max_seqlen(0),
    }
    nll = model_forward(model, batch)  # [1, T]
    (nll * plan.pack_tensor(wts)).sum().backward()
    back = plan.unpack_tensor(nll.detach(), s)  # [B, s]
    grads = _full_grads(model)
    with torch.no_grad():  # the same row as one plain sequence: attention crosses boundaries
        plain = {k: batch[k] for k in ("input_ids", "labels")}
        crossed = plan.unpack_tensor(model_forward(model, plain), s)

    def worst(values):
        return max(
            (values[i, : n - 1] - nll_sep[i][0, : n - 1]).abs().max().item()
            for i, n in enumerate(lengths)
            if n > 1
        )

    return {
        "nll_diff": worst(back),
        "unpacked_diff": worst(crossed),
        "grad_diff": max((grads[n] - grads_sep[n]).abs().max().item() for n in grads),
        "grad_scale": max(g.abs().max().item() for g in grads_sep.values()),
        "nll_scale": max(x.abs().max().item() for x in nll_sep),
    }


def _full_grads(model):
    """Gradients by name; under sequence parallelism the norm weights' (each TP rank saw
    its slice of the tokens) summed over TP, as `finalize_model_grads` does."""
    from megatron.core import parallel_state as ps

    out = {}
    for name, p in model.named_parameters():
        g = p.grad.clone()
        if getattr(p, "sequence_parallel", False):
            torch.distributed.all_reduce(g, group=ps.get_tensor_model_parallel_group())
        out[name] = g
    return out


def mixed_length_records(tok):
    """Short (1-turn) and long (4-turn) episodes; every other record has a valid skill, so
    the teachers are the longest sequences."""
    from megatron_seed.benchmarks.synthetic import synthetic_records

    records = []
    for seed, turns in enumerate((1, 4)):
        for r in synthetic_records(
            tok, groups=1, group_size=3, turns=turns, seed=seed, valid_skill_every=2
        ):
            r.group_id = f"{r.group_id}-{turns}"
            records.append(r)
    return records


def packed_and_padded(hf_dir, tok_dir, tp, pp, cfg, tokens, sequence_parallel=False):
    """The same SEED update and the same NLL step with padded micro-batches (`cfg`) and with
    packed ones (`optim.micro_batch_tokens=tokens`), each from the checkpoint: log-probs of
    `score` (students, teachers), `train_step` metrics and gradients, `nll_step` metrics and
    gradients, by layout name."""
    import dataclasses

    from transformers import AutoTokenizer

    import megatron_seed.models.qwen as qwen
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    if sequence_parallel:  # a GPU switch, turned on here on the CPU
        real = qwen.gpu_switches
        qwen.gpu_switches = lambda on_gpu, tp, use_te, main_grad=False: {
            **real(on_gpu, tp, use_te, main_grad),
            "sequence_parallel": tp > 1,
        }
    init_parallel(tp, pp)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    packed_cfg = dataclasses.replace(
        cfg, optim=dataclasses.replace(cfg.optim, micro_batch_tokens=tokens)
    )
    out = {}
    for name, c in (("padded", cfg), ("packed", packed_cfg)):
        trainer = SeedTrainer(c, hf_dir)
        pb = build_policy_batch(
            mixed_length_records(tok), tok, pad_to_multiple_of=trainer.seq_multiple
        )
        run = {"student": trainer.score(pb.student), "teacher": trainer.score(pb.teacher)}
        run["metrics"] = trainer.train_step(pb)
        run["grads"] = trainer.grads_by_hf_name()
        del trainer
        sft = SeedTrainer(c, hf_dir, reference=False)
        run["nll"] = sft.nll_step(pb.teacher)
        run["nll_grads"] = sft.grads_by_hf_name()
        out[name] = run
    out["lengths"] = (pb.student.lengths, pb.teacher.lengths)
    return out


def replay_update_and_grads(hf_dir, tok_dir, tp, pp, cfg):
    """Analyzer replay: one update with replay rows (weight `cfg.algo.replay_weight`), and,
    from the same weights, one without them and one NLL step on the replay rows alone.
    Returns the three metrics and gradients by HF name."""
    import dataclasses

    from transformers import AutoTokenizer

    from megatron_seed.benchmarks.synthetic import synthetic_records
    from megatron_seed.train.batch import build_policy_batch
    from megatron_seed.train.trainer import SeedTrainer

    trainer, _, pb = _setup(
        hf_dir, tok_dir, tp, pp, cfg, groups=2, group_size=2, turns=3, valid_skill_every=2
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    # replay rows: other chats, longer than the policy batch's, loss on their action tokens
    others = synthetic_records(tok, groups=1, group_size=3, turns=5, seed=7)
    replay_pb = build_policy_batch(others, tok, with_teacher=False)
    replay = replay_pb.student
    assert replay.input_ids.shape[1] > pb.student.input_ids.shape[1]
    with_replay = trainer.train_step(pb, replay)
    grads_replay = trainer.grads_by_hf_name()
    plain_cfg = dataclasses.replace(cfg, algo=dataclasses.replace(cfg.algo, replay_weight=0.0))
    plain = SeedTrainer(plain_cfg, hf_dir)
    without = plain.train_step(pb)
    grads_plain = plain.grads_by_hf_name()
    nll_trainer = SeedTrainer(plain_cfg, hf_dir, reference=False)
    nll = nll_trainer.nll_step(replay)
    grads_nll = nll_trainer.grads_by_hf_name()
    return with_replay, without, nll, grads_replay, grads_plain, grads_nll


def methods_one_update(root: str, methods: list[str]) -> dict:
    """One Stage-2 update of each named method on the tiny world (`make_tiny_world` at
    ``root``), all on one fleet and one env pool: the engines are synced to each method's
    start (`Stage2Job.fleet_address`). The family library is ROOT/library; the Stage-1
    annotations static-skills and seed-replay read are written from the first method's
    trajectories by the oracle analyzer. Then the base is evaluated with the library's
    skills (Skill-Prompt*). Returns per method its metrics row, its first trajectory and
    the analysis sources; and the evaluation."""
    import dataclasses

    import ray

    from envs.spec import get_env
    from envs.workers import EnvPool
    from megatron_seed import recipes
    from megatron_seed.data import read_jsonl, write_jsonl
    from megatron_seed.methods import METHODS
    from megatron_seed.pipeline import stage1
    from megatron_seed.pipeline.evaluate import evaluate_policies
    from megatron_seed.pipeline.stage2 import Stage2Job, check_job, run_stage2
    from megatron_seed.rollout.session import init_ray, start_fleet
    from megatron_seed.skills.library import SkillLibrary, game_skills

    root = Path(root)
    env = get_env("alfworld")
    games = [str(g) for g in env.list_tasks(root / "games", None)]
    base = recipes.get("tiny").config.with_changes(
        {"updates": 1, "save_every": 0, "fleet": {"engines": 1}, "env": {"workers": 1}}
    )
    init_ray(base)
    fleet = start_fleet(base, root / "model")
    r = base.rollout
    pool = EnvPool(env.name, num_workers=1, max_steps=r.max_steps)
    annotated = root / "annotated.jsonl"
    out: dict = {}
    try:
        for name in methods:
            # "METHOD+overlap": phases overlapped; "METHOD+uncertain": selective analysis
            method, _, variant = name.partition("+")
            cfg = METHODS[method].config(base)
            if variant == "overlap":
                cfg = cfg.with_changes({"rollout": {"overlap": True}})
            if variant == "uncertain":
                cfg = cfg.with_changes({"skill": {"select": "uncertain"}})
            if variant == "one_step_off":  # three updates: the lag shows from the second on
                cfg = cfg.with_changes({"rollout": {"one_step_off": True}, "updates": 3})
            if cfg.algo.advantage_reweight == "rlsd":  # lambda visibly decays within 2 updates
                cfg = dataclasses.replace(
                    cfg, algo=dataclasses.replace(cfg.algo, rlsd_decay_updates=2)
                )
            source = annotated if cfg.skill.teacher_source == "stage1_library" else None
            job = Stage2Job(
                model_dir=str(root / "model"),
                games=games,
                out_dir=str(root / "runs" / name),
                cfg=cfg,
                fleet_address=fleet.address,
                skill_library=game_skills(cfg, env, games, source or root / "library"),
                replay_data=str(annotated) if cfg.algo.replay_weight else None,
            )
            check_job(job)
            rows = run_stage2(job, pool=pool)
            row = rows[-1]
            runs = root / "runs" / name / "trajectories"
            updates = [list(read_jsonl(p)) for p in sorted(runs.glob("update_*.jsonl"))]
            records = updates[0]
            if not annotated.is_file():
                done, _ = stage1.annotate_oracle(records, cfg)
                write_jsonl(done, annotated)
            out[name] = {
                "row": row,
                "first_user": records[0].turns[0].user,
                "model_dir": str(root / "model"),
                "sources": sorted({x.analysis.source for x in records if x.analysis}),
                "skills": sorted({x.skill for x in records if x.skill}),
                "analysed_groups": sorted(x.group_id for x in records if x.analysis),
                "rows": rows,
                "updates": updates,
            }
        skills = SkillLibrary.load(root / "library").for_games(games, env.family)
        out["evaluation"] = evaluate_policies(
            [root / "model"], {"train": games}, base, fleet=fleet, skills=skills
        )[0]
    finally:
        pool.close()
        fleet.close()
        ray.shutdown()
    return out


def parameter_dtypes(hf_dir: str, precision: str) -> dict:
    """The dtypes of a freshly built model's parameters, by name."""
    from megatron_seed.models import qwen
    from megatron_seed.models.parallel import init_parallel

    init_parallel(1, 1)
    spec = qwen.QwenSpec.from_pretrained(hf_dir)
    model = qwen.build_gpt_model(spec, precision=precision, use_te=False)
    return {name: str(p.dtype) for name, p in model.named_parameters()}


def no_signal_update(hf_dir, tok_dir, cfg, rewards):
    """One update on a batch whose groups have these rewards (one per record, 2 groups of
    2, every record with a valid skill): the student log-probs before and after, and the
    metrics."""
    from transformers import AutoTokenizer

    from megatron_seed.train.batch import build_policy_batch

    trainer, records, _ = _setup(hf_dir, tok_dir, 1, 1, cfg, groups=2, group_size=2, turns=3)
    for record, reward in zip(records, rewards, strict=True):
        record.reward, record.won = reward, reward > 0
    pb = build_policy_batch(records, AutoTokenizer.from_pretrained(tok_dir))
    before = trainer.score(pb.student)
    metrics = trainer.train_step(pb)
    return {"before": before, "after": trainer.score(pb.student), "metrics": metrics}


def moe_refit_probe(hf_dir, tok_dir, cfg, out_dir):
    """The refit check on a tiny Qwen3-MoE trainer (`algo.routing_replay` off) against two
    fake engines whose routers picked other experts than the trainer's would (random routes)
    and whose log-probs of the probe are transformers' with its routers forced to those
    routes: the check's metrics, the gap free routing would leave, and the `RefitError` an
    engine with other weights (log-probs shifted by 0.3) gets."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.pipeline import stage2
    from megatron_seed.pipeline.job import Stage2Job
    from megatron_seed.pipeline.roles import Leader
    from megatron_seed.rollout.refit import RefitError, check_refit
    from megatron_seed.train.batch import select_rows, with_routes
    from megatron_seed.train.trainer import SeedTrainer

    init_parallel(1, 1)
    trainer = SeedTrainer(cfg, hf_dir)
    probe = stage2._probe(cfg, AutoTokenizer.from_pretrained(tok_dir), trainer.seq_multiple)
    spec, n = trainer.spec, probe.input_ids.shape[1]
    g = torch.Generator().manual_seed(7)
    routes = [  # engine e: [n, layers, k]
        torch.rand(n, spec.num_layers, spec.num_experts, generator=g).argsort(-1)[..., : spec.top_k]
        for _ in range(2)
    ]
    rows = with_routes(select_rows(probe, torch.zeros(2, dtype=torch.long)), routes)
    forced, _ = hf_forced_logprobs(hf_dir, rows)  # [2, n]
    engines = [forced[e, : n - 1].tolist() for e in range(2)]

    class Fleet:
        shift = 0.0

        def routes_per_engine(self, sequences):
            assert sequences == [probe.input_ids[0].tolist()]
            return [[r.numpy()] for r in routes]

        def prompt_logprobs_per_engine(self, sequences):
            return [[engines[0]], [[x + self.shift for x in engines[1]]]]

    fleet = Fleet()
    side = Leader(Stage2Job("m", ["g"], out_dir, cfg=cfg), SimpleNamespace(fleet=fleet))
    run = SimpleNamespace(probe=probe, trainer=trainer, side=side, step=3, cfg=cfg)
    metrics = stage2.verify_refit(run)
    free = trainer.score(probe)[0, :-1].tolist()
    free_gap = check_refit(free, engines, max_gap=1e9)["sync/probe_gap_max"]
    fleet.shift = 0.3
    try:
        stage2.verify_refit(run)
        error = None
    except RefitError as err:
        error = str(err)
    return {"metrics": metrics, "free_gap": free_gap, "error": error}


def broadcast_or_raise_on_ranks(rank0_result):
    """What every rank gets from `broadcast_or_raise` when rank 0 holds `rank0_result` (the
    other ranks hold None): ("ok", value) or ("raised", message)."""
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.pipeline.collective import broadcast_or_raise, rank

    init_parallel(1, 1)
    mine = rank0_result if rank() == 0 else None
    try:
        return "ok", broadcast_or_raise(mine, RuntimeError, "update 3")
    except RuntimeError as err:
        return "raised", str(err)
