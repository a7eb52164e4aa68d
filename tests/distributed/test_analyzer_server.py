"""External analyzer client against real local HTTP servers (127.0.0.1 only).

- a stdlib server the tests script with faults: 500, 429 + Retry-After, a handler that sleeps
  past the client timeout, a body cut short, malformed JSON, 401;
- a run of `seed annotate` killed half-way and restarted re-sends nothing already stored;
- vLLM's own OpenAI server on a tiny random model (slow: engine start-up).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from megatron_seed.config import SkillConfig
from megatron_seed.data.records import Status, TrajectoryRecord, Turn, write_jsonl
from megatron_seed.skills.external import (
    AnalyzerRequestError,
    ChatClient,
    EndpointConfig,
    ExternalAnalyzer,
    ResponseStore,
)
from megatron_seed.skills.parse import analyze_with_retries

REPO = Path(__file__).resolve().parents[2]


def make_record(i: int, won: bool = False) -> TrajectoryRecord:
    """A one-step record (short prompt: it must fit a tiny model's context)."""
    user = f"Your task is to: put a mug {i} in the fridge.\nYour current observation is: a room."
    turn = Turn(user, "<action>go to fridge 1</action>", [5, 2], [-0.1, -0.2],
                observation="a room.", executed="go to fridge 1")  # fmt: skip
    return TrajectoryRecord(
        task_id=f"t{i}", group_id="g", game="", family="pick", turns=[turn], reward=float(won),
        won=won, status=Status.OK, goal=f"put a mug {i} in the fridge",
        final_observation="You arrive at fridge 1.",
    )  # fmt: skip


# --------------------------------------------------------------------------- fake server


class FakeOpenAI:
    """A chat-completions server whose next replies can be scripted faults.

    faults: consumed one per request: "500", "429", "timeout", "truncated", "malformed",
        "401"; None (or an empty script) answers normally. `always` repeats one fault.
    hold_after: after that many normal answers, further requests wait for `release`.
    """

    def __init__(self, faults: list[str] | None = None, always: str | None = None, hold_after: int | None = None, sleep_s: float = 1.5) -> None:  # fmt: skip
        self.faults = list(faults or [])
        self.always = always
        self.hold_after = hold_after
        self.sleep_s = sleep_s
        self.bodies: list[dict[str, Any]] = []
        self.served = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def answer(body: dict[str, Any]) -> bytes:
        last = body["messages"][-1]["content"]
        tag = hashlib.sha256(last.encode()).hexdigest()[:6]
        skill = f"Avoid repeating an action that failed; check the observation first ({tag})."
        return json.dumps({
            "id": "x", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": json.dumps({"summary": "s", "skill": skill})}}],
            "usage": {"prompt_tokens": len(last.split()), "completion_tokens": 17, "total_tokens": 0},
        }).encode()  # fmt: skip

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None, length: int | None = None) -> None:  # fmt: skip
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                try:
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                    fault = fake.faults.pop(0) if fake.faults else fake.always
                    hold = fake.hold_after is not None and fake.served >= fake.hold_after
                if hold:
                    fake.release.wait(timeout=30)
                if fault == "500":
                    return self._send(500, b"internal error")
                if fault == "429":
                    return self._send(429, b"slow down", {"Retry-After": "1"})
                if fault == "401":
                    return self._send(401, b'{"error": "bad key"}')
                if fault == "timeout":
                    time.sleep(fake.sleep_s)
                reply = fake.answer(body)
                if fault == "truncated":  # promise the whole body, send half, hang up
                    self.close_connection = True
                    return self._send(200, reply[: len(reply) // 2], length=len(reply))
                if fault == "malformed":
                    return self._send(200, b'{"id": "x", "choices": [{"message": ')
                if fault != "timeout":
                    with fake.lock:
                        fake.served += 1
                return self._send(200, reply, {"Content-Type": "application/json"})

        return Handler


def _client(url: str, **kw: Any) -> ChatClient:
    cfg = dict(
        base_url=url,
        model="fake",
        timeout_s=0.5,
        max_attempts=6,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
    )
    return ChatClient(EndpointConfig(**{**cfg, **kw}))


def test_client_retries_every_fault_kind_then_succeeds() -> None:
    faults = ["500", "429", "timeout", "truncated", "malformed"]
    with FakeOpenAI(faults) as fake:
        client = _client(fake.url)
        start = time.monotonic()
        gen = client.complete([{"role": "user", "content": "hi there"}])
        elapsed = time.monotonic() - start
    assert json.loads(gen.text)["skill"].startswith("Avoid repeating")
    assert (gen.prompt_tokens, gen.completion_tokens, gen.finish_reason) == (2, 17, "stop")
    assert len(fake.bodies) == 6 and client.http_retries == 5
    # a body cut short reads as a connection error or as malformed JSON (urllib3's choice)
    assert {"HTTP 500", "HTTP 429", "timeout after 0.5 s", "malformed response body (JSONDecodeError)"} <= set(client.retry_reasons)  # fmt: skip
    assert sum(client.retry_reasons.values()) == 5
    assert elapsed >= 1.0  # Retry-After: 1 was honoured
    body = fake.bodies[0]
    assert (body["model"], body["temperature"], body["max_tokens"]) == ("fake", 0.0, 4096)


def test_client_gives_up_with_a_clear_error_after_its_budget() -> None:
    with FakeOpenAI(always="500") as fake:
        with pytest.raises(
            AnalyzerRequestError, match=r"gave up after 3 attempts; last error: HTTP 500"
        ):
            _client(fake.url, max_attempts=3).complete([{"role": "user", "content": "x"}])
        assert len(fake.bodies) == 3
    with FakeOpenAI(always="401") as fake:  # not retryable
        with pytest.raises(AnalyzerRequestError, match="HTTP 401"):
            _client(fake.url).complete([{"role": "user", "content": "x"}])
        assert len(fake.bodies) == 1


def test_api_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED_TEST_KEY", "sk-test")
    client = _client("http://127.0.0.1:9", api_key_env="SEED_TEST_KEY")
    assert client._headers()["Authorization"] == "Bearer sk-test"
    monkeypatch.delenv("SEED_TEST_KEY")
    assert "Authorization" not in client._headers()
    with pytest.raises(ValueError, match="http"):
        EndpointConfig(base_url="127.0.0.1:80", model="m")


def test_analyzer_store_stats_and_failures_through_the_retry_loop(tmp_path: Path) -> None:
    records = [make_record(i) for i in range(6)]
    with FakeOpenAI(["500", "429"]) as fake:
        analyzer = ExternalAnalyzer(
            _client(fake.url, concurrency=3), ResponseStore(tmp_path / "r.jsonl")
        )
        results = analyze_with_retries(analyzer, records, SkillConfig())
        assert all(r.valid and r.skill and r.attempts == 1 for r in results)
        assert len(fake.bodies) == 8  # 6 requests + 2 retried faults
        stats = analyzer.stats.to_dict(analyzer.client)
        assert (stats["requests"], stats["sent"], stats["cached"], stats["failed"]) == (6, 6, 0, 0)
        assert stats["completion_tokens"] == 6 * 17 and stats["http_retries"] == 2
        assert 0 < stats["latency_p50_s"] <= stats["latency_max_s"]
        # a second run over the same store sends nothing
        again = ExternalAnalyzer(_client(fake.url), ResponseStore(tmp_path / "r.jsonl"))
        assert [r.skill for r in analyze_with_retries(again, records, SkillConfig())] == [
            r.skill for r in results
        ]
        assert len(fake.bodies) == 8 and again.stats.cached == 6
    with FakeOpenAI(
        always="500"
    ) as fake:  # the endpoint is down: no teacher signal, nothing stored
        store = ResponseStore(tmp_path / "down.jsonl")
        down = ExternalAnalyzer(_client(fake.url, max_attempts=2), store)
        results = analyze_with_retries(down, records[:2], SkillConfig())
        assert all(r.transport_error and not r.valid and r.skill is None for r in results)
        assert "gave up after 2 attempts" in str(results[0].error)
        assert len(fake.bodies) == 4 and len(store) == 0 and down.stats.failed == 2


def test_store_skips_a_line_cut_by_a_kill(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(
        '{"trajectory_id": "a", "prompt_hash": "h", "text": "t"}\n{"trajectory_id": "b", "pro'
    )
    store = ResponseStore(path)
    assert len(store) == 1 and store.skipped_lines == 1
    from megatron_seed.skills.parse import Generation

    store.put("c", "h2", Generation(text="u"))
    store.close()
    reread = ResponseStore(path)
    assert len(reread) == 2 and reread.get("c", "h2")["text"] == "u"


def _annotate_args(src: Path, out: Path, url: str) -> list[str]:
    return ["annotate", "--in", str(src), "--out", str(out), "--base-url", url, "--model", "fake",
            "--concurrency", "1", "--timeout", "5", "--backoff", "0.01", "--no-progress"]  # fmt: skip


def _wait(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


def test_killed_annotate_run_resumes_without_resending(tmp_path: Path) -> None:
    from megatron_seed.cli import main

    n, first = 8, 3
    src, out = tmp_path / "traj.jsonl", tmp_path / "ann"
    write_jsonl([make_record(i, won=i % 2 == 0) for i in range(n)], src)
    with FakeOpenAI(hold_after=first) as fake:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "megatron_seed.cli", *_annotate_args(src, out, fake.url)]
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            store = out / "responses.jsonl"
            _wait(lambda: store.exists() and len(store.read_text().splitlines()) >= first)
            _wait(lambda: len(fake.bodies) > first)  # the next request is in flight (held)
        finally:
            proc.kill()
            proc.wait(timeout=30)
        fake.release.set()
        sent_before = len(fake.bodies)
        assert sent_before == first + 1 and not (out / "summary.json").exists()
        assert main(_annotate_args(src, out, fake.url)) == 0
        resent = [b["messages"][0]["content"] for b in fake.bodies[sent_before:]]
        assert len(resent) == n - first  # the held request is redone; the stored 3 are not
        summary = json.loads((out / "summary.json").read_text())
        assert summary["acceptance_rate"] == 1.0 and summary["client"]["cached"] == first
        assert len((out / "responses.jsonl").read_text().splitlines()) == n
        # a finished run re-run pays for nothing
        assert main(_annotate_args(src, out, fake.url)) == 0
        assert len(fake.bodies) == sent_before + n - first


# --------------------------------------------------------------------------- vLLM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("vllm")
    from megatron_seed.models.tiny import make_tiny_qwen
    from megatron_seed.models.tiny_tokenizer import build_tokenizer
    from tests.conftest import TINY_CORPUS

    model = tmp_path_factory.mktemp("vllm_tiny")
    tok = build_tokenizer(TINY_CORPUS * 4, vocab_size=512, out_dir=model)
    make_tiny_qwen(model, model_type="qwen3", vocab_size=len(tok))
    port = _free_port()
    log = (model / "server.log").open("w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
           "--max-model-len", "2048", "--enforce-eager", "--dtype", "float32"]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited: {(model / 'server.log').read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(url + "/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("vLLM server did not come up in 300 s") from None
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_client_against_vllm_openai_server(vllm_server: str, tmp_path: Path) -> None:
    records = [make_record(i) for i in range(3)]
    cfg = SkillConfig(max_retries=1)

    def analyzer() -> ExternalAnalyzer:
        client = ChatClient(EndpointConfig(base_url=vllm_server, model="tiny", max_tokens=24, concurrency=2, timeout_s=60))  # fmt: skip
        return ExternalAnalyzer(client, ResponseStore(tmp_path / "r.jsonl"))

    first = analyzer()
    results = analyze_with_retries(first, records, cfg)
    # a random model writes garbage: validation rejects it, after one retry quoting the error
    assert all(not r.valid and r.skill is None and not r.transport_error for r in results), [r.error for r in results]  # fmt: skip
    assert all(r.attempts == 2 and r.retries == 1 for r in results)
    stats = first.stats.to_dict(first.client)
    assert (stats["sent"], stats["failed"], stats["http_retries"]) == (6, 0, 0)
    assert 0 < stats["completion_tokens"] <= 6 * 24 and stats["prompt_tokens"] > 6 * 50
    assert len(first.stats.latencies) == 6 and stats["latency_max_s"] > 0
    assert results[0].prompt_tokens > 0 and results[0].completion_tokens > 0
    # temperature 0 + the store: a rerun (retries included) is served from disk
    second = analyzer()
    again = analyze_with_retries(second, records, cfg)
    assert second.stats.cached == 6 and second.stats.sent == 0
    assert [r.raw for r in again] == [r.raw for r in results]
    # the continuation layout sends the episode's chat (system/user/assistant) + the request
    cont = analyze_with_retries(analyzer(), records[:1], SkillConfig(max_retries=0, analyzer_layout="continuation"))  # fmt: skip
    assert cont[0].attempts == 1 and not cont[0].transport_error and cont[0].completion_tokens > 0
