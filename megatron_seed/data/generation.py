"""One reply of a generation engine: the vLLM fleet, a scripted policy or an external
analyzer. Token ids and log-probs are the sampled ones (empty for an external server)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Generation:
    """One completion.

    token_ids: exactly as sampled, including <|im_end|> when generation stopped on it.
    logprobs: log-prob of each sampled token under the engine's weights (same length).
    text: the reply (`token_ids` decoded with skip_special_tokens=True).
    finish_reason: "stop" (EOS / stop token) or "length" (hit max_tokens).
    prompt_tokens, completion_tokens, latency_s, cached: an analyzer reply's accounting.
    error: set when the request failed after the engine's own retries.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    error: str | None = None
