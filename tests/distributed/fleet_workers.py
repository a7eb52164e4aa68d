"""Functions run inside spawned gloo processes by the fleet tests (importable by `spawn`)."""

from __future__ import annotations

import torch


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.02) -> None:
    """Add seeded noise to every parameter; identical on all TP ranks for replicated ones."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(getattr(model, "module", model).named_parameters())):
            g = torch.Generator().manual_seed(seed * 1000 + i)
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def trainer_syncs_fleet(
    hf_dir: str, tp: int, address, input_ids: torch.Tensor, syncs: int, bucket_bytes: int
) -> dict:
    """A TP-way Megatron trainer that perturbs its weights and streams them into the fleet.

    Rank 0 connects to the running Ray cluster and the fleet (production's path); the other
    ranks only take part in the collective export. Per sync: fleet log-probs before, the
    trainer's log-probs, fleet log-probs after (each engine separately), sync stats.
    """
    import torch.distributed as dist

    from megatron_seed.models.convert import HFCheckpoint, export_hf_weights, load_hf_weights
    from megatron_seed.models.logprobs import token_logprobs
    from megatron_seed.models.parallel import init_parallel
    from megatron_seed.models.qwen import build_gpt_model
    from megatron_seed.rollout.weight_sync import drain

    init_parallel(tp, 1)
    ckpt = HFCheckpoint(hf_dir)
    model = build_gpt_model(ckpt.spec)
    load_hf_weights(model, ckpt)
    rank = dist.get_rank()
    fleet = None
    if rank == 0:
        import ray

        from megatron_seed.rollout.fleet import Fleet

        ray.init(address=address.gcs_address, namespace=address.namespace, log_to_driver=False)
        fleet = Fleet.connect(address)
    seqs = input_ids.tolist()
    rounds = []
    for k in range(syncs):
        perturb(model, seed=100 + k)
        trainer = token_logprobs(model, input_ids)[:, :-1]  # [b, s-1]
        stream = export_hf_weights(model, ckpt.spec)
        if fleet is None:
            drain(stream)
            continue
        before = torch.tensor(fleet.prompt_logprobs(seqs))  # [b, s-1]
        stats = fleet.update_weights(stream, bucket_bytes=bucket_bytes)
        after = [torch.tensor(x) for x in fleet.prompt_logprobs_per_engine(seqs)]  # E x [b, s-1]
        rounds.append({"trainer": trainer, "before": before, "after": after, "stats": stats})
    if rank == 0:
        import ray

        ray.shutdown()
    return {"rank": rank, "rounds": rounds}
