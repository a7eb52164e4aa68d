"""The generated corruption test: for each kind of input a command reads, bad variants are
derived from a good one (`tests/corruption.py`: cut short, emptied, another JSON type at the
top or in a field, a member missing, another kind of file in its place) and every command
that reads that kind is run on each. Each must be refused as a bad input is: exit 2, at most
three lines, no traceback, the bad file or folder named, nothing left at ``--out``, within
30 s.
Commands stop at their first check, so every variant runs (a few seconds for all of them)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from megatron_seed import cli
from tests.corruption import (
    PARQUET_BYTES,
    Writer,
    file_variants,
    folder_variants,
    json_variants,
    jsonl_variants,
    module_variants,
    writes,
)


@pytest.fixture(scope="module")
def good(tmp_path_factory, alfworld_games) -> dict[str, Path]:
    """One good input of every kind, the bad ones' siblings."""
    from megatron_seed.config import SeedConfig
    from megatron_seed.data import Analysis, TrajectoryRecord, Turn, write_jsonl
    from megatron_seed.models.tiny import make_tiny_policy, make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("corruption")
    tok = build_tokenizer(["put a mug in the desk, then look around"] * 4, 300)
    model = make_tiny_policy(root / "model", tok, hidden_size=64, heads=2, kv_heads=1)
    turn = Turn(
        "Your task is to: put a mug in desk.", "<action>look</action>", [5, 6], [-0.5, -0.2]
    )
    skill = "look first, then take the mug to the desk"
    records = [
        TrajectoryRecord(task_id=f"t{i}", group_id="u0/t", game="g", family="pick", turns=[turn],
                         reward=float(i), won=bool(i), skill=skill, env="alfworld",
                         analysis=Analysis(trajectory_id=f"t{i}", valid=True, summary=skill))
        for i in range(2)
    ]  # fmt: skip
    write_jsonl(records, root / "records.jsonl")
    (root / "config.json").write_text(
        json.dumps({"optim": {"lr": 1e-4}, "rollout": {"group_size": 4}, "updates": 2})
    )
    library = root / "library"
    library.mkdir()
    # one skill for every family: without it, a library covers no family of any job
    (library / "general.md").write_text("Look before you act; take the object you need.\n")
    from envs.alfworld.games import generate_games

    for split in ("train", "seen", "unseen"):  # one game each: every file a variant
        generate_games(root / "games", split, n=1, seed=3)
    from envs.spec import get_env

    for split in ("train", "seen", "unseen"):  # one question each, the corpus, no index yet
        get_env("search").generate_tasks(root / "search", split, 1, 0)
        get_env("sokoban").generate_tasks(root / "sokoban", split, 1, 0)
        get_env("webshop").generate_tasks(root / "webshop", split, 1, 0)
    for index in (root / "search").glob("corpus.jsonl.*"):
        shutil.rmtree(index)
    comparison = {"results": {"SEED": [{"train": {"macro_avg": 0.5}}]}, "seconds": {}}
    comparison |= {"skills": {}, "curves": {"SEED": [[0.5]]}, "seeds": [0], "settings": []}
    (root / "compare.json").write_text(json.dumps(comparison))
    (root / "cluster.json").write_text(
        json.dumps({"partition": "gpu", "nccl_socket_ifname": "ib0", "nccl_timeout_s": 600})
    )
    # a finished Stage-2 run (what `seed bench analyzer` probes): config, policy, records
    run = root / "run" / "stage2"
    (run / "trajectories").mkdir(parents=True)
    SeedConfig().save(run / "config.json")
    shutil.copytree(model, run / "final_hf")
    # one record: cut to half is inside it (two alike records would be cut between them)
    write_jsonl(records[:1], run / "trajectories" / "update_00000.jsonl")
    # an environment in a file of its own: Sokoban's spec under another name
    (root / "spec.py").write_text(ENV_SPEC)
    assert (
        cli.main(["convert", "hf-to-megatron", "--hf", str(model), "--out", str(root / "meg")]) == 0
    )
    # a trainer checkpoint as `save_checkpoint` lays it out; its optimizer folder is a
    # dist-checkpoint like the model's (the checks read an index, never Adam's state)
    step = root / "job" / "checkpoints" / "step_000002"
    shutil.copytree(root / "meg", step)
    shutil.copytree(step / "model", step / "optimizer")
    layout = {"tp": 1, "pp": 1, "dp": 1, "ep": 1}
    state = {"step": 2, "data_position": 8, "extra": {}, "layout": layout, "adam_step": 2}
    (step / "trainer_state.json").write_text(json.dumps(state))
    (step / "rng").mkdir()
    torch.save({"torch": torch.get_rng_state()}, step / "rng" / "rank_00000.pt")
    from tests.gguf_files import write_llama_gguf

    llama = make_tiny_qwen(
        root / "llama", model_type="llama", vocab_size=304, tie_word_embeddings=False
    )
    write_llama_gguf(llama, tok, root / "model.gguf")
    return {"model": model, "games": alfworld_games, "records": root / "records.jsonl",
            "megatron": root / "meg", "checkpoint": step, "gguf": root / "model.gguf",
            "env spec": root / "spec.py", "run": root / "run",
            "config": root / "config.json", "library": library,
            "cluster": root / "cluster.json", "comparison": root / "compare.json",
            "few games": root / "games", "search": root / "search",
            "sokoban": root / "sokoban", "webshop": root / "webshop"}  # fmt: skip


def _train(g: dict[str, Path], out: Path) -> str:
    return f"train --model {g['model']} --games {g['games'] / 'train'} --out {out}"


ENV_SPEC = '''"""Sokoban under another name, loaded from this file."""

from envs.sokoban import spec as SPEC
'''


def _resume(bad: Path, g: dict[str, Path]) -> str:
    """`seed train` rerun on a job folder whose latest checkpoint is ``bad``."""
    (bad.parent / "latest").write_text(bad.name + "\n")
    return _train(g, bad.parent.parent)


def _task_readers(env: str) -> dict[str, Callable[[Path, dict[str, Path], Path], str]]:
    """The commands that read an environment's task folder (its splits and shared files):
    played, trained on, compared on."""
    return {
        "eval": lambda bad, g, out: f"eval --env {env} --games {bad} --policy expert --out {out}",
        "train": lambda bad, g, out: (
            f"train --env {env} --model {g['model']} --games {bad} --out {out}"
        ),
        "compare": lambda bad, g, out: (
            f"compare --env {env} --model {g['model']} --games {bad} --out {out}"
        ),
    }


# each reader as a command line (paths here hold no spaces), split into argv by `_argv`
READERS: dict[str, dict[str, Callable[[Path, dict[str, Path], Path], str]]] = {
    # a checkpoint's weights and config (a tokenizer, where there is one, is checked too)
    "checkpoint folder": {
        "check-parity": lambda bad, g, out: f"check-parity --hf {bad}",
        "convert": lambda bad, g, out: f"convert hf-to-megatron --hf {bad} --out {out}",
    },
    # a model a policy plays or trains from: its tokenizer is required
    "model folder": {
        "eval": lambda bad, g, out: f"eval --games {g['games']} --policy {bad} --out {out}",
        "train": lambda bad, g, out: _train({**g, "model": bad}, out),
        "sft": lambda bad, g, out: f"sft --data {g['records']} --model {bad} --out {out}",
        "run": lambda bad, g, out: f"run --model {bad} --out {out}",
        "compare": lambda bad, g, out: f"compare --model {bad} --games {g['games']} --out {out}",
    },
    "megatron checkpoint": {
        "convert": lambda bad, g, out: f"convert megatron-to-hf --megatron {bad} --out {out}",
    },
    # a job folder's latest checkpoint, which a rerun of the same command resumes from
    "trainer checkpoint": {"train": lambda bad, g, out: _resume(bad, g)},
    "gguf file": {"convert": lambda bad, g, out: f"convert gguf-to-hf --gguf {bad} --out {out}"},
    "run folder": {
        "bench": lambda bad, g, out: f"bench analyzer --runs {bad} --last 1 --out {out}/a.json",
    },
    "env spec": {
        "eval": lambda bad, g, out: (
            f"eval --env {bad}:SPEC --games {g['sokoban']} --policy expert --out {out}"
        ),
        "games": lambda bad, g, out: f"games --env {bad}:SPEC --split train --n 1 --out {out}",
        "train": lambda bad, g, out: (
            f"train --env {bad}:SPEC --model {g['model']} --games {g['sokoban']} --out {out}"
        ),
        "compare": lambda bad, g, out: (
            f"compare --env {bad}:SPEC --model {g['model']} --games {g['sokoban']} --out {out}"
        ),
    },
    "config json": {
        "train": lambda bad, g, out: f"{_train(g, out)} --config-json {bad}",
        "eval": lambda bad, g, out: (
            f"eval --games {g['games']} --policy expert --config-json {bad} --out {out}"
        ),
    },
    "records": {
        "annotate": lambda bad, g, out: f"annotate --in {bad} --out {out} --embedded",
        "sft": lambda bad, g, out: f"sft --data {bad} --model {g['model']} --out {out}",
        "train": lambda bad, g, out: f"{_train(g, out)} --replay-data {bad}",
    },
    "skill library": {
        "train": lambda bad, g, out: f"{_train(g, out)} --method skill-grpo --skill-library {bad}",
        "eval": lambda bad, g, out: (
            f"eval --games {g['games']} --policy {g['model']} --skill-library {bad} --out {out}"
        ),
        "run": lambda bad,
        g,
        out: f"run --quick --algo skill-grpo --skill-library {bad} --out {out}",
        "compare": lambda bad, g, out: (
            f"compare --quick --methods skill-grpo --skill-library {bad} --out {out}"
        ),
    },
    "games folder": {
        "eval": lambda bad, g, out: f"eval --games {bad} --policy expert --out {out}",
        "train": lambda bad, g, out: f"train --model {g['model']} --games {bad} --out {out}",
        "compare": lambda bad, g, out: f"compare --model {g['model']} --games {bad} --out {out}",
    },
    # a search-QA folder: questions per split, the corpus, its retriever's settings
    "search tasks": _task_readers("search"),
    "sokoban rooms": _task_readers("sokoban"),
    "webshop tasks": _task_readers("webshop"),
    "comparison": {"compare": lambda bad, g, out: f"compare --merge {bad.parent} --out {out}"},
    "cluster profile": {
        "launch": lambda bad, g, out: (
            f"launch qwen2.5-7b --executor slurm --nodes 2 --dryrun --job-dir {out} "
            f"--cluster-profile {bad} --model /m --games /g --out {out}"
        ),
    },
}


# what transformers' save_pretrained writes besides the required config, weights and
# tokenizer files, and a model may lack: its generation defaults, its chat template
MODEL_OPTIONAL = ("generation_config.json", "chat_template.jinja", "special_tokens_map.json")
# a checkpoint converted or checked needs no tokenizer
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CHECKPOINT_OPTIONAL = (*MODEL_OPTIONAL, *TOKENIZER)


# the good input each kind's variants are derived from (a key of the `good` fixture)
SOURCE = {
    "checkpoint folder": "model", "model folder": "model", "config json": "config",
    "megatron checkpoint": "megatron", "trainer checkpoint": "checkpoint", "gguf file": "gguf",
    "env spec": "env spec", "run folder": "run",
    "records": "records", "skill library": "library", "games folder": "few games",
    "search tasks": "search", "sokoban rooms": "sokoban", "webshop tasks": "webshop",
    "comparison": "comparison", "cluster profile": "cluster",
}  # fmt: skip


def _variants(kind: str, g: dict[str, Path]) -> list[tuple[str, Writer]]:
    if kind == "model folder":
        return list(folder_variants(g["model"], optional=MODEL_OPTIONAL))
    if kind == "checkpoint folder":
        return list(folder_variants(g["model"], optional=CHECKPOINT_OPTIONAL))
    if kind == "megatron checkpoint":
        return list(folder_variants(g["megatron"], optional=TOKENIZER))
    if kind == "trainer checkpoint":
        return list(folder_variants(g["checkpoint"], optional=TOKENIZER))
    if kind == "gguf file":
        return list(file_variants(g["gguf"].read_bytes()))
    if kind == "run folder":  # the final policy's tokenizer is required (it is played)
        return list(folder_variants(g["run"], optional=MODEL_OPTIONAL))
    if kind == "env spec":
        return list(module_variants(g["env spec"].read_text(), "SPEC"))
    if kind == "config json":
        return list(json_variants(g["config"].read_text()))
    if kind == "records":
        return list(jsonl_variants(g["records"].read_text()))
    if kind == "skill library":
        return list(folder_variants(g["library"]))
    if kind == "games folder":
        # the PDDL problem is the generator's record, not read; a trial without its game file
        # is no game (ALFWorld's own loader skips such trials: the original data has them)
        optional = ("initial_state.pddl", "game.tw-pddl")
        return list(folder_variants(g["few games"], optional=optional))
    if kind == "search tasks":
        # the corpus's generator settings: read when `seed games` adds a split, not by a player
        corpus = ("corpus.jsonl holds a parquet file", _replaced(g["search"], "corpus.jsonl"))
        return [*folder_variants(g["search"], unread=("corpus.meta.json",)), corpus]
    if kind == "sokoban rooms":
        return list(folder_variants(g["sokoban"]))
    if kind == "webshop tasks":
        return list(folder_variants(g["webshop"], json_fields=2))
    if kind == "comparison":  # and a run inside it that is no object
        nested = json.loads(g["comparison"].read_text()) | {"results": {"SEED": [3]}}
        return [*json_variants(g["comparison"].read_text()),
                ("a run that is no object", writes(json.dumps(nested)))]  # fmt: skip
    assert kind == "cluster profile"
    return list(json_variants(g["cluster"].read_text()))


def _replaced(good: Path, member: str) -> Writer:
    """The folder ``good`` with ``member`` replaced by a parquet file (a sibling format)."""

    def write(path: Path) -> None:
        shutil.copytree(good, path)
        (path / member).write_bytes(PARQUET_BYTES)

    return write


def _refused(capsys, argv: list[str], bad: Path, out: Path) -> str | None:
    """Why ``seed ARGV`` was not refused as a bad input naming ``bad`` (None: it was)."""
    start = time.monotonic()
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    seconds = time.monotonic() - start
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    if code != 2:
        return f"exit {code}: {' | '.join(lines)[:300]}"
    if len(lines) > 3 or "Traceback" in err:
        return f"{len(lines)} lines: {err[:300]}"
    if str(bad.parent) not in err:  # each variant's own folder: the file or a member named
        return f"does not name {bad}: {err.strip()[:300]}"
    if out.exists():
        return f"left {out} behind"
    if seconds > 30:
        return f"took {seconds:.0f} s"
    return None


# where each command's work begins, after its checks: reaching one with a bad input is a
# failure (the command would have spent minutes on it), reported as the crash it becomes
WORK = [
    ("megatron_seed.models.parallel", "spawn"),  # train, convert
    ("megatron_seed.pipeline.stage1", "run_sft"),
    ("megatron_seed.models.parity", "check_parity"),
    ("megatron_seed.pipeline.commands_eval", "_model_episodes"),
    ("megatron_seed.pipeline.commands_eval", "play_scripted"),
    ("megatron_seed.skills.parse", "analyze_with_retries"),
    ("megatron_seed.testbed.default_job", "run_default_job"),
    ("megatron_seed.compare.commands", "run_method_job"),
    ("megatron_seed.benchmarks.analyzer", "probe_run"),
]


def _work_started(*args, **kwargs):
    raise RuntimeError("work started on a bad input")


@pytest.mark.parametrize("kind", list(READERS))
def test_every_reader_refuses_every_corruption(kind, good, tmp_path, capsys, monkeypatch):
    import importlib

    for key in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.delenv(key, raising=False)
    for module, name in WORK:
        monkeypatch.setattr(importlib.import_module(module), name, _work_started)
    monkeypatch.setenv("SEED_ERROR_DIR", str(tmp_path / "errors"))
    failures = []
    variants = _variants(kind, good)
    suffix = good_suffix(kind, good)
    name = {"comparison": "compare.json", "trainer checkpoint": "checkpoints/step_000002"}.get(
        kind, f"input{suffix}"
    )
    for command, argv in READERS[kind].items():  # the good input itself is not refused
        source, path = good[SOURCE[kind]], tmp_path / f"good-{command}" / name
        if source.is_dir():
            shutil.copytree(source, path)
        else:
            path.parent.mkdir(parents=True)
            shutil.copy(source, path)
        assert cli.main(argv(path, good, tmp_path / f"out-good-{command}").split()) != 2, (
            command, capsys.readouterr().err
        )  # fmt: skip
        capsys.readouterr()
    for i, (what, write) in enumerate(variants):
        for command, argv in READERS[kind].items():
            bad = tmp_path / f"bad{i}-{command}" / name
            write(bad)
            out = tmp_path / f"out{i}-{command}"
            why = _refused(capsys, argv(bad, good, out).split(), bad, out)
            if why:
                failures.append(f"{command} <- {what}: {why}")
    total = len(variants) * len(READERS[kind])
    assert not failures, f"{len(failures)} of {total}:\n" + "\n".join(failures)


def good_suffix(kind: str, g: dict[str, Path]) -> str:
    """The bad input's file suffix: its good sibling's (``.json``, ``.jsonl``; folders none)."""
    source = {"config json": "config", "records": "records", "cluster profile": "cluster",
              "gguf file": "gguf", "env spec": "env spec"}  # fmt: skip
    return g[source[kind]].suffix if kind in source else ""


def test_a_checkpoint_of_another_model_is_refused(good, tmp_path, capsys):
    """A dist-checkpoint whose `hf/config.json` describes another model (two layers more, or
    another width): its tensors' global shapes say so before any process starts."""
    for change in ({"num_hidden_layers": 4}, {"hidden_size": 96}):
        meg = tmp_path / f"meg-{next(iter(change))}"
        shutil.copytree(good["megatron"], meg)
        config = json.loads((meg / "hf" / "config.json").read_text()) | change
        config["layer_types"] = ["full_attention"] * config["num_hidden_layers"]
        (meg / "hf" / "config.json").write_text(json.dumps(config))
        argv = ["convert", "megatron-to-hf", "--megatron", str(meg), "--out", str(tmp_path / "o")]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "a checkpoint of another model" in err and str(meg / "model") in err, err
        assert not (tmp_path / "o").exists()
