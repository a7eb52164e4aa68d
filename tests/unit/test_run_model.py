"""`seed run --model DIR`: a pretrained model folder instead of the tiny base policy.

The folder is checked before any work (`models.checks.validate_base_model`: an HF checkpoint
this project builds, a tokenizer that loads, fits the vocabulary and renders its chat template
as `ChatBuilder` does), and the job then starts from it with the `pretrained-cpu` recipe (or
`--recipe`) on the size's games: no base policy is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_seed import recipes
from megatron_seed.testbed import default_job
from tests.cli_checks import refused_in_one_line


@pytest.fixture(scope="module")
def model(tmp_path_factory, tiny_tokenizer) -> Path:
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import save_tokenizer

    out = make_tiny_qwen(tmp_path_factory.mktemp("m") / "llama", model_type="llama", vocab_size=512)
    save_tokenizer(tiny_tokenizer, out)
    return out


def _copy(model: Path, dest: Path, tokenizer: bool = True) -> Path:
    dest.mkdir()
    for f in model.iterdir():
        if tokenizer or not f.name.startswith(("tokenizer", "chat_template")):
            (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_a_good_model_folder_passes_and_bad_ones_are_one_line(model, tmp_path, capsys) -> None:
    from megatron_seed.models.checks import validate_base_model

    assert validate_base_model(model).model_type == "llama"
    out = tmp_path / "out"
    argv = ["run", "--model", "MODEL", "--quick", "--out", str(out)]

    def refused(folder: Path, *needles: str) -> None:
        refused_in_one_line(capsys, [a if a != "MODEL" else str(folder) for a in argv], *needles)
        assert not out.exists()  # refused before games, base or output folder

    refused(tmp_path / "nowhere", "is not a directory")
    no_tokenizer = _copy(model, tmp_path / "no-tok", tokenizer=False)
    refused(no_tokenizer, str(no_tokenizer), "has no tokenizer.json")
    from megatron_seed.models.tiny import make_tiny_qwen

    small = make_tiny_qwen(tmp_path / "small", model_type="llama", vocab_size=256)
    for f in model.glob("tokenizer*"):  # the ~500-token tokenizer on a 256-token model
        (small / f.name).write_bytes(f.read_bytes())
    capsys.readouterr()  # the checkpoint writer's progress
    refused(small, "the model's vocabulary 256")
    broken = _copy(model, tmp_path / "broken")
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nope"}}')
    refused(broken, "unreadable tokenizer")
    no_chat = _copy(model, tmp_path / "no-chat")
    tok_cfg = json.loads((no_chat / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (no_chat / "tokenizer_config.json").write_text(
        json.dumps(tok_cfg | {"chat_template": template})
    )
    (no_chat / "chat_template.jinja").unlink(missing_ok=True)
    refused(no_chat, str(no_chat), "chat template")
    refused_in_one_line(
        capsys, ["run", "--recipe", "default", "--quick"], "--recipe is for --model"
    )
    refused_in_one_line(
        capsys, ["run", "--model", str(model), "--recipe", "nope"], "unknown recipe 'nope'"
    )


def test_the_job_starts_from_the_model_with_the_pretrained_recipe(model, tmp_path, monkeypatch):
    """No base policy is built; the method job gets the folder as its base, the recipe's
    Stage 1 and Stage 2, and the report names the model."""
    seen: dict = {}

    def no_base(*a, **k):
        raise AssertionError("a base policy was built")

    def job(out, base, games, cfg, algo, **kw):
        seen.update(base=base, cfg=cfg, games=games, facts=kw["facts"], base_root=kw["base_root"])
        return {}

    monkeypatch.setattr("megatron_seed.testbed.base_policy.build_base_policy", no_base)
    monkeypatch.setattr(default_job, "run_method_job", job)
    monkeypatch.setattr(
        default_job, "_games", lambda root, *a: {"train": ["t"], "seen": [], "unseen": []}
    )
    default_job.run_default_job(
        tmp_path / "out", size="quick", algo="grpo", model=model, recipe="pretrained-cpu"
    )
    want = recipes.get("pretrained-cpu").config
    assert seen["base"] == model and seen["base_root"] == tmp_path / "out" / "base"
    assert seen["cfg"].optim.lr == want.optim.lr and seen["cfg"].rollout.prompt_style == "paper"
    assert seen["cfg"].rollout.group_size == want.rollout.group_size
    assert seen["facts"]["base_model"] == str(model) and "base_policy" not in seen["facts"]
    assert seen["facts"]["recipe"] == "pretrained-cpu"


def test_a_job_folder_and_the_base_cache_belong_to_one_model(model, tmp_path) -> None:
    """A `--model` job folder records its model and refuses another (its finished phases
    would be reported under the new one); the base's cached evaluation is keyed by it."""
    from megatron_seed.compare.job import _games_key, check_same_config
    from megatron_seed.errors import CommandError

    cfg = recipes.get("pretrained-cpu").config
    check_same_config(tmp_path, cfg, model)
    check_same_config(tmp_path, cfg, model)  # a resume
    with pytest.raises(CommandError, match="base_model differ"):
        check_same_config(tmp_path, cfg, tmp_path / "another")
    games = {"train": ["a"], "seen": [], "unseen": []}
    assert _games_key(games, 4, 0, cfg, model) != _games_key(games, 4, 0, cfg, tmp_path)
    assert _games_key(games, 4, 0, cfg) == _games_key(games, 4, 0, cfg, None)


def test_an_export_keeps_the_models_chat_template(model, tmp_path) -> None:
    """A transformers-5 folder keeps its chat template in chat_template.jinja (SmolLM2's
    import does): every export (Stage 1's, Stage 2's, the final) carries it along with the
    tokenizer, or the trained model would render prompts without the base's system text."""
    import torch

    from megatron_seed.models.convert import save_hf_checkpoint

    source = tmp_path / "source"
    source.mkdir()
    for f in model.iterdir():
        (source / f.name).write_bytes(f.read_bytes())
    (source / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    config = json.loads((model / "config.json").read_text())
    out = save_hf_checkpoint(iter([("w", torch.zeros(1))]), tmp_path / "out", config, source)
    assert (out / "chat_template.jinja").read_text() == "{{ messages[0]['content'] }}"
    assert (out / "tokenizer.json").is_file()
