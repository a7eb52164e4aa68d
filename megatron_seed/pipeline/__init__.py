"""The two stages and the evaluation: Stage 1 (collect, annotate, hindsight-skill SFT),
Stage 2 (the SEED update loop as phase functions), skill-free evaluation, metrics logs,
and the `seed train` / `seed sft` commands.
"""
