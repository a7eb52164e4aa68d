"""Worker for the chunked-NLL tests (run under `models.parallel.spawn`)."""

from __future__ import annotations

import torch


def chunked_matches_whole(hf_dir, tp, seq, rows, chunk, sequence_parallel):
    """Per-token NLL and every gradient of the chunked output layer against the whole-
    sequence one, same weights; also the no-grad chunked path's values."""
    import megatron_seed.models.qwen as qwen
    from megatron_seed.models.logprobs import model_forward, shifted_labels
    from megatron_seed.models.parallel import init_parallel

    init_parallel(tp, 1)
    spec = qwen.QwenSpec.from_pretrained(hf_dir)
    torch.manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (rows, seq))
    batch = {"input_ids": ids, "labels": shifted_labels(ids)}
    weight = torch.linspace(0.5, 1.5, seq)  # [s]: every position's gradient differs
    out, state, calls = {}, None, []
    for tokens in (0, chunk):
        model = qwen.build_gpt_model(
            spec, use_te=False, sequence_parallel=sequence_parallel, logit_chunk_tokens=tokens
        )
        if state is None:
            state = model.state_dict()
        model.load_state_dict(state)
        original = model._chunk_nll
        model._chunk_nll = lambda *a, _f=original, _t=tokens: (calls.append(_t), _f(*a))[1]
        nll = model_forward(model, batch)  # [b, s]
        (nll * weight).sum().backward()
        with torch.no_grad():
            nll_eval = model_forward(model, batch)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        out[tokens] = (nll.detach(), nll_eval, grads)
    (whole, _, g_whole), (chunked, chunked_eval, g_chunked) = out[0], out[chunk]
    return {
        "nll_diff": (whole - chunked).abs().max().item(),
        "eval_diff": (chunked_eval - chunked).abs().max().item(),
        "grad_diff": max((g_whole[n] - g_chunked[n]).abs().max().item() for n in g_whole),
        "grad_scale": max(g.abs().max().item() for g in g_whole.values()),
        "chunks": calls.count(chunk),  # chunk calls in forward, backward recompute and eval
        "whole_calls": calls.count(0),
        "sequence_parallel": bool(model.config.sequence_parallel),
    }
