"""Three ways to serve the same workload, each returning a RunResult measured the same way.

- `run_nano`: nano_infer's LLMEngine, driven through its low-level API (add_request /
  step), so the KV pool can be read between steps.
- `run_hf_static`: transformers `generate()` on fixed batches, left-padded. A batch runs
  until its longest request is done; the tokens the shorter ones generate past their
  own length are thrown away and not counted. This is what most people do by hand.
- `run_hf_continuous`: transformers' own continuous batching (the manager behind
  `model.generate_batch`). `generate_batch` takes one `max_new_tokens` for all
  requests, so we call the same manager it wraps, one `add_request` per request with
  its own length. The manager is kept between rounds (`persistent_manager=True`), so
  its one-off set-up is not timed, just as building nano_infer's engine is not.

Every runner submits all requests at t=0 and reports each output token's time.
"""
from __future__ import annotations

import math
import time

import torch

from ..kv.paged import kv_bytes_per_token
from ..sampling_params import SamplingParams
from .workload import RunResult, Workload, result_from_token_times


def run_nano(engine, workload: Workload, name: str = "nano_infer") -> RunResult:
    kv, running, steps_before = engine.kv, engine.scheduler.running, engine.num_steps
    cpu0, t0 = time.process_time(), time.perf_counter()
    for i, req in enumerate(workload.requests):
        params = SamplingParams(temperature=0, max_tokens=req.max_tokens, ignore_eos=True)
        engine.add_request(f"bench-{i}", prompt_token_ids=req.prompt_token_ids, params=params, arrival_time=t0)
    finished = {}
    peak_blocks = peak_tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        peak_blocks = max(peak_blocks, sum(len(s.block_table) for s in running))
        peak_tokens = max(peak_tokens, sum(s.num_computed_tokens for s in running))
    cpu_s = time.process_time() - cpu0
    token_times = [[t - t0 for t in finished[f"bench-{i}"].metrics.token_times] for i in range(len(workload.requests))]
    per_token = engine.kv_bytes_per_token
    return result_from_token_times(
        name, token_times, workload, cpu_s=cpu_s,
        kv_reserved_bytes=peak_blocks * kv.block_size * per_token,
        kv_used_bytes=peak_tokens * per_token,
        extra={"kv_pool_mb": engine.kv_pool.nbytes / 2**20, "engine_steps": engine.num_steps - steps_before},
    )


class _StepClock:
    """A generate() streamer that only keeps time: put() is called once with the prompt, then once per step."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_kv_bytes_per_token(model) -> int:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return kv_bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, model.dtype)


def run_hf_static(model, workload: Workload, batch_size: int, pad_token_id: int, name: str | None = None) -> RunResult:
    from transformers import GenerationConfig

    device, per_token = model.device, hf_kv_bytes_per_token(model)
    reqs = workload.requests
    token_times: list[list[float]] = []
    peak_reserved = peak_used = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    for start in range(0, len(reqs), batch_size):
        batch = reqs[start : start + batch_size]
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.tensor([[pad_token_id] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in batch], device=device)
        pad = torch.tensor([width - len(r.prompt_token_ids) for r in batch], device=device)
        mask = torch.arange(width, device=device) >= pad[:, None]
        new_tokens = max(r.max_tokens for r in batch)
        clock = _StepClock()
        # eos -1: no token ends a row early (None would fall back to the model's own EOS)
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=pad_token_id)
        model.generate(input_ids=ids, attention_mask=mask.long(), generation_config=config, streamer=clock)
        steps = clock.times[1:]  # the first put() is the prompt
        token_times += [[t - t0 for t in steps[: r.max_tokens]] for r in batch]
        peak_reserved = max(peak_reserved, len(batch) * (width + new_tokens) * per_token)
        peak_used = max(peak_used, sum(len(r.prompt_token_ids) + r.max_tokens for r in batch) * per_token)
    return result_from_token_times(name or f"hf_static_b{batch_size}", token_times, workload,
                                   cpu_s=time.process_time() - cpu0,
                                   kv_reserved_bytes=peak_reserved, kv_used_bytes=peak_used)


class HFContinuous:
    """transformers' continuous batching, with its cache sized for one workload shape.

    Its defaults size the KV cache from free memory and allocate an attention mask of
    max_batch_tokens x cache tokens, which on a CPU takes tens of seconds to fill and
    gigabytes to hold. We size the cache to fit the workload (nothing is ever evicted) and
    give it the same per-step token budget as nano_infer.
    """

    def __init__(self, model, workload: Workload, max_batch_tokens: int, page_size: int = 256):
        from transformers import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching.utils import WorkloadHints

        self.model = model
        model.destroy_cached_continuous_batching_manager()  # a manager sized for another workload
        total = sum(len(r.prompt_token_ids) + r.max_tokens for r in workload.requests)
        self.cb_config = ContinuousBatchingConfig(
            page_size=page_size, num_blocks=math.ceil(total / page_size) + len(workload.requests),
            max_batch_tokens=max_batch_tokens)
        self.hints = WorkloadHints(max_prompt_length=max(len(r.prompt_token_ids) for r in workload.requests),
                                   max_generated_length=max(r.max_tokens for r in workload.requests),
                                   num_requests=len(workload.requests))
        self.gen_config = GenerationConfig(do_sample=False, eos_token_id=-1, max_new_tokens=self.hints.max_generated_length)
        self.round = 0

    def run(self, workload: Workload, name: str = "hf_continuous") -> RunResult:
        self.round += 1
        with self.model.continuous_batching_context_manager(
                generation_config=self.gen_config, continuous_batching_config=self.cb_config,
                workload_hints=self.hints, persistent_manager=True) as manager:
            cache = manager.batch_processor.cache
            capacity = cache.num_sectors * cache.bytes_per_sector
            cpu0, t0 = time.process_time(), time.perf_counter()
            ids = [manager.add_request(r.prompt_token_ids, request_id=f"r{self.round}-{i}", max_new_tokens=r.max_tokens,
                                       record_timestamps=True, eos_token_id=-1)
                   for i, r in enumerate(workload.requests)]
            results, peak_reserved = {}, 0
            while len(results) < len(ids):
                out = manager.get_result(timeout=0.05)
                peak_reserved = max(peak_reserved, capacity - cache.compute_free_capacity(relative=False))
                if out is not None and out.is_finished():
                    if out.error:
                        raise RuntimeError(f"transformers continuous batching failed: {out.error}")
                    results[out.request_id] = out
            cpu_s = time.process_time() - cpu0
        token_times = [[t - t0 for t in results[i].timestamps] for i in ids]
        return result_from_token_times(name, token_times, workload, cpu_s=cpu_s, kv_reserved_bytes=int(peak_reserved),
                                       extra={"kv_pool_mb": cache.cache_tensor.numel() / 2**20})

    def close(self) -> None:
        self.model.destroy_cached_continuous_batching_manager()
