"""The tiny base policy: built once, cached, guarded, loadable. The build is the one the
session's quick default job made (`tests/fixtures.py`: it trains a real model with the Megatron
trainer); whether it acts well is measured by the default job's test and benchmarks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from megatron_seed.testbed.base_policy import (
    MANIFEST,
    BasePolicyCacheError,
    BasePolicySettings,
    build_base_policy,
    read_manifest,
)

QUICK = BasePolicySettings.for_run("quick", seed=0)  # `seed run --quick`'s


@pytest.fixture(scope="module")
def built(quick_job):
    """(the quick job's base folder, its model folder, the job's games folder)."""
    out = quick_job.out / "base"
    model_dir = build_base_policy(
        out, games_dir=quick_job.out / "games", progress=False, measure=False, settings=QUICK
    )
    return out, model_dir, quick_job.out / "games"


def test_cache_is_reused_and_guarded(built):
    out, model_dir, games = built
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = build_base_policy(out, games_dir=games, progress=False, measure=False, settings=QUICK)
    assert again == model_dir
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    assert not out.with_name(out.name + ".partial").exists()  # no rebuild started
    other = dataclasses.replace(QUICK, train_steps=QUICK.train_steps + 1)
    with pytest.raises(BasePolicyCacheError, match="other settings"):
        build_base_policy(out, games_dir=games, progress=False, measure=False, settings=other)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    manifest = read_manifest(out)
    assert manifest["key"]["settings"] == json.loads(json.dumps(dataclasses.asdict(QUICK)))
    assert set(manifest["timings_s"]) >= {"games", "demos", "train", "build", "total"}


def test_partial_and_corrupt_caches_fail_loud(built, tmp_path):
    out, _, _ = built
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "junk").write_text("x")
    with pytest.raises(BasePolicyCacheError, match="no manifest"):
        build_base_policy(partial, progress=False, measure=False, settings=QUICK)
    # a copy of the build with one tokenizer file changed
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / MANIFEST).read_text())
    manifest["key"]["games_dir"] = None
    (copy / MANIFEST).write_text(json.dumps(manifest))
    config = copy / "tokenizer" / "tokenizer_config.json"
    config.write_text(config.read_text() + " ")
    with pytest.raises(BasePolicyCacheError, match="missing or changed"):
        build_base_policy(copy, progress=False, measure=False, settings=QUICK)


def test_model_and_tokenizer_match_and_load(built):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from megatron_seed.data.tokenizer import IM_END

    _, model_dir, _ = built
    config = AutoConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert config.model_type == "qwen2"
    assert config.vocab_size % 4 == 0
    assert len(tokenizer) <= config.vocab_size < len(tokenizer) + 4
    assert config.hidden_size // config.num_attention_heads in (32, 64)
    assert tokenizer.eos_token == IM_END
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.get_input_embeddings().weight.shape[0] == config.vocab_size
