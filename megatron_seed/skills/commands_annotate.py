"""``seed annotate``: hindsight-skill annotation of trajectories (paper §3.2), resumable.

Reads trajectory records (JSONL), asks an analyzer for one skill per trajectory (an
OpenAI-compatible endpoint, or ``--embedded`` offline), retries bad replies with the parse
error quoted, and writes to ``--out``:

- ``annotated.jsonl``: the records with ``skill`` and the typed ``analysis``;
- ``sft.jsonl``: the accepted pairs (x_tau, s_tau): the analyzer messages, the canonical
  JSON reply and the skill;
- ``responses.jsonl``: every endpoint reply as it arrives (rerunning the same command
  continues where a killed run stopped and pays for nothing twice);
- ``summary.json``: acceptance rate, skill metrics and client statistics.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from megatron_seed.config import SkillConfig
from megatron_seed.data.records import TrajectoryRecord, read_jsonl, write_jsonl
from megatron_seed.errors import CommandError, output_dir
from megatron_seed.files import write_json
from megatron_seed.skills.oracle import oracle_analyzer
from megatron_seed.skills.prompt import LAYOUTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``seed annotate``."""
    defaults = SkillConfig()
    parser.add_argument("--in", dest="inp", required=True, help="trajectory records (JSONL)")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1"
    )
    parser.add_argument("--model", help="model name at the endpoint")
    parser.add_argument(
        "--embedded",
        action="store_true",
        help="offline: the records' environment's oracle analyzer (no endpoint)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the key"
    )
    d = defaults  # the skill config's
    parser.add_argument("--layout", choices=LAYOUTS, default=d.analyzer_layout, help="prompt")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="per analysis")
    parser.add_argument("--max-retries", type=int, default=d.max_retries, help="re-asks")
    parser.add_argument("--min-words", type=int, default=d.min_words, help="shortest skill")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per HTTP request")
    parser.add_argument("--max-attempts", type=int, default=6, help="HTTP attempts per request")
    parser.add_argument("--backoff", type=float, default=1.0, help="first backoff delay (s)")
    parser.add_argument("--limit", type=int, default=None, help="annotate only the first N")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load(path: str, limit: int | None) -> list[TrajectoryRecord]:
    if not Path(path).is_file():
        raise CommandError(f"no trajectory file {path}")
    records = list(read_jsonl(path))  # a line that is no record: one line naming it
    records = records[:limit] if limit is not None else records
    if not records:
        raise CommandError(f"{path} holds no trajectory records")
    return records


def _oracle(records: list[TrajectoryRecord], path: str) -> Any:
    """The oracle analyzer of the records' environment (one environment per file)."""
    from envs.spec import EnvSpecError, get_env

    names = sorted({r.env for r in records})
    if len(names) != 1 or not names[0]:
        raise CommandError(
            f"{path}: --embedded needs records of one named environment, got {names}"
        )
    try:
        env = get_env(names[0])
    except EnvSpecError as err:
        raise CommandError(str(err)) from None
    try:
        return oracle_analyzer(env)
    except ValueError as err:
        raise CommandError(str(err)) from None


def _analyzer(
    args: argparse.Namespace, out: Path, records: list[TrajectoryRecord]
) -> tuple[Any, Any]:
    """(generate_fn, its stats source) for the chosen analyzer."""
    if args.embedded:
        if args.base_url or args.model:
            raise CommandError("--embedded takes no --base-url/--model")
        return _oracle(records, args.inp), None
    if not args.base_url or not args.model:
        raise CommandError(
            "give --base-url and --model (an OpenAI-compatible endpoint), or --embedded"
        )
    from megatron_seed.skills.external import (
        ChatClient,
        EndpointConfig,
        ExternalAnalyzer,
        ResponseStore,
    )

    try:
        cfg = EndpointConfig(
            base_url=args.base_url,
            model=args.model,
            api_key_env=args.api_key_env,
            max_tokens=args.max_tokens,
            concurrency=args.concurrency,
            timeout_s=args.timeout,
            max_attempts=args.max_attempts,
            backoff_base_s=args.backoff,
        )
    except ValueError as err:
        raise CommandError(str(err)) from err
    analyzer = ExternalAnalyzer(
        ChatClient(cfg), ResponseStore(out / "responses.jsonl"), progress=not args.no_progress
    )
    return analyzer, analyzer


def _sft_rows(annotated: list[TrajectoryRecord], requests: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for record, request in zip(annotated, requests, strict=True):
        if not record.has_teacher:
            continue
        summary = (record.analysis.summary if record.analysis else None) or ""
        rows.append(
            {
                "trajectory_id": request.trajectory_id,
                "layout": request.layout,
                "won": record.won,
                "messages": request.messages,  # x_tau (continuation: the episode chat + request)
                "response": json.dumps({"summary": summary, "skill": record.skill}),
                "skill": record.skill,
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    """Annotate, write the outputs, print the acceptance rate."""
    from megatron_seed.skills.parse import (
        analysis_metrics,
        analyze_with_retries,
        apply_results,
        build_requests,
    )

    if args.concurrency < 1 or args.max_retries < 0 or args.min_words < 1:
        raise CommandError("--concurrency and --min-words must be >= 1, --max-retries >= 0")
    records = _load(args.inp, args.limit)
    out = output_dir(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generate_fn, client_stats = _analyzer(args, out, records)
    cfg = SkillConfig(
        analyzer_layout=args.layout,
        min_words=args.min_words,
        max_retries=args.max_retries,
        max_tokens=args.max_tokens,
    )
    start = time.monotonic()
    try:
        results = analyze_with_retries(generate_fn, records, cfg)
    except ValueError as err:  # e.g. continuation layout on windowed records
        raise CommandError(str(err)) from err
    annotated = apply_results(records, results)
    write_jsonl(annotated, out / "annotated.jsonl")
    rows = _sft_rows(annotated, build_requests(records, cfg.analyzer_layout, cfg.min_words))
    with (out / "sft.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    metrics = analysis_metrics(results)
    failed = sum(r.transport_error for r in results)
    summary: dict[str, Any] = {
        "trajectories": len(records),
        "accepted": len(rows),
        "acceptance_rate": len(rows) / len(records),
        "request_failures": failed,
        "layout": cfg.analyzer_layout,
        "analyzer": "embedded" if args.embedded else args.model,
        "seconds": round(time.monotonic() - start, 3),
        "metrics": metrics,
    }
    if client_stats is not None:
        summary["client"] = client_stats.stats.to_dict(client_stats.client)
        client_stats.store.close()
    write_json(out / "summary.json", summary)
    print(
        f"annotated {len(records)} trajectories: {len(rows)} accepted "
        f"({summary['acceptance_rate']:.1%}), {failed} request failures -> {out}"
    )
    if failed:
        first = next(r.error for r in results if r.transport_error)
        if failed == len(records):
            raise CommandError(f"every analyzer request failed; first: {first}")
        print(f"{failed} requests failed (rerun to retry them; stored replies are reused): {first}")
        return 1
    return 0
