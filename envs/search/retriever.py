"""Retrievers for the search environment: BM25 in process, or a Search-R1 retrieval server.

- ``Retriever``: the protocol the environment speaks, ``search(query, k) -> list[Doc]``.
- ``BM25Retriever``: ``bm25s`` over a ``{"id", "contents"}`` JSONL corpus (wiki-18's schema,
  Search-R1's ``wiki-18.jsonl``), tokenised by bm25s's own tokenizer with English stopwords.
  The index is built once and saved next to the corpus (``<corpus>.bm25/<key>/``, or under
  ``cache_dir``), keyed by the corpus file's size and SHA-256: a second process loads it, a
  changed or truncated corpus gets a fresh index.
- ``HttpRetriever``: ``POST /retrieve`` of a Search-R1-style server. Two request shapes:
  verl-agent's ``{"query": q, "topk": k, "return_scores": true}`` and Search-R1's original
  ``{"queries": [q], "topk": k, "return_scores": true}`` (``retrieval_server.py``); the answer
  ``{"result": [[{"document": {"id", "contents"}, "score": s}, ...]]}`` or, without scores,
  plain documents. Connection errors, timeouts and 5xx are retried with exponential backoff.
- ``load_retriever(root)``: the retriever a task folder names in ``retriever.json``
  (``{"backend": "bm25", "corpus": "corpus.jsonl"}`` or ``{"backend": "http", "url": ...}``),
  cached per process (one index load per env worker).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CONFIG_NAME = "retriever.json"
TOP_K = 3  # Search-R1's retrieval depth (``topk: 3``)


class RetrieverError(ValueError):
    """A retriever that cannot be built or a corpus/config that cannot be read (one line)."""


class RetrieverUnavailable(RetrieverError):
    """The retrieval server did not answer within its retries."""


@dataclass(frozen=True)
class Doc:
    """One retrieved passage: ``contents`` is wiki-18's ``"Title"\\ntext``."""

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        """The first line of the contents (quotes kept, as Search-R1 shows it)."""
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        """The contents after the title line."""
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) > 1 else ""


class Retriever(Protocol):
    """What the environment needs: the top ``k`` passages for a query."""

    def search(self, query: str, k: int = TOP_K) -> list[Doc]:
        """The ``k`` best passages for ``query``, best first."""
        ...


# --------------------------------------------------------------------------- BM25


def read_corpus(path: str | os.PathLike) -> tuple[list[tuple[str, str]], str]:
    """(``[(id, contents), ...]``, the index key ``<size>-<sha256>``) of a JSONL corpus.

    A line that is not a JSON object with string ``id`` and ``contents`` is a `RetrieverError`
    naming the file and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise RetrieverError(f"no corpus file {path}")
    digest = hashlib.sha256()
    docs: list[tuple[str, str]] = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            digest.update(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RetrieverError(f"{path}:{lineno}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
                raise RetrieverError(
                    f"{path}:{lineno}: expected an object with 'id' and 'contents'"
                )
            docs.append((str(row.get("id", len(docs))), row["contents"]))
    if not docs:
        raise RetrieverError(f"corpus {path} has no passages")
    return docs, f"{path.stat().st_size}-{digest.hexdigest()}"


def tokenize(texts: list[str]) -> list[list[str]]:
    """bm25s's own tokenizer (scikit-learn's word pattern, lower case, English stopwords)."""
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class BM25Retriever:
    """BM25 (bm25s, Lucene scoring) over a JSONL corpus; the index is cached on disk.

    ``built`` tells whether this instance indexed the corpus (True) or loaded a saved index.
    """

    def __init__(self, corpus: str | os.PathLike, cache_dir: str | os.PathLike | None = None):
        import bm25s

        self.corpus = Path(corpus)
        self.docs, self.key = read_corpus(self.corpus)
        base = Path(cache_dir) if cache_dir else self.corpus.with_name(self.corpus.name + ".bm25")
        self.index_dir = base / self.key[:80]
        self.built = False
        if (self.index_dir / "params.index.json").is_file():
            self._bm25 = bm25s.BM25.load(str(self.index_dir), show_progress=False)
        else:
            self._bm25 = bm25s.BM25()
            self._bm25.index(tokenize([c for _, c in self.docs]), show_progress=False)
            self.built = True
            self._save(base)
        if self._bm25.scores["num_docs"] != len(self.docs):
            raise RetrieverError(f"the BM25 index at {self.index_dir} does not match {self.corpus}")

    def _save(self, base: Path) -> None:
        """Write the index to a temporary folder and rename it into place (atomic: another
        process building the same index at the same time keeps a whole one)."""
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
        self._bm25.save(str(tmp), show_progress=False)
        try:
            os.replace(tmp, self.index_dir)
        except OSError:  # another process won the race: its index is the same
            shutil.rmtree(tmp, ignore_errors=True)
        for stale in base.iterdir():  # indexes of earlier versions of the corpus
            if stale.name != self.index_dir.name and not stale.name.startswith(".tmp-"):
                shutil.rmtree(stale, ignore_errors=True)

    def search(self, query: str, k: int = TOP_K) -> list[Doc]:
        """The top ``k`` passages (ties and zero scores in bm25s's order)."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int = TOP_K) -> list[list[Doc]]:
        """`search` of several queries in one bm25s call."""
        k = min(k, len(self.docs))
        if k <= 0 or not queries:
            return [[] for _ in queries]
        result = self._bm25.retrieve(tokenize(list(queries)), k=k, show_progress=False)
        return [
            [Doc(*self.docs[int(i)], score=float(s)) for i, s in zip(ids, scores, strict=True)]
            for ids, scores in zip(result.documents, result.scores, strict=True)
        ]


# --------------------------------------------------------------------------- HTTP

STYLES = ("query", "queries", "auto")


def _payload(style: str, query: str, k: int) -> dict[str, Any]:
    if style == "query":  # verl-agent's retrieval server
        return {"query": query, "topk": k, "return_scores": True}
    return {"queries": [query], "topk": k, "return_scores": True}  # Search-R1's original


def parse_result(body: Any) -> list[Doc]:
    """Docs of a ``/retrieve`` answer: ``{"result": [[item, ...]]}`` (one list per query; a
    flat list is taken as the single query's), each item ``{"document": doc, "score": s}`` or
    a plain ``doc`` (``{"id", "contents"}``)."""
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        raise RetrieverError("the answer has no 'result' list")
    result = body["result"]
    items = result[0] if result and isinstance(result[0], list) else result
    docs = []
    for item in items:
        if not isinstance(item, dict):
            raise RetrieverError(f"a result item is {type(item).__name__}, not an object")
        doc = item.get("document", item)
        if not isinstance(doc, dict) or "contents" not in doc:
            raise RetrieverError("a result item has no 'contents'")
        score = item.get("score") if "document" in item else None
        docs.append(
            Doc(
                str(doc.get("id", "")),
                str(doc["contents"]),
                None if score is None else float(score),
            )
        )
    return docs


class HttpRetriever:
    """A Search-R1 retrieval server at ``url`` (``http://host:port/retrieve``).

    ``style``: "query" (verl-agent), "queries" (Search-R1) or "auto" (try "query"; on an HTTP
    4xx answer switch to "queries" and remember it). Connection errors, timeouts and 5xx are
    retried ``retries`` times, waiting ``backoff_s * 2**attempt``; then `RetrieverUnavailable`.
    """

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        style: str = "auto",
    ) -> None:
        if style not in STYLES:
            raise RetrieverError(f"unknown request style {style!r}; choose from {list(STYLES)}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.style = style
        self._session: Any = None

    def _post(self, style: str, query: str, k: int) -> Any:
        """One request; returns the response (any status) or raises requests' error."""
        import requests

        if self._session is None:
            self._session = requests.Session()
        return self._session.post(self.url, json=_payload(style, query, k), timeout=self.timeout_s)

    def search(self, query: str, k: int = TOP_K) -> list[Doc]:
        """The server's top ``k`` passages for ``query``."""
        import requests

        last = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            style = "query" if self.style == "auto" else self.style
            try:
                response = self._post(style, query, k)
                if self.style == "auto" and 400 <= response.status_code < 500:
                    response = self._post("queries", query, k)
                    if response.status_code < 400:
                        self.style = "queries"
                elif self.style == "auto" and response.status_code < 400:
                    self.style = "query"
            except requests.RequestException as err:
                last = f"{type(err).__name__}: {_first_line(str(err))}"
                continue
            if response.status_code >= 500:
                last = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise RetrieverError(
                    f"retriever {self.url} rejected the request: HTTP {response.status_code} "
                    f"{_first_line(response.text)[:200]}"
                )
            try:
                return parse_result(response.json())[:k]
            except (ValueError, RetrieverError) as err:
                raise RetrieverError(f"retriever {self.url}: bad answer: {err}") from None
        raise RetrieverUnavailable(
            f"retriever {self.url} unavailable after {self.retries + 1} attempts: {last}"
        )


def _first_line(text: str) -> str:
    return (text or "").strip().split("\n", 1)[0]


# --------------------------------------------------------------------------- config

_CACHE: dict[tuple[str, str], Retriever] = {}


def write_config(root: str | os.PathLike, config: dict[str, Any]) -> Path:
    """Write ``root/retriever.json`` (sorted keys: byte-identical for the same config)."""
    path = Path(root) / CONFIG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    return path


def find_root(task: str | os.PathLike) -> Path:
    """The task folder holding ``retriever.json``: the task file's nearest ancestor with one
    (``root/<split>/<data_source>/<qid>.json`` -> ``root``), or ``task`` itself if a folder."""
    path = Path(task).resolve()
    for folder in [path, *path.parents][:5]:
        if (folder / CONFIG_NAME).is_file():
            return folder
    raise RetrieverError(f"no {CONFIG_NAME} in the folders above {task}")


def build_retriever(config: dict[str, Any], root: str | os.PathLike) -> Retriever:
    """A retriever from a config dict (relative corpus paths are relative to ``root``)."""
    backend = config.get("backend")
    if backend == "bm25":
        if "corpus" not in config:
            raise RetrieverError(f"{CONFIG_NAME}: the bm25 backend needs 'corpus'")
        corpus = Path(root) / config["corpus"]  # an absolute path stays absolute
        cache = config.get("cache_dir")
        return BM25Retriever(corpus, Path(root) / cache if cache else None)
    if backend == "http":
        if "url" not in config:
            raise RetrieverError(f"{CONFIG_NAME}: the http backend needs 'url'")
        keys = ("timeout_s", "retries", "backoff_s", "style")
        return HttpRetriever(config["url"], **{k: config[k] for k in keys if k in config})
    raise RetrieverError(f"{CONFIG_NAME}: unknown backend {backend!r}; choose 'bm25' or 'http'")


def _read_config(path: Path) -> dict[str, Any]:
    """``retriever.json``'s object; `RetrieverError` for a missing file, bad JSON or another
    JSON type."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise RetrieverError(f"no {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RetrieverError(f"{path}: not JSON ({err})") from None
    if not isinstance(config, dict):
        raise RetrieverError(f"{path}: expected a JSON object")
    return config


def check_retriever(root: Path) -> None:
    """``root/retriever.json`` as `build_retriever` reads it, and for BM25 its corpus's two
    ends, without reading the corpus through (wiki-18 is 14 GB): its first and last non-blank
    lines are ``{"id", "contents"}`` records (a file cut mid-record has a last line that does
    not parse). `RetrieverError` naming the file."""
    path = root / CONFIG_NAME
    config = _read_config(path)
    backend = config.get("backend")
    if backend not in ("bm25", "http"):
        raise RetrieverError(f"{path}: unknown backend {backend!r}; choose 'bm25' or 'http'")
    field = "corpus" if backend == "bm25" else "url"
    if not isinstance(config.get(field), str):
        raise RetrieverError(f"{path}: the {backend} backend needs '{field}' (a string)")
    if backend == "bm25":
        _check_corpus_ends(root / config["corpus"])


def _check_corpus_ends(corpus: Path) -> None:
    if not corpus.is_file() or corpus.stat().st_size == 0:
        raise RetrieverError(f"no corpus file {corpus}, or it is empty")
    size = corpus.stat().st_size
    with corpus.open("rb") as f:
        head = f.read(1 << 20)
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    # the first and the last non-blank lines, as `read_corpus` reads them (a last line
    # without its newline is whole if it parses; one cut mid-record does not)
    lines = [x for x in head.split(b"\n") if x.strip()]
    ends = [x for x in tail.split(b"\n") if x.strip()]
    if not lines or not ends:
        raise RetrieverError(f"{corpus}: no record in its first or last megabyte")
    for where, raw in (("first", lines[0]), ("last", ends[-1])):
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RetrieverError(
                f"{corpus}: its {where} record is not JSON, cut short? ({err})"
            ) from None
        if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
            raise RetrieverError(
                f"{corpus}: its {where} line is not an object with 'id' and 'contents'"
            )


def load_retriever(root: str | os.PathLike) -> Retriever:
    """The retriever ``root/retriever.json`` names, built once per process per config."""
    path = Path(root) / CONFIG_NAME
    config = _read_config(path)
    key = (str(Path(root).resolve()), json.dumps(config, sort_keys=True))
    if key not in _CACHE:
        _CACHE[key] = build_retriever(config, root)
    return _CACHE[key]
