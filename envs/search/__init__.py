"""Search-based question answering (Search-R1 protocol) behind `envs.api.EnvSpec`.

- ``env``: ``SearchEnv`` (``<search>``/``<answer>`` steps, top-3 ``<information>``, exact
  match after SQuAD normalisation), ``normalize_answer``, ``exact_match``; its docstring
  states where it departs from Search-R1.
- ``retriever``: BM25 (bm25s) over a JSONL corpus with an on-disk index cache, and a client
  of Search-R1's ``POST /retrieve`` server; ``load_retriever(root)``.
- ``corpus``: the generated encyclopedia of fictional entities and its questions, tagged by
  Search-R1's seven data sources; ``tasks``: task files (generate, list, read);
  ``official``: Search-R1's parquet files.
- ``prompt``: the ``paper`` (Search-R1's instruction) and ``compact`` prompts, the parser.
- ``expert``: demonstrations (gold chain, noisy with retrieval mistakes), hints, random.
- ``oracle``: skills from the trajectory and the gold chain. ``commands``: ``seed games``.

Heavy dependencies (bm25s, pyarrow, requests) are imported only when used.
"""

from __future__ import annotations

from envs.api import EnvSpec, RolloutDefaults
from envs.search import commands, expert, oracle, prompt
from envs.search.env import DEFAULT_MAX_STEPS, SearchEnv
from envs.search.tasks import expert_plan, generate_tasks, list_tasks, task_family

REPORT_COLUMNS = (
    ("nq", "NQ"),
    ("triviaqa", "TriviaQA"),
    ("popqa", "PopQA"),
    ("hotpotqa", "HotpotQA"),
    ("2wikimultihopqa", "2Wiki"),
    ("musique", "MuSiQue"),
    ("bamboogle", "Bamboogle"),
)  # Search-R1's table order


def spec() -> EnvSpec:
    """The search environment's spec."""
    return EnvSpec(
        name="search",
        make_env=SearchEnv,
        list_tasks=list_tasks,
        family=task_family,
        prompt=prompt,
        description="a search-based question-answering environment (Search-R1 protocol)",
        # Search-R1 and verl-agent: 4 turns (verl-agent keeps all 4 in a windowed prompt),
        # 500 tokens a reply (max_response_length)
        rollout=RolloutDefaults(
            max_steps=DEFAULT_MAX_STEPS, max_response_tokens=500, history_window=4
        ),
        report_columns=REPORT_COLUMNS,
        plan=expert_plan,
        oracle=oracle.ORACLE,
        generate_tasks=generate_tasks,
        command=commands,
        demos=expert,
    )
