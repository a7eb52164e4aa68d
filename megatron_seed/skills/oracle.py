"""An environment's oracle (`envs.api.Oracle`) as a ``generate_fn`` for
`skills.parse.analyze_with_retries`: each request answered with ``oracle.analyze(record)``
as the JSON text an analyzer model would reply, for offline Stage 1 without an endpoint."""

from __future__ import annotations

import json

from envs.api import EnvSpec, Oracle
from megatron_seed.skills.parse import AnalysisRequest, Generation


class OracleAnalyzer:
    """``generate_fn`` that answers every request with the oracle's analysis as JSON.

    A record the oracle cannot read gets ``Generation(error="<name> failed: ...")``: no
    teacher signal. A retry gets the same answer (the oracle is deterministic): a skill that
    fails validation stays invalid, as with any analyzer at temperature 0.
    """

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle

    def __call__(self, requests: list[AnalysisRequest]) -> list[Generation]:
        """One `Generation` per request, in order."""
        out = []
        for request in requests:
            try:
                analysis = self.oracle.analyze(request.record)
                text = json.dumps(analysis, ensure_ascii=self.oracle.ensure_ascii)
            except Exception as err:  # a record or task the replay cannot read
                name = self.oracle.name
                out.append(Generation(error=f"{name} failed: {type(err).__name__}: {err}"))
                continue
            out.append(Generation(text=text, completion_tokens=len(text.split())))
        return out


def oracle_analyzer(env: EnvSpec) -> OracleAnalyzer:
    """The ``generate_fn`` of ``env``'s oracle; a ``ValueError`` naming an environment
    without one."""
    if env.oracle is None:
        raise ValueError(f"environment {env.name!r} has no oracle analyzer")
    return OracleAnalyzer(env.oracle)
