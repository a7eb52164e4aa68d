"""The tiny base policy the default CPU job starts from: built here, cached on disk.

SEED starts from an instruction-tuned LLM that (a) succeeds only sometimes on ALFWorld (the
paper's untrained "Vanilla" row), (b) changes what it does when a skill is placed in its
context and (c) can already write a skill about an episode. No such model exists offline, so
the project builds one: a byte-level BPE tokenizer and a tiny Qwen2 model trained by
behaviour cloning (masked NLL with the project's Megatron trainer, ``SeedTrainer.nll_step``)
on demonstrations played in the real ALFWorld engine.

Choices (all recorded in ``manifest.json``; ``BasePolicySettings`` holds the numbers):

- Games: small rooms (``RoomSize(4, 1)``: four receptacles, one distractor), the six
  families round-robin. With ``games_dir`` (the default job's folder) its ``train`` games are
  used first (the job's Stage-2 training games are among the cloned ones); the rest are
  generated inside the build (2 processes), never in the shared folder.
- Rendering: exactly as the agent loop renders episodes (``Rendering``: the ``compact``
  prompt style, ``full`` history: one chat per episode, one training sequence per episode;
  ``window`` gives one per step); the targets are ``<action>A</action><|im_end|>``.
- Demonstrations per game:
  * noisy, no hint (``noisy_per_game``): a searching player (``play_noisy``): until the
    object is found it visits places in a random order, opening closed ones; afterwards it
    follows the planner (fast-downward ``policy_commands``, replanned from the state
    reached). With probability ``mistake_prob`` per step (at most ``max_mistakes``) the
    action is a random admissible one or the previous action again ("Nothing happens."),
    and the planner recovers. Every demonstration wins; the mistakes are cloned too.
  * hinted (``hinted_per_game``): the planner's plan played exactly, with a skill stating
    that plan inserted by H into every prompt ("Workflow: to heat some egg and put it in
    countertop, go to sinkbasin 1, take egg 1 from sinkbasin 1, ..."). Templates vary.
  * analysis (``analysis_per_game``): a no-hint demonstration, whole (a success) or cut
    short (a failure: the step budget ran out), as the analyzer request of
    ``analyzer_layout`` with the embedded analyzer's JSON answer as the target.
- Why it succeeds only sometimes: without a hint the object's place is unknown until
  visited and the clone samples the searcher's random order and its mistakes; a hint that
  names the place removes the search.
- Model: Qwen2, head_dim 32 (vLLM CPU supports 32/64), vocab = tokenizer length rounded up
  to a multiple of 4; one process, fp32, Adam, warm-up then cosine decay, length-bucketed
  batches; the weights are written back as a HF folder with the tokenizer files.
- Measurement (``measure_base_policy``, optional): the real ``AgentLoop`` with an
  in-process vLLM engine on held-out games, with and without the plan as a skill.

Cache: the build writes into ``<out_dir>.partial`` and renames it to ``out_dir`` at the end,
so ``out_dir`` is complete or absent. A rerun with the same settings returns the cached model
after checking every file recorded in the manifest (size and SHA-256); an ``out_dir`` without
a manifest, with different settings or with a changed file is an error, never reused.
"""

from megatron_seed.testbed.base_policy.build import (
    build_base_policy,
    cache_key,
    load_cached,
    read_manifest,
)
from megatron_seed.testbed.base_policy.measure import measure_base_policy
from megatron_seed.testbed.base_policy.settings import (
    MANIFEST,
    MODEL_SUBDIR,
    TOKENIZER_SUBDIR,
    BasePolicyCacheError,
    BasePolicySettings,
    Rendering,
)

__all__ = [
    "MANIFEST",
    "MODEL_SUBDIR",
    "TOKENIZER_SUBDIR",
    "BasePolicyCacheError",
    "BasePolicySettings",
    "Rendering",
    "build_base_policy",
    "cache_key",
    "load_cached",
    "measure_base_policy",
    "read_manifest",
]
