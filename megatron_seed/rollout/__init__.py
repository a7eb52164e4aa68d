"""Rollouts: the multi-turn agent loop, the vLLM engines and their Ray fleet, weight sync
from the trainer, the on-policy analyzer, and the rollout session a phase plays with.
"""
