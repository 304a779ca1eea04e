"""LLMEngine: requests in, one scheduled forward pass per `step()`, outputs out.

    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():
            ...

Each knob of the curriculum is a constructor argument (`EngineConfig`), so every notebook turns one knob
on the same engine. The step loop is the same whatever is on: schedule, let the plug-ins adjust the
batch, run the model, process the outputs, commit to the caches. What each chapter adds lives beside it:
KV memory in `kv/` (one `KVManager` over the block manager and the prefix cache), scheduling in
`scheduler.py`, packing and the forward pass in `model_runner.py`, sampling and stop checks in
`output_processor.py`, tensor parallelism in `distributed/` (an executor under the runner), and five
plug-ins (plugin.py): the host tier's `KVOffloader` (kv/offload.py), the `SpeculativeDecoder` (spec/),
the `BeamSearcher` (beam/, made on the first beam-search request), the `StepRecorder` of the memory
plots (memory.py) and `DenseCopies` of int4 weights for batches (dense_copies.py).
"""
from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import torch

from ..config import EngineConfig
from ..beam import BeamSearcher, BeamSearchParams, BeamState
from .cpu_allocator import keep_freed_memory
from .dense_copies import DenseCopies
from ..distributed import driver_shard, start_workers
from ..kv.offload import BlockSwap, KVOffloader
from ..kv.paged import kv_bytes_per_token
from ..kv.sizing import make_kv_cache
from .logits_processors import resolve_token_rules
from .memory import StepRecorder
from .model_runner import ModelRunner
from .plugin import EnginePlugin, StepContext
from ..models.loader import (default_model, eos_token_ids, load_config, load_model, load_tokenizer, pick_dtype,
                             release_freed_memory, resolve_model)
from .output_processor import OutputProcessor
from ..outputs import RequestMetrics, RequestOutput
from .request import Request, check_utf8
from ..sampling_params import SamplingParams
from .scheduler import Scheduler, scored_rows_per_step
from ..spec import DraftProposer, SpeculativeDecoder
from ..utils import cdiv

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, model: str | None = None, **kwargs):
        cfg = self.config = EngineConfig.from_kwargs(model, **kwargs)  # every setting checked: nothing loaded yet
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype, dtype_reason = pick_dtype(self.device, cfg.dtype)
        if self.device.type == "cpu":
            keep_freed_memory()
        if cfg.seed is not None:  # vLLM's seed: requests without their own seed draw from torch's generator
            torch.manual_seed(cfg.seed)
        self.model_dir, self.gguf_file = resolve_model(cfg.model or default_model(), cfg.gguf_file)
        self.model_name = cfg.model or str(self.model_dir)
        self.hf_config = load_config(self.model_dir, self.gguf_file)
        self.max_model_len = cfg.check_model(self.hf_config, self.gguf_file)  # shapes checked: weights not read yet
        self.tp, launch, self.device = driver_shard(cfg.tensor_parallel_size, self.device)
        self.model = load_model(self.model_dir, self.hf_config, self.device, self.dtype, self.max_model_len, self.tp,
                                self.gguf_file, cfg.quantization)
        self.tokenizer = load_tokenizer(self.model_dir, self.gguf_file, cfg.tokenizer)
        self.eos_token_ids = eos_token_ids(self.model_dir, self.tokenizer)
        self.vocab_size = self.hf_config.vocab_size
        self.kv_bytes_per_token = kv_bytes_per_token(
            self.hf_config.num_hidden_layers, self.model.num_kv_heads, self.model.head_dim, self.dtype)
        draft = self._load_draft()
        self.kv, self.kv_pool = make_kv_cache(cfg, self.hf_config, self.model, self.dtype, self.device,
                                              self.kv_bytes_per_token, self.max_model_len)
        self.prefix_cache = self.kv.prefix_cache if cfg.prefix_cache else None  # not the KVManager's stand-in
        self.spec = None if cfg.speculative_config is None else SpeculativeDecoder(
            cfg.speculative_config, self.kv, self.max_model_len, draft)
        self.scheduler = Scheduler(
            self.kv, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            policy=cfg.scheduler_policy, mode=cfg.scheduler, chunked_prefill=cfg.enable_chunked_prefill,
            lookahead=self.spec.lookahead if self.spec else None, max_scored_rows=scored_rows_per_step(self.vocab_size))
        block_size = self.kv.block_size if self.kv else 1
        tier = self.kv.tier if cfg.kv_offloading_size else None  # not the KVManager's stand-in
        self.executor = None if self.tp is None else start_workers(
            cfg, self.tp, launch, self.model_name if launch else str(self.model_dir), self.dtype, self.device,
            self.max_model_len, self.kv.num_blocks if self.kv else None, block_size, tier.num_blocks if tier else 0)
        self.runner = ModelRunner(self.model, self.kv_pool, cfg.attention, block_size, self.device, self.executor)
        if not cfg.enforce_eager and self.device.type == "cuda" and self.kv_pool is not None and self.tp is None:
            self.runner.capture_decode(self.max_model_len)
        self.offloader = None
        if tier is not None:  # chapter 12: a host pool beside each KV pool, and the plug-in that copies between them
            self.runner.attach_host_tier(tier.num_blocks)
            self.offloader = KVOffloader(tier, self.kv.cost)
        if draft is not None:
            draft.attach(self.runner, self.kv.num_blocks, self.kv.block_size, cfg.attention, self.device, self.dtype)
        self.recorder = StepRecorder(self.kv, self.scheduler, self.kv_bytes_per_token) if cfg.record_steps else None
        self.requests: dict[str, Request] = {}
        self.beam_searcher = None  # made on the first beam-search request
        self.plugins, self.claimers = [], []  # by phase (`_plug_in`); those that claim logit rows
        self._plug_in(self.offloader, self.spec, self.recorder, DenseCopies.for_model(self.model))
        self.output_processor = OutputProcessor(self.requests, self.scheduler, self.tokenizer, self.eos_token_ids,
                                                self.max_model_len, self.device)
        self.num_steps = 0
        if self.device.type == "cpu":  # what parsing the config and the tokenizer freed: ~20 MiB for a GGUF file
            release_freed_memory()
        self.startup_line = self._describe(dtype_reason)
        logger.info(self.startup_line)

    # -- construction ------------------------------------------------------------------------
    def _load_draft(self) -> DraftProposer | None:
        """The draft model of speculative decoding, if configured; its K/V shares the target's block ids."""
        spec = self.config.speculative_config
        if spec is None or spec.method != "draft_model":
            return None
        draft = DraftProposer(spec.model, self.hf_config, self.tokenizer, self.device, self.dtype, self.max_model_len)
        # the draft's K/V lives in blocks of the same ids: budget for both per token
        self.kv_bytes_per_token += kv_bytes_per_token(
            draft.config.num_hidden_layers, draft.model.num_kv_heads, draft.model.head_dim, self.dtype)
        return draft

    def _plug_in(self, *plugins: EnginePlugin | None) -> None:
        """Add plug-ins (None: a feature that is off), kept in the order of their phase, whatever order they came in."""
        self.plugins = sorted([*self.plugins, *filter(None, plugins)], key=lambda p: p.phase)
        self.claimers = [p for p in self.plugins if type(p).claims is not EnginePlugin.claims]

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at garbage collection and interpreter exit)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _describe(self, dtype_reason: str) -> str:
        """One line on what was chosen and why: the dtype, and how many tokens of KV fit."""
        name = self.gguf_file or (self.model_dir.name if Path(self.model_name).exists() else self.model_name)
        line = f"{name}: {str(self.dtype).removeprefix('torch.')} ({dtype_reason}) on {self.device}"
        line += f", {self.model.weights_held}" if self.model.weights_held else ""
        if self.kv is None:
            return line + ", no KV cache"
        tokens = self.kv.num_blocks * self.kv.block_size
        line = (f"{line}, {self.config.kv_cache} KV cache of {self.kv_pool.nbytes / 2**20:,.1f} MiB "
                f"= {tokens:,} tokens ({self.kv_bytes_per_token:,} bytes per token)")
        if self.offloader is None:
            return line
        host = self.runner.host_pools[0]
        return (f"{line}; host tier of {host.nbytes / 2**20:,.1f} MiB = {self.kv.tier.num_blocks * self.kv.block_size:,} "
                f"tokens, preemption by {self.config.preemption_mode}")

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None,
                    params: SamplingParams | BeamSearchParams | None = None,
                    prompt_token_ids: list[int] | None = None, stream: bool = False,
                    arrival_time: float | None = None, constraint_index=None) -> None:
        """Validate and queue a request. Raises ValueError (and changes nothing) on bad input.

        `params` may be BeamSearchParams: the request's sequences are then its beams (chapter 11).
        `constraint_index` is the constraint's compiled token index when the caller built it
        already (AsyncLLM does so off the engine thread); otherwise it is compiled here.
        """
        beam = params if isinstance(params, BeamSearchParams) else None
        params = beam.sampling_params() if beam else params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        prompt_token_ids = list(self.encode(prompt) if prompt_token_ids is None else prompt_token_ids)
        self._check_lengths(prompt_token_ids, params, beam)
        params = resolve_token_rules(params, self.tokenizer, self.vocab_size)
        constraint = self._build_constraint(params, constraint_index)
        fork = params.n > 1 and (self.config.kv_cache == "paged" or beam is not None)
        req = Request(request_id, prompt, prompt_token_ids, params, [], RequestMetrics(arrival_time or time.perf_counter()),
                      stream, constraint=constraint)
        req.seqs = [req.new_sequence(i, self.device, self.tokenizer) for i in range(1 if fork else params.n)]
        req.seqs[0].num_pending_forks = params.n - 1 if fork else 0
        if beam is not None:
            max_new = params.max_tokens or self.max_model_len - len(prompt_token_ids)
            req.beam = BeamState.start(beam, req.seqs[0], self.eos_token_ids, max_new)
            if self.beam_searcher is None:
                self.beam_searcher = BeamSearcher(self.requests, self.scheduler, self.tokenizer, self.device)
                self._plug_in(self.beam_searcher)
        self.requests[request_id] = req
        for seq in req.seqs:
            self.scheduler.add(seq)

    def _check_lengths(self, prompt_token_ids: list[int], params: SamplingParams, beam=None) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt is empty: it must have at least one token")
        n_prompt = len(prompt_token_ids)
        if n_prompt >= self.max_model_len:  # counted before the ids are read: 2 million of them took 6 s
            raise ValueError(f"prompt has {n_prompt} tokens; the limit is max_model_len - 1 = {self.max_model_len - 1}")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt_token_ids must be integers in [0, {self.vocab_size})")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ValueError(
                f"max_tokens={max_tokens} plus the prompt's {n_prompt} tokens exceeds max_model_len={self.max_model_len}; "
                f"use max_tokens <= {self.max_model_len - n_prompt}")
        if self.config.kv_cache == "paged" and cdiv(n_prompt + max_tokens, self.kv.block_size) > self.kv.num_blocks:
            raise ValueError(
                f"request needs up to {cdiv(n_prompt + max_tokens, self.kv.block_size)} KV blocks but the pool has "
                f"{self.kv.num_blocks}; it could never fit: lower max_tokens or give the cache more memory")
        if beam is not None:
            self._check_beam(beam.beam_width, n_prompt, max_tokens)
        elif params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} samples run side by side, but max_num_seqs={self.config.max_num_seqs}")

    def _check_beam(self, k: int, n_prompt: int, max_tokens: int) -> None:
        """Beams fork onto shared blocks, all `beam_width` of them live at once, and decide each round
        from their own logits: what that rules out is refused before anything runs."""
        if self.config.kv_cache == "contiguous":
            raise ValueError("beam search forks beams onto shared KV blocks: it needs kv_cache='paged' (or 'none'), "
                             "not 'contiguous'")
        if self.spec is not None:
            raise ValueError("beam search with speculative decoding is not supported: a speculative verify accepts one "
                             "continuation per sequence, beam search keeps beam_width of them")
        if k > self.config.max_num_seqs:
            raise ValueError(f"beam_width={k} beams run side by side, but max_num_seqs={self.config.max_num_seqs}")
        if self.kv is not None:  # paged: "contiguous" was refused above, "none" has no pool
            bs = self.kv.block_size
            shared, own = n_prompt // bs, cdiv(n_prompt + max_tokens, bs) - n_prompt // bs
            if shared + k * own > self.kv.num_blocks:
                raise ValueError(f"beam_width={k} beams of up to {n_prompt + max_tokens} tokens need up to "
                                 f"{shared + k * own} KV blocks but the pool has {self.kv.num_blocks}; lower "
                                 f"beam_width or max_tokens, or give the cache more memory")

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a text prompt. A text too long to fit max_model_len in any tokenization is
        refused before tokenizing it (a 20 MB prompt would otherwise take ~40 s and GBs of memory)."""
        self.check_prompt_chars(prompt)
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def check_prompt_chars(self, prompt: str) -> None:
        """What encode can refuse without tokenizing: not a string, empty, a lone surrogate, too many characters."""
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string (or pass prompt_token_ids)")
        if len(prompt) > self.max_prompt_chars:
            raise ValueError(f"prompt has {len(prompt):,} characters: more than max_model_len={self.max_model_len} tokens "
                             f"of this tokenizer can hold (at most {self.max_prompt_chars:,} characters)")
        check_utf8(prompt, "prompt")

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """No token spells more than its longest vocabulary entry's characters (byte-level entries
        are one character per byte), so a longer text cannot fit; x2 leaves room for normalizers."""
        return 2 * self.max_model_len * max(map(len, self.tokenizer.get_vocab()))

    def _build_constraint(self, params: SamplingParams, index=None):
        if not params.constrained:
            return None
        from ..constrained import ConstraintLimits, build_constraint

        return build_constraint(params, self.vocabulary, self.device, self.config.constraint_limits or ConstraintLimits(),
                                index)

    @property
    def vocabulary(self):
        """What every token id spells, for constraints (built on first use, then cached)."""
        from ..constrained import TokenVocabulary

        return TokenVocabulary.from_tokenizer(self.tokenizer, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its blocks go back to the pool (full ones stay cached)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        for seq in req.seqs:
            seq.num_pending_forks = 0  # samples that were still to fork off never will
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        return self.output_processor.output(req)

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, let the plug-ins adjust the batch, run the model, process outputs, commit."""
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.scheduled:
            return []
        step = StepContext(batch, self.runner, BlockSwap([], batch.copies, []), start)
        for plugin in self.plugins:  # by phase: the host tier's copies, then speculation's proposals
            plugin.adjust(step)
        logits = self.runner.run(batch.scheduled, step.moves)  # the block copies no plug-in ran, then the pass
        self.output_processor.process(batch, logits, self.claimers)  # sample, verify, append, stop
        self.scheduler.update_from_output(batch)  # full computed blocks into the prefix cache
        self.num_steps += 1
        for plugin in self.plugins:
            plugin.after_step(step)
        return self.output_processor.step_outputs(start)

    # -- introspection -----------------------------------------------------------------------
    @property
    def num_generated_tokens(self) -> int:
        return self.output_processor.num_generated_tokens

    @property
    def history(self):
        return self.recorder.records if self.recorder else []
