"""Synthetic multi-turn trajectories for benchmarks and trainer checks.

They have the exact structure of real records (a task line, observations,
sampled action ids with log-probs, groups, rewards, skills) with random contents, so that
the trainer's math and speed can be checked without an environment or engine.
"""

from __future__ import annotations

import random

from megatron_seed.data import Analysis, TrajectoryRecord, Turn

TASK_MARKER = "Goal:"  # the synthetic environment's task line (where H inserts a skill)

_WORDS = [
    "go",
    "to",
    "open",
    "close",
    "take",
    "move",
    "heat",
    "cool",
    "clean",
    "slice",
    "examine",
    "the",
    "a",
    "mug",
    "cup",
    "cabinet",
    "drawer",
    "fridge",
    "sinkbasin",
    "countertop",
    "microwave",
    "apple",
    "knife",
    "desk",
    "shelf",
    "lamp",
    "1",
    "2",
    "3",
    "4",
]


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def synthetic_records(
    tokenizer,
    groups: int = 2,
    group_size: int = 2,
    turns: int = 3,
    action_tokens: int = 6,
    obs_words: int = 12,
    seed: int = 0,
    history_mode: str = "full",
    valid_skill_every: int = 1,
) -> list[TrajectoryRecord]:
    """`groups * group_size` records of `turns` turns. Action ids (about
    `action_tokens` per turn, lengths vary) are drawn from the tokenizer's ordinary tokens; every `valid_skill_every`-th record has a valid skill;
    rewards alternate so that groups have non-zero advantages."""
    rng = random.Random(seed)
    n_special = len(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    assert n_special >= 1 and vocab
    records = []
    for g in range(groups):
        task = f"put a {rng.choice(['mug', 'apple', 'knife'])} in {rng.choice(['fridge', 'desk'])}."
        for k in range(group_size):
            steps = []
            for t in range(turns):
                head = f"{TASK_MARKER} {task}\n" if t == 0 or history_mode == "window" else ""
                obs = _sentence(rng, obs_words)
                length = rng.randint(max(1, action_tokens // 2), action_tokens * 3 // 2)
                ids = [rng.choice(vocab) for _ in range(length)]
                lps = [-rng.uniform(0.1, 5.0) for _ in ids]
                steps.append(
                    Turn(
                        user=head + obs,
                        action=tokenizer.decode(ids),
                        action_ids=ids,
                        logprobs=lps,
                        observation=obs,
                    )
                )
            i = g * group_size + k
            records.append(
                TrajectoryRecord(
                    task_id=f"task{g}",
                    group_id=f"g{g}",
                    game=f"game{g}",
                    family="pick",
                    turns=steps,
                    reward=float((i + g) % 2),
                    won=bool((i + g) % 2),
                    history_mode=history_mode,
                    system_prompt="You are an expert agent.",
                    task_marker=TASK_MARKER,
                    goal=task,
                    skill=f"Workflow: find the object first, then {_sentence(rng, 6)}."
                    if i % valid_skill_every == 0
                    else None,
                    analysis=Analysis(f"task{g}/{k}", valid=i % valid_skill_every == 0),
                )
            )
    return records


def annotated_record(
    game: str, won: bool, skill: str | None, valid: bool = True, family: str = "pick"
) -> TrajectoryRecord:
    """A one-turn record of ``game`` with an analysis (``valid``) and ``skill``: what skill
    libraries are built from, without an environment."""
    turn = Turn(user="obs", action="<action>look</action>", action_ids=[5], logprobs=[-1.0])
    return TrajectoryRecord(
        task_id=game,
        group_id=game,
        game=game,
        family=family,
        turns=[turn],
        reward=float(won),
        won=won,
        skill=skill,
        analysis=Analysis(game, valid=valid),
    )
