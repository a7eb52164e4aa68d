"""External analyzer: any OpenAI-compatible chat-completions endpoint (paper §3.2, B.4).

`ChatClient` sends one request with retries: exponential backoff with jitter on 429 (the
server's Retry-After is honoured), 5xx, 408, timeouts, connection errors and bodies that are
not a complete chat-completion JSON (truncated or malformed). Other 4xx are not retried
(a wrong key, model or request does not heal); every loop is bounded by ``max_attempts``.

`ResponseStore` is a resumable JSONL cache keyed by (trajectory id, prompt hash): a reply is
appended and flushed as soon as it arrives, so a killed run restarted with the same inputs
pays for nothing it already has. Retries of the analysis loop are deterministic at
temperature 0 (their prompts quote the stored reply), so they hit the store too.

`ExternalAnalyzer` is a ``generate_fn`` for `analyze_with_retries`: cached replies first,
the rest through a bounded thread pool, with token and latency statistics.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_seed.data.generation import Generation
from megatron_seed.skills.parse import AnalysisRequest
from megatron_seed.skills.prompt import Message

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524})


class AnalyzerRequestError(RuntimeError):
    """A request that failed for good (non-retryable status, or the retry budget spent)."""


@dataclass(frozen=True)
class EndpointConfig:
    """An OpenAI-compatible endpoint and how to call it (paper: temperature 0, 4,096 tokens)."""

    base_url: str  # e.g. http://127.0.0.1:8000/v1 (a trailing /v1 is added if missing)
    model: str
    api_key_env: str = "OPENAI_API_KEY"  # unset or empty: no Authorization header
    temperature: float = 0.0
    max_tokens: int = 4096
    concurrency: int = 8
    timeout_s: float = 120.0
    max_attempts: int = 6  # HTTP attempts per request, first included
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    retry_after_max_s: float = 600.0  # a longer Retry-After is an error, not a wait

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if self.concurrency < 1 or self.max_attempts < 1:
            raise ValueError("concurrency and max_attempts must be >= 1")

    @property
    def chat_url(self) -> str:
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions"


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _parse_completion(body: bytes) -> tuple[str, dict[str, int], str | None]:
    """(text, usage, finish_reason) of a chat-completion body; _Retryable if malformed."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as err:
        excerpt = body[:200].decode("utf-8", "replace")
        raise _Retryable(f"malformed response body ({type(err).__name__}): {excerpt!r}") from err
    usage = data.get("usage") or {}
    return (
        text or "",
        {
            "prompt_tokens": int(usage.get("prompt_tokens") or 0),
            "completion_tokens": int(usage.get("completion_tokens") or 0),
        },
        choice.get("finish_reason"),
    )


class ChatClient:
    """Chat completions with bounded retries. Thread-safe (one HTTP session per thread)."""

    def __init__(
        self,
        cfg: EndpointConfig,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = cfg
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._local = threading.local()
        self._lock = threading.Lock()
        self.http_retries = 0  # retried HTTP attempts over the client's life
        self.retry_reasons: dict[str, int] = {}

    def _session(self) -> Any:
        import requests

        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.cfg.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def payload(self, messages: list[Message]) -> dict[str, Any]:
        """The request body (also what the prompt hash covers)."""
        return {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
        }

    def _attempt(self, body: dict[str, Any]) -> Generation:
        import requests

        start = time.monotonic()
        try:
            resp = self._session().post(
                self.cfg.chat_url, json=body, headers=self._headers(), timeout=self.cfg.timeout_s
            )
            content = resp.content  # reads the whole body (a cut connection raises here)
        except requests.Timeout as err:
            raise _Retryable(f"timeout after {self.cfg.timeout_s:g} s") from err
        except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as err:
            raise _Retryable(f"connection error: {type(err).__name__}") from err
        latency = time.monotonic() - start
        if resp.status_code in RETRY_STATUSES:
            raise _Retryable(
                f"HTTP {resp.status_code}: {content[:200].decode('utf-8', 'replace')!r}",
                _retry_after(resp.headers.get("Retry-After")),
            )
        if resp.status_code != 200:
            raise AnalyzerRequestError(
                f"HTTP {resp.status_code} from {self.cfg.chat_url}: "
                f"{content[:300].decode('utf-8', 'replace')!r}"
            )
        text, usage, finish = _parse_completion(content)
        return Generation(text=text, latency_s=latency, finish_reason=finish, **usage)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
        delay *= self._rng.uniform(0.5, 1.0)  # jitter: clients that failed together spread out
        if retry_after is not None:
            if retry_after > self.cfg.retry_after_max_s:
                raise AnalyzerRequestError(f"server asks to retry after {retry_after:.0f} s")
            delay = max(delay, retry_after)
        return delay

    def complete(self, messages: list[Message]) -> Generation:
        """One chat completion; AnalyzerRequestError once the retry budget is spent."""
        body = self.payload(messages)
        last = ""
        for attempt in range(self.cfg.max_attempts):
            try:
                return self._attempt(body)
            except _Retryable as err:
                last = str(err)
                with self._lock:
                    self.http_retries += attempt + 1 < self.cfg.max_attempts
                    reason = last.split(":")[0]
                    self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + 1
                if attempt + 1 < self.cfg.max_attempts:
                    self._sleep(self._backoff(attempt, err.retry_after))
        raise AnalyzerRequestError(
            f"gave up after {self.cfg.max_attempts} attempts; last error: {last}"
        )


def prompt_hash(payload: dict[str, Any]) -> str:
    """Hash of a request body (messages, model and sampling settings)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class ResponseStore:
    """Append-only JSONL of finished replies, keyed by (trajectory id, prompt hash).

    A line cut short by a kill is skipped on load (``skipped_lines``); only successful
    replies are stored, so a failed request is retried by the next run.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], dict[str, Any]] = {}
        self.skipped_lines = 0
        if self.path.exists():
            for entry in self._read():
                self._entries[(entry["trajectory_id"], entry["prompt_hash"])] = entry
        self._file = self.path.open("a", encoding="utf-8")

    def _read(self) -> Iterator[dict[str, Any]]:
        with self.path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    if (
                        isinstance(entry, dict)
                        and {"trajectory_id", "prompt_hash", "text"} <= entry.keys()
                    ):
                        yield entry
                        continue
                except json.JSONDecodeError:
                    pass
                if line.strip():
                    self.skipped_lines += 1

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, trajectory_id: str, phash: str) -> dict[str, Any] | None:
        with self._lock:
            return self._entries.get((trajectory_id, phash))

    def put(self, trajectory_id: str, phash: str, gen: Generation) -> None:
        """Append one reply and flush it to disk."""
        entry = {
            "trajectory_id": trajectory_id,
            "prompt_hash": phash,
            "text": gen.text,
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "latency_s": round(gen.latency_s, 4),
            "finish_reason": gen.finish_reason,
            "time": time.time(),
        }
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            # a previous run killed mid-line left no newline: start on a fresh line
            if self._file.tell() > 0 and not self._ends_with_newline():
                self._file.write("\n")
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._entries[(trajectory_id, phash)] = entry

    def _ends_with_newline(self) -> bool:
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) == b"\n"

    def close(self) -> None:
        self._file.close()


@dataclass
class ClientStats:
    """Requests, cache hits, failures, tokens and latency of an `ExternalAnalyzer`."""

    requests: int = 0  # generations asked for (cached included)
    cached: int = 0
    sent: int = 0  # sent to the endpoint (succeeded or not)
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self, client: ChatClient | None = None) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        out: dict[str, Any] = {
            "requests": self.requests,
            "cached": self.cached,
            "sent": self.sent,
            "failed": self.failed,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "latency_mean_s": statistics.fmean(lat) if lat else 0.0,
            "latency_p50_s": pct(0.5),
            "latency_p90_s": pct(0.9),
            "latency_max_s": lat[-1] if lat else 0.0,
            "wall_s": self.wall_s,
        }
        if client is not None:
            out["http_retries"] = client.http_retries
            out["retry_reasons"] = dict(client.retry_reasons)
        return out


class ExternalAnalyzer:
    """``generate_fn`` over a `ChatClient` and a `ResponseStore`, with bounded concurrency."""

    def __init__(self, client: ChatClient, store: ResponseStore, progress: bool = False) -> None:
        self.client = client
        self.store = store
        self.progress = progress
        self.stats = ClientStats()
        self._lock = threading.Lock()

    def _one(self, request: AnalysisRequest, phash: str) -> Generation:
        try:
            gen = self.client.complete(request.messages)
        except AnalyzerRequestError as err:
            with self._lock:
                self.stats.sent += 1
                self.stats.failed += 1
            return Generation(error=str(err))
        self.store.put(request.trajectory_id, phash, gen)
        with self._lock:
            self.stats.sent += 1
            self.stats.prompt_tokens += gen.prompt_tokens
            self.stats.completion_tokens += gen.completion_tokens
            self.stats.latencies.append(gen.latency_s)
        return gen

    def __call__(self, requests: list[AnalysisRequest]) -> list[Generation]:
        start = time.monotonic()
        out: list[Generation | None] = [None] * len(requests)
        todo: list[tuple[int, AnalysisRequest, str]] = []
        for i, request in enumerate(requests):
            phash = prompt_hash(self.client.payload(request.messages))
            entry = self.store.get(request.trajectory_id, phash)
            if entry is None:
                todo.append((i, request, phash))
                continue
            out[i] = Generation(
                text=entry["text"],
                prompt_tokens=entry.get("prompt_tokens", 0),
                completion_tokens=entry.get("completion_tokens", 0),
                finish_reason=entry.get("finish_reason"),
                cached=True,
            )
        self.stats.requests += len(requests)
        self.stats.cached += len(requests) - len(todo)
        if todo:
            bar = None
            if self.progress:
                from tqdm import tqdm

                bar = tqdm(total=len(todo), desc="analyzer requests", unit="req", leave=False)
            with ThreadPoolExecutor(max_workers=self.client.cfg.concurrency) as pool:
                futures = {pool.submit(self._one, req, ph): i for i, req, ph in todo}
                for future in as_completed(futures):
                    out[futures[future]] = future.result()
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                bar.close()
        self.stats.wall_s += time.monotonic() - start
        return [g if g is not None else Generation(error="no reply") for g in out]
