"""Task files of the search environment: writing, listing and reading them.

Layout (one corpus shared by the splits; the task file format is the same for generated and
official data):

    root/corpus.jsonl                  the generated encyclopedia ({"id", "contents"} rows)
    root/corpus.meta.json              the settings it was built from (seed, corpus_size)
    root/retriever.json                {"backend": "bm25", "corpus": "corpus.jsonl"} or http
    root/<split>/<data_source>/<qid>.json

A task file holds ``question``, ``golden_answers``, ``data_source``, ``gold_queries`` (one
query per hop; null for official data), ``gold_doc_ids``, ``gold_titles``, ``hops`` and
``shape`` ("attribute": 1 hop, "chain": a bridge/compositional chain, "comparison":
two entities' years compared) and ``distractor_queries`` (near-duplicate names per hop: the noisy expert's mistakes).

A question is KEPT only if each of its gold queries retrieves its gold passage in BM25's
top 3 (the retriever the environment uses), so the gold chain is an expert plan that wins.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from envs.api import checked_task_files
from envs.search import corpus as world_mod
from envs.search.retriever import CONFIG_NAME, TOP_K, BM25Retriever, check_retriever, write_config

SPLITS = ("train", "seen", "unseen")
CORPUS_NAME = "corpus.jsonl"
META_NAME = "corpus.meta.json"
DEFAULT_CORPUS_SIZE = 600
DEFAULT_MAX_HOPS = 3  # 3 searches + the answer fit Search-R1's 4-turn budget
MIN_CORPUS, MAX_CORPUS = 100, 3000
SEEN_SHARE = 4  # one fact in 4 of world A is asked in "seen", the rest in "train"
_REQUIRED = ("question", "golden_answers", "data_source")


class TaskError(ValueError):
    """A task folder or task file that cannot be used (one line)."""


# --------------------------------------------------------------------------- reading


def load_task(task: str | os.PathLike) -> dict[str, Any]:
    """A task file's contents (checked: question, golden_answers, data_source)."""
    path = Path(task)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise TaskError(f"no task file {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TaskError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict) or any(k not in data for k in _REQUIRED):
        raise TaskError(f"{path}: a task needs {', '.join(_REQUIRED)}")
    answers = data["golden_answers"]
    if isinstance(answers, str):
        data["golden_answers"] = [answers]
    elif not isinstance(answers, list) or not answers:
        raise TaskError(f"{path}: golden_answers must be a non-empty list")
    for key, kind in _TYPES.items():
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise TaskError(f"{path}: {key} is {data[key]!r:.40}, not a {kind.__name__}")
    if not all(isinstance(a, str) for a in data["golden_answers"]):
        raise TaskError(f"{path}: golden_answers must be strings")
    return data


# the types of a task file's fields (Search-R1's parquet columns, as `seed games` writes them)
_TYPES = {"id": str, "question": str, "data_source": str, "split": str, "gold_queries": list}


def list_tasks(root: str | os.PathLike, split: str | None = None) -> list[Path]:
    """Task files under ``root/<split>/<data_source>/``, sorted; every split if None (the
    encyclopedia's hidden and ``.bm25`` index folders are not splits). Checked before any
    episode: every task file (`load_task`), the retriever's settings and the corpus's ends
    (`check_retriever`); a `TaskError` or `RetrieverError` names the file."""
    tasks = checked_task_files(root, split, load_task, _is_split)
    if tasks:
        check_retriever(Path(root))
    return tasks


def _is_split(folder: Path) -> bool:
    name = folder.name
    return folder.is_dir() and not name.startswith(".") and not name.endswith(".bm25")


def task_family(task: str | os.PathLike) -> str:
    """The task's data source: the name of its folder."""
    return Path(task).parent.name


def expert_plan(task: str | os.PathLike) -> list[str] | None:
    """The gold query chain as searches, then the answer; None without gold queries."""
    data = load_task(task)
    queries = data.get("gold_queries")
    if not queries:
        return None
    return [f"<search>{q}</search>" for q in queries] + [
        f"<answer>{data['golden_answers'][0]}</answer>"
    ]


# --------------------------------------------------------------------------- writing


def _dump(data: Any) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def ensure_corpus(root: Path, seed: int, corpus_size: int) -> world_mod.World:
    """Write ``root/corpus.jsonl`` for (seed, corpus_size), or check the one already there
    is that corpus (another corpus -> `TaskError`: the splits must share one)."""
    if not MIN_CORPUS <= corpus_size <= MAX_CORPUS:
        raise TaskError(f"corpus_size must be in [{MIN_CORPUS}, {MAX_CORPUS}], got {corpus_size}")
    world = world_mod.build_world(seed, corpus_size)
    text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in world.docs())
    meta = {"generator": "envs.search.corpus", "seed": seed, "corpus_size": corpus_size}
    path = root / CORPUS_NAME
    if path.exists():
        if path.read_text() != text:
            try:
                old = json.loads((root / META_NAME).read_text())
                built = f"seed={old.get('seed')} corpus_size={old.get('corpus_size')}"
            except (OSError, json.JSONDecodeError):
                built = "other settings (no readable corpus.meta.json)"
            raise TaskError(
                f"{path} holds a corpus built from {built}, not seed={seed} "
                f"corpus_size={corpus_size}; write these tasks to another folder"
            )
    else:
        root.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        (root / META_NAME).write_text(_dump(meta))
    config = {"backend": "bm25", "corpus": CORPUS_NAME}
    existing = root / CONFIG_NAME
    if existing.exists() and json.loads(existing.read_text()) != config:
        raise TaskError(f"{existing} names another retriever; write these tasks to another folder")
    write_config(root, config)
    return world


def top3(world: world_mod.World, bm25: BM25Retriever) -> dict[str, set[str]]:
    """Entity name -> the ids of the passages BM25 ranks in its top 3 for that query."""
    names = sorted({e.name for e in world.entities})
    return {
        name: {d.id for d in docs}
        for name, docs in zip(names, bm25.search_many(names, TOP_K), strict=True)
    }


def _kept(
    world: world_mod.World, questions: list[world_mod.Question], top: dict[str, set[str]]
) -> list[world_mod.Question]:
    """The questions whose every gold query retrieves its gold passage in the top 3."""
    by_key = world.by_key
    return [
        q for q in questions
        if all(by_key[k].doc_id in top[by_key[k].name] for k in q.entities)
    ]  # fmt: skip


def _shape(q: world_mod.Question) -> tuple[int, bool]:
    return q.hops, q.fact.startswith("cmp:")


def _pool(
    world: world_mod.World, split: str, source: str, max_hops: int, top: dict[str, set[str]]
) -> list[world_mod.Question]:
    """The kept questions of one split and source, in the split's order (shapes interleaved:
    hop counts and bridge/comparison alternate)."""
    which = "B" if split == "unseen" else "A"
    seen: set[str] = set()
    questions = []
    for q in world_mod.candidates(world, source, which, max_hops):
        in_seen = world_mod.stable_hash(q.fact) % SEEN_SHARE == 0
        if q.fact in seen or (which == "A" and in_seen != (split == "seen")):
            continue
        seen.add(q.fact)
        questions.append(q)
    questions = _kept(world, questions, top)
    rng = random.Random(f"search-tasks:{world.seed}:{split}:{source}")
    rng.shuffle(questions)
    groups: dict[tuple[int, bool], list[world_mod.Question]] = {}
    for q in questions:
        groups.setdefault(_shape(q), []).append(q)
    ordered, lists = [], [groups[k] for k in sorted(groups)]
    for i in range(max(map(len, lists), default=0)):
        ordered += [g[i] for g in lists if i < len(g)]
    return ordered


def _task_json(world: world_mod.World, q: world_mod.Question, split: str, qid: str) -> dict:
    hops = [world.by_key[k] for k in q.entities]
    return {
        "id": qid,
        "split": split,
        "data_source": q.data_source,
        "question": q.question,
        "golden_answers": q.answers,
        "gold_queries": [e.name for e in hops],
        "gold_doc_ids": [e.doc_id for e in hops],
        "gold_titles": [e.title for e in hops],
        "hops": q.hops,
        "shape": "comparison"
        if q.fact.startswith("cmp:")
        else "chain"
        if q.hops > 1
        else "attribute",
        "distractor_queries": [world.distractors(e) for e in hops],
    }


def generate_tasks(
    root: str | os.PathLike,
    split: str,
    n: int,
    seed: int,
    corpus_size: int = DEFAULT_CORPUS_SIZE,
    max_hops: int = DEFAULT_MAX_HOPS,
    families: list[str] | None = None,
) -> list[Path]:
    """Write ``n`` tasks of ``split`` under ``root`` (and the shared corpus); their paths.

    The corpus depends on (seed, corpus_size) only; the questions of a split on (seed, split,
    max_hops, families), the data sources taking turns in Search-R1's order, so a smaller
    ``n`` writes a prefix of a larger one. ``families`` picks data sources (default: all
    seven); ``max_hops`` (2-4) bounds MuSiQue chains: a k-hop question needs k searches and
    an answer, so 4 hops need an episode budget of 5 steps. Same arguments -> byte-identical
    files.
    """
    if split not in SPLITS:
        raise TaskError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    if n < 1:
        raise TaskError(f"n must be >= 1, got {n}")
    if not 2 <= max_hops <= 4:
        raise TaskError(f"max_hops must be 2, 3 or 4, got {max_hops}")
    sources = list(families) if families else list(world_mod.DATA_SOURCES)
    bad = [s for s in sources if s not in world_mod.DATA_SOURCES]
    if bad:
        raise TaskError(f"unknown data sources {bad}; choose from {list(world_mod.DATA_SOURCES)}")
    sources = [s for s in world_mod.DATA_SOURCES if s in sources]
    root = Path(root)
    world = ensure_corpus(root, seed, corpus_size)
    top = top3(world, BM25Retriever(root / CORPUS_NAME))
    pools = {s: _pool(world, split, s, max_hops, top) for s in sources}
    wanted = {s: len(range(i, n, len(sources))) for i, s in enumerate(sources)}
    short = {s: len(pools[s]) for s in sources if len(pools[s]) < wanted[s]}
    if short:
        raise TaskError(
            f"the {split} split of a {corpus_size}-passage corpus has only {short} kept questions; "
            f"ask for fewer tasks or a larger corpus_size"
        )
    paths = []
    for i in range(n):
        source = sources[i % len(sources)]
        q = pools[source][i // len(sources)]
        qid = f"{source}-{world_mod.stable_hash(source + q.fact):016x}"
        path = root / split / source / f"{qid}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_dump(_task_json(world, q, split, qid)))
        paths.append(path)
    return paths
