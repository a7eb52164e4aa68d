"""What the CPU test bed needs to know about each environment it runs the default job on.

The library takes an environment by name and knows nothing else of it (`envs.spec`). The
test bed also has to size a job for it: how many tasks, which task options make a world the
tiny base policy can learn, how long an episode may be and how long a reply. Those choices
live here, one `EnvProfile` per environment, so that `seed run --env NAME`, `seed compare`
and the base-policy builder read them from one place.

Sizes (`SIZES`): ``full``, ``quick`` and, for ALFWorld, ``evidence``: the quick world with
4x the training games and held-out games sampled like the training games, the design of
`docs/results.md`'s power section (a method's outcome should not ride on which of 6 games
it learns).

- ``alfworld``: the paper's main environment (small rooms; QUICK and EVIDENCE play Pick only).
- ``search``: search-based QA over a generated encyclopedia (at most 4 turns).
- ``sokoban``: one box on a 6x6 grid (at most 15 moves).
- ``webshop``: shopping over a generated catalogue (at most 15 actions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobSize:
    """How big one run is: its games and evaluation; Stage 1 and Stage 2 are its recipe's."""

    name: str
    recipe: str  # `megatron_seed.recipes` name: the config of Stage 1 and Stage 2
    n_train: int  # Stage-2 training games
    n_eval: int  # games per evaluation split (seen, unseen)
    stage1_tasks: int
    train_eval_episodes: int  # sampled episodes per training game at evaluation
    families: tuple[str, ...] = ()  # task families of the games; () = all of them
    # sampled episodes per held-out (seen, unseen) game at the rollout temperature; 0: one
    # greedy episode per game
    heldout_episodes: int = 0


@dataclass(frozen=True)
class EnvProfile:
    """One environment as the test bed runs it.

    task_options: keyword options of the environment's ``generate_tasks`` for every set of
        tasks the test bed writes (the job's and the base policy's).
    rollout: `RolloutConfig` fields that differ from the default job's recipe.
    base_quick / base_full / base_evidence: `BasePolicySettings` fields that differ from its
        defaults, per size.
    """

    env: str
    title: str  # the report's name of the environment
    quick: JobSize
    full: JobSize
    task_options: dict[str, Any] = field(default_factory=dict)
    family_option: str | None = None  # generate_tasks' keyword for a JobSize's families
    rollout: dict[str, Any] = field(default_factory=dict)
    base_quick: dict[str, Any] = field(default_factory=dict)
    base_full: dict[str, Any] = field(default_factory=dict)
    run_dir: str = ""  # `seed run`'s default output folder (other sizes: "-SIZE" appended)
    evidence: JobSize | None = None  # None: the environment has no EVIDENCE size
    base_evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def sizes(self) -> tuple[str, ...]:
        """The names of the sizes this environment has."""
        return tuple(s for s in SIZES if getattr(self, s) is not None)

    def size(self, name: str) -> JobSize:
        """The size called ``name``; a one-line error naming the environment's sizes."""
        if name not in self.sizes:
            raise ValueError(
                f"{self.title} has no {name!r} size; choose from {', '.join(self.sizes)}"
            )
        return getattr(self, name)

    def base_settings(self, size: str) -> dict[str, Any]:
        """`BasePolicySettings` fields of the base policy of size ``size``."""
        self.size(size)  # an unknown size fails here
        return getattr(self, f"base_{size}")

    def generate_options(self, families: tuple[str, ...] = ()) -> dict[str, Any]:
        """``generate_tasks`` options for tasks of ``families`` (() = all)."""
        options = dict(self.task_options)
        if self.family_option is not None:
            options[self.family_option] = list(families) or None
        return options


# every QUICK base policy: the job's own few training games cloned many times over (with
# ``games_dir``): it plays those sometimes and nothing else (too little compute to learn to
# copy names)
_QUICK_BASE: dict[str, Any] = dict(
    n_train_games=6,
    noisy_per_game=8,
    hinted_per_game=2,
    analysis_per_game=8,  # 2 gave 0-8 % valid skills in Stage 2 (ALFWorld); 8 gives the format
    train_steps=200,
)

SIZES = ("full", "quick", "evidence")  # `seed run` / `seed compare --size`

# ALFWorld's EVIDENCE size: QUICK's world and recipe with 4x the games (24 training games,
# every update still 2 tasks x 8 episodes), every number from sampled episodes: 24 x 8 on the
# training games, 24 x 4 on each held-out split (docs/results.md, "Power")
_EVIDENCE = JobSize(
    "evidence",
    "default-quick",
    n_train=24,
    n_eval=24,
    stage1_tasks=24,
    train_eval_episodes=8,
    families=("pick",),
    heldout_episodes=4,
)
# its base policy clones every one of the 24 training games (a clone of 6 would play the
# other 18 as it plays unseen games: never); 4x the steps, so that each game's
# demonstrations are seen as often as by QUICK's clone
_EVIDENCE_BASE = {**_QUICK_BASE, "n_train_games": 24, "train_steps": 800, "families": ("pick",)}

# ALFWorld's FULL base policy: QUICK's recipe on the job's own 16 training games (every
# family), trained until it wins some of them and not most. Success on its 16 games (T=1,
# 4 episodes each, seed 20, docs/results.md "The full default job"): 200 steps 0 %, 350 17 %,
# 500 48 %; 10x these steps' demos at 600 steps won 70 % and left RL nothing to add. The
# earlier base, cloned on 200 games, won 6 %: too rarely for a group to carry an outcome.
_FULL_BASE = {**_QUICK_BASE, "n_train_games": 16, "train_steps": 450}

ALFWORLD = EnvProfile(
    env="alfworld",
    title="ALFWorld",
    full=JobSize("full", "default", n_train=16, n_eval=18, stage1_tasks=16, train_eval_episodes=8),
    quick=JobSize(
        "quick",
        "default-quick",
        n_train=6,
        n_eval=6,
        stage1_tasks=6,
        train_eval_episodes=8,
        families=("pick",),  # the shortest family: a smaller base policy plays it sometimes
    ),
    # the room size the base policy is built for; planner walkthroughs only
    task_options={"room": (4, 1), "handcoded": False, "workers": 2},
    family_option="families",
    base_quick={**_QUICK_BASE, "families": ("pick",)},
    base_full=_FULL_BASE,
    run_dir="runs/default",
    evidence=_EVIDENCE,
    base_evidence=_EVIDENCE_BASE,
)

SEARCH = EnvProfile(
    env="search",
    title="Search-QA",
    full=JobSize("full", "default", n_train=16, n_eval=14, stage1_tasks=16, train_eval_episodes=4),
    quick=JobSize(
        "quick", "default-quick", n_train=6, n_eval=7, stage1_tasks=6, train_eval_episodes=8
    ),
    # Search-R1's budget: at most 4 turns; a query or an answer fits in 32 tokens
    rollout=dict(max_steps=4, max_response_tokens=32),
    base_quick=_QUICK_BASE,
    run_dir="runs/search",
)

SOKOBAN = EnvProfile(
    env="sokoban",
    title="Sokoban",
    full=JobSize("full", "default", n_train=16, n_eval=12, stage1_tasks=16, train_eval_episodes=4),
    quick=JobSize(
        "quick", "default-quick", n_train=6, n_eval=6, stage1_tasks=6, train_eval_episodes=8
    ),
    # verl-agent's text Sokoban: at most 15 moves; "<action>left</action>" is a few tokens
    rollout=dict(max_steps=15, max_response_tokens=16),
    base_quick=_QUICK_BASE,
    run_dir="runs/sokoban",
)

WEBSHOP = EnvProfile(
    env="webshop",
    title="WebShop",
    full=JobSize("full", "default", n_train=16, n_eval=15, stage1_tasks=16, train_eval_episodes=4),
    quick=JobSize(
        "quick", "default-quick", n_train=6, n_eval=5, stage1_tasks=6, train_eval_episodes=4
    ),
    # verl-agent's WebShop: at most 15 actions; the longest reply, the search of the
    # instruction's attributes, type and options, fits in 48 tokens
    rollout=dict(max_steps=15, max_response_tokens=48),
    # an episode's pages are long (a results page lists 10 products): half the analysis
    # examples, fewer cloning steps than ALFWorld's 200
    base_quick={**_QUICK_BASE, "analysis_per_game": 4, "train_steps": 160},
    run_dir="runs/webshop",
)

PROFILES: dict[str, EnvProfile] = {p.env: p for p in (ALFWORLD, SEARCH, SOKOBAN, WEBSHOP)}


def profile(env: str) -> EnvProfile:
    """The profile of ``env``; a one-line error naming the known ones."""
    if env not in PROFILES:
        raise ValueError(
            f"the CPU test bed has no job for environment {env!r}; choose from {sorted(PROFILES)}"
        )
    return PROFILES[env]
