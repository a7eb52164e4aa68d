"""Qwen2 / Qwen2.5 / Qwen3 on megatron-core: model builders and layer specs, HF <-> Megatron
conversion with parity checks, tensor/pipeline-parallel setup, and the small CPU-compat
module that lets megatron-core run on gloo.
"""
