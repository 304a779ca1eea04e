"""LLMEngine: requests in, one scheduled forward pass per `step()`, outputs out.

    engine.add_request("r1", "Hello", SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        for out in engine.step():
            ...

Each knob of the curriculum is a constructor argument, so every notebook turns one knob
on the same engine: `kv_cache` ("none" | "contiguous" | "paged"), `block_size`,
`prefix_cache` (None | "hash" | "radix"), `attention` ("gather" | "blockwise"),
`scheduler` ("continuous" | "static"), `scheduler_policy` ("fcfs" | "lpm"),
`tensor_parallel_size` (worker processes, each with a shard of every layer),
`speculative_config` (vLLM's dict: n-gram prompt lookup or a draft model; see `spec/`).
"""
from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .cpu_allocator import keep_freed_memory
from .detokenizer import IncrementalDetokenizer
from .kv import BlockManager, ContiguousKVCache, KVPool
from .kv.paged import kv_bytes_per_token, num_blocks_for_budget
from .memory import StepRecorder
from .model_runner import ModelRunner
from .models.loader import default_model, load_config, load_model, pick_dtype, resolve_model
from .outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .prefix import make_prefix_cache
from .sampling import sample, seeded_generator
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence, SequenceStatus
from .spec import DraftProposer, SpeculativeConfig, SpeculativeDecoder

# KV pool on a CPU unless kv_cache_memory says otherwise: vLLM's CPU default of 4 GiB, or half the memory
# still available after the weights, whichever is less (and never more than max_num_seqs full-length
# sequences could use). The pool's pages are committed only as blocks fill (`kv.paged.lazy_zeros`).
CPU_KV_BUDGET = 4 * 1024**3
CPU_KV_AVAILABLE_FRACTION = 0.5

logger = logging.getLogger(__name__)


@dataclass
class EngineConfig:
    model: str | None = None
    gguf_file: str | None = None  # a GGUF file in the `model` folder (or pass the .gguf path as `model`)
    dtype: str | torch.dtype | None = "auto"
    device: str | None = None
    kv_cache: str = "paged"
    block_size: int = 16
    num_kv_blocks: int | None = None
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
    distributed_backend: str | None = None  # default: "nccl" on CUDA, "gloo" on CPU
    distributed_timeout: float = 300.0  # seconds a step (or start-up) waits for a rank before it fails
    speculative_config: dict | None = None  # {"method": "ngram" | "draft_model", "num_speculative_tokens": k, ...}
    constraint_limits: object = None  # constrained.ConstraintLimits; None: its defaults


def check_utf8(text: str, what: str) -> None:
    """JSON can carry a lone surrogate ("\\ud800"), which is not a character and cannot be tokenized."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} contains {text[e.start:e.end]!r} at character {e.start}: a lone UTF-16 surrogate, "
                         f"not a character") from None


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    metrics: RequestMetrics
    stream: bool = False
    error: Exception | None = None  # what failed it inside a step

    @property
    def pending_forks(self) -> int:
        return sum(s.num_pending_forks for s in self.seqs)


class LLMEngine:
    def __init__(self, model: str | None = None, **kwargs):
        unknown = set(kwargs) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown engine option(s) {sorted(unknown)}; options are {sorted(EngineConfig.__dataclass_fields__)}")
        cfg = self.config = EngineConfig(model=model, **kwargs)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype, dtype_reason = pick_dtype(self.device, cfg.dtype)
        if self.device.type == "cpu":
            keep_freed_memory()
        self.model_dir, self.gguf_file = resolve_model(cfg.model or default_model(), cfg.gguf_file)
        self.model_name = cfg.model or str(self.model_dir)
        self.hf_config = load_config(self.model_dir, self.gguf_file)
        self.max_model_len = cfg.max_model_len or min(self.hf_config.max_position_embeddings, 8192)
        if self.max_model_len > self.hf_config.max_position_embeddings:
            raise ValueError(f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings={self.hf_config.max_position_embeddings}")
        self.tp, launch = self._tensor_parallel()
        if self.tp is not None and self.gguf_file:
            raise ValueError("a GGUF checkpoint with tensor_parallel_size > 1 is not supported; use the safetensors one")
        self.model = load_model(self.model_dir, self.hf_config, self.device, self.dtype, self.max_model_len, self.tp,
                                self.gguf_file)
        self.tokenizer = self._load_tokenizer()
        self.eos_token_ids = self._eos_token_ids()
        self.vocab_size = self.hf_config.vocab_size
        self.kv_bytes_per_token = kv_bytes_per_token(
            self.hf_config.num_hidden_layers, self.model.num_kv_heads, self.model.head_dim, self.dtype)
        self.spec_config = SpeculativeConfig.parse(cfg.speculative_config)
        draft = None
        if self.spec_config is not None and self.tp:
            raise ValueError("speculative_config with tensor_parallel_size > 1 is not supported: the draft model and "
                             "the verify rows run on the driver only")
        if self.spec_config is not None:
            if cfg.kv_cache == "none":
                raise ValueError("speculative_config verifies proposals against cached K/V: it needs kv_cache='paged' or 'contiguous'")
            if self.spec_config.method == "draft_model":
                draft = DraftProposer(self.spec_config.model, self.hf_config, self.tokenizer, self.device, self.dtype, self.max_model_len)
                # the draft's K/V lives in blocks of the same ids: budget for both per token
                self.kv_bytes_per_token += kv_bytes_per_token(
                    draft.config.num_hidden_layers, draft.model.num_kv_heads, draft.model.head_dim, self.dtype)
        self.kv, self.kv_pool = self._make_kv_cache()
        pc = cfg.prefix_cache
        if pc == "auto":
            pc = "radix" if cfg.kv_cache == "paged" else None
        if pc is not None and cfg.kv_cache != "paged":
            raise ValueError(f"prefix_cache={pc!r} shares KV blocks, so it needs kv_cache='paged' (got {cfg.kv_cache!r})")
        self.prefix_cache = make_prefix_cache(pc, self.kv)
        if cfg.max_num_batched_tokens < 1 or cfg.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        self.spec = None
        if self.spec_config is not None:
            self.spec = SpeculativeDecoder(self.spec_config, self.kv, draft, self.max_model_len)
        self.scheduler = Scheduler(
            self.kv, self.prefix_cache, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens, policy=cfg.scheduler_policy,
            mode=cfg.scheduler, chunked_prefill=cfg.enable_chunked_prefill,
            lookahead=self.spec.lookahead if self.spec else None)
        block_size = self.kv.block_size if self.kv else 1
        self.executor = self._start_workers(launch, block_size) if self.tp else None
        self.runner = ModelRunner(self.model, self.kv_pool, cfg.attention, block_size, self.device, self.executor)
        if draft is not None:
            draft.make_pool(self.kv.num_blocks, self.kv.block_size, cfg.attention, self.device, self.dtype)
            self.runner.draft = draft
        self.requests: dict[str, Request] = {}
        self.recorder = StepRecorder() if cfg.record_steps else None
        self.num_steps = 0
        self.num_generated_tokens = 0
        self.startup_line = self._describe(dtype_reason)
        logger.info(self.startup_line)

    # -- construction ------------------------------------------------------------------------
    def _tensor_parallel(self):
        """(TPShard of rank 0, torchrun Launch or None); (None, None) for one process."""
        from .distributed import TPShard, check_tp_sizes, torchrun_launch

        size = self.config.tensor_parallel_size
        check_tp_sizes(self.hf_config, size)
        if size == 1:
            return None, None
        if not self.config.distributed_timeout > 0:
            raise ValueError(f"distributed_timeout={self.config.distributed_timeout} must be > 0 seconds")
        launch = torchrun_launch()
        if launch is not None:
            if launch.world_size != size:
                raise ValueError(f"tensor_parallel_size={size} but torchrun started WORLD_SIZE={launch.world_size} ranks")
            if launch.rank != 0:
                raise ValueError(f"this is rank {launch.rank} of a torchrun job: rank 0 runs the LLM, the others "
                                 f"call nano_infer.distributed.run_worker()")
        if self.device.type == "cuda":
            self.device = torch.device("cuda", launch.local_rank if launch else 0)
            torch.cuda.set_device(self.device)
        return TPShard(0, size), launch

    def _start_workers(self, launch, block_size: int):
        from .distributed import TPExecutor, WorkerConfig
        from .distributed.launch import default_backend

        cfg = self.config
        local_ranks = launch.local_world_size if launch else cfg.tensor_parallel_size
        threads = max(1, torch.get_num_threads() // local_ranks) if self.device.type == "cpu" else None
        worker = WorkerConfig(
            model=self.model_name if launch else str(self.model_dir), dtype=self.dtype, device_type=self.device.type,
            max_model_len=self.max_model_len, num_blocks=self.kv.num_blocks if self.kv else None,
            block_size=block_size, attention=cfg.attention, num_threads=threads)
        return TPExecutor(self.tp, worker, cfg.distributed_backend or default_backend(self.device.type),
                          cfg.distributed_timeout)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at garbage collection and interpreter exit)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _describe(self, dtype_reason: str) -> str:
        """One line on what was chosen and why: the dtype, and how many tokens of KV fit."""
        name = self.gguf_file or (self.model_dir.name if Path(self.model_name).exists() else self.model_name)
        line = f"{name}: {str(self.dtype).removeprefix('torch.')} ({dtype_reason}) on {self.device}"
        if self.kv is None:
            return line + ", no KV cache"
        tokens = self.kv.num_blocks * self.kv.block_size
        return (f"{line}, {self.config.kv_cache} KV cache of {self.kv_pool.nbytes / 2**20:,.1f} MiB "
                f"= {tokens:,} tokens ({self.kv_bytes_per_token:,} bytes per token)")

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_dir, gguf_file=self.gguf_file)

    def _eos_token_ids(self) -> set[int]:
        ids = set()
        gen_path = self.model_dir / "generation_config.json"
        if gen_path.exists():
            eos = json.loads(gen_path.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def _kv_budget(self) -> int:
        cfg = self.config
        if cfg.kv_cache_memory is not None:
            return int(cfg.kv_cache_memory)
        if self.device.type == "cuda":
            if not 0 < cfg.gpu_memory_utilization <= 1:
                raise ValueError(f"gpu_memory_utilization={cfg.gpu_memory_utilization} must be in (0, 1]")
            total = torch.cuda.get_device_properties(self.device).total_memory
            # leave room for activations: a step of max_num_batched_tokens through the widest layer
            activations = 8 * cfg.max_num_batched_tokens * max(self.hf_config.intermediate_size, self.vocab_size) * 4
            return int(total * cfg.gpu_memory_utilization - torch.cuda.memory_allocated(self.device) - activations)
        import psutil

        return min(CPU_KV_BUDGET, int(psutil.virtual_memory().available * CPU_KV_AVAILABLE_FRACTION))

    def _make_kv_cache(self):
        cfg = self.config
        if cfg.kv_cache == "none":
            return None, None
        layers, heads, hd = self.hf_config.num_hidden_layers, self.model.num_kv_heads, self.model.head_dim
        if cfg.kv_cache == "contiguous":
            per_seq = self.kv_bytes_per_token * self.max_model_len
            num_seqs = min(cfg.max_num_seqs, self._kv_budget() // per_seq)
            if num_seqs < 1:
                raise ValueError(f"KV budget holds no {self.max_model_len}-token sequence; lower max_model_len")
            kv = ContiguousKVCache(num_seqs, self.max_model_len)
        elif cfg.kv_cache == "paged":
            if cfg.block_size < 1:
                raise ValueError(f"block_size={cfg.block_size} must be >= 1")
            if cfg.num_kv_blocks is not None:
                num_blocks = cfg.num_kv_blocks
            else:
                num_blocks = num_blocks_for_budget(self._kv_budget(), self.kv_bytes_per_token, cfg.block_size)
                # never more than every sequence at full length could use
                num_blocks = min(num_blocks, cfg.max_num_seqs * -(-self.max_model_len // cfg.block_size) + 1)
            kv = BlockManager(num_blocks, cfg.block_size, log=cfg.log_blocks)
        else:
            raise ValueError(f"kv_cache={cfg.kv_cache!r} is invalid: use 'none', 'contiguous' or 'paged'")
        pool = KVPool(layers, kv.num_blocks, kv.block_size, heads, hd, self.dtype, self.device)
        return kv, pool

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | None = None, params: SamplingParams | None = None,
                    prompt_token_ids: list[int] | None = None, stream: bool = False,
                    arrival_time: float | None = None, constraint_index=None) -> None:
        """Validate and queue a request. Raises ValueError (and changes nothing) on bad input.

        `constraint_index` is the constraint's compiled token index when the caller built it
        already (AsyncLLM does so off the engine thread); otherwise it is compiled here.
        """
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if prompt_token_ids is None:
            prompt_token_ids = self.encode(prompt)
        prompt_token_ids = list(prompt_token_ids)
        if not prompt_token_ids:
            raise ValueError("prompt is empty: it must have at least one token")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt_token_ids must be integers in [0, {self.vocab_size})")
        n_prompt = len(prompt_token_ids)
        if n_prompt >= self.max_model_len:
            raise ValueError(f"prompt has {n_prompt} tokens; the limit is max_model_len - 1 = {self.max_model_len - 1}")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - n_prompt
        if n_prompt + max_tokens > self.max_model_len:
            raise ValueError(
                f"max_tokens={max_tokens} plus the prompt's {n_prompt} tokens exceeds max_model_len={self.max_model_len}; "
                f"use max_tokens <= {self.max_model_len - n_prompt}")
        if isinstance(self.kv, BlockManager):
            need = -(-(n_prompt + max_tokens) // self.kv.block_size)
            if need > self.kv.num_blocks:
                raise ValueError(
                    f"request needs up to {need} KV blocks but the pool has {self.kv.num_blocks}; "
                    f"it could never fit: lower max_tokens or give the cache more memory")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} samples run side by side, but max_num_seqs={self.config.max_num_seqs}")
        constraint = self._build_constraint(params, constraint_index)
        fork = params.n > 1 and isinstance(self.kv, BlockManager)
        seqs = [self._new_seq(request_id, prompt_token_ids, params, i, constraint, stream) for i in range(1 if fork else params.n)]
        metrics = RequestMetrics(arrival_time=arrival_time or time.perf_counter())
        seqs[0].num_pending_forks = params.n - 1 if fork else 0
        req = Request(request_id, prompt, prompt_token_ids, params, seqs, metrics, stream)
        self.requests[request_id] = req
        for seq in seqs:
            self.scheduler.add(seq)

    def encode(self, prompt: str) -> list[int]:
        """Token ids of a text prompt. A text too long to fit max_model_len in any tokenization is
        refused before tokenizing it (a 20 MB prompt would otherwise take ~40 s and GBs of memory)."""
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string (or pass prompt_token_ids)")
        check_utf8(prompt, "prompt")
        if len(prompt) > self.max_prompt_chars:
            raise ValueError(f"prompt has {len(prompt):,} characters: more than max_model_len={self.max_model_len} tokens "
                             f"of this tokenizer can hold (at most {self.max_prompt_chars:,} characters)")
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """No token spells more than its longest vocabulary entry's characters (byte-level entries
        are one character per byte), so a longer text cannot fit; x2 leaves room for normalizers."""
        return 2 * self.max_model_len * max(map(len, self.tokenizer.get_vocab()))

    def _build_constraint(self, params: SamplingParams, index=None):
        if not params.constrained:
            return None
        from .constrained import ConstraintLimits, build_constraint

        return build_constraint(params, self.vocabulary, self.device, self.config.constraint_limits or ConstraintLimits(),
                                index)

    @property
    def vocabulary(self):
        """What every token id spells, for constraints (built on first use, then cached)."""
        from .constrained import TokenVocabulary

        return TokenVocabulary.from_tokenizer(self.tokenizer, vocab_size=self.vocab_size, eos_token_ids=self.eos_token_ids)

    def _new_seq(self, request_id, prompt_token_ids, params, index, constraint, stream, parent: Sequence | None = None):
        seq = Sequence(request_id, list(prompt_token_ids), params, index=index,
                       token_ids=list(parent.token_ids) if parent else [])
        if params.seed is not None:
            seq.generator = seeded_generator(params.seed, index, self.device)
        if constraint is not None:
            seq.constraint = constraint if index == 0 and parent is None else constraint.fork()
        if params.logprobs is not None:
            seq.logprobs = list(parent.logprobs) if parent is not None and parent.logprobs is not None else []
        if stream or params.stop:  # text is needed while running; otherwise decode once at the end
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        return seq

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stop a request now; its blocks go back to the pool (full ones stay cached)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        return self._output(req)

    # -- one step ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        out = self.scheduler.schedule()
        for seq in out.preempted:
            self.requests[seq.request_id].metrics.num_preemptions += 1
        if not out.scheduled:
            return []
        copies = []
        if self.kv is not None:
            copies, self.kv.pending_copies = self.kv.pending_copies, []
        if self.spec is not None:
            self.runner.copy_blocks(copies)  # before a draft model writes into the copies
            copies = []
            out.scheduled = self.spec.propose(self.runner, out.scheduled)
        scheduled = self.recorder.describe(out) if self.recorder else None
        logits = self.runner.run(out.scheduled, copies)
        samplers, rows, verifies, row = [], [], [], 0
        for seq, n in out.scheduled:
            if seq.spec_token_ids:  # a verify: one logit row per proposal, plus one
                verifies.append((seq, row))
                row += n
                continue
            if seq.num_computed_tokens + n == len(seq):
                samplers.append(seq)
                rows.append(row)
                row += 1
            seq.num_computed_tokens += n
        for i, seq in enumerate(list(samplers)):
            req = self.requests[seq.request_id]
            if seq.num_pending_forks:
                children = self._fork(req, seq)
                samplers += children
                rows += [rows[i]] * len(children)
        sample_logits = logits if rows == list(range(len(logits))) else logits[rows]  # no copy in the usual case
        tokens = self._sample(sample_logits, samplers) if samplers else []
        logprobs = self._logprobs(sample_logits, samplers, tokens)
        now = time.perf_counter()
        touched = {}
        for i, (seq, token) in enumerate(zip(samplers, tokens)):
            req = touched[seq.request_id] = self.requests[seq.request_id]
            if seq.is_finished:  # a sibling sample failed the request earlier in this loop
                continue
            try:
                if isinstance(token, Exception):
                    raise token
                if seq.logprobs is not None:
                    seq.logprobs.append(logprobs[i])
                self._append_token(seq, token, now)
                self.num_generated_tokens += 1
            except Exception as e:  # noqa: BLE001 - this request fails; the step goes on for the others
                self._fail(req, e)
        for seq, row in verifies:
            req = touched[seq.request_id] = self.requests[seq.request_id]
            if seq.is_finished:
                continue
            try:
                self._append_verified(seq, logits[row : row + 1 + len(seq.spec_token_ids)], now)
            except Exception as e:  # noqa: BLE001
                self._fail(req, e)
        if self.prefix_cache is not None:
            for seq, _ in out.scheduled:
                if not seq.is_finished:
                    self.prefix_cache.cache_computed(seq)
        self.num_steps += 1
        if self.recorder is not None:
            self.recorder.record(self, out, scheduled, start)
        outputs = []
        for req in touched.values():
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = start
            done = all(s.is_finished for s in req.seqs) and not req.pending_forks
            if done or req.stream:
                outputs.append(self._output(req))
            if done:
                req.metrics.finished_time = now
                del self.requests[req.request_id]
        return outputs

    def _append_verified(self, seq: Sequence, logits: torch.Tensor, now: float) -> None:
        """Append what verification accepted, one token at a time (each may finish the request),
        then give back the KV slots of the rejected proposals."""
        tokens = self.spec.accept(seq, logits)
        self.spec.clear(seq)
        for token in tokens:
            seq.num_computed_tokens = len(seq)  # K/V of every token so far is computed and accepted
            self._append_token(seq, token, now)
            self.num_generated_tokens += 1
            if seq.is_finished:
                return
        self.spec.rollback(seq, seq.num_computed_tokens)

    def _sample(self, logits: torch.Tensor, samplers: list[Sequence]) -> list[int | Exception]:
        """One token per row. If the batched draw raises, each row is drawn alone, so the error
        lands on the request that caused it and every other row still gets its token."""
        try:
            return sample(logits, samplers)
        except Exception:  # noqa: BLE001
            tokens = []
            for i, seq in enumerate(samplers):
                try:
                    tokens += sample(logits[i : i + 1], [seq])
                except Exception as e:  # noqa: BLE001
                    tokens.append(e)
            return tokens

    @staticmethod
    def _logprobs(logits: torch.Tensor, samplers: list[Sequence], tokens: list) -> dict[int, dict[int, Logprob]]:
        """For the rows whose request asked for logprobs: {token: Logprob} of the sampled token and the
        k most likely, from the raw logits (computed only for those rows)."""
        rows = [i for i, seq in enumerate(samplers) if seq.params.logprobs is not None and isinstance(tokens[i], int)]
        if not rows:
            return {}
        lp = logits[rows].float().log_softmax(dim=-1)
        out = {}
        for lp_row, i in zip(lp, rows):
            token = tokens[i]
            entry = {token: Logprob(lp_row[token].item(), int((lp_row > lp_row[token]).sum()) + 1)}
            top = lp_row.topk(samplers[i].params.logprobs) if samplers[i].params.logprobs else None
            if top is not None:
                for rank, (value, tid) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
                    entry.setdefault(tid, Logprob(value, rank))
            out[i] = entry
        return out

    def _fail(self, req: Request, error: Exception) -> None:
        """Finish `req` with `error`: its blocks go back to the pool, the step's other requests go on."""
        req.error = error
        for seq in req.seqs:
            seq.num_pending_forks = 0
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")

    def _fork(self, req: Request, parent: Sequence) -> list[Sequence]:
        """n > 1: the other samples share the prompt's blocks with the first (copy-on-write later)."""
        children = []
        for index in range(1, parent.num_pending_forks + 1):
            child = self._new_seq(req.request_id, req.prompt_token_ids, req.params, index, parent.constraint, req.stream, parent)
            child.num_computed_tokens = parent.num_computed_tokens
            child.num_cached_tokens = parent.num_cached_tokens
            self.kv.fork(parent, child)
            if self.prefix_cache is not None:
                self.prefix_cache.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            self.scheduler.running.append(child)
            children.append(child)
        req.seqs += children
        parent.num_pending_forks = 0
        return children

    def _append_token(self, seq: Sequence, token: int, now: float) -> None:
        req = self.requests[seq.request_id]
        seq.token_ids.append(token)
        if seq.index == 0:
            if req.metrics.first_token_time is None:
                req.metrics.first_token_time = now
                req.metrics.num_cached_tokens = seq.num_cached_tokens
            req.metrics.token_times.append(now)
        params = seq.params
        reason, stop_reason = None, None
        if seq.constraint is not None:
            seq.constraint.advance(token)
        if seq.detokenizer is not None:
            delta = seq.detokenizer.add(token)
            text = seq.detokenizer.text
            for stop in params.stop:  # only where the new text could complete it: O(stop length) per token
                at = text.find(stop, max(0, len(text) - len(delta) - len(stop) + 1)) if delta else -1
                if at >= 0:
                    seq.detokenizer.text = seq.detokenizer.text[:at]
                    reason, stop_reason = "stop", stop
                    break
        if reason is None:
            if token in params.stop_token_ids:
                reason, stop_reason = "stop", token
            elif not params.ignore_eos and token in self.eos_token_ids:
                reason = "stop"
            elif seq.constraint is not None and seq.constraint.is_done:
                reason = "stop"
            elif params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
                reason = "length"
            elif len(seq) >= self.max_model_len:
                reason = "length"
        if reason is not None:
            seq.stop_reason = stop_reason
            if seq.detokenizer is not None and not isinstance(stop_reason, str):
                seq.detokenizer.flush()
            self.scheduler.finish(seq, reason)

    def _text(self, seq: Sequence) -> str:
        if seq.detokenizer is not None:
            return seq.detokenizer.text
        if seq.is_finished:
            return self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=seq.params.skip_special_tokens)
        return ""

    def _output(self, req: Request) -> RequestOutput:
        outs = [CompletionOutput(s.index, self._text(s), list(s.output_token_ids), s.finish_reason, s.stop_reason,
                                 None if s.logprobs is None else list(s.logprobs))
                for s in sorted(req.seqs, key=lambda s: s.index)]
        finished = all(s.is_finished for s in req.seqs) and not req.pending_forks
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished, req.metrics, req.error)

    # -- introspection -----------------------------------------------------------------------
    @property
    def history(self):
        return self.recorder.records if self.recorder else []
