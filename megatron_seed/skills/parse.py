"""Parsing, validation and the batched retry loop of the analyzer.

As the reference code does: the reply should be JSON ``{"summary": ..., "skill": ...}``; it
is parsed leniently (a JSON object anywhere in the text, code fences, trailing commas,
single quotes, a ``skill:`` line as a last resort); the skill must be non-empty, have at
least ``min_words`` words and not be a copy of the prompt. A failed reply is re-asked up to
``max_retries`` times with the parse error quoted; a trajectory whose skill still fails gets
``valid=False``, no skill and hence no teacher signal.

The generation engine is abstract: ``generate_fn(requests) -> replies`` takes a list of
`AnalysisRequest` and returns, in order, a `Generation` (or a plain ``str``) for each. The
fleet uses ``request.record`` + ``request.appended`` (continuation: the episode chat ids plus
the appended turns) and an HTTP client uses ``request.messages``.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from megatron_seed.config import SkillConfig
from megatron_seed.data.generation import Generation
from megatron_seed.data.records import Analysis, TrajectoryRecord
from megatron_seed.skills.prompt import (
    ANSWER_FORMAT,
    SKILL_PLACEHOLDER,
    AnalyzerLayout,
    Message,
    analyzer_messages,
    full_messages,
    one_line,
    trajectory_id,
)

SKILL_KEYS = ("skill", "episode_skill", "hindsight_skill", "episode_hint")
SUMMARY_KEYS = ("summary", "episode_summary")
RETRY_TEMPLATE = (
    "Your previous reply could not be used: {error}. Reply again with ONLY a JSON object "
    'of the form {answer_format} whose "skill" has at least {min_words} words.'
)
# The failed reply is echoed back (so the model sees what it wrote) up to this many chars.
MAX_ECHO_CHARS = 1000

_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_SKILL_LINE = re.compile(
    r"""^[\s>*#_-]*["']?(?:episode[ _-]?|hindsight[ _-]?)?skill["']?\s*\**\s*[:=]\s*(.+?)\s*$""",
    re.IGNORECASE | re.MULTILINE,
)
_SKILL_FIELD = re.compile(
    r"""["']?(?:episode_|hindsight_)?skill["']?\s*:\s*(["'])((?:\\.|(?!\1).)*)(\1)?""",
    re.DOTALL | re.IGNORECASE,
)
_SUMMARY_LINE = re.compile(
    r"""^[\s>*#_-]*["']?(?:episode[ _-]?)?summary["']?\s*\**\s*[:=]\s*(.+?)\s*$""",
    re.IGNORECASE | re.MULTILINE,
)


@dataclass(frozen=True)
class ValidationRules:
    """What makes a skill acceptable (the reference code: non-empty, >= 5 words)."""

    min_words: int = 5
    max_words: int | None = None  # None: no upper limit
    reject_prompt_copy: bool = True  # a skill found verbatim in the prompt is a copy

    @classmethod
    def from_config(cls, cfg: SkillConfig) -> ValidationRules:
        return cls(min_words=cfg.min_words)


@dataclass
class ParseResult:
    """One reply, parsed and validated. ``skill`` is None unless ``valid``."""

    skill: str | None
    summary: str | None
    valid: bool
    error: str | None  # the message quoted in a retry; None when valid
    method: str  # "json", "repaired", "line" or "none"


# --------------------------------------------------------------------------- parsing


def _balanced_objects(text: str) -> list[str]:
    """Every top-level ``{...}`` span of the text (brace matching that skips strings)."""
    spans, depth, start, quote, escaped = [], 0, -1, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'" and depth > 0:
            # a single quote inside a JSON string is an apostrophe; only track it when it
            # opens a value or key (after {, [, :, or ,)
            if ch == '"' or re.search(r"[{\[:,]\s*$", text[start:i]):
                quote = ch
            continue
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def _load_object(candidate: str) -> tuple[dict[str, Any] | None, bool]:
    """(the object, repaired?) of a JSON-ish text; (None, False) if it is not one."""
    try:
        value = json.loads(candidate)
        return (value, False) if isinstance(value, dict) else (None, False)
    except json.JSONDecodeError:
        pass
    fixed = _TRAILING_COMMA.sub(r"\1", candidate)
    fixed = fixed.replace("\u201c", '"').replace("\u201d", '"')
    for attempt in (fixed, fixed.replace("true", "True").replace("false", "False")):
        try:
            value = json.loads(attempt)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(attempt)  # single quotes, Python literals
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
        if isinstance(value, dict):
            return value, True
    return None, False


def _pick(obj: dict[str, Any], keys: Sequence[str]) -> Any:
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    for key in keys:
        if key in lowered:
            return lowered[key]
    return None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return one_line(" ".join(value))
    return None


def _strip_line_value(value: str) -> str:
    value = value.strip().rstrip(",").strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return one_line(value.replace('\\"', '"'))


def extract(text: str) -> tuple[str | None, str | None, str, str | None]:
    """(skill, summary, method, error) from a reply; skill None with an error if none found."""
    body = _THINK.sub("", text or "").strip()
    if not body:
        return None, None, "none", "the reply is empty"
    candidates = [m.group(1) for m in _FENCE.finditer(body)] + [body]
    objects: list[tuple[dict[str, Any], bool]] = []
    for cand in candidates:
        for span in _balanced_objects(cand):
            obj, repaired = _load_object(span)
            if obj is not None:
                objects.append((obj, repaired))
    keys_seen: list[str] = []
    for obj, repaired in objects:
        raw = _pick(obj, SKILL_KEYS)
        if raw is None:
            keys_seen += [str(k) for k in obj]
            continue
        skill = _as_text(raw)
        summary = _as_text(_pick(obj, SUMMARY_KEYS))
        if skill is None:
            return None, summary, "json", f'"skill" must be a string, got {type(raw).__name__}'
        return skill, summary, "repaired" if repaired else "json", None
    fld = _SKILL_FIELD.search(body)
    if fld:  # a "skill": "..." field in JSON that does not parse as a whole
        if fld.group(3) is None:
            return None, None, "line", 'the "skill" string is not closed (truncated reply?)'
        return _strip_line_value(fld.group(2)), None, "line", None
    line = _SKILL_LINE.search(body)
    if line:
        value = line.group(1)
        summary_line = _SUMMARY_LINE.search(body)
        summary = _strip_line_value(summary_line.group(1)) if summary_line else None
        return _strip_line_value(value), summary, "line", None
    if keys_seen:
        return None, None, "json", f'the JSON object has no "skill" field (keys: {keys_seen[:6]})'
    return None, None, "none", 'no JSON object with a "skill" field found in the reply'


def validate(skill: str | None, rules: ValidationRules, prompt_text: str = "") -> str | None:
    """The reason the skill is not acceptable, or None if it is."""
    if skill is None or not skill.strip():
        return "the skill is empty"
    words = len(skill.split())
    if words < rules.min_words:
        return f"the skill has {words} word{'s' * (words != 1)}; at least {rules.min_words} are required"
    if rules.max_words is not None and words > rules.max_words:
        return f"the skill has {words} words; at most {rules.max_words} are allowed"
    if rules.reject_prompt_copy:
        norm = one_line(skill).lower().strip(" .")
        if norm == SKILL_PLACEHOLDER.lower().strip("<>") or norm == SKILL_PLACEHOLDER.lower():
            return "the skill is the placeholder of the answer format, not a skill"
        if len(norm) >= 20 and norm in one_line(prompt_text).lower():
            return "the skill copies text of the prompt instead of analysing the episode"
    return None


def parse_reply(text: str, rules: ValidationRules, prompt_text: str = "") -> ParseResult:
    """Parse and validate one analyzer reply."""
    skill, summary, method, error = extract(text)
    if error is None:
        error = validate(skill, rules, prompt_text)
    if error is not None:
        return ParseResult(None, summary, False, error, method)
    return ParseResult(skill, summary, True, None, method)


def retry_messages(
    messages: list[Message], reply: str, error: str, min_words: int = 5
) -> list[Message]:
    """The messages of a retry: the failed reply, then a user turn quoting the error."""
    echo = (reply or "").strip()
    if len(echo) > MAX_ECHO_CHARS:
        echo = echo[:MAX_ECHO_CHARS] + " ..."
    ask = RETRY_TEMPLATE.format(error=error, answer_format=ANSWER_FORMAT, min_words=min_words)
    return [
        *messages,
        {"role": "assistant", "content": echo or "(empty)"},
        {"role": "user", "content": ask},
    ]


# --------------------------------------------------------------------------- batching


@dataclass(frozen=True)
class AnalysisRequest:
    """One generation to make.

    messages: the complete chat (what a chat endpoint receives).
    appended: the messages after the episode's own chat (continuation layout; the fleet
        appends their ids to the episode's chat ids) or the whole prompt (record layout).
    """

    index: int  # position in the batch of records
    trajectory_id: str
    record: TrajectoryRecord
    layout: AnalyzerLayout
    messages: list[Message]
    appended: list[Message]
    attempt: int = 0  # 0: first ask; k: k-th retry


GenerateFn = Callable[[list[AnalysisRequest]], Sequence["Generation | str"]]


@dataclass
class AnalysisResult:
    """The analysis of one trajectory. ``skill`` is None unless ``valid``."""

    index: int
    trajectory_id: str
    skill: str | None = None
    summary: str | None = None
    valid: bool = False
    error: str | None = None  # last parse/validation/transport error
    retries: int = 0  # re-asks after a bad reply
    attempts: int = 0  # generations made (cached ones included)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    transport_error: bool = False  # the engine/endpoint failed (not the reply)
    raw: str = ""  # the last reply
    method: str = "none"
    history: list[str] = field(default_factory=list)  # errors of each failed attempt

    @property
    def skill_words(self) -> int:
        return len(self.skill.split()) if self.skill else 0

    def to_analysis(self) -> Analysis:
        """The record's view of this result."""
        return Analysis(
            trajectory_id=self.trajectory_id,
            valid=self.valid,
            summary=self.summary,
            error=self.error,
            retries=self.retries,
            attempts=self.attempts,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            transport_error=self.transport_error,
        )


def build_requests(
    records: Sequence[TrajectoryRecord], layout: AnalyzerLayout, min_words: int = 5
) -> list[AnalysisRequest]:
    """The first-attempt requests of a batch of records."""
    return [
        AnalysisRequest(
            index=i,
            trajectory_id=trajectory_id(r),
            record=r,
            layout=layout,
            messages=full_messages(r, layout, min_words),
            appended=analyzer_messages(r, layout, min_words),
        )
        for i, r in enumerate(records)
    ]


def _as_generation(out: Generation | str) -> Generation:
    return out if isinstance(out, Generation) else Generation(text=str(out))


def analyze_with_retries(
    generate_fn: GenerateFn,
    records: Sequence[TrajectoryRecord],
    cfg: SkillConfig,
    rules: ValidationRules | None = None,
    layout: AnalyzerLayout | None = None,
) -> list[AnalysisResult]:
    """Analyze every record: one batch for all, then re-ask only the failed ones.

    At most ``1 + cfg.max_retries`` generations per trajectory. A transport error (the
    engine gave up) ends that trajectory at once, without a teacher signal.
    """
    rules = rules or ValidationRules.from_config(cfg)
    layout = layout or cfg.analyzer_layout
    requests = build_requests(records, layout, rules.min_words)
    results = [AnalysisResult(index=q.index, trajectory_id=q.trajectory_id) for q in requests]
    pending = requests
    for _ in range(cfg.max_retries + 1):
        if not pending:
            break
        outs = list(generate_fn(pending))
        if len(outs) != len(pending):
            raise RuntimeError(
                f"generate_fn returned {len(outs)} replies for {len(pending)} requests"
            )
        pending = [
            retry
            for request, out in zip(pending, outs, strict=True)
            if (retry := absorb_reply(request, results[request.index], out, cfg, rules))
        ]
    return results


def absorb_reply(
    request: AnalysisRequest,
    res: AnalysisResult,
    out: Generation | str,
    cfg: SkillConfig,
    rules: ValidationRules,
) -> AnalysisRequest | None:
    """Fold one reply to `request` into its result `res`; return the retry to ask next
    (quoting the error), or None when the trajectory is done (valid skill, transport error,
    or no retries left). The step of `analyze_with_retries` and of analyses that run as
    episodes end (`rollout.overlap`)."""
    gen = _as_generation(out)
    attempt = request.attempt
    res.attempts += 1
    res.retries = attempt
    res.prompt_tokens += gen.prompt_tokens
    res.completion_tokens += gen.completion_tokens
    res.latency_s += gen.latency_s
    res.raw = gen.text
    if gen.error is not None:
        res.error, res.transport_error = f"analyzer request failed: {gen.error}", True
        res.history.append(res.error)
        return None
    prompt_text = "\n".join(m["content"] for m in request.messages)
    parsed = parse_reply(gen.text, rules, prompt_text)
    res.method = parsed.method
    res.summary = parsed.summary
    if parsed.valid:
        res.skill, res.valid, res.error = parsed.skill, True, None
        return None
    res.error = parsed.error
    res.history.append(str(parsed.error))
    if attempt >= cfg.max_retries:
        return None
    return replace(
        request,
        messages=retry_messages(request.messages, gen.text, str(parsed.error), rules.min_words),
        appended=retry_messages(request.appended, gen.text, str(parsed.error), rules.min_words),
        attempt=attempt + 1,
    )


def apply_results(
    records: Sequence[TrajectoryRecord], results: Sequence[AnalysisResult]
) -> list[TrajectoryRecord]:
    """Copies of the records with `skill` (only if valid) and the typed `analysis` set."""
    return [
        replace(record, skill=res.skill if res.valid else None, analysis=res.to_analysis())
        for record, res in zip(records, results, strict=True)
    ]


# A skill whose word 3-grams repeat earlier ones at least this often is degenerate text.
DEGENERATE_REPEAT_SHARE = 0.5
_EDGE_PUNCT = re.compile(r"^\W+|\W+$")


def repeated_trigram_share(skill: str) -> float:
    """Share of the skill's word 3-grams that repeat an earlier one: 1 - distinct / total.

    Words are whitespace tokens, lower-cased, with punctuation stripped at both ends
    ("1," is "1"). Fewer than 3 words: 0."""
    words = [w for w in (_EDGE_PUNCT.sub("", t) for t in skill.lower().split()) if w]
    grams = list(zip(words, words[1:], words[2:], strict=False))
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def is_degenerate(skill: str) -> bool:
    """Whether a skill is degenerate text: `repeated_trigram_share` >= 1/2, i.e. at least half
    of its word 3-grams repeat earlier ones (the text says the same thing over and over).

    Examples (shares as computed):
      0.95  "go to go to go to ..." (20 times): a loop.
      0.64  one 10-word sentence written 3 times. r copies of a k-word sentence (whose own
            3-grams differ) give ((r - 1) k - 2) / (r k - 2): 3 copies are always >= 1/2,
            2 copies never (a single restatement is not counted).
      0.44  a normal 18-word skill followed by "and then" 10 times (a loop still short).
      0.23  "go to cabinet 1, go to cabinet 2, ..., go to cabinet 8": a list, not a loop.
      <= 0.19  every skill of the ALFWorld oracle analyzer (`envs.alfworld.oracle`) on 96
            generated episodes (6 families; expert, detour, rejected-action, no-action and
            random-walk policies); the highest is a two-object workflow that names each
            "go to ... 1" twice.
    Why not the simpler rules: the most frequent 3-gram of a sentence written r times
    covers only about 1/k of the 3-grams (0.11 for the example above), so it misses
    repeated sentences; and a distinct-word ratio falls with length on correct workflows
    (0.39 on the oracle's "put two pillow in armchair" workflow), so "< 0.4" flags them.
    """
    return repeated_trigram_share(skill) >= DEGENERATE_REPEAT_SHARE


def analysis_metrics(results: Sequence[AnalysisResult]) -> dict[str, float]:
    """Validity rate, degenerate rate, retries, skill length and tokens of a batch (for the
    metrics log). ``degenerate_rate`` is the share of valid skills that `is_degenerate` (0.0
    when none is valid, as ``words_mean``)."""
    n = len(results)
    if n == 0:
        return {"analyze/n": 0.0}
    valid = [r for r in results if r.valid]
    degenerate = sum(is_degenerate(r.skill or "") for r in valid)
    return {
        "analyze/n": float(n),
        "analyze/valid_rate": len(valid) / n,
        "analyze/degenerate_rate": degenerate / len(valid) if valid else 0.0,
        "analyze/retries_mean": statistics.fmean(r.retries for r in results),
        "analyze/retried_rate": sum(r.retries > 0 for r in results) / n,
        "analyze/transport_errors": float(sum(r.transport_error for r in results)),
        "analyze/words_mean": statistics.fmean(r.skill_words for r in valid) if valid else 0.0,
        "analyze/prompt_tokens": float(sum(r.prompt_tokens for r in results)),
        "analyze/completion_tokens": float(sum(r.completion_tokens for r in results)),
    }
