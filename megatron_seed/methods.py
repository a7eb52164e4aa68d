"""Methods by name: every row of the paper's Table 1 and its Table-2 ablations as data.

A `Method` is a loss variant (changes to `AlgoConfig`, whose terms live in `algo/`), a
teacher-context source (`SkillConfig.teacher_source`, resolved by `skills.library`), whether
the library's skill is in the rollout prompts, whether a Stage-1 hindsight-skill SFT comes
first, and whether evaluation runs with the library's skill. `seed train --method NAME`
applies one; `seed compare --methods ...` runs several side by side.

Baselines follow the public reference stack that ran SEED's baselines (BASELINES.md;
`algo/baselines.py` has each term's equations): no Stage-1 SFT, a static family-keyed skill
library as the teacher's context, teacher log-probs once per batch with theta_old
(`teacher_mode="snapshot"`). SEED's rows use the policy's own on-policy skills and the
current weights for the teacher (`live`, the paper's equations). The paper's faithful
variant of OPSD (sampled-token reverse-KL policy gradient to a teacher that sees the
expert plan) is a row of its own, `opsd-paper`.

    name           trains  Stage 1  loss (changes to AlgoConfig)          teacher   rollout skill  eval skill
    vanilla        no      -        -                                     -         -              no
    skill-prompt   no      -        -                                     -         -              yes (Skill-Prompt*)
    grpo           yes     no       use_opd=False                         -         no             no
    grpo-shuffled  yes     no       use_opd=False, shuffle_advantages     -         no             no
    skill-grpo     yes     no       use_opd=False                         -         library        no and yes (Skill-GRPO*)
    opsd           yes     no       policy_weight=0, snapshot             library   no             no
    opsd-paper     yes     no       policy_weight=0, reverse_kl_pg, snap. expert    no             no
    grpo-opsd      yes     no       beta_opd=0, snapshot                  library   no             no
    skill-sd       yes     no       distill=iw_reverse_kl, snapshot       library   no             no
    rlsd           yes     no       advantage_reweight=rlsd, lambda_opd=0 library   no             no
    sdar           yes     no       snapshot                              library   no             no
    seed           yes     yes      (the defaults: live)                  analyzer  no             no
    seed-replay    yes     yes      replay_weight=0.1 (analyzer replay)   analyzer  no             no
    no-sft         yes     no       -                                     analyzer  no             no
    no-opd         yes     yes      use_opd=False                         -         no             no
    static-skills  yes     yes      -                                     stage1    no             no
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from megatron_seed.config import SeedConfig
from megatron_seed.errors import CommandError

TeacherSource = Literal["none", "analyzer", "library", "stage1_library", "expert_plan"]
SNAPSHOT = {"teacher_mode": "snapshot"}  # the reference stack's teacher: theta_old, per batch


@dataclass(frozen=True)
class Method:
    """One method of the comparison (module docstring: the table)."""

    name: str
    label: str  # its report row (evaluated without skills)
    trains: bool = True  # False: the base policy is evaluated as it is
    stage1: bool = False  # Stage-1 hindsight-skill SFT first
    algo: dict[str, Any] = field(default_factory=dict)  # changes to AlgoConfig
    teacher: TeacherSource = "none"  # "none": no teacher pass (algo.use_opd False)
    rollout_skill: bool = False  # the library's skill in every rollout prompt
    eval_plain: bool = True  # a report row evaluated without skills
    eval_skill_label: str | None = None  # a row evaluated with the library's skill
    source: str = "reference stack"  # where its settings come from

    @property
    def needs_library(self) -> bool:
        """Whether the method reads a family skill library (teacher, rollouts or eval)."""
        return self.teacher == "library" or self.rollout_skill or bool(self.eval_skill_label)

    def config(self, cfg: SeedConfig) -> SeedConfig:
        """``cfg`` with this method's loss, teacher source and rollout-skill settings."""
        if not self.trains:
            raise CommandError(
                f"method {self.name!r} trains nothing: evaluate the base policy with seed eval"
            )
        use_opd = self.teacher != "none"
        algo = dataclasses.replace(cfg.algo, **{"use_opd": use_opd, **self.algo})
        teacher = self.teacher if use_opd else "analyzer"
        skill = dataclasses.replace(
            cfg.skill, teacher_source=teacher, rollout_skill=self.rollout_skill
        )
        return dataclasses.replace(cfg, algo=algo, skill=skill)


def _baseline(name: str, label: str, teacher: TeacherSource = "library", **algo: Any) -> Method:
    return Method(name, label, teacher=teacher, algo={**SNAPSHOT, **algo})


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("vanilla", "Base (Vanilla)", trains=False),
        Method(
            "skill-prompt",
            "Skill-Prompt*",
            trains=False,
            eval_plain=False,
            eval_skill_label="Skill-Prompt*",
        ),
        Method("grpo", "GRPO"),
        Method(
            "grpo-shuffled",
            "GRPO, advantages permuted (control)",
            algo={"shuffle_advantages": True},
            source="this project (negative control: must not learn)",
        ),
        Method("skill-grpo", "Skill-GRPO", rollout_skill=True, eval_skill_label="Skill-GRPO*"),
        _baseline("opsd", "OPSD", policy_weight=0.0),
        Method(
            "opsd-paper",
            "OPSD (paper: reverse-KL PG, expert plan)",
            teacher="expert_plan",
            algo={**SNAPSHOT, "policy_weight": 0.0, "distill": "reverse_kl_pg"},
            source="paper (faithful variant)",
        ),
        _baseline("grpo-opsd", "GRPO+OPSD", beta_opd=0.0),
        _baseline("skill-sd", "Skill-SD", distill="iw_reverse_kl"),
        _baseline("rlsd", "RLSD", advantage_reweight="rlsd", lambda_opd=0.0),
        _baseline("sdar", "SDAR"),
        Method("seed", "SEED", stage1=True, teacher="analyzer", source="paper"),
        Method(
            "seed-replay",
            "SEED + analyzer replay",
            stage1=True,
            teacher="analyzer",
            algo={"replay_weight": 0.1},
            source="this project (beyond the paper)",
        ),
        # the paper's Table 2 ablations
        Method("no-sft", "w/o Hindsight Skill SFT", teacher="analyzer", source="paper"),
        Method("no-opd", "w/o Self-Evolving OPD", stage1=True, source="paper"),
        Method(
            "static-skills",
            "w/o On-Policy Skill",
            stage1=True,
            teacher="stage1_library",
            source="paper",
        ),
    )
}


def get_method(name: str) -> Method:
    """The method called ``name``; a one-line `CommandError` naming the others."""
    if name not in METHODS:
        raise CommandError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]
