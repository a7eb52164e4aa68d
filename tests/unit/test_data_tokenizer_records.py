"""The tiny Qwen-style tokenizer and the trajectory record."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from megatron_seed.data import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    Analysis,
    Status,
    TrajectoryRecord,
    Turn,
    read_jsonl,
    write_jsonl,
)
from megatron_seed.models.tiny_tokenizer import build_tokenizer

PROBES = [
    "Your task is to: put a clean mug in coffeemachine.",
    "  leading spaces,\ttabs\nand newlines\n\n",
    "unicode: café naïve ü 日本語 🙂",
    f"{IM_START}user\nhello{IM_END}\n{IM_START}assistant\n<action>look</action>{IM_END}",
    "numbers 12345 and punctuation !?.,;:'\"",
]


def test_special_tokens_and_chat_template(tiny_tokenizer) -> None:
    tok = tiny_tokenizer
    assert tok.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [0, 1, 2]
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == (IM_END, ENDOFTEXT, None)
    assert len(tok) <= 512
    assert tok.encode("look", add_special_tokens=False) == tok.encode("look")  # no BOS/EOS added
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n"
    )
    prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    for probe in PROBES:  # byte-level: every string round-trips
        assert tok.decode(tok.encode(probe)) == probe


def test_save_keeps_tokenizer_class_and_reload_gives_identical_ids(tmp_path) -> None:
    from tests.conftest import TINY_CORPUS

    tok = build_tokenizer(TINY_CORPUS, vocab_size=300, out_dir=tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "TokenizersBackend"
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for probe in PROBES:
        assert reloaded.encode(probe) == tok.encode(probe), probe
    messages = [{"role": "user", "content": PROBES[0]}]
    assert reloaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )
    assert reloaded.eos_token_id == tok.eos_token_id == 2


def test_vocab_size_below_byte_alphabet_is_rejected() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(["abc"], vocab_size=100)


def _record(**overrides) -> TrajectoryRecord:
    data = {
        "task_id": "t-1",
        "group_id": "u3/t-1",
        "game": "pick_and_place_simple-Mug-None-CoffeeMachine-7/trial_1",
        "family": "pick",
        "turns": [
            Turn("Your task is to: a mug.\n…", "go to desk 1", [5, 6, 2], [-0.1, -2e-7, -1e-30],
                 observation="You are in a room.", admissible=["go to desk 1", "look"],
                 executed="go to desk 1"),
            Turn("You arrive at desk 1.", "<action", [7, 8], [-0.3, -0.7],
                 observation="You arrive at desk 1.", executed="<action", valid=False),
        ],
        "reward": 1.0,
        "won": True,
        "goal": "put a mug in desk",
        "final_observation": "You pick up the mug 1.",
        "invalid_actions": 1,
        "skill": "Workflow: find the mug, then place it. Ünïcode ok.",
        "analysis": Analysis("t-1:abc", valid=True, summary="It worked.", attempts=1),
        "status": Status.MAX_STEPS,
        "history_mode": "window",
        "system_prompt": None,
        "meta": {"analyzer_raw": '{"skill": "..."}', "seconds": 1.5},
    }  # fmt: skip
    data.update(overrides)
    return TrajectoryRecord(**data)


def test_record_json_round_trip_is_exact(tmp_path) -> None:
    record = _record()
    line = record.to_json()
    assert json.loads(line)["status"] == "max_steps"
    again = TrajectoryRecord.from_json(line)
    assert again == record
    assert again.turns[0].logprobs == [-0.1, -2e-7, -1e-30]  # floats bit-exact
    assert isinstance(again.status, Status) and isinstance(again.turns[1], Turn)
    assert isinstance(again.analysis, Analysis) and again.turns[1].valid is False
    records = [record, _record(task_id="t-2", skill=None, analysis=None, status="ok")]
    write_jsonl(records, tmp_path / "r.jsonl")
    assert list(read_jsonl(tmp_path / "r.jsonl")) == records


def test_record_validation_fails_loud() -> None:
    with pytest.raises(ValueError, match=r"unknown TrajectoryRecord keys \['rewrad'\]"):
        TrajectoryRecord.from_dict({**_record().to_dict(), "rewrad": 1.0})
    data = _record().to_dict()
    data["turns"][0]["obs"] = "x"
    with pytest.raises(ValueError, match=r"unknown Turn keys \['obs'\]"):
        TrajectoryRecord.from_dict(data)
    with pytest.raises(ValueError, match="schema 1 is not the current 2"):
        TrajectoryRecord.from_dict({**_record().to_dict(), "schema": 1})
    old = {k: v for k, v in _record().to_dict().items() if k != "schema"}
    with pytest.raises(ValueError, match="schema 1"):  # written before the schema field
        TrajectoryRecord.from_dict(old)
    with pytest.raises(ValueError, match="log-probs"):
        Turn("obs", "a", [1, 2], [-0.1])
    with pytest.raises(ValueError):
        _record(status="crashed")
    with pytest.raises(ValueError, match="history_mode"):
        _record(history_mode="sliding")


def test_status_trainable_and_has_teacher() -> None:
    assert [s.value for s in Status if s.trainable] == ["ok", "max_steps", "truncated"]
    assert _record().has_teacher
    assert not _record(analysis=Analysis("t", valid=False)).has_teacher
    assert not _record(analysis=None).has_teacher
    assert not _record(skill="").has_teacher
    assert _record().trainable and _record(status="truncated").trainable
    assert not _record(status="env_error").trainable
    assert not _record(turns=[]).trainable  # an episode that never acted trains nothing


def test_policy_version_round_trips_and_old_records_have_none() -> None:
    record = _record(policy_version=3)
    assert TrajectoryRecord.from_json(record.to_json()).policy_version == 3
    data = _record().to_dict()
    del data["policy_version"]  # written before the field existed
    assert TrajectoryRecord.from_dict(data).policy_version is None


def test_ids_identical_when_loaded_from_a_qwen2_model_folder(tmp_path, tiny_tokenizer):
    """transformers loads a folder whose config.json says qwen2 with its Qwen2Tokenizer
    class; our tokenizer must give the same ids that way too."""
    import json

    from transformers import AutoTokenizer

    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    save_tokenizer(tiny_tokenizer, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 512}))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    probe = "Your task is to:  put a  clean mug\tin coffeemachine 1.\n\n café ü 42 it's <|im_end|>"
    assert loaded.encode(probe, add_special_tokens=False) == tiny_tokenizer.encode(
        probe, add_special_tokens=False
    )
