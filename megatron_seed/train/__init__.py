"""The Megatron trainer: per-token log-prob passes (old, reference, teacher, student), the
joint SEED loss over mini-batches, Adam steps, and dist-checkpoints that resume across
layouts.
"""
