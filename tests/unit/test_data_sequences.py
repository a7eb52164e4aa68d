"""Chat serialisation, skill insertion H, and student/teacher sequences."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_seed.data import (
    IM_END,
    Analysis,
    ChatBuilder,
    TokenSequence,
    TrajectoryRecord,
    Turn,
    build_sequences,
    check_actions,
    check_pair,
    insert_skill,
)

SYSTEM = "You are an expert agent."
MARKER = "Your task is to:"  # the task line H inserts after (an environment's)
OBS = [
    "You are an expert agent operating in the ALFRED Embodied Environment.\n"
    "Your task is to: put a clean mug in coffeemachine.\n"
    "Your current observation is: you see a countertop 2.",
    "You arrive at countertop 2. On the countertop 2, you see a mug 1.",
    "You pick up the mug 1 from the countertop 2.",
]
ACTIONS = ["<action>go to countertop 2</action>", "take mug 1 from countertop 2", "look"]
SKILL = "Workflow: take the mug, clean it at the sinkbasin, then place it."


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _record(tok, *, eos: tuple[bool, ...] = (True, True, False), **overrides) -> TrajectoryRecord:
    """Turns whose action ids are encode(text) (+ <|im_end|> where the engine sampled it)."""
    turns = []
    for k, (obs, act) in enumerate(zip(OBS, ACTIONS, strict=True)):
        ids = _encode(tok, act) + ([tok.convert_tokens_to_ids(IM_END)] if eos[k] else [])
        turns.append(Turn(obs, act, ids, [-0.01 * (k + 1) - 0.001 * i for i in range(len(ids))]))
    data = {
        "task_id": "t",
        "group_id": "g",
        "game": "game",
        "family": "clean",
        "turns": turns,
        "reward": 1.0,
        "won": True,
        "system_prompt": SYSTEM,
        "task_marker": MARKER,
        "skill": SKILL,
        "analysis": Analysis("t", valid=True),
    }
    data.update(overrides)
    return TrajectoryRecord(**data)


def _action_positions(seq: TokenSequence, turn: int) -> list[int]:
    return [i for i in range(len(seq)) if seq.action_mask[i] and seq.turn_index[i] == turn]


def _chat_messages(record: TrajectoryRecord) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": record.system_prompt}]
    for turn in record.turns:
        messages += [
            {"role": "user", "content": turn.user},
            {"role": "assistant", "content": turn.action},
        ]
    return messages


def _ids(tok, messages, generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    return _encode(tok, text)


# ---------------------------------------------------------------- H


def test_insert_skill_task_line_exact_text() -> None:
    text = "Role line.\nYour task is to: heat an egg.\nYou see a microwave."
    assert insert_skill(text, "Use the microwave.", "task_line", MARKER) == (
        "Role line.\nYour task is to: heat an egg.\n[Hindsight skill]\nUse the microwave.\n"
        "\nYou see a microwave."
    )
    assert insert_skill("Your task is to: x", "S", "task_line", MARKER) == (
        "Your task is to: x\n[Hindsight skill]\nS\n"
    )


def test_insert_skill_system_and_failures() -> None:
    assert insert_skill("Be brief.", "S", "system") == "Be brief.\n[Hindsight skill]\nS\n"
    assert insert_skill(None, "S", "system") == "[Hindsight skill]\nS\n"
    with pytest.raises(ValueError, match="Your task is to:"):
        insert_skill("You see a desk.", "S", "task_line", MARKER)
    with pytest.raises(ValueError, match="Your task is to:"):  # mid-line does not count
        insert_skill("Role. Your task is to: x", "S", "task_line", MARKER)
    with pytest.raises(ValueError, match="found 2"):
        insert_skill("Your task is to: a\nYour task is to: b", "S", "task_line", MARKER)
    with pytest.raises(ValueError, match="task-line marker"):  # the environment has none
        insert_skill("Your task is to: x", "S", "task_line", None)
    assert insert_skill("Goal: x\nGo.", "S", "task_line", "Goal:") == (
        "Goal: x\n[Hindsight skill]\nS\n\nGo."
    )  # any environment's marker
    with pytest.raises(ValueError, match="empty skill"):
        insert_skill("Your task is to: a", "  ", "task_line", MARKER)


# ---------------------------------------------------------------- ChatBuilder


def test_chat_builder_prompts_match_chat_template_and_prefix_training_sequence(
    tiny_tokenizer,
) -> None:
    tok = tiny_tokenizer
    record = _record(tok, eos=(True, True, True))
    chat = ChatBuilder(tok, SYSTEM)
    messages = _chat_messages(record)
    prompts = []
    for k, turn in enumerate(record.turns):
        prompt = chat.prompt_ids(turn.user) if k == 0 else chat.append_user(turn.user)
        assert prompt == _ids(tok, messages[: 2 + 2 * k], generation_prompt=True)
        prompts.append(prompt)
        chat.append_action(turn.action_ids, turn.logprobs)
    (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
    student = pair.student
    assert student.input_ids == _ids(tok, messages, generation_prompt=False)
    assert student == chat.sequence()
    for k, prompt in enumerate(prompts):  # rollout prompt k = the sequence up to action k
        start = _action_positions(student, k)[0]
        assert student.input_ids[:start] == prompt


def test_action_ids_are_inserted_verbatim_never_retokenised(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    # the engine may sample a non-canonical split: here every character as its own token
    weird = [i for ch in "go to countertop 2" for i in _encode(tok, ch)]
    assert _encode(tok, tok.decode(weird)) != weird  # re-tokenising would change the ids
    record = _record(tok)
    record.turns[1] = Turn(OBS[1], "go to countertop 2", weird, [-0.5] * len(weird))
    (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
    for seq in (pair.student, pair.teacher):
        assert seq.action_ids() == [i for t in record.turns for i in t.action_ids]
        spans = _action_positions(seq, 1)
        assert [seq.input_ids[i] for i in spans] == weird
        assert spans == list(range(spans[0], spans[0] + len(weird)))  # one contiguous span


def test_eos_convention_and_mask_covers_only_action_tokens(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    im_end = tok.convert_tokens_to_ids(IM_END)
    newline = _encode(tok, "\n")
    record = _record(tok, eos=(True, False, False))
    (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
    s = pair.student
    for k, turn in enumerate(record.turns):
        idx = _action_positions(s, k)
        after = s.input_ids[idx[-1] + 1 : idx[-1] + 3]
        assert [s.logprobs[i] for i in idx] == turn.logprobs
        if turn.action_ids[-1] == im_end:  # sampled EOS: a loss token; builder adds "\n" only
            assert s.input_ids[idx[-1]] == im_end and after[: len(newline)] == newline
        else:  # no EOS sampled: the template closes the message, outside the mask
            assert after[:1] == [im_end] and not s.action_mask[idx[-1] + 1]
    # every non-action token is template, system, observation: none carries loss
    assert sum(s.action_mask) == sum(len(t.action_ids) for t in record.turns)
    assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.action_mask, strict=True) if not m)
    n_system = len(_encode(tok, f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"))
    assert s.turn_index[:n_system] == [-1] * n_system and s.turn_index[n_system] == 0
    assert max(s.turn_index) == 2


def test_chat_builder_misuse_fails_loud(tiny_tokenizer) -> None:
    chat = ChatBuilder(tiny_tokenizer)
    with pytest.raises(RuntimeError):
        chat.append_action([5])
    with pytest.raises(RuntimeError):
        chat.append_user("x")
    chat.prompt_ids("Your task is to: x")
    with pytest.raises(RuntimeError):
        chat.append_user("again")  # the action is missing
    with pytest.raises(ValueError):
        chat.append_action([5, 6], [-0.1])
    chat.append_action([5, 6])  # rollout use: no log-probs -> NaN placeholders
    assert all(lp != lp for lp in chat.sequence().logprobs[-4:-2])


# ---------------------------------------------------------------- student / teacher


def test_full_mode_teacher_inserts_skill_in_first_user_message_only(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    record = _record(tok)
    (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
    assert pair.turn is None
    first = dataclasses.replace(
        record.turns[0], user=insert_skill(OBS[0], SKILL, "task_line", MARKER)
    )
    teacher_record = dataclasses.replace(record, turns=[first, *record.turns[1:]])
    (plain,) = build_sequences(teacher_record, tok, skill_insert_at="task_line", with_teacher=False)
    assert pair.teacher == plain.student  # teacher = the chat of H(h), nothing else changed
    text = tok.decode(pair.teacher.input_ids)
    assert text.count("[Hindsight skill]") == 1
    assert text.index(SKILL) < text.index(OBS[1])
    assert pair.teacher.action_ids() == pair.student.action_ids()
    assert pair.teacher.action_turns() == pair.student.action_turns()


def test_system_insertion(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    (pair,) = build_sequences(_record(tok), tok, skill_insert_at="system")
    text = tok.decode(pair.teacher.input_ids)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}\n[Hindsight skill]\n{SKILL}\n<|im_end|>")
    assert text.count(SKILL) == 1
    check_pair(pair.student, pair.teacher)


def test_window_mode_one_pair_per_turn_with_skill_in_every_prompt(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    window_obs = [
        f"Your task is to: put a mug.\n[history of {k} steps]\nStep {k}." for k in range(3)
    ]
    record = _record(tok, history_mode="window")
    record.turns = [
        dataclasses.replace(t, user=o) for t, o in zip(record.turns, window_obs, strict=True)
    ]
    pairs = build_sequences(record, tok, skill_insert_at="task_line")
    assert [p.turn for p in pairs] == [0, 1, 2]
    for k, pair in enumerate(pairs):
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": window_obs[k]},
        ]
        prompt = _ids(tok, messages, generation_prompt=True)
        assert pair.student.input_ids[: len(prompt)] == prompt
        assert pair.student.action_ids() == record.turns[k].action_ids
        assert set(pair.student.action_turns()) == {k}
        assert tok.decode(pair.teacher.input_ids).count("[Hindsight skill]") == 1
        check_pair(pair.student, pair.teacher)


def test_no_teacher_without_a_valid_skill(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    for record in (_record(tok, analysis=Analysis("t", valid=False)), _record(tok, skill=None)):
        (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
        assert pair.teacher is None
    (pair,) = build_sequences(_record(tok), tok, skill_insert_at="task_line", with_teacher=False)
    assert pair.teacher is None


def test_missing_task_line_fails_loud_at_build(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    record = _record(tok)
    record.turns[0] = dataclasses.replace(record.turns[0], user="You see a desk.")
    with pytest.raises(ValueError, match="Your task is to:"):
        build_sequences(record, tok, skill_insert_at="task_line")
    build_sequences(record, tok, skill_insert_at="system")  # system insertion needs no task line


def test_check_pair_and_check_actions_catch_misalignment(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    record = _record(tok)
    (pair,) = build_sequences(record, tok, skill_insert_at="task_line")
    s, t = pair.student, pair.teacher
    bad = dataclasses.replace(t, input_ids=list(t.input_ids))
    bad.input_ids[bad.action_mask.index(True)] += 1
    with pytest.raises(ValueError, match="action tokens differ"):
        check_pair(s, bad)
    bad = dataclasses.replace(t, turn_index=[0 if x == 1 else x for x in t.turn_index])
    with pytest.raises(ValueError, match="different turns"):
        check_pair(s, bad)
    bad = dataclasses.replace(t, logprobs=[x * 2 for x in t.logprobs])
    with pytest.raises(ValueError, match="log-probs differ"):
        check_pair(s, bad)
    leaky = TokenSequence(
        list(s.input_ids), list(s.action_mask), list(s.logprobs), list(s.turn_index)
    )
    leaky.action_mask[3] = True  # a system/prompt token marked as loss
    with pytest.raises(ValueError, match="loss tokens differ"):
        check_actions(leaky, record.turns)
    check_actions(s, record.turns)
