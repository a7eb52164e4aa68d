"""The route record's read-out (`worker_extension.RouteBuffer`) as a GPU engine drives it: a
replayed CUDA graph writes a padded batch while the step has fewer real tokens, and a long
prefill comes in several steps, each overwriting the buffer. The compiled engine end to end:
tests/distributed/test_compiled_routes.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def test_each_step_keeps_its_real_tokens_in_order_and_only_while_recording():
    from megatron_seed.rollout.worker_extension import RouteBuffer

    buffer = RouteBuffer([1, 3], tokens=8, k=2, device=torch.device("cpu"))  # MoE layers 1, 3
    done = [0]  # tokens forwarded so far

    def execute_model(step: SimpleNamespace) -> str:
        """A forward of `step.total_num_scheduled_tokens` tokens padded to `step.padded`."""
        position = torch.arange(done[0], done[0] + step.padded)  # padding rows run on
        picked = torch.stack([position, position + 1], dim=-1)  # [padded, k]
        buffer.capture(3, picked + 100)  # the routers run in layer order; 3 after 1 here
        buffer.capture(1, picked)
        done[0] += step.total_num_scheduled_tokens
        return "output"

    execute = buffer.record_steps(execute_model)
    assert execute(SimpleNamespace(total_num_scheduled_tokens=2, padded=4)) == "output"
    assert buffer.take().shape == (0, 2, 2)  # not recording: nothing kept
    buffer.recording = True
    for real, padded in ((5, 8), (3, 4), (0, 0)):
        execute(SimpleNamespace(total_num_scheduled_tokens=real, padded=padded))
    routes = buffer.take()  # [tokens, layers, k]
    position = torch.arange(2, 10)
    want = torch.stack([position, position + 1], dim=-1)  # [8, k]
    assert routes.dtype == torch.int16 and routes.shape == (8, 2, 2)
    assert torch.equal(routes[:, 0].long(), want) and torch.equal(routes[:, 1].long(), want + 100)
    assert buffer.take().shape == (0, 2, 2)  # the record started over
