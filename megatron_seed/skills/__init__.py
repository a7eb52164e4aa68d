"""Hindsight skills: the analyzer prompt (two layouts), lenient parsing and validation with
retries, and the external analyzer client (any OpenAI-compatible endpoint, resumable).

Oracle analyzers that know an environment's ground truth live with their environment
(`EnvSpec.oracle`); `skills.oracle` makes one a ``generate_fn``. H (inserting a skill) is
`megatron_seed.data.insert_skill`.
"""
