"""EngineConfig: every engine knob, checked alone and in combination before anything loads.

A bad setting costs a ValueError that names it and says why, in milliseconds: never after a
multi-GB checkpoint has been read. `check()` runs in `__post_init__`; `check_model()` needs only
the model's config.json (the shapes), which is read before the weights.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import torch

from .compilation import compile_sizes
from .constrained.limits import ConstraintLimits
from .text.chat_template import resolve_chat_template

KV_CACHES = ("none", "contiguous", "paged")
PREFIX_CACHES = ("auto", None, "hash", "radix")
ATTENTIONS = ("gather", "blockwise")
SCHEDULERS = ("continuous", "static")
POLICIES = ("fcfs", "lpm")
PREEMPTION_MODES = ("recompute", "swap", "auto")
OFFLOADING_BACKENDS = ("native",)
QUANTIZATIONS = (None, "gguf", "none", "int8", "int4")
KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's names ("fp8" is e4m3), plus int8

logger = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    model: str | None = None
    gguf_file: str | None = None  # a GGUF file in the `model` folder (or pass the .gguf path as `model`)
    dtype: str | torch.dtype | None = "auto"
    # how weights are held (vLLM's knob): None = a GGUF file's tensors as stored where torch's int4 kernel is fast
    # (bfloat16 on CPU), else dequantized; "gguf" = as stored always; "none" = dequantized to `dtype`;
    # "int8" / "int4" = a safetensors checkpoint quantized at load (int8 per row, int4 in groups of 32)
    quantization: str | None = None
    device: str | None = None
    kv_cache: str = "paged"
    block_size: int = 16
    num_kv_blocks: int | None = None
    # how K/V is stored (vLLM's knob): "auto" = the model's dtype; "int8" / "fp8" (= "fp8_e4m3") / "fp8_e5m2" = one
    # byte a value and a float16 scale per token and KV head (kv/quant.py), so the same bytes hold ~2x the tokens of bf16
    kv_cache_dtype: str = "auto"
    kv_cache_memory: int | None = None  # bytes for the KV pool
    gpu_memory_utilization: float = 0.85
    prefix_cache: str | None = "auto"  # "auto": radix when the cache is paged
    attention: str = "gather"
    scheduler: str = "continuous"
    scheduler_policy: str = "fcfs"
    max_num_seqs: int = 256  # vLLM's default; a CPU decode step gets cheaper per token up to ~64-128 rows
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    log_blocks: bool = False
    record_steps: bool = False
    tensor_parallel_size: int = 1  # ranks that each hold a shard of every layer (chapter 10)
    # a Mixture-of-Experts model under tensor_parallel_size (vLLM's knob): False = every rank a slice of every
    # expert; True = every rank whole experts, num_experts / tensor_parallel_size of them (chapter 15)
    enable_expert_parallel: bool = False
    distributed_backend: str | None = None  # default: "nccl" on CUDA, "gloo" on CPU
    distributed_timeout: float = 300.0  # seconds a step (or start-up) waits for a rank before it fails
    speculative_config: dict | None = None  # {"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}
    constraint_limits: ConstraintLimits | None = None  # None: its defaults
    structured_outputs_config: dict | None = None  # vLLM's {"backend": "auto" | "guidance" | "nano"} (backends.py)
    # chapter 12: GiB of host memory for a second KV tier (vLLM's knob; summed over tensor-parallel ranks); 0: off
    kv_offloading_size: float = 0
    kv_offloading_backend: str = "native"  # vLLM's knob: "native" is the only one here
    # how preemption frees blocks: "recompute" (drop, prefill again), "swap" (copy to the host tier and
    # back), "auto" (the cheaper by measured rates); None: "auto" with a host tier, else "recompute"
    preemption_mode: str | None = None
    # vLLM's options, under vLLM's names, so its scripts run unchanged
    seed: int | None = None  # seeds torch's generator once: requests without their own seed then repeat across runs
    tokenizer: str | None = None  # a folder or hub id of the tokenizer, when it is not the model's
    # vLLM's --chat-template: a file, a shipped template's name ("chatml_tools": tools for ChatML models), or the
    # Jinja text; it replaces the tokenizer's template for every chat. None: the model's own
    chat_template: str | None = None
    # vLLM's custom logits processors: LogitsProcessor subclasses (v1 interface) or "module.Class" names of them,
    # each built once and run on every step's sampled rows (engine/custom_logits.py)
    logits_processors: list | None = None
    enable_prefix_caching: bool | None = None  # False: prefix_cache=None; True: the prefix_cache given ("auto": radix)
    # vLLM's knob. None: CUDA graphs on CUDA (engine/cuda_graph.py), a compiled decode step on a CPU for 4- and 8-bit
    # weights (engine/compiled_decode.py); False: compiled on a CPU whatever the weights; True: all eager
    enforce_eager: bool | None = None
    compilation_config: dict | None = None  # vLLM's knob: {"compile_sizes": [...]}, the CPU step's (compilation.py)
    trust_remote_code: bool = False  # accepted: the model code is this package's own, no checkpoint code runs
    disable_log_stats: bool = False  # accepted: the engine logs no periodic stats (the server's /metrics has them)

    @classmethod
    def from_kwargs(cls, model: str | None = None, **kwargs) -> EngineConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(kwargs) - names
        if unknown:
            raise TypeError(f"unknown engine option(s) {sorted(unknown)}; options are {sorted(names)}")
        return cls(model=model, **kwargs)

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Each setting, then the combinations; resolves prefix_cache="auto" and parses speculative_config."""
        for name, choices in (("kv_cache", KV_CACHES), ("kv_cache_dtype", KV_CACHE_DTYPES), ("attention", ATTENTIONS),
                              ("prefix_cache", PREFIX_CACHES), ("scheduler", SCHEDULERS), ("scheduler_policy", POLICIES),
                              ("quantization", QUANTIZATIONS)):
            _one_of(name, getattr(self, name), choices)
        if self.kv_cache_dtype != "auto" and self.kv_cache != "paged":
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} quantizes the paged KV pool: it needs "
                             f"kv_cache='paged' (got kv_cache={self.kv_cache!r}, which keeps K/V in the model's dtype)")
        if self.quantization not in (None, "none") and self.tensor_parallel_size > 1:
            raise ValueError(f"quantization={self.quantization!r} with tensor_parallel_size > 1 is not supported: "
                             f"quantized layers are not sharded; use quantization='none'")
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be >= 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks} must be >= 1")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len={self.max_model_len} must be >= 2 (a prompt token and an output token)")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization} must be in (0, 1]")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size!r} must be an integer >= 1")
        if self.tensor_parallel_size > 1 and not self.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout={self.distributed_timeout} must be > 0 seconds")
        self._check_vllm_options()
        if self.chat_template is not None:
            resolve_chat_template(self.chat_template)
        if self.prefix_cache == "auto":
            self.prefix_cache = "radix" if self.kv_cache == "paged" else None
        if self.prefix_cache is not None and self.kv_cache != "paged":
            raise ValueError(f"prefix_cache={self.prefix_cache!r} shares KV blocks, so it needs kv_cache='paged' "
                             f"(got {self.kv_cache!r})")
        if self.scheduler_policy == "lpm" and self.prefix_cache is None:
            raise ValueError("scheduler_policy='lpm' orders requests by prefix-cache match: set prefix_cache='hash' or 'radix'")
        self._check_offloading()
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        if self.speculative_config is not None:
            if self.logits_processors:
                raise ValueError("speculative_config with logits_processors is not supported (as in vLLM): a "
                                 "verify step's rows are one request's positions, not a batch of requests")
            if self.tensor_parallel_size > 1:
                raise ValueError("speculative_config with tensor_parallel_size > 1 is not supported: the draft model "
                                 "and the verify rows run on the driver only")
            if self.kv_cache == "none":
                raise ValueError("speculative_config verifies proposals against cached K/V: it needs kv_cache='paged' "
                                 "or 'contiguous'")

    def _check_vllm_options(self) -> None:
        """vLLM's switches mapped onto this engine's knobs; those that change nothing here say so in the log."""
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r} must be an integer (or None)")
        if self.enable_prefix_caching is False:
            self.prefix_cache = None
        elif self.enable_prefix_caching and self.kv_cache != "paged":
            raise ValueError(f"enable_prefix_caching=True shares KV blocks, so it needs kv_cache='paged' "
                             f"(got {self.kv_cache!r})")
        compile_sizes(self)
        if self.trust_remote_code:
            logger.info("trust_remote_code=True changes nothing: no code from the checkpoint runs, the model is "
                        "nano_infer's own Llama-family forward")

    def _check_offloading(self) -> None:
        """The host tier (chapter 12) and the preemption mode that can use it."""
        size = self.kv_offloading_size
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 <= size < float("inf"):
            raise ValueError(f"kv_offloading_size={size!r} must be a number of GiB >= 0 (0: no host tier)")
        _one_of("kv_offloading_backend", self.kv_offloading_backend, OFFLOADING_BACKENDS)
        if size and self.kv_cache != "paged":
            raise ValueError(f"kv_offloading_size moves KV blocks between two pools: it needs kv_cache='paged' "
                             f"(got {self.kv_cache!r})")
        if self.preemption_mode is None:
            self.preemption_mode = "auto" if size else "recompute"
        _one_of("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        if self.preemption_mode != "recompute" and not size:
            raise ValueError(f"preemption_mode={self.preemption_mode!r} swaps blocks to the host tier: set "
                             f"kv_offloading_size > 0 (GiB), or use preemption_mode='recompute'")

    def check_model(self, hf_config, gguf_file: str | None) -> int:
        """The checks that need the model's shapes (config.json, read before the weights); returns max_model_len."""
        check_tp_sizes(hf_config, self.tensor_parallel_size, self.enable_expert_parallel)
        if self.quantization in ("int8", "int4") and num_experts(hf_config):
            raise ValueError(f"quantization={self.quantization!r} quantizes dense linear layers, and most of a "
                             f"Mixture-of-Experts model's weights are its experts, which stay in the model's dtype: "
                             f"use quantization=None")
        if self.tensor_parallel_size > 1 and gguf_file:
            raise ValueError("a GGUF checkpoint with tensor_parallel_size > 1 is not supported; use the safetensors one")
        if self.quantization == "gguf" and not gguf_file:
            raise ValueError("quantization='gguf' runs a GGUF file's tensors as stored, and the checkpoint is "
                             "safetensors: use 'int8' or 'int4' to quantize it at load")
        if self.quantization in ("int8", "int4") and gguf_file:
            raise ValueError(f"quantization={self.quantization!r} quantizes a float checkpoint at load, and a GGUF file "
                             f"is already quantized: use None (as stored) or 'none' (dequantized)")
        window = getattr(hf_config, "sliding_window", None)
        if hf_config.model_type == "mixtral" and window:
            raise ValueError(f"this Mixtral config attends through a sliding window of {window} tokens, which the paged "
                             f"pool does not implement (Mixtral-8x7B's configs set sliding_window null)")
        limit = hf_config.max_position_embeddings
        max_model_len = self.max_model_len or min(limit, 8192)
        if max_model_len > limit:
            raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={limit}")
        return max_model_len


VllmConfig = EngineConfig  # vLLM's name, which custom logits processors' constructors are written against


def num_experts(config) -> int:
    """A Mixture-of-Experts config's expert count (`num_experts`; Mixtral's `num_local_experts`), 0 for a dense model."""
    return getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0


def expert_intermediate_size(config) -> int:
    """Each expert's MLP width: `moe_intermediate_size` (Qwen3-MoE, whose `intermediate_size` is its dense layers'),
    else `intermediate_size` (OLMoE, Mixtral)."""
    return getattr(config, "moe_intermediate_size", None) or config.intermediate_size


def _one_of(name: str, value, choices: tuple) -> None:
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}={value!r} is invalid: use one of {listed}")


def check_tp_sizes(config, world_size: int, expert_parallel: bool = False) -> None:
    """ValueError naming the constraint when the model cannot be cut into `world_size` equal shards."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"tensor_parallel_size={world_size!r} must be an integer >= 1")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide num_attention_heads={heads} "
                         f"(every rank holds the same number of query heads)")
    if kv_heads % world_size and world_size % kv_heads:
        raise ValueError(f"tensor_parallel_size={world_size} and num_key_value_heads={kv_heads}: one must divide "
                         f"the other (KV heads are split when tp divides them, replicated when they divide tp)")
    if config.intermediate_size % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide intermediate_size={config.intermediate_size}")
    experts = num_experts(config)
    if expert_parallel and experts % world_size:
        raise ValueError(f"enable_expert_parallel with tensor_parallel_size={world_size} must divide "
                         f"num_experts={experts} (every rank holds the same number of whole experts)")
    inter = expert_intermediate_size(config)
    if experts and not expert_parallel and inter % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide the experts' intermediate size {inter} "
                         f"(or set enable_expert_parallel=True to give each rank whole experts)")
    if getattr(config, "model_type", None) == "olmoe" and kv_heads % world_size:
        raise ValueError(f"tensor_parallel_size={world_size} must divide num_key_value_heads={kv_heads} for OLMoE: "
                         f"its key norm spans all KV heads, so they are split, never replicated")


# -- speculative_config: vLLM's dict, parsed and checked before anything is loaded ----------------------------
#     {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
#     {"method": "draft_model", "model": "path/or/hub-id", "num_speculative_tokens": 4}
# A bad field raises ValueError naming the field and why. Whether a draft model fits the target (same
# vocabulary and tokenizer) is checked when it is loaded (spec/draft.py, `check_compatible`).
SPEC_METHODS = ("ngram", "draft_model")
SPEC_KEYS = {"ngram": {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"},
        "draft_model": {"method", "num_speculative_tokens", "model"}}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: str | None = None

    @classmethod
    def parse(cls, config: dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if config is None or isinstance(config, SpeculativeConfig):
            return config
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(config).__name__}")
        method = config.get("method")
        if method is None and config.get("model") is not None:
            method = "draft_model"
        if method not in SPEC_METHODS:
            raise ValueError(f"speculative_config method={method!r} is unknown: use one of {list(SPEC_METHODS)}")
        unknown = set(config) - SPEC_KEYS[method]
        if unknown:
            raise ValueError(f"speculative_config has field(s) {sorted(unknown)} that method {method!r} "
                             f"does not take; it takes {sorted(SPEC_KEYS[method])}")
        k = config.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens={k!r} must be an integer >= 1")
        if method == "draft_model":
            model = config.get("model")
            if not isinstance(model, str) or not model:
                raise ValueError("speculative_config method 'draft_model' needs model: a folder or hub id of the draft")
            return cls(method, k, model=model)
        hi, lo = config.get("prompt_lookup_max", 4), config.get("prompt_lookup_min", 1)
        for name, v in (("prompt_lookup_max", hi), ("prompt_lookup_min", lo)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config {name}={v!r} must be an integer >= 1")
        if lo > hi:
            raise ValueError(f"speculative_config prompt_lookup_min={lo} is larger than prompt_lookup_max={hi}")
        return cls(method, k, prompt_lookup_max=hi, prompt_lookup_min=lo)
