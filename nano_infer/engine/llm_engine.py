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
`output_processor.py`, tensor parallelism in `distributed/` (an executor under the runner), and the
plug-ins (core/plugin.py): the host tier's, the memory plots', the int4 layers' dense copies, and the
features that register themselves (build.py): speculative decoding and beam search. `build.py` makes
every part, in order; the engine owns the table of live requests, and is its one writer.
"""
from __future__ import annotations

import functools
import logging
import time
from types import MappingProxyType

from ..config import EngineConfig, num_experts
from ..constrained import ConstraintLimits, build_constraint
from ..constrained.backends import backend_of
from ..constrained.constraint import Constraint
from ..constrained.token_index import TokenIndex
from ..constrained.vocabulary import TokenVocabulary
from ..core.batch import BlockSwap
from ..core.plugin import EnginePlugin, StepContext
from ..core.request import Request
from ..core.utils import cdiv
from ..outputs import RequestMetrics, RequestOutput
from ..sampling_params import BeamSearchParams, SamplingParams
from ..text.utf8 import check_utf8
from .build import EngineParts, Feature, build_engine
from .compiled_decode import CompiledDecode
from .cpu_threads import FreeCoreThreads
from .custom_logits import PersistentBatch, resolve_processors
from .logits_processors import resolve_token_rules
from .output_processor import OutputProcessor
from .request_stats import RequestStats
from .sequences import new_sequence
from .stats import EngineStats, HostTierSnapshot, copy_of
from .vllm_options import drop_neutral_options

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, model: str | None = None, **kwargs):
        config = EngineConfig.from_kwargs(model, **drop_neutral_options(kwargs))  # vLLM's no-op options: at neutral
        self.constraint_backend = backend_of(config.structured_outputs_config)  # checked before the model loads
        processor_classes = resolve_processors(config.logits_processors)  # so are these
        parts = self.parts = build_engine(config)  # checked, then built in order
        self.config, self.device, self.dtype = parts.config, parts.device, parts.dtype
        self.model_dir, self.gguf_file, self.model_name = parts.model_dir, parts.gguf_file, parts.model_name
        self.hf_config, self.max_model_len, self.vocab_size = parts.hf_config, parts.max_model_len, parts.hf_config.vocab_size
        self.model, self.tokenizer, self.eos_token_ids = parts.model, parts.tokenizer, parts.eos_token_ids
        self.kv, self.kv_pool, self.kv_bytes_per_token = parts.kv, parts.kv_pool, parts.kv_bytes_per_token
        self.prefix_cache = self.kv.prefix_cache if self.config.prefix_cache else None  # not the KVManager's stand-in
        self.executor, self.runner, self.scheduler = parts.executor, parts.runner, parts.scheduler
        self.offloader, self.recorder, self.plugins = parts.offloader, parts.recorder, parts.plugins
        self.claimers = [p for p in self.plugins if type(p).claims is not EnginePlugin.claims]
        self.serving: dict[type, Feature] = {f.serves: f for f in parts.features if f.serves is not None}
        self.requests: dict[str, Request] = {}  # written here only
        self.output_processor = OutputProcessor(MappingProxyType(self.requests), self.scheduler, self.tokenizer,
                                                self.eos_token_ids, self.max_model_len, self.device)
        if processor_classes:  # vLLM's custom processors, on every sampled row (custom_logits.py)
            self.output_processor.custom = PersistentBatch([cls(config, self.device, False) for cls in processor_classes])
        self.num_steps = 0
        self.request_stats = RequestStats()  # latency histograms, published with the stats
        self._publish()
        self.startup_line = self._describe(parts)
        logger.info(self.startup_line)

    @classmethod
    def from_engine_args(cls, engine_args) -> LLMEngine:
        """vLLM's constructor from an EngineArgs (nano_infer.engine.arg_utils): its fields are the options."""
        options = {f: getattr(engine_args, f) for f in engine_args.__dataclass_fields__}
        return cls(options.pop("model"), **options)

    def reset_prefix_cache(self) -> bool:
        """vLLM's: forget every cached prefix block no request holds (both tiers), e.g. after the weights
        changed. True when no cached block is left; False while a running request still holds some."""
        if self.prefix_cache is None:
            return True
        self.kv.clear()
        self._publish()
        return self.prefix_cache.num_cached_blocks() == 0

    def plugin(self, cls: type[EnginePlugin]) -> EnginePlugin | None:
        """The plug-in of this class, if it is on (`engine.plugin(SpeculativeDecoder).stats`)."""
        return next((p for p in self.plugins if isinstance(p, cls)), None)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at garbage collection and interpreter exit)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _describe(self, parts: EngineParts) -> str:
        """One line on what was chosen and why: the dtype, and how many tokens of KV fit."""
        line = f"{parts.display_name}: {str(self.dtype).removeprefix('torch.')} ({parts.dtype_reason}) on {self.device}"
        if experts := num_experts(self.model.config):
            cut = (", whole experts per rank" if self.config.enable_expert_parallel else ", a slice of each per rank") \
                if self.config.tensor_parallel_size > 1 else ""
            line += f", {self.model.config.num_experts_per_tok} of {experts} experts a token{cut}"
        line += f", {self.model.weights_held}" if self.model.weights_held else ""
        threads = self.plugin(FreeCoreThreads)
        line += f", up to {threads.max_threads} threads (as many as cores are free)" if threads else ""
        if isinstance(self.runner.graphs, CompiledDecode):
            sizes = self.runner.graphs.batch_sizes
            line += (f", decode steps of up to {sizes[-1]} sequences compiled by torch.compile on first use "
                     f"(batch sizes {', '.join(map(str, sizes))}; enforce_eager=True: eager)")
        if self.kv is None:
            return line + ", no KV cache"
        tokens = self.kv.num_blocks * self.kv.block_size
        stored = "" if self.config.kv_cache_dtype == "auto" else f" in {self.config.kv_cache_dtype}"
        line = (f"{line}, {self.config.kv_cache} KV cache{stored} of {self.kv_pool.nbytes / 2**20:,.1f} MiB "
                f"= {tokens:,} tokens ({self.kv_bytes_per_token:,} bytes per token)")
        if self.kv_pool.open_nbytes:
            line += (f", each running sequence's open block exact beside it ({self.kv_pool.open_rows} x "
                     f"{self.kv_pool.open_ring} block{'s' if self.kv_pool.open_ring > 1 else ''}, up to "
                     f"{self.kv_pool.open_nbytes / 2**20:,.1f} MiB)")
        if self.offloader is None:
            return line
        host = self.runner.host_pools[0]
        return (f"{line}; host tier of {host.nbytes / 2**20:,.1f} MiB = {self.kv.tier.num_blocks * self.kv.block_size:,} "
                f"tokens, preemption by {self.config.preemption_mode}")

    def warm_up(self) -> None:
        """Compile the CPU decode step's batch buckets now (engine/compiled_decode.py), before any request holds
        a block: a server calls it before it listens. Nothing to do on an engine that decodes eagerly."""
        if isinstance(self.runner.graphs, CompiledDecode):
            self.runner.graphs.warm_up()

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None,
                    params: SamplingParams | BeamSearchParams | None = None,
                    prompt_token_ids: list[int] | None = None, stream: bool = False,
                    arrival_time: float | None = None, constraint_index: TokenIndex | None = None) -> None:
        """Validate and queue a request. Raises ValueError (and changes nothing) on bad input.

        `params` is SamplingParams, or the parameters of a feature that serves its own requests
        (BeamSearchParams: the request's sequences are then its beams, chapter 11).
        `constraint_index` is the constraint's compiled token index when the caller built it
        already (AsyncLLM does so off the engine thread); otherwise it is compiled here.
        """
        owner = self.serving.get(type(params))
        if owner is None and params is not None and not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams or one of {', '.join(t.__name__ for t in self.serving)}, "
                             f"got {type(params).__name__}")
        sampling = owner.sampling_params(params) if owner else params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        prompt_token_ids = list(self.encode(prompt) if prompt_token_ids is None else prompt_token_ids)
        max_tokens = self._check_lengths(prompt_token_ids, sampling)
        if owner is not None:
            owner.check(params, len(prompt_token_ids), max_tokens)
        elif sampling.n > self.config.max_num_seqs:
            raise ValueError(f"n={sampling.n} samples run side by side, but max_num_seqs={self.config.max_num_seqs}")
        sampling = resolve_token_rules(sampling, self.tokenizer, self.vocab_size)
        if self.output_processor.custom is not None:
            self.output_processor.custom.validate(sampling)
        constraint = self._build_constraint(sampling, constraint_index)
        fork = sampling.n > 1 and (self.config.kv_cache == "paged" or owner is not None)
        req = Request(request_id, prompt, prompt_token_ids, sampling, [],
                      RequestMetrics(arrival_time or time.perf_counter()), stream, constraint=constraint)
        req.seqs = [new_sequence(req, i, self.device, self.tokenizer) for i in range(1 if fork else sampling.n)]
        req.seqs[0].num_pending_forks = sampling.n - 1 if fork else 0
        if owner is not None:
            owner.add(req, params, max_tokens)
        self.requests[request_id] = req
        for seq in req.seqs:
            self.scheduler.add(seq)

    def _check_lengths(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Refuse a prompt or a length that cannot run; returns the most tokens it may generate."""
        if not prompt_token_ids:
            raise ValueError("prompt is empty: it must have at least one token")
        n_prompt = len(prompt_token_ids)
        if n_prompt >= self.max_model_len:  # counted before the ids are read: reading millions of them takes seconds
            raise ValueError(f"prompt has {n_prompt} tokens; the limit is max_model_len - 1 = {self.max_model_len - 1}")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt_token_ids must be integers in [0, {self.vocab_size})")
        # as vLLM: max_tokens beyond what max_model_len leaves after the prompt is capped there (finish_reason "length")
        max_tokens = min(params.max_tokens or self.max_model_len, self.max_model_len - n_prompt)
        if self.config.kv_cache == "paged" and cdiv(n_prompt + max_tokens, self.kv.block_size) > self.kv.num_blocks:
            raise ValueError(
                f"request needs up to {cdiv(n_prompt + max_tokens, self.kv.block_size)} KV blocks but the pool has "
                f"{self.kv.num_blocks}; it could never fit: lower max_tokens or give the cache more memory")
        return max_tokens

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a text prompt. A text too long to fit max_model_len in any tokenization is
        refused before tokenizing it (the tokenizer's time and memory grow with the text's length)."""
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

    def _build_constraint(self, params: SamplingParams, index: TokenIndex | None = None) -> Constraint | None:
        if not params.constrained:
            return None
        return build_constraint(params, self.vocabulary, self.device, self.config.constraint_limits or ConstraintLimits(),
                                index, self.constraint_backend)

    @property
    def vocabulary(self) -> TokenVocabulary:
        """What every token id spells, for constraints (built on first use, then cached)."""
        return TokenVocabulary.from_tokenizer(self.tokenizer, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its blocks go back to the pool (full ones stay cached)."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self._retire([request_id])
        for seq in req.seqs:
            seq.num_pending_forks = 0  # samples that were still to fork off never will
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        out = self.output_processor.output(req)
        self.request_stats.finish(req)
        return out

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, let the plug-ins adjust the batch, run the model, process outputs, commit."""
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch.scheduled:
            self._publish()
            return []
        step = StepContext(batch, self.runner, BlockSwap([], batch.copies, [], batch.open_block_copies), start)
        for plugin in self.plugins:  # by phase: the host tier's copies, then speculation's proposals
            plugin.adjust(step)
        logits = self.runner.run(batch.scheduled, step.moves)  # the block copies no plug-in ran, then the pass
        self.output_processor.process(step, logits, self.claimers)  # sample, verify, append, stop
        self.scheduler.update_from_output(batch)  # full computed blocks into the prefix cache
        self.num_steps += 1
        for plugin in self.plugins:
            plugin.after_step(step)
        outputs = self.output_processor.step_outputs()
        self.request_stats.observe(self.output_processor.touched.values())
        self._retire([out.request_id for out in outputs if out.finished])
        self._publish()
        return outputs

    def _retire(self, request_ids: list[str]) -> None:
        """Finished or aborted requests leave the table, and the features that served them forget them."""
        for request_id in request_ids:
            del self.requests[request_id]
            for feature in self.serving.values():
                feature.release(request_id)

    def _publish(self) -> None:
        """Swap in a new EngineStats for readers on other threads (stats.py): built whole, then assigned."""
        kv, scheduler, tier = self.kv, self.scheduler, self.offloader
        host = None if tier is None else HostTierSnapshot(
            tier.tier.num_blocks, tier.tier.num_free_blocks, tier.tier.num_cached_blocks(), copy_of(tier.tier.stats),
            tier.bytes_out, tier.bytes_in)
        self.stats = EngineStats(
            self.parts.display_name, self.max_model_len, len(scheduler.running), len(scheduler.waiting), self.num_steps,
            self.num_generated_tokens, self.runner.num_forward_tokens, kv.num_blocks if kv else 0,
            kv.num_free_blocks if kv else 0, copy_of(self.prefix_cache.stats) if self.prefix_cache else None, host,
            self.request_stats.snapshot())

    # -- introspection -----------------------------------------------------------------------
    @property
    def num_generated_tokens(self) -> int:
        return self.output_processor.num_generated_tokens

    @property
    def history(self):
        return self.recorder.records if self.recorder else []
