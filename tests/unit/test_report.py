"""The run report reads as text: facts as bullets (no JSON), the episodes behind every rate,
a legend for its marks, the starred-row note only where a row is starred."""

from __future__ import annotations

from pathlib import Path

from megatron_seed.compare.report import write_report


def _split(rate: float, n: int) -> dict:
    return {
        "episodes": n, "per_family": {"pick": rate}, "per_family_episodes": {"pick": n},
        "macro_avg": rate, "success": rate, "episode_length": 7.5, "decoding": "T=0",
    }  # fmt: skip


def _report(tmp_path: Path, rows: dict) -> str:
    facts = {"seed": 0, "base_policy": {"games": 6, "demonstrations": {"noisy": 48}}}
    return write_report(tmp_path, rows, facts, "alfworld", "ALFWorld").read_text()


def test_facts_rates_and_legend(tmp_path: Path) -> None:
    text = _report(tmp_path, {"SEED": {"seen": _split(0.25, 8)}})
    assert "{" not in text  # no raw JSON
    assert "- base policy:\n  - games: 6\n  - demonstrations: noisy 48\n" in text
    # All: 2 of 8 with Wilson's interval by hand, centre (0.25 + z^2/16) / (1 + z^2/8) =
    # 0.331, half-width 1.96 sqrt(0.25 * 0.75 / 8 + z^2 / 256) / (1 + z^2/8) = 0.260
    assert "| SEED | 25.0 (8) | – | – | – | – | – | 25.0 | 25.0 [7, 59] | 7.5 | 8 |" in text
    assert "– = no task of that family" in text and "in parentheses" in text
    assert "marked *" not in text  # no starred row, no note
    assert "What these numbers can conclude: they are one run (one seed)" in text


def test_the_starred_note_only_with_a_starred_row(tmp_path: Path) -> None:
    rows = {"Skill-Prompt*": {"seen": _split(0.5, 4)}}
    assert "Rows marked * play with the skill library" in _report(tmp_path, rows)


def test_each_model_against_the_base_paired_by_game(tmp_path: Path) -> None:
    """Per game success-rate differences, their mean and 95 % t interval by hand: base wins
    1/4, 0/4, 2/4 of three games, SEED 3/4, 1/4, 2/4: differences 0.5, 0.25, 0 (mean 0.25,
    sd 0.25, t(2) 4.303: half-width 4.303 x 0.25 / sqrt 3 = 0.621)."""

    def train(wins: list[int]) -> dict:
        split = _split(sum(wins) / 12, 12)
        return {"train": split | {"per_game": {f"g{i}": [w, 4] for i, w in enumerate(wins)}}}

    rows = {"Base (Vanilla)": train([1, 0, 2]), "SEED": train([3, 1, 2])}
    text = _report(tmp_path, rows)
    line = "- SEED - base: +25.0 points [-37.1, +87.1] (95 % t, paired over 3 games): not told"
    assert line in text, text
    rows["SEED"] = train([4, 4, 4])  # +0.75, +1.0, +0.5: mean 0.75, half-width 0.621
    assert "- SEED - base: +75.0 points [+12.9, +137.1]" in _report(tmp_path, rows)
    assert "above the base in this run" in _report(tmp_path, rows)
    del rows["Base (Vanilla)"]
    assert "Against the base" not in _report(tmp_path, rows)  # no base row: no lines
