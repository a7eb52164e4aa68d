"""The search environment: Search-R1's interaction protocol over a retriever.

A task is a question. Each step the reply must hold exactly one ``<search>query</search>``
or ``<answer>text</answer>``:

- search: the observation is the top-3 passages as Search-R1's ``_passages2string`` formats
  them, ``Doc 1(Title: "T") text`` one per line, inside ``<information>...</information>``;
- answer: the episode ends; reward = won = exact match of the answer against the golden
  answers after SQuAD normalisation (``normalize_answer``: lower case, punctuation and the
  articles a/an/the removed, whitespace collapsed; Search-R1's ``em_check``);
- invalid: the observation is the environment's error message, reward 0, the step counts,
  ``info["invalid"] = True`` (the reference penalises it by 0.01: the library's
  ``rollout.invalid_action_penalty`` applies that, not the env).

Turns: ``max_steps`` replies in all (4 by default), searches and the answer alike; after the
last one the episode ends, lost unless it was a right answer. Search-R1 plays ``max_turns``
turns whose searches run and then one more reply whose search is not run (its final answer
turn): up to ``max_turns + 1`` replies.

Where else it departs from Search-R1 (``postprocess_predictions`` takes the first
``<(search|answer)>(.*?)</\1>`` match, case-sensitive, of any length):
- a reply holding several tags, both kinds, an unclosed tag or an empty one is invalid (as
  verl-agent's brief of the reference stack counts them), not read by its first tag;
- the tags may be upper or lower case (``<SEARCH>`` is a search);
- a query or answer longer than ``MAX_ACTION_CHARS`` (256) characters is invalid;
- the invalid-reply message is this module's ``INVALID_MESSAGE``, not Search-R1's.
"""

from __future__ import annotations

import os
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.api import MAX_ACTION_CHARS
from envs.search.retriever import TOP_K, Doc, Retriever, find_root, load_retriever
from envs.search.tasks import load_task

DEFAULT_MAX_STEPS = 4  # Search-R1 / verl-agent: at most 4 turns
INVALID_MESSAGE = (
    "Your previous reply is invalid. To search, put one query between <search> and "
    "</search>. To give the final answer, put it between <answer> and </answer>. Reply with "
    "exactly one of the two."
)
_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(r"</?(search|answer)>", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation (Search-R1's ``normalize_answer``): lower case, punctuation
    removed, the articles a/an/the removed, whitespace collapsed."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golden_answers: str | Sequence[str]) -> bool:
    """Whether the normalised prediction equals a normalised golden answer."""
    golds = [golden_answers] if isinstance(golden_answers, str) else golden_answers
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(str(g)) for g in golds)


def parse_reply(text: str | None) -> tuple[str, str] | None:
    """(``"search"`` | ``"answer"``, content with whitespace collapsed) of a reply holding
    exactly one well-formed, non-empty tag of the two kinds; None otherwise."""
    if not text:
        return None
    tags = _TAG.findall(text)
    if len(tags) != 1 or len(_OPEN.findall(text)) != 2:  # a second or an unclosed tag
        return None
    kind, content = tags[0][0].lower(), " ".join(tags[0][1].split())
    if not content or len(content) > MAX_ACTION_CHARS:
        return None
    return kind, content


def format_docs(docs: Sequence[Doc]) -> str:
    """Search-R1's ``_passages2string``: ``Doc i(Title: <first line>) <rest>`` per line."""
    lines = []
    for i, doc in enumerate(docs, 1):
        text = " ".join(doc.text.split())
        lines.append(f"Doc {i}(Title: {doc.title}) {text}")
    return "\n".join(lines)


def information(docs: Sequence[Doc]) -> str:
    """The observation after a search."""
    return f"<information>{format_docs(docs)}</information>"


class SearchEnv:
    """One question at a time (implements ``envs.api.Env``).

    ``retriever``: a fixed retriever (tests); default: the one the task folder's
    ``retriever.json`` names, loaded once per process.
    """

    def __init__(
        self,
        max_steps: int = DEFAULT_MAX_STEPS,
        top_k: int = TOP_K,
        retriever: Retriever | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.max_steps = max_steps
        self.top_k = top_k
        self._fixed = retriever
        self.retriever: Retriever | None = retriever
        self.task: dict[str, Any] = {}
        self.steps = 0
        self.done = True
        self.won = False
        self.observation = ""

    def reset(self, game: str | os.PathLike) -> tuple[str, dict[str, Any]]:
        """Start an episode of the task file ``game``: the observation is the question."""
        self.task = load_task(game)
        self.retriever = self._fixed or load_retriever(find_root(Path(game)))
        self.steps, self.done, self.won = 0, False, False
        self.observation = self.task["question"]
        return self.observation, self._info(invalid=False)

    def _info(self, invalid: bool, **extra: Any) -> dict[str, Any]:
        return {
            "won": self.won,
            "task": self.task.get("question", ""),
            "invalid": invalid,
            "data_source": self.task.get("data_source", ""),
            "step": self.steps,
            **extra,
        }

    def step(self, action_text: str) -> tuple[str, float, bool, dict[str, Any]]:
        """One action: a search, an answer, or an invalid reply (see the module docstring)."""
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset()")
        self.steps += 1
        parsed = parse_reply(action_text)
        reward, extra = 0.0, {}
        if parsed is None:
            self.observation = INVALID_MESSAGE
        elif parsed[0] == "search":
            assert self.retriever is not None
            docs = self.retriever.search(parsed[1], self.top_k)
            self.observation = information(docs)
            extra["doc_ids"] = [d.id for d in docs]
        else:
            self.won = exact_match(parsed[1], self.task["golden_answers"])
            reward = float(self.won)
            self.done = True
            self.observation = (
                "Your answer is correct." if self.won else "Your answer is not correct."
            )
        if self.steps >= self.max_steps:
            self.done = True
        return self.observation, reward, self.done, self._info(parsed is None, **extra)
