"""Trajectory records, chat serialisation, skill insertion H, student/teacher sequences,
collation, and the Qwen chat tokens.

The flow: the rollout loop builds prompts with `ChatBuilder` and stores a `TrajectoryRecord`;
`build_sequences` turns a record into student/teacher `TokenSequence`s with the same code;
`collate` pads them into the shifted `[b, s]` tensors the loss functions in
`megatron_seed.algo` take.
"""

from megatron_seed.data.collate import TokenBatch, align_teacher, collate
from megatron_seed.data.records import (
    Analysis,
    HistoryMode,
    Status,
    TrajectoryRecord,
    Turn,
    read_jsonl,
    write_jsonl,
)
from megatron_seed.data.sequences import (
    SKILL_BLOCK,
    ChatBuilder,
    SequencePair,
    SkillInsertAt,
    TokenSequence,
    build_sequences,
    check_actions,
    check_chat_template,
    check_pair,
    default_system_prompt,
    insert_skill,
)
from megatron_seed.data.tokenizer import ENDOFTEXT, IM_END, IM_START, check_tokenizer

__all__ = [
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "SKILL_BLOCK",
    "Analysis",
    "ChatBuilder",
    "HistoryMode",
    "SequencePair",
    "SkillInsertAt",
    "Status",
    "TokenBatch",
    "TokenSequence",
    "TrajectoryRecord",
    "Turn",
    "align_teacher",
    "build_sequences",
    "check_actions",
    "check_chat_template",
    "check_pair",
    "check_tokenizer",
    "collate",
    "default_system_prompt",
    "insert_skill",
    "read_jsonl",
    "write_jsonl",
]
