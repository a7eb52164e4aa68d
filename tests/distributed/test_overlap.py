"""Overlapped phases (`rollout.overlap`) on the real engines: two vLLM engines in Ray actors
serving the tiny world's policy, ALFWorld episodes in Ray env workers, episodes advancing
independently and each analysed as it ends, with either pacing (`rollout.overlap_pacing`).
What must hold: every turn carries exactly the ids the engine sampled and their log-probs,
and every skill comes from its own episode; paced, each engine runs its episodes' turns to
the end of the batch and decodes analyses alone only once its episodes have all ended."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


class RecordingFleet:
    """The fleet as `FleetStream` sees it, keeping every request sent and every call's ref."""

    def __init__(self, fleet) -> None:
        self.fleet = fleet
        self.num_engines = fleet.num_engines
        self.request_timeout_s = fleet.request_timeout_s
        self.sent: list[tuple[int, tuple, list[int]]] = []  # (engine, key, prompt ids)
        self.calls: list = []
        self.waits: list[tuple[int, list]] = []  # per call: (engine, its until_done keys)

    def advance(self, engine, requests, linger_s=0.0, until_done=None):
        self.sent += [(engine, key, list(ids)) for key, ids, _, _ in requests]
        ref = self.fleet.advance(engine, requests, linger_s, until_done)
        self.calls.append(ref)
        self.waits.append((engine, list(until_done or ())))
        return ref

    def restart(self, engine, reason):
        self.fleet.restart(engine, reason)


PACINGS = ("paced", "free")


@pytest.fixture(scope="module")
def plays(tiny_world):
    """One rollout of each pacing on one session (2 tasks x 2 samples, 3 steps)."""
    from envs.spec import get_env
    from megatron_seed import recipes
    from megatron_seed.rollout.analyzer import apply_analysis
    from megatron_seed.rollout.overlap import AnalysisPlan, FleetStream, play_overlapped
    from megatron_seed.rollout.session import RolloutSession

    root = tiny_world  # the session's world; its first three games
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    if ray.is_initialized():  # another module's Ray, without this PYTHONPATH
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray_ov_"))
    cfg = recipes.get("tiny").config.with_changes(
        {
            "rollout": {"max_prompt_tokens": 1500, "max_steps": 3, "overlap": True},
            "skill": {"analyzer_layout": "continuation", "max_tokens": 48, "max_retries": 1},
            "fleet": {"engines": 2, "max_model_len": 2048},
        }
    )
    games = [str(g) for g in get_env("alfworld").list_tasks(root / "games", "train")][:3]
    out = {}
    with RolloutSession(cfg, root / "model") as session:
        for pacing in PACINGS:
            session.loop.cfg = dataclasses.replace(cfg.rollout, overlap_pacing=pacing)
            fleet = RecordingFleet(session.fleet)
            plan = AnalysisPlan(session.tokenizer, cfg.skill, session.analyzer_prompt_limit())
            result = play_overlapped(
                session.loop, FleetStream(fleet), session.tasks(games), 2, session.sampling(),
                0, plan,
            )  # fmt: skip
            records, stats, results = result.records, result.stats, result.analyses
            timing = result.timing
            replies = [ray.get(ref) for ref in fleet.calls]  # per call
            chats = [_chat_ids(session.tokenizer, r) for r in records]
            scored = session.fleet.prompt_logprobs([ids for ids, _ in chats])
            analysed = [records[r.index] for r in results]
            metrics = apply_analysis(analysed, results)
            out[pacing] = dict(
                records=records, stats=stats, results=results, timing=timing, fleet=fleet,
                calls=replies, replies=[pair for call in replies for pair in call],
                chats=chats, scored=scored, metrics=metrics, cfg=cfg, tokenizer=session.tokenizer,
            )  # fmt: skip
    yield out
    ray.shutdown()


@pytest.fixture(params=PACINGS)
def played(plays, request):
    return plays[request.param]


def _chat_ids(tokenizer, record) -> tuple[list[int], list[tuple[int, int]]]:
    """The episode's whole chat as ids, and the [start, end) of each turn's action ids."""
    from megatron_seed.data.sequences import ChatBuilder

    chat, spans = ChatBuilder(tokenizer, record.system_prompt), []
    for i, turn in enumerate(record.turns):
        ids = chat.prompt_ids(turn.user) if i == 0 else chat.append_user(turn.user)
        spans.append((len(ids), len(ids) + len(turn.action_ids)))
        chat.append_action(turn.action_ids, turn.logprobs)
    return list(chat.sequence().input_ids), spans


def test_every_turn_carries_the_engines_sampled_ids_and_logprobs(played):
    records, replies, fleet = played["records"], played["replies"], played["fleet"]
    assert len(records) == 6 and all(r.turns for r in records)
    answers = {}  # (episode, turn) -> the generation the engine returned
    for (kind, i), gen in replies:
        if kind == "act":
            answers[(i, sum(k[0] == i for k in answers))] = gen
    prompts = {}
    for engine, (kind, i), ids in fleet.sent:
        if kind == "act":
            prompts.setdefault(i, []).append((engine, ids))
    for i, record in enumerate(records):
        assert len(prompts[i]) == len(record.turns)
        for t, turn in enumerate(record.turns):
            gen = answers[(i, t)]
            assert turn.action_ids == list(gen.token_ids) and turn.logprobs == list(gen.logprobs)
        # the engine saw exactly the chat the trainer will score, turn after turn
        chat, spans = played["chats"][i]
        for (_, sent), (start, _) in zip(prompts[i], spans, strict=True):
            assert sent == chat[:start]
    # an independent check of the log-probs: the engine re-scores each whole chat
    for i, record in enumerate(records):
        chat, spans = played["chats"][i]
        scored = played["scored"][i]
        for turn, (start, end) in zip(record.turns, spans, strict=True):
            again = scored[start - 1 : end - 1]  # scored[k] = log p(chat[k+1] | chat[:k+1])
            assert again == pytest.approx(turn.logprobs, abs=1e-4)


def test_every_skill_comes_from_its_own_episode(played):
    from megatron_seed.data.requests import request_ids
    from megatron_seed.skills.parse import build_requests

    records, results, fleet, cfg = (
        played["records"],
        played["results"],
        played["fleet"],
        played["cfg"],
    )
    trainable = [i for i, r in enumerate(records) if r.trainable]
    assert sorted(r.index for r in results) == trainable  # each analysed once
    first_ask = {}
    for _, (kind, i), ids in fleet.sent:
        if kind == "analyze":
            first_ask.setdefault(i, ids)
    last_reply = {i: gen.text for (kind, i), gen in played["replies"] if kind == "analyze"}
    for res in results:
        i, record = res.index, records[res.index]
        (request,) = build_requests([record], "continuation", cfg.skill.min_words)
        assert first_ask[i] == request_ids(played["tokenizer"], request)
        assert first_ask[i][: len(played["chats"][i][0])] == played["chats"][i][0]
        assert res.raw == last_reply[i]  # the reply folded into this record is its own
        assert record.analysis is not None and record.analysis.trajectory_id == res.trajectory_id
        assert record.skill == (res.skill if res.valid else None)
        assert 1 <= res.attempts <= 2
    assert played["metrics"]["analyze/n"] == len(results)


def test_the_driver_accounts_for_its_time(played):
    timing, stats = played["timing"], played["stats"]
    assert timing.episodes_s > 0 and timing.analysis_tail_s > 0
    assert stats.turns == sum(len(r.turns) for r in played["records"])
    assert stats.engine_wait_s == timing.wait["engines"] and sum(timing.wait.values()) > 0


def test_paced_engines_run_turns_to_the_end_and_analyse_alone_only_after_their_episodes(plays):
    """Paced: an episode stays on one engine; every call that decodes turns runs until all
    of its engine's turns are answered; an engine steps for analyses alone only once every
    episode that played on it has ended (its analyses rode the turns before)."""
    played = plays["paced"]
    fleet, calls = played["fleet"], played["calls"]
    engine_of: dict[int, set[int]] = {}
    for engine, (kind, i), _ in fleet.sent:
        if kind == "act":
            engine_of.setdefault(i, set()).add(engine)
    assert all(len(e) == 1 for e in engine_of.values()), engine_of  # never moved
    last_act: dict[int, int] = {}  # episode -> the call that answered its last turn
    for c, reply in enumerate(calls):
        for (kind, i), _ in reply:
            if kind == "act":
                last_act[i] = c
    alone = 0
    for c, ((engine, until), reply) in enumerate(zip(fleet.waits, calls, strict=True)):
        answered = {key for key, _ in reply}
        if until:
            assert all(kind == "act" for kind, _ in until)
            assert set(until) <= answered  # the batch ran to its end
            continue
        alone += 1
        mine = [i for i, (e,) in engine_of.items() if e == engine]
        assert all(last_act[i] < c for i in mine), (c, engine)
    assert alone > 0  # the last analyses ran after the episodes
    assert any(kind == "analyze" for _, (kind, _), _ in fleet.sent)
