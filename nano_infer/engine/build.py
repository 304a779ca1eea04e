"""One construction path: every part of an engine, built in the order each part needs the ones before it.

    settings checked -> device and dtype -> the model's shapes checked -> tensor-parallel shard ->
    weights and tokenizer -> features (a draft model) -> KV pool sized for all -> workers -> runner ->
    scheduler -> features attached -> plug-ins in phase order

`build_engine` returns the parts as one frozen record: nothing is reassigned after another part read it.

The engine names the layers below it (models, kv, prefix, distributed) and never the features above it.
A feature package (speculative decoding, beam search) registers its plug-in class here with
`@register_feature` when it is imported (nano_infer/__init__.py imports them); the engine builds every
registered class from its config and plugs in those that are on.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import torch

from ..compilation import compile_sizes
from ..config import EngineConfig
from ..core.plugin import EnginePlugin
from ..core.request import Request
from ..core.sequence import Sequence
from ..distributed import TPExecutor, driver_shard, start_workers
from ..kv.manager import KVManager
from ..kv.offload import KVOffloader
from ..kv.paged import KVPool
from ..kv.quant import kv_bytes_per_token
from ..kv.sizing import make_kv_cache
from ..models.dense_copies import DenseCopies
from ..models.llama import CausalLM
from ..models.moe import is_moe
from ..sampling_params import SamplingParams
from ..text.chat_template import resolve_chat_template
from ..models.loader import (default_model, eos_token_ids, load_config, load_model, load_tokenizer, pick_dtype,
                             release_freed_memory, resolve_model)
from .cpu_allocator import keep_freed_memory
from .memory import StepRecorder
from .compiled_decode import CompiledDecode, cxx_compiler, wants_compiled_decode
from .model_runner import ModelRunner
from .cpu_threads import FreeCoreThreads
from .scheduler import WAITING_PROMPT_SHARE, Scheduler, scored_rows_per_step
from .tp_worker import worker_runner

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

P = TypeVar("P")  # the request parameters a feature serves


@dataclass(frozen=True)
class FeatureSetup:
    """What a feature is made from: the settings, the target's config and tokenizer, before any KV memory exists."""

    config: EngineConfig
    hf_config: PretrainedConfig
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: set[int]
    device: torch.device
    dtype: torch.dtype
    max_model_len: int


class Feature(EnginePlugin, Generic[P]):
    """A plug-in from a package above the engine. Made once the model is loaded (`create`, None when the
    config leaves it off), it may keep K/V of its own per token (`kv_bytes_per_token`, budgeted with the
    pool), and is `attach`ed once the pool and the runner exist. One that `serves` a kind of request
    parameters (beam search: BeamSearchParams) gets those requests from `LLMEngine.add_request`."""

    serves: type | None = None
    kv_bytes_per_token = 0

    @classmethod
    def create(cls, setup: FeatureSetup) -> Feature | None:
        raise NotImplementedError

    def attach(self, runner: ModelRunner, kv: KVManager | None) -> None:
        """Once the KV pool and the runner exist."""

    # -- a feature that serves its own kind of request ----------------------------------------
    def sampling_params(self, params: P) -> SamplingParams:
        """How the request's sequences sample (beam search: one per beam, the rows claimed by the feature)."""
        raise NotImplementedError

    def check(self, params: P, num_prompt_tokens: int, max_tokens: int) -> None:
        """Refuse (ValueError) what it cannot run, before anything is queued."""

    def add(self, req: Request, params: P, max_tokens: int) -> None:
        """A new request it serves, its first sequence made."""

    def release(self, request_id: str) -> None:
        """A request it serves left the engine (finished, failed or aborted): forget it."""


FEATURES: list[type[Feature]] = []


def register_feature(cls: type[Feature]) -> type[Feature]:
    """Class decorator: the engine builds this feature from every config (it decides whether it is on)."""
    FEATURES.append(cls)
    return cls


@dataclass(frozen=True)
class EngineParts:
    config: EngineConfig
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str  # why this dtype: the startup line says it
    model_dir: Path
    gguf_file: str | None
    model_name: str
    display_name: str  # what the startup line and the server's clients call the model (`display_name`)
    hf_config: PretrainedConfig
    max_model_len: int
    model: CausalLM
    tokenizer: PreTrainedTokenizerBase
    eos_token_ids: set[int]
    kv_bytes_per_token: int  # the target's K/V per token and any feature's beside it (a draft model's)
    kv: KVManager | None  # None: kv_cache="none"
    kv_pool: KVPool | None
    executor: TPExecutor | None  # the tensor-parallel workers, on the driver
    runner: ModelRunner
    scheduler: Scheduler
    features: list[Feature]
    offloader: KVOffloader | None  # the host tier's plug-in (chapter 12)
    recorder: StepRecorder | None  # record_steps=True
    plugins: list[EnginePlugin]  # every plug-in that is on, in phase order


def build_engine(config: EngineConfig) -> EngineParts:
    """Build every part of an engine for `config`, checked settings first, weights only once the shapes fit."""
    local_device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype, dtype_reason = pick_dtype(local_device, config.dtype)
    if local_device.type == "cpu":
        keep_freed_memory()
    if config.seed is not None:  # vLLM's seed: requests without their own seed draw from torch's generator
        torch.manual_seed(config.seed)
    model_dir, gguf_file = resolve_model(config.model or default_model(), config.gguf_file)
    model_name = config.model or str(model_dir)
    hf_config = load_config(model_dir, gguf_file)
    max_model_len = config.check_model(hf_config, gguf_file)  # shapes checked: weights not read yet
    sizes = compile_sizes(config)
    if sizes and (local_device.type != "cpu" or is_moe(hf_config)):
        raise ValueError("compilation_config['compile_sizes'] sizes a CPU's compiled decode step, which a GPU (its "
                         "CUDA graphs are captured for each batch size on first use) and a Mixture-of-Experts model "
                         "(each step asks how many tokens each expert got) do not run")
    tp, launch, device = driver_shard(config.tensor_parallel_size, local_device,  # under torchrun: its local GPU
                                      config.enable_expert_parallel)
    model = load_model(model_dir, hf_config, device, dtype, max_model_len, tp, gguf_file, config.quantization)
    tokenizer = load_tokenizer(model_dir, gguf_file, config.tokenizer)
    if config.chat_template is not None:
        tokenizer.chat_template = resolve_chat_template(config.chat_template)
    eos = eos_token_ids(model_dir, tokenizer)
    setup = FeatureSetup(config, hf_config, tokenizer, eos, device, dtype, max_model_len)
    features = [f for cls in FEATURES if (f := cls.create(setup)) is not None]
    bytes_per_token = kv_bytes_per_token(hf_config.num_hidden_layers, model.num_kv_heads, model.head_dim, dtype,
                                         config.kv_cache_dtype) + sum(f.kv_bytes_per_token for f in features)
    kv, kv_pool = make_kv_cache(config, hf_config, model, dtype, device, bytes_per_token, max_model_len)
    block_size = kv.block_size if kv else 1
    tier = kv.tier if config.kv_offloading_size else None  # not the KVManager's stand-in
    executor = None if tp is None else start_workers(
        config, tp, launch, worker_runner, model_name if launch else str(model_dir), dtype, device, max_model_len,
        kv.num_blocks if kv else None, block_size, tier.num_blocks if tier else 0,
        (kv_pool.open_rows, kv_pool.open_ring) if kv_pool else (0, 1))
    runner = ModelRunner(model, kv_pool, config.attention, block_size, device, executor)
    if kv is not None:
        runner.open_blocks = kv.blocks.open_blocks  # the rows the runner packs each step's open-block slots from
    # a step of a model with experts asks the host how many tokens each expert got: no graph can hold that
    if kv_pool is not None and tp is None and not is_moe(hf_config):
        if device.type == "cuda" and not config.enforce_eager:
            runner.capture_decode(max_model_len)
        # (the blockwise walk's loop over a table's chunks takes the table's width as a number: no dynamic width)
        elif (wants_compiled_decode(False if sizes else config.enforce_eager, device, model)
              and config.kv_cache_dtype == "auto" and config.attention == "gather"):
            if cxx_compiler():
                runner.graphs = CompiledDecode(model, runner.kv_pool.store, block_size, dtype, sizes)
            else:
                logger.warning("decode steps run eagerly: torch.compile needs a C++ compiler and Python's headers, "
                               "and one is missing (`make compiler` installs Debian's g++ and python3-dev)")
    if tier is not None:  # chapter 12: a host pool beside each KV pool, and the plug-in that copies between them
        runner.attach_host_tier(tier.num_blocks)
    offloader = None if tier is None else KVOffloader(tier, kv.cost)
    scheduler = Scheduler(
        kv, max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        policy=config.scheduler_policy, mode=config.scheduler, chunked_prefill=config.enable_chunked_prefill,
        lookahead=_lookahead(features), max_scored_rows=scored_rows_per_step(hf_config.vocab_size),
        prompt_share=WAITING_PROMPT_SHARE)
    for feature in features:
        feature.attach(runner, kv)
    recorder = StepRecorder(kv, scheduler, bytes_per_token) if config.record_steps else None
    threads = FreeCoreThreads.for_cpu() if device.type == "cpu" and tp is None else None
    plugins = [p for p in (offloader, *features, recorder, DenseCopies.for_model(model), threads) if p is not None]
    if device.type == "cpu":  # what parsing the config and the tokenizer freed
        release_freed_memory()
    return EngineParts(config, device, dtype, dtype_reason, model_dir, gguf_file, model_name,
                       display_name(model_name, model_dir, gguf_file), hf_config, max_model_len,
                       model, tokenizer, eos, bytes_per_token, kv, kv_pool, executor, runner, scheduler, features,
                       offloader, recorder, sorted(plugins, key=lambda p: p.phase))


def display_name(model_name: str, model_dir: Path, gguf_file: str | None) -> str:
    """The hub id, a GGUF file's name, or a local folder's name: never an absolute path."""
    return gguf_file or (model_dir.name if Path(model_name).exists() else model_name)


def _lookahead(features: list[Feature]) -> Callable[[Sequence], int] | None:
    """The proposal slots the scheduler reserves: the one feature that asks for any (speculative decoding)."""
    asking = [f for f in features if type(f).lookahead is not EnginePlugin.lookahead]
    if len(asking) > 1:
        raise ValueError(f"{[type(f).__name__ for f in asking]} all reserve KV slots past a sequence's next token: "
                         f"at most one such feature can be on")
    return asking[0].lookahead if asking else None
