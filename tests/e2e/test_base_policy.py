"""The tiny base policy: built once (small settings), cached, guarded, loadable.

Marked slow: the build trains a real model with the Megatron trainer (~1 min on 2 cores).
Whether it acts well is measured by the default job's end-to-end test and benchmarks.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from megatron_seed.testbed.base_policy import (
    MANIFEST,
    BasePolicyCacheError,
    BasePolicySettings,
    build_base_policy,
    read_manifest,
)

pytestmark = pytest.mark.slow

SMALL = dataclasses.replace(
    BasePolicySettings.for_run(quick=True, seed=0), n_train_games=8, n_eval_games=2, train_steps=20
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("base_policy")
    out = root / "policy"
    start = time.perf_counter()
    model_dir = build_base_policy(
        out, games_dir=root / "games", progress=False, measure=False, settings=SMALL
    )
    return out, model_dir, time.perf_counter() - start


def test_cache_is_reused_and_guarded(built):
    out, model_dir, _ = built
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = build_base_policy(
        out, games_dir=out.parent / "games", progress=False, measure=False, settings=SMALL
    )
    assert again == model_dir
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    assert not out.with_name(out.name + ".partial").exists()  # no rebuild started
    other = dataclasses.replace(SMALL, train_steps=SMALL.train_steps + 1)
    with pytest.raises(BasePolicyCacheError, match="other settings"):
        build_base_policy(
            out, games_dir=out.parent / "games", progress=False, measure=False, settings=other
        )
    manifest = read_manifest(out)
    assert manifest["key"]["settings"] == json.loads(json.dumps(dataclasses.asdict(SMALL)))
    assert set(manifest["timings_s"]) >= {"games", "demos", "train", "build", "total"}


def test_partial_and_corrupt_caches_fail_loud(built, tmp_path):
    out, _, _ = built
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "junk").write_text("x")
    with pytest.raises(BasePolicyCacheError, match="no manifest"):
        build_base_policy(partial, progress=False, measure=False, settings=SMALL)
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
        build_base_policy(copy, progress=False, measure=False, settings=SMALL)


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
