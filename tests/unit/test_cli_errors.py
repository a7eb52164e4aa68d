"""Every `seed` command meets bad input with a one-line error and exit code 2: truncated or
unreadable checkpoints, output paths that collide with files, unknown names. Nothing is
computed and nothing is written first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megatron_seed import cli
from tests.cli_checks import refused_in_one_line


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from megatron_seed.models.tiny import make_tiny_policy
    from megatron_seed.models.tiny_tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("cli_errors")
    tok = build_tokenizer(["hello world, a tiny corpus"] * 4, 300)
    return make_tiny_policy(root / "model", tok, hidden_size=64, heads=2, kv_heads=1)


@pytest.fixture
def truncated(model: Path, tmp_path: Path) -> Path:
    bad = tmp_path / "truncated"
    bad.mkdir()
    for f in model.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return bad


def _fails(capsys, argv: list[str], *needles: str) -> None:
    refused_in_one_line(capsys, argv, *needles)


def test_truncated_checkpoint_is_a_one_line_error(truncated: Path, tmp_path: Path, capsys):
    _fails(
        capsys,
        ["convert", "hf-to-megatron", "--hf", str(truncated), "--out", str(tmp_path / "o")],
        "truncated",
    )
    assert not (tmp_path / "o").exists()
    _fails(capsys, ["check-parity", "--hf", str(truncated)], "truncated")
    (truncated / "config.json").write_text('{"model_type": ')
    _fails(capsys, ["check-parity", "--hf", str(truncated)], "config.json")


def test_output_path_that_is_a_file_fails_before_any_work(model: Path, tmp_path: Path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("someone's file\n")
    _fails(
        capsys, ["games", "--out", str(taken), "--split", "train", "--n", "1"], "is not a folder"
    )
    _fails(
        capsys,
        ["games", "--out", str(taken / "sub"), "--split", "train", "--n", "1"],
        "is not a folder",
    )
    _fails(
        capsys,
        ["convert", "hf-to-megatron", "--hf", str(model), "--out", str(taken)],
        "is not a folder",
    )
    records = tmp_path / "records.jsonl"
    records.write_text("")
    _fails(capsys, ["annotate", "--in", str(records), "--out", str(taken), "--embedded"])
    assert taken.read_text() == "someone's file\n"  # untouched


def test_unreadable_records_and_unknown_names(model: Path, tmp_path: Path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    _fails(
        capsys,
        ["annotate", "--in", str(bad), "--out", str(tmp_path / "a"), "--embedded"],
        "line 1 is not a trajectory record",
    )
    old = tmp_path / "old.jsonl"  # a record of the first schema (rendered prompts only)
    old.write_text(
        json.dumps(
            {
                "task_id": "t",
                "group_id": "g",
                "game": "x",
                "family": "f",
                "turns": [],
                "reward": 0.0,
                "won": False,
            }
        )
        + "\n"
    )
    _fails(
        capsys,
        ["annotate", "--in", str(old), "--out", str(tmp_path / "a"), "--embedded"],
        "schema 1",
    )
    games = tmp_path / "games"
    games.mkdir()
    argv = ["train", "--model", str(model), "--games", str(games), "--out", str(tmp_path / "t")]
    _fails(capsys, [*argv, "--env", "no-such-env"], "unknown environment 'no-such-env'")
    _fails(capsys, [*argv, "--recipe", "qwen9"], "unknown recipe 'qwen9'")
    _fails(capsys, [*argv, "--engines", "0"], "fleet.engines must be >= 1, got 0")
    _fails(
        capsys,
        ["games", "--env", "nope", "--out", str(tmp_path / "g")],
        "unknown environment 'nope'",
    )


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


# (name, the command line built from (model, games, tmp), what the one line says); each
# fails before anything is computed or written (`out` below is never created)
BAD = [
    ("train: data parallel 0", lambda m, g, t: ["train", *_job(m, g, t), "--dp", "0"], "--dp"),
    (
        "train: negative evaluation period",
        lambda m, g, t: ["train", *_job(m, g, t), "--eval-every", "-1"],
        "--eval-every",
    ),
    (
        "train: truncated tokenizer.json",
        lambda m, g, t: ["train", *_job(_cut(m, t, "tokenizer.json"), g, t)],
        "tokenizer.json is not valid JSON",
    ),
    (
        "train: replay data that is not records",
        lambda m, g, t: ["train", *_job(m, g, t), "--replay-data", str(_text(t, "{'x'"))],
        "line 1 is not a trajectory record",
    ),
    (
        "train: missing replay data",
        lambda m, g, t: ["train", *_job(m, g, t), "--replay-data", str(t / "none.jsonl")],
        "is not a file",
    ),
    (
        "train: a config JSON that is a list",
        lambda m, g, t: ["train", *_job(m, g, t), "--config-json", "[1]"],
        "no such file (nor a JSON object)",
    ),
    (
        "train: a config file that is a list",
        lambda m, g, t: ["train", *_job(m, g, t), "--config-json", str(_text(t, "[1]"))],
        "an object expected, got list",
    ),
    (
        "train: a missing config file",
        lambda m, g, t: ["train", *_job(m, g, t), "--config-json", str(t / "none.json")],
        "none.json: no such file",
    ),
    (
        "train: a config of another method",  # e.g. a SEED run's saved stage2/config.json
        lambda m, g, t: [
            "train",
            *_job(m, g, t),
            "--method",
            "grpo",
            "--config-json",
            '{"algo": {"use_opd": true}}',
        ],
        "algo.use_opd, which --method grpo decides",
    ),
    (
        "eval: output that is a folder",
        lambda m, g, t: ["eval", "--games", str(g), "--policy", "random", "--out", str(t)],
        "is a folder",
    ),
    (
        "eval: zero episodes",
        lambda m, g, t: ["eval", "--games", str(g), "--policy", "random", "--episodes", "0"],
        "--episodes",
    ),
    ("run: zero updates", lambda m, g, t: ["run", "--updates", "0"], "--updates"),
    ("run: unknown environment", lambda m, g, t: ["run", "--env", "nope"], "invalid choice"),
    ("compare: a seed that is no number", lambda m, g, t: ["compare", "--seeds", "x"], "'x'"),
    (
        "run: a skill library that is not there",
        lambda m, g, t: ["run", "--skill-library", str(t / "none"), "--out", str(t / "out")],
        "--skill-library: skill library",
    ),
    (
        "compare: a skill library file that is not annotations",
        lambda m, g, t: [
            "compare",
            "--skill-library",
            str(_text(t, "{'x'")),
            "--out",
            str(t / "out"),
        ],
        "not Stage-1 annotations",
    ),
    ("smoke: tensor parallel 0", lambda m, g, t: ["smoke", "--tp", "0"], "--tp"),
    ("bench: unknown benchmark", lambda m, g, t: ["bench", "nothing"], "invalid choice"),
    (
        "init-model: unknown shape",
        lambda m, g, t: ["init-model", "--shape", "nope", "--out", str(t / "out")],
        "unknown shape",
    ),
    (
        "sft: a model folder that is not there",
        lambda m, g, t: [
            "sft",
            "--data",
            str(_text(t, "{}")),
            "--model",
            str(t / "none"),
            *_out(t),
        ],
        "is not a directory",
    ),
    ("convert: unknown direction", lambda m, g, t: ["convert", "sideways"], "invalid choice"),
    (
        "check-parity: zero sequences",
        lambda m, g, t: ["check-parity", "--hf", str(m), "--batch", "0"],
        "--batch",
    ),
    (
        "games: unknown environment",
        lambda m, g, t: ["games", "--env", "nope", "--out", str(t / "out")],
        "unknown environment",
    ),
    (
        "annotate: records that are not JSON",
        lambda m, g, t: ["annotate", "--in", str(_text(t, "not json")), *_out(t), "--embedded"],
        "line 1 is not a trajectory record",
    ),
    (
        "launch: a job without its paths",
        lambda m, g, t: ["launch", "tiny", "--dryrun"],
        "without its paths",
    ),
]


def _out(tmp: Path) -> list[str]:
    return ["--out", str(tmp / "out")]


def _job(model: Path, games: Path, tmp: Path) -> list[str]:
    return ["--model", str(model), "--games", str(games / "train"), *_out(tmp)]


def _cut(model: Path, tmp: Path, name: str) -> Path:
    copy = _copy(model, tmp / "cut")
    data = (copy / name).read_bytes()
    (copy / name).write_bytes(data[: len(data) // 2])
    return copy


def _text(tmp: Path, text: str) -> Path:
    path = tmp / "bad.jsonl"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize(("argv", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_table(argv, needle, model, alfworld_games, tmp_path, capsys, monkeypatch):
    for key in ("SEED_MODEL_DIR", "SEED_GAMES_DIR", "SEED_OUT_DIR"):
        monkeypatch.delenv(key, raising=False)
    _fails(capsys, argv(model, alfworld_games, tmp_path), needle)
    assert not (tmp_path / "out").exists()


def test_the_table_covers_every_command() -> None:
    assert {name.split(":")[0] for name, _, _ in BAD} == set(cli.COMMANDS)


def test_an_input_error_deep_in_an_environment_is_one_line(tmp_path, capsys):
    """A search corpus cut mid-record is found when the tasks are listed, before any episode:
    its `RetrieverError` (an input error of the project's) is one line, exit 2."""
    from envs.spec import get_env

    games = tmp_path / "games"
    get_env("search").generate_tasks(games, "train", 2, 0)
    corpus = games / "corpus.jsonl"
    corpus.write_bytes(corpus.read_bytes()[: corpus.stat().st_size // 2])
    for index in games.glob("corpus.jsonl.*"):  # a cached index would hide the cut
        shutil.rmtree(index) if index.is_dir() else index.unlink()
    _fails(capsys, ["eval", "--env", "search", "--games", str(games), "--policy", "expert"],
           "corpus.jsonl:", "cut short?")  # fmt: skip


def test_a_defect_is_one_line_with_the_path_of_its_traceback(tmp_path, capsys, monkeypatch):
    """Anything else a command raises is printed as one line naming the exception and the
    file that holds its traceback; the exit code (1) tells it from an input error (2)."""
    import megatron_seed.pipeline.commands_eval as command

    def broken(args):
        raise RuntimeError("the step table is empty\nsecond line")

    monkeypatch.setattr(command, "run", broken)
    monkeypatch.setenv("SEED_ERROR_DIR", str(tmp_path / "errors"))
    assert cli.main(["eval", "--games", str(tmp_path), "--policy", "expert"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("seed eval: error: RuntimeError: the step table is empty (traceback: ")
    (log,) = (tmp_path / "errors").iterdir()
    assert str(log) in err
    text = log.read_text()
    assert text.startswith("seed eval --games") and "Traceback" in text and "broken" in text
