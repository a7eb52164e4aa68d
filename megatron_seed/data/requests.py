"""Token ids of an analysis request (`skills.parse.AnalysisRequest`), built with the same
`ChatBuilder` as rollout prompts: the analyzer decodes from them and Stage 1 trains on them.
In the `continuation` layout the ids start with the episode's own chat, from the exact
sampled action ids, so an engine's prefix cache already holds the trajectory."""

from __future__ import annotations

from typing import Any

from megatron_seed.data.records import TrajectoryRecord
from megatron_seed.data.sequences import ChatBuilder


def episode_chat(tokenizer: Any, record: TrajectoryRecord) -> ChatBuilder:
    """The chat of `record`'s episode, rebuilt from its sampled action ids."""
    chat = ChatBuilder(tokenizer, record.system_prompt)
    for i, turn in enumerate(record.turns):
        if i == 0:
            chat.prompt_ids(turn.user)
        else:
            chat.append_user(turn.user)
        chat.append_action(turn.action_ids, turn.logprobs)
    return chat


def request_ids(tokenizer: Any, request: Any) -> list[int]:
    """Prompt ids of one analysis request (either layout, any retry depth)."""
    messages = list(request.appended)
    if request.layout == "continuation":
        chat, ids = episode_chat(tokenizer, request.record), None
    else:
        system = None
        if messages and messages[0]["role"] == "system":
            system = messages.pop(0)["content"]
        chat = ChatBuilder(tokenizer, system)
        ids = chat.prompt_ids(messages.pop(0)["content"])
    for message in messages:
        if message["role"] == "user":
            ids = chat.append_user(message["content"])
        else:  # an earlier reply quoted in a retry
            text_ids = tokenizer.encode(message["content"], add_special_tokens=False)
            reply = [*text_ids, chat.im_end_id]
            chat.append_action(reply, [0.0] * len(reply))
    assert ids is not None
    return ids
