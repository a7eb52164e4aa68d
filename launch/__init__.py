"""Launching with NeMo-Run: launch plans (recipe + nodes + overrides, validated), the GPU
layout and its memory arithmetic, local and Slurm executors, and the Ray health wait.
"""
