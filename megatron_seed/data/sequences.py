"""Chat serialisation, skill insertion H, and student/teacher token sequences.

Token ids are built by concatenating separately tokenised template segments, with each
action's sampled ids inserted verbatim. The chat is never re-tokenised as a whole, so the
ids the engine sampled are the ids the trainer scores. The same `ChatBuilder` builds the
rollout loop's generation prompts and the training sequences, so the two cannot drift.

Layout (Qwen chat), one segment per line:

    <|im_start|>system\\n{system}<|im_end|>\\n        (only if there is a system prompt)
    <|im_start|>user\\n{observation_t}<|im_end|>\\n    turn t
    <|im_start|>assistant\\n                          generation prompt ends here
    {action_ids_t}                                   sampled ids, verbatim: the loss tokens
    \\n   or   <|im_end|>\\n                          closing, never in the loss

EOS convention: the engine stops on <|im_end|> and returns it as the last sampled id, with
its log-prob. It stays in `action_ids` and is a loss token (the policy learns when to stop);
the builder then only adds the "\\n". If the action has no trailing <|im_end|> (it hit the
response limit, or stopped on another token) the builder closes the message with
"<|im_end|>\\n", which is template, not a loss token. For an action whose ids are
`encode(text) + [<|im_end|>]`, the result equals `tokenizer.apply_chat_template`.

The checkpoint's own chat template is followed where it differs in known ways, and checked:
- a template that inserts a default system prompt into a chat without one (Qwen2.5: "You
  are Qwen, created by Alibaba Cloud. ...") has the builder insert the same one when it is
  given none (`default_system_prompt`);
- Qwen3's template (default, thinking mode) renders the generation prompt as
  ``<|im_start|>assistant\\n`` and earlier assistant turns as their text with any
  ``<think>`` block removed; the builder keeps every action verbatim, so for actions
  without a think block its prompts are the template's. (The template also gives a chat's
  final assistant message an empty ``<think>\\n\\n</think>\\n\\n``: its rendering of a
  reply it did not see sampled; a builder sequence holds the sampled ids instead.
  ``enable_thinking=False`` puts that empty block into every generation prompt but not
  into the history, which no prefix-extending chat can follow: the builder does not.)
`check_chat_template` renders a probe chat both ways at every turn and fails loud at the
first differing token; `ChatBuilder` runs it once per tokenizer and template.

History modes: `full` scores every turn of a trajectory in one sequence (the paper's h_t);
`window` gives one sequence per turn whose single user message (the turn's observation)
already holds the rendered last-k history (the reference code's layout).
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from megatron_seed.data.records import TrajectoryRecord, Turn
from megatron_seed.data.tokenizer import IM_END, IM_START, check_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SkillInsertAt = Literal["task_line", "system"]
SKILL_BLOCK = "\n[Hindsight skill]\n{skill}\n"


def insert_skill(
    text: str | None, skill: str, insert_at: SkillInsertAt, marker: str | None = None
) -> str:
    """H: the text with the skill inserted; deterministic.

    task_line: `text` is a user message holding exactly one line that starts with `marker`
        (the environment's task line, e.g. ALFWorld's); SKILL_BLOCK goes right after that
        line's text (before its newline). No such line, or several: ValueError.
    system: `text` is the system prompt (None: no system prompt); SKILL_BLOCK is appended.
    """
    if not skill or not skill.strip():
        raise ValueError("cannot insert an empty skill")
    block = SKILL_BLOCK.format(skill=skill)
    if insert_at == "system":
        return text + block if text else block.lstrip("\n")
    if insert_at != "task_line":
        raise ValueError(f"unknown insert_at {insert_at!r}; expected 'task_line' or 'system'")
    if not marker:
        raise ValueError("insert_at='task_line' needs the environment's task-line marker")
    lines = list(re.finditer(rf"^{re.escape(marker)}[^\n]*", text or "", re.MULTILINE))
    if len(lines) != 1:
        found = "no" if not lines else f"{len(lines)}"
        raise ValueError(
            f"need exactly one line starting with {marker!r} to insert the skill after; "
            f"found {found} in: {(text or '')[:200]!r}"
        )
    end = lines[0].end()
    return text[:end] + block + text[end:]


@dataclass
class TokenSequence:
    """One token sequence, unshifted: entry i describes token input_ids[i].

    action_mask[i]: token i is a sampled action token (a loss target).
    logprobs[i]: rollout log-prob of token i where action_mask[i], else 0.0 (NaN where the
        builder was given none: using it then fails loud).
    turn_index[i]: the turn token i belongs to (its user message, assistant header, action
        and closing tokens); -1 for the system message.
    """

    input_ids: list[int]
    action_mask: list[bool]
    logprobs: list[float]
    turn_index: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    def action_ids(self) -> list[int]:
        """The sampled action tokens, in order."""
        return [t for t, m in zip(self.input_ids, self.action_mask, strict=True) if m]

    def action_turns(self) -> list[int]:
        """The turn index of each action token, in order."""
        return [t for t, m in zip(self.turn_index, self.action_mask, strict=True) if m]


class ChatBuilder:
    """Incremental chat token builder; the rollout loop and the trainer share it.

    Rollout use::

        chat = ChatBuilder(tokenizer, system_prompt)
        prompt = chat.prompt_ids(first_user_text)    # generate from these ids
        chat.append_action(sampled_ids)
        prompt = chat.append_user(next_observation)  # and so on
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, system_prompt: str | None = None):
        """system_prompt None: the chat template's default system prompt if it has one
        (Qwen2.5's), else no system message."""
        check_tokenizer(tokenizer)
        check_chat_template(tokenizer)  # once per tokenizer and template
        self._tokenizer = tokenizer
        self.system_prompt = (
            default_system_prompt(tokenizer) if system_prompt is None else system_prompt
        )
        self.im_end_id: int = tokenizer.convert_tokens_to_ids(IM_END)
        self._header = self._encode(f"{IM_START}assistant\n")
        self._close_open = self._encode(f"{IM_END}\n")  # action did not end with <|im_end|>
        self._close_eos = self._encode("\n")  # action ended with the sampled <|im_end|>
        self._reset()

    def _encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _reset(self) -> None:
        self._seq = TokenSequence([], [], [], [])
        self._turn = -1
        self._awaiting_action = False
        if self.system_prompt is not None:
            self._extend(self._encode(f"{IM_START}system\n{self.system_prompt}{IM_END}\n"))

    def _extend(self, ids: list[int], logprobs: list[float] | None = None) -> None:
        action = logprobs is not None
        self._seq.input_ids.extend(ids)
        self._seq.action_mask.extend([action] * len(ids))
        self._seq.logprobs.extend(logprobs if action else [0.0] * len(ids))
        self._seq.turn_index.extend([self._turn] * len(ids))

    def _add_user(self, text: str) -> list[int]:
        self._turn += 1
        self._extend(self._encode(f"{IM_START}user\n{text}{IM_END}\n"))
        self._extend(self._header)
        self._awaiting_action = True
        return list(self._seq.input_ids)

    def prompt_ids(self, first_user_text: str) -> list[int]:
        """Start a new chat (system + first user message); return the generation prompt."""
        self._reset()
        return self._add_user(first_user_text)

    def append_action(self, action_ids: list[int], logprobs: list[float] | None = None) -> None:
        """Append the sampled ids verbatim (loss tokens) and the closing template tokens."""
        if not self._awaiting_action:
            raise RuntimeError("append_action needs a prompt (prompt_ids / append_user) first")
        if not action_ids:
            raise ValueError("empty action")
        if logprobs is None:
            logprobs = [float("nan")] * len(action_ids)
        if len(logprobs) != len(action_ids):
            raise ValueError(f"{len(action_ids)} action ids but {len(logprobs)} log-probs")
        self._extend(list(action_ids), list(logprobs))
        ends_with_eos = action_ids[-1] == self.im_end_id
        self._extend(self._close_eos if ends_with_eos else self._close_open)
        self._awaiting_action = False

    def append_user(self, text: str) -> list[int]:
        """Append the next user message; return the new generation prompt."""
        if self._awaiting_action or self._turn < 0:
            raise RuntimeError("append_user needs a completed turn (append_action) first")
        return self._add_user(text)

    @property
    def num_turns(self) -> int:
        """User messages so far."""
        return self._turn + 1

    def sequence(self) -> TokenSequence:
        """A copy of the tokens so far."""
        s = self._seq
        return TokenSequence(
            list(s.input_ids), list(s.action_mask), list(s.logprobs), list(s.turn_index)
        )


# ---------------------------------------------------------------- the checkpoint's template

_PROBE_SYSTEM = "You are an agent in a house.\nAnswer with one action."
# user observations and actions of the probe chat: several lines, runs of spaces, a tab,
# unicode, digits; no action holds a <think> block (see the module docstring)
_PROBE_TURNS = (
    ("You are in a room.\n  You see a cabinet 1, a mug 2 and a café table.", "go to cabinet 1"),
    ("You arrive at cabinet 1.\tIt is closed.\n", "open cabinet 1\nthen look"),
    ("Nothing happens.", " take mug 2 from cabinet 1."),
    ("You pick up the mug 2 from the cabinet 1. (3 steps left)", None),
)
_DEFAULT_SYSTEM = re.compile(rf"{re.escape(IM_START)}system\n(.*){re.escape(IM_END)}\n", re.DOTALL)
_defaults: dict[str, str | None] = {}  # chat template -> its default system prompt
# tokenizer -> the (template, system prompt) pairs already checked
_checked: weakref.WeakKeyDictionary[Any, set[tuple[str, str | None]]] = weakref.WeakKeyDictionary()


def _chat_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) and template else None


def default_system_prompt(tokenizer: PreTrainedTokenizerFast) -> str | None:
    """The system prompt the tokenizer's chat template inserts into a chat without one
    (Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."); None
    if it inserts none or the tokenizer has no chat template. ValueError if the template
    renders anything else before the first user message."""
    template = _chat_template(tokenizer)
    if template is None:
        return None
    if template not in _defaults:
        probe = _PROBE_TURNS[0][0]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": probe}], tokenize=False, add_generation_prompt=False
        )
        at = text.find(f"{IM_START}user\n{probe}{IM_END}\n")
        if at < 0:
            raise ValueError("the chat template does not render a user message as Qwen's does")
        match = _DEFAULT_SYSTEM.fullmatch(text[:at])
        if at and match is None:
            raise ValueError(f"the chat template renders {text[:at][:80]!r} before the chat")
        _defaults[template] = match.group(1) if match else None
    return _defaults[template]


def check_chat_template(
    tokenizer: PreTrainedTokenizerFast, system_prompt: str | None = None
) -> None:
    """Fail loud (ValueError, one line) unless the ids `ChatBuilder` builds equal
    `tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)` at
    every turn of a probe chat, without a system prompt and with `system_prompt` (a probe
    one if None). The probe's actions are `encode(text) + [<|im_end|>]` without think
    blocks; the template is rendered with its defaults (Qwen3: thinking mode). A tokenizer
    without a chat template is not checked. Runs once per tokenizer, template and prompt."""
    template = _chat_template(tokenizer)
    if template is None:
        return
    done = _checked.setdefault(tokenizer, set())
    systems = [s for s in (None, system_prompt or _PROBE_SYSTEM) if (template, s) not in done]
    if not systems:
        return
    done.update((template, s) for s in systems)  # the probe's own ChatBuilders skip the check
    try:
        for system in systems:
            _check_probe(tokenizer, system)
    except Exception:
        done.difference_update((template, s) for s in systems)
        raise


def _check_probe(tokenizer: PreTrainedTokenizerFast, system: str | None) -> None:
    """The builder's prompt at every turn of the probe chat against the template's."""
    chat = ChatBuilder(tokenizer, system)
    messages = [] if system is None else [{"role": "system", "content": system}]
    for k, (user, action) in enumerate(_PROBE_TURNS):
        messages.append({"role": "user", "content": user})
        built = chat.prompt_ids(user) if k == 0 else chat.append_user(user)
        want = list(
            tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, return_dict=False
            )
        )
        if built != want:
            raise ValueError(_mismatch(tokenizer, built, want, k, system))
        if action is not None:
            chat.append_action(
                [*tokenizer.encode(action, add_special_tokens=False), chat.im_end_id]
            )
            messages.append({"role": "assistant", "content": action})


def _mismatch(
    tokenizer: Any, built: list[int], want: list[int], turn: int, system: str | None
) -> str:
    """One line: the first differing position and both tokens there."""
    at = next(
        (i for i, (a, b) in enumerate(zip(built, want, strict=False)) if a != b),
        min(len(built), len(want)),
    )

    def token(ids: list[int]) -> str:
        return repr(tokenizer.convert_ids_to_tokens(ids[at])) if at < len(ids) else "(end)"

    name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
    return (
        f"chat template of {name} and ChatBuilder differ at token {at} of the turn-{turn + 1} "
        f"prompt ({'no' if system is None else 'a'} system prompt): template {token(want)}, "
        f"builder {token(built)}"
    )


@dataclass
class SequencePair:
    """A student sequence and its teacher (None: no teacher signal for this trajectory)."""

    student: TokenSequence
    teacher: TokenSequence | None
    turn: int | None = None  # window mode: the turn this pair scores; full mode: None


def _chat_sequence(
    tokenizer: PreTrainedTokenizerFast,
    system_prompt: str | None,
    turns: list[Turn],
    first_turn: int = 0,
) -> TokenSequence:
    """One chat over `turns`; turn indices start at `first_turn`."""
    chat = ChatBuilder(tokenizer, system_prompt)
    chat.prompt_ids(turns[0].user)
    for i, turn in enumerate(turns):
        if i:
            chat.append_user(turn.user)
        chat.append_action(turn.action_ids, turn.logprobs)
    seq = chat.sequence()
    seq.turn_index = [t + first_turn if t >= 0 else t for t in seq.turn_index]
    return seq


def _with_skill(turns: list[Turn], skill: str, marker: str | None) -> list[Turn]:
    """H on the first user message (window mode: each sequence has only that one)."""
    first = replace(turns[0], user=insert_skill(turns[0].user, skill, "task_line", marker))
    return [first, *turns[1:]]


def build_sequences(
    record: TrajectoryRecord,
    tokenizer: PreTrainedTokenizerFast,
    skill_insert_at: SkillInsertAt,
    with_teacher: bool = True,
) -> list[SequencePair]:
    """Student and teacher sequences of one record, in the record's history mode.

    skill_insert_at: where H puts the skill (`SkillConfig.insert_at`).
    full: one pair for the whole trajectory. window: one pair per turn, each a single
    user message (the turn's rendered prompt) plus the action. The teacher exists when
    `with_teacher` and the record's skill passed validation; it is the same chat with the
    skill inserted by H (in every turn's prompt in window mode). Both are checked: their
    loss tokens are exactly the record's action ids, identical and in the same order.
    """
    if not record.turns:
        raise ValueError(f"record {record.task_id!r} has no turns")
    skill = record.skill if with_teacher and record.has_teacher else None
    window = record.history_mode == "window"
    groups = [[t] for t in record.turns] if window else [record.turns]
    pairs = []
    for g, turns in enumerate(groups):
        first = g if window else 0
        student = _chat_sequence(tokenizer, record.system_prompt, turns, first)
        teacher = None
        if skill is not None and skill_insert_at == "system":
            base = record.system_prompt  # None: the template's default, if it has one
            system = insert_skill(
                default_system_prompt(tokenizer) if base is None else base, skill, "system"
            )
            teacher = _chat_sequence(tokenizer, system, turns, first)
        elif skill is not None:
            teacher = _chat_sequence(
                tokenizer,
                record.system_prompt,
                _with_skill(turns, skill, record.task_marker),
                first,
            )
        check_actions(student, turns, first)
        if teacher is not None:
            check_pair(student, teacher)
        pairs.append(SequencePair(student, teacher, first if window else None))
    return pairs


def check_actions(seq: TokenSequence, turns: list[Turn], first_turn: int = 0) -> None:
    """Raise unless the loss tokens of `seq` are exactly the turns' sampled ids, per turn."""
    want_ids = [i for t in turns for i in t.action_ids]
    want_turns = [first_turn + k for k, t in enumerate(turns) for _ in t.action_ids]
    if seq.action_ids() != want_ids or seq.action_turns() != want_turns:
        raise ValueError("loss tokens differ from the record's sampled action ids")
    if len(seq) and seq.action_mask[0]:
        raise ValueError("the first token cannot be a loss token (nothing predicts it)")


def check_pair(student: TokenSequence, teacher: TokenSequence) -> None:
    """Raise unless student and teacher carry identical action tokens in the same order
    (same ids, same turns, same rollout log-probs)."""
    if student.action_ids() != teacher.action_ids():
        raise ValueError("student and teacher action tokens differ")
    if student.action_turns() != teacher.action_turns():
        raise ValueError("student and teacher action tokens belong to different turns")
    s_lp = [lp for lp, m in zip(student.logprobs, student.action_mask, strict=True) if m]
    t_lp = [lp for lp, m in zip(teacher.logprobs, teacher.action_mask, strict=True) if m]
    same = (a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(s_lp, t_lp, strict=True))
    if not all(same):
        raise ValueError("student and teacher rollout log-probs differ")
