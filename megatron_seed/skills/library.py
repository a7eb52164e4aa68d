"""Skill libraries: the fixed teacher contexts (and rollout skills) of the paper's baselines.

Every method inserts its context with the same H (`data.insert_skill`); what differs is where
the text comes from (`SkillConfig.teacher_source`):

    analyzer        the policy's own on-policy skill for that trajectory (SEED); not here
    library         a library keyed by task family: a folder holding ``general.md`` (text for
                    every family, optional) and ``<family>.md`` (one per family), as the
                    reference stack's static skill library; a user's folder, or one written
                    from Stage-1 annotations (`SkillLibrary.from_annotations`)
    stage1_library  per game, the first valid Stage-1 skill of that game, a success's first
                    (the paper's "w/o On-Policy Skill" ablation; `per_game_library`)
    expert_plan     the environment's expert plan as text (original OPSD's privileged
                    teacher: the ground-truth solution; `expert_plan_skills`)

Each source resolves to one ``{game: skill}`` dict for the training tasks (`Stage2Job.
skill_library`), and, for the family library, for any evaluation task too (Skill-Prompt*,
Skill-GRPO*). A game the source has no text for is an error at set-up, not a silent
trajectory without a teacher, except in the Stage-1 library: a game none of whose Stage-1
skills passed validation gets no teacher there, as a trajectory whose on-policy skill fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_seed.data.records import TrajectoryRecord

if TYPE_CHECKING:
    from envs.api import EnvSpec
    from megatron_seed.config import SeedConfig

GENERAL = "general.md"


class LibraryError(ValueError):
    """A skill library that is missing, empty, or does not cover the tasks asked for."""


@dataclass(frozen=True)
class SkillLibrary:
    """A family-keyed skill library: ``general`` text for all, ``families[f]`` for family f."""

    general: str = ""
    families: dict[str, str] = field(default_factory=dict)

    def skill_for(self, family: str) -> str | None:
        """The text for a task of ``family``: general then the family's, blank-line joined;
        None when the library has neither."""
        parts = [t for t in (self.general, self.families.get(family, "")) if t.strip()]
        return "\n\n".join(p.strip() for p in parts) or None

    def for_games(
        self, games: Iterable[str], family: Callable[[str], str], strict: bool = True
    ) -> dict[str, str]:
        """``{game: skill}`` for every game (``family(game)`` names its family); a
        `LibraryError` naming the families the library has no text for (not `strict`:
        those games are left out)."""
        games = list(games)
        out, missing = {}, set()
        for game in games:
            text = self.skill_for(family(game))
            if text is None:
                missing.add(family(game))
            else:
                out[game] = text
        if missing and strict:
            raise LibraryError(
                f"the skill library has no general.md and no text for the families "
                f"{sorted(missing)} (has: {sorted(self.families)})"
            )
        return out

    def save(self, folder: str | Path) -> Path:
        """Write ``general.md`` (when there is general text) and one ``<family>.md`` each."""
        root = Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        if self.general.strip():
            (root / GENERAL).write_text(self.general.strip() + "\n")
        for fam, text in sorted(self.families.items()):
            (root / f"{fam}.md").write_text(text.strip() + "\n")
        return root

    @classmethod
    def load(cls, folder: str | Path) -> SkillLibrary:
        """The library in ``folder``; `LibraryError` if it is no folder or holds no text."""
        root = Path(folder)
        if not root.is_dir():
            raise LibraryError(f"skill library {root} is not a folder of .md files")
        general, families = "", {}
        for path in sorted(root.glob("*.md")):
            text = path.read_text().strip()
            if path.name == GENERAL:
                general = text
            elif text:
                families[path.stem] = text
        if not general and not families:
            raise LibraryError(f"skill library {root} holds no text (general.md or FAMILY.md)")
        return cls(general, families)

    @classmethod
    def from_annotations(cls, records: Iterable[TrajectoryRecord]) -> SkillLibrary:
        """A family library from Stage-1 annotations: per family, the first valid skill
        written for a success (a workflow) and the first for a failure (an avoidance
        rule), in record order; no general text. `LibraryError` if no skill is valid."""
        won: dict[str, str] = {}
        lost: dict[str, str] = {}
        for record in records:
            if record.has_teacher:
                (won if record.won else lost).setdefault(record.family, record.skill)
        families = {}
        for fam in sorted(set(won) | set(lost)):
            families[fam] = "\n\n".join(t for t in (won.get(fam), lost.get(fam)) if t)
        if not families:
            raise LibraryError("the annotations hold no valid skill to build a library from")
        return cls("", families)


def load_library(path: str | Path) -> SkillLibrary:
    """A family library from a folder (`SkillLibrary.load`) or from a JSONL file of Stage-1
    annotations (`SkillLibrary.from_annotations`, what `seed annotate` writes)."""
    from megatron_seed.data import read_jsonl

    if Path(path).is_file():
        try:
            return SkillLibrary.from_annotations(read_jsonl(path))
        except (ValueError, TypeError, KeyError) as err:
            if isinstance(err, LibraryError):
                raise
            raise LibraryError(f"{path}: not Stage-1 annotations ({err})") from None
    return SkillLibrary.load(path)


def library_flag(path: str | Path) -> SkillLibrary:
    """``--skill-library PATH`` loaded before any work (`load_library`): a one-line
    `CommandError` for a missing folder, one without skills, or a file that is not Stage-1
    annotations."""
    from megatron_seed.errors import CommandError

    try:
        return load_library(path)
    except (LibraryError, OSError) as err:
        raise CommandError(f"--skill-library: {err}") from None


def per_game_library(records: Iterable[TrajectoryRecord]) -> dict[str, str]:
    """The ``stage1_library`` source: per game, the first valid Stage-1 skill, preferring
    one written for a successful episode."""
    library: dict[str, str] = {}
    valid = [r for r in records if r.has_teacher]
    for record in sorted(valid, key=lambda r: not r.won):  # stable: successes first
        library.setdefault(record.game, record.skill)
    if not library:
        raise LibraryError("the annotations hold no valid skill to build a skill library from")
    return library


def plan_text(plan: Sequence[str]) -> str:
    """An expert plan as a privileged context (original OPSD's ground-truth solution)."""
    steps = "\n".join(f"{i}. {action}" for i, action in enumerate(plan, 1))
    return f"An expert solves this task with these actions, in order:\n{steps}"


def expert_plan_skills(
    games: Iterable[str], expert_plan: Callable[[str], Sequence[str] | None]
) -> dict[str, str]:
    """``{game: plan_text(expert_plan(game))}``; `LibraryError` naming a game without one."""
    out = {}
    for game in games:
        plan = expert_plan(game)
        if not plan:
            raise LibraryError(f"the environment has no expert plan for task {game}")
        out[game] = plan_text(plan)
    return out


def fixed_source(cfg: SeedConfig) -> str | None:
    """The fixed skill source a config reads (`SkillConfig.teacher_source` when the teacher
    pass is on and not the analyzer's; "library" for rollout skills alone); None: none."""
    source = cfg.skill.teacher_source
    if cfg.algo.use_opd and source != "analyzer":
        return source
    return "library" if cfg.skill.rollout_skill else None


def game_skills(
    cfg: SeedConfig, env: EnvSpec, games: Sequence[str], path: str | Path | None
) -> dict[str, str] | None:
    """``{game: skill}`` of the config's fixed source for ``games`` (None when it reads
    none): the environment's expert plans, a family library (``library``: a folder, or
    Stage-1 annotations to build one from, `load_library`), or per game from Stage-1
    annotations, a JSONL file (``stage1_library``). `LibraryError` when the source
    needs ``path`` and has none, or does not cover every game (the Stage-1 library: any)."""
    from megatron_seed.data import read_jsonl

    source = fixed_source(cfg)
    if source is None:
        return None
    if source == "expert_plan":
        return expert_plan_skills(games, env.expert_plan)
    if path is None:
        what = "a family folder" if source == "library" else "Stage-1 annotations (JSONL)"
        raise LibraryError(f"the {source!r} skill source needs --skill-library ({what})")
    if source == "library":
        return load_library(path).for_games(games, env.family)
    if not Path(path).is_file():
        raise LibraryError(f"--skill-library {path}: {source!r} reads a JSONL file of annotations")
    library = per_game_library(read_jsonl(path))
    if not any(g in library for g in games):
        raise LibraryError(f"the Stage-1 library {path} has a skill for none of the games")
    return library
