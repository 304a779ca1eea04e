"""What `kv_cache_dtype` costs in accuracy and buys in capacity (chapter 14; the README's figures).

    python -m nano_infer.bench.kv_dtype                      # SmolLM2-135M (the GGUF of `make models`)
    python -m nano_infer.bench.kv_dtype --model <dir or .gguf> --rounds 5

The measurements, each against kv_cache_dtype="auto" on the same weights:

- accuracy: a text the model did not write, scored teacher-forced (prompt log-probs, `SamplingParams.
  prompt_logprobs`) in prefill chunks of 16 tokens, so almost every attention read goes through the cache
  and its quantization. Per dtype: mean and largest |log-prob difference| of the text's tokens in nats,
  and how often the most likely next token is the same (`accuracy`).
- keys by hand: the model's real K (every layer, after rotary) quantized with one scale per token and
  head, the same after the Hadamard rotation (what the engine does) and with one scale per channel per
  block of 16 tokens (KIVI's choice for keys), the relative error of each; then the same K with one channel
  made an outlier (`k_scale_study`); and, in one dense pass written apart from the engine, K/V rounded
  everywhere against each query's own block exact, the engine's rule (`open_block_study`).
- capacity: the tokens a pool of the same bytes holds per dtype (`pool_tokens`), and a batch of
  requests at a budget where bfloat16 preempts: preemptions and time per dtype, interleaved rounds, the
  ratio of medians with its verdict (`compare_preemption`).
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass, field

import torch

from ..core.utils import cdiv
from ..kv.quant import dequantize, kv_bytes_per_token, quantize, rotation
from ..models.attention import AttentionMetadata, DenseAttention, SeqSlice
from ..models.loader import load_config, resolve_model
from ..sampling_params import SamplingParams
from .llamacpp import DEFAULT_GGUF
from .prefix import SCENE_NOTES, questions
from .timing import Comparison, interleaved

DTYPES = ("int8", "fp8_e4m3", "fp8_e5m2")
OUTLIER_CHANNEL = 5  # the channel `with_outlier_channel` scales
CHUNK = 16  # prefill chunk (tokens per step) of the scoring engines: most keys a token attends to are cached


def evaluation_token_ids(tokenizer, num_tokens: int = 512) -> list[int]:
    """At least `num_tokens` (then cut to it) of plain English the model did not write: the scene notes and the
    characters' lines of the prefix-cache benchmark, one per line."""
    lines, n = list(SCENE_NOTES), 8
    while True:
        ids = tokenizer.encode("\n".join(lines + questions(n)), add_special_tokens=False)
        if len(ids) >= num_tokens or n >= 96:
            return ids[:num_tokens]
        n += 8


def scoring_llm(model, kv_cache_dtype: str = "auto", chunk: int = CHUNK, **options):
    """An engine that scores a prompt `chunk` tokens a step (the step's token budget), with no prefix cache."""
    from ..llm import LLM

    options = dict(dict(max_num_seqs=4, kv_cache_memory=64 << 20), **options)
    return LLM(str(model), kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=chunk, prefix_cache=None, **options)


@dataclass
class Scores:
    logprobs: list[float]  # of each token after the first, given the ones before it
    top1: list[int]  # the most likely token at each of those positions


def teacher_forced_logprobs(llm, token_ids: list[int]) -> Scores:
    """The text scored by its own prefill (no token generated counts): one request, prompt_logprobs=1."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
    (out,) = llm.generate(prompt_token_ids=[token_ids], sampling_params=params, use_tqdm=False)
    entries = out.prompt_logprobs[1:]
    return Scores([e[t].logprob for e, t in zip(entries, token_ids[1:])],
                  [next(tid for tid, lp in e.items() if lp.rank == 1) for e in entries])


def accuracy(reference: Scores, candidate: Scores) -> dict:
    """Mean and largest |log-prob difference| (nats), and the share of positions whose most likely token agrees."""
    diffs = [abs(a - b) for a, b in zip(reference.logprobs, candidate.logprobs)]
    agree = sum(a == b for a, b in zip(reference.top1, candidate.top1))
    return dict(mean_abs_dlogprob=statistics.fmean(diffs), max_abs_dlogprob=max(diffs),
                top1_agreement=agree / len(reference.top1), tokens=len(diffs))


def compare_accuracy(model, token_ids: list[int], dtypes=DTYPES, **options) -> dict[str, dict]:
    """`accuracy` of each kv_cache_dtype against "auto", the same text, the same weights."""
    reference = teacher_forced_logprobs(scoring_llm(model, "auto", **options), token_ids)
    return {d: accuracy(reference, teacher_forced_logprobs(scoring_llm(model, d, **options), token_ids)) for d in dtypes}


# -- keys by hand: per-token vs per-channel scales ---------------------------------------------------------
class _Recorder(DenseAttention):
    """Dense attention that keeps each layer's K after rotary (what a cache stores): [T, kv_heads, head_dim]."""

    def __init__(self):
        super().__init__(None)
        self.keys: list[torch.Tensor] = []

    def attend(self, layer, q, k, v):
        self.keys.append(k.float().clone())
        return super().attend(layer, q, k, v)


@torch.inference_mode()
def dense_pass(llm, token_ids: list[int], backend: DenseAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_ids` as one prompt through the model, attention by `backend`, no cache: (ids, final hidden states)."""
    ids = torch.tensor(token_ids, device=llm.engine.device)
    backend.meta = AttentionMetadata(slot_mapping=None, prefills=[SeqSlice(0, len(ids), len(ids))])
    return ids, llm.engine.model(ids, torch.arange(len(ids), device=ids.device), backend)


def model_keys(llm, token_ids: list[int]) -> list[torch.Tensor]:
    """Per layer, the keys of `token_ids` as one prompt: [T, kv_heads, head_dim] in float32."""
    dense_pass(llm, token_ids, recorder := _Recorder())
    return recorder.keys


def per_token(k: torch.Tensor, kv_cache_dtype: str, rotate: bool = False) -> torch.Tensor:
    """K read back with one scale per token and head; `rotate`: turned by `quant.rotation` first and back after
    reading (the engine's layout), else as it comes."""
    turn = rotation(k.shape[-1]) if rotate else torch.eye(k.shape[-1])
    return dequantize(*quantize(k.float() @ turn, kv_cache_dtype), torch.float32) @ turn.T


def per_channel(k: torch.Tensor, kv_cache_dtype: str, block_size: int = 16) -> torch.Tensor:
    """K read back with one scale per channel and head per block of `block_size` tokens (KIVI's layout for keys; a
    trailing partial block is left out, so the result may be shorter)."""
    T = k.shape[0] // block_size * block_size
    blocks = k[:T].reshape(T // block_size, block_size, *k.shape[1:]).permute(0, 2, 3, 1)  # [n, KVH, D, tokens]
    back = dequantize(*quantize(blocks, kv_cache_dtype), torch.float32)
    return back.permute(0, 3, 1, 2).reshape(T, *k.shape[1:])


def relative_error(k: torch.Tensor, back: torch.Tensor, channels: torch.Tensor) -> float:
    """||K - K'|| / ||K|| over the given channels (a bool mask over head_dim)."""
    k = k[: back.shape[0], ..., channels]
    return float((back[..., channels] - k).norm() / k.norm())


def with_outlier_channel(k: torch.Tensor, channel: int = OUTLIER_CHANNEL, factor: float = 20.0) -> torch.Tensor:
    """K with one channel (of every head) `factor` times larger: the outlier channels KIVI and KVQuant report."""
    return k * torch.where(torch.arange(k.shape[-1], device=k.device) == channel, factor, 1.0)


def k_scale_study(keys: list[torch.Tensor], dtypes=("int8", "fp8_e4m3"), block_size: int = 16) -> list[dict]:
    """Per dtype, the relative error of K (mean over layers) with per-token scales (plain and rotated, the engine's)
    and per-channel-per-block ones, for the model's keys and the same with an outlier channel planted: over all
    channels, and over the others (an outlier makes a per-token scale coarse for every channel beside it). The
    largest channel-to-median amax ratio says how outlying the channels are."""
    others = torch.ones(keys[0].shape[-1], dtype=torch.bool)
    others[OUTLIER_CHANNEL] = False
    everything = torch.ones_like(others)
    rows = []
    for label, ks in (("model K", keys), ("outlier K", [with_outlier_channel(k) for k in keys])):
        amax = torch.stack([k.abs().amax(dim=(0, 1)) for k in ks])  # [layers, head_dim]
        spread = float((amax.amax(-1) / amax.median(-1).values).max())
        for d in dtypes:
            backs = {"per_token": [per_token(k, d) for k in ks], "rotated": [per_token(k, d, rotate=True) for k in ks],
                     "per_channel": [per_channel(k, d, block_size) for k in ks]}
            row = dict(keys=label, kv_cache_dtype=d, channel_amax_over_median=spread)
            for name, channels in (("", everything), ("_other_channels", others)):
                for layout, back in backs.items():
                    row[layout + name] = statistics.fmean(relative_error(k, b, channels) for k, b in zip(ks, back))
            rows.append(row)
    return rows


# -- what an exact open block would buy: a simulation, not the engine ----------------------------------------
class _OpenBlock(DenseAttention):
    """One dense pass: each query sees earlier blocks' K/V rounded as the pool keeps them (rotated, per token) and, if
    `own_exact`, its own block's exact: the rule of kv/open_blocks.py, computed without the pool (the tests' oracle)."""

    def __init__(self, kv_cache_dtype: str | None, own_exact: bool = False, block_size: int = 16):
        super().__init__(None)
        self.kv_cache_dtype, self.own_exact, self.block_size = kv_cache_dtype, own_exact, block_size

    def attend(self, layer, q, k, v):
        if self.kv_cache_dtype is None:  # the reference: exact everywhere
            return super().attend(layer, q, k, v)
        groups, pos = q.shape[1] // k.shape[1], torch.arange(q.shape[0], device=q.device)
        heads = lambda x: x.float().repeat_interleave(groups, 1).transpose(0, 1)  # noqa: E731  [H, T, D]
        kr, vr = (heads(per_token(x, self.kv_cache_dtype, rotate=True)) for x in (k, v))
        own = (pos[:, None] // self.block_size == pos[None, :] // self.block_size) & self.own_exact
        qh = q.float().transpose(0, 1) / q.shape[-1] ** 0.5
        p = torch.where(own, qh @ heads(k).mT, qh @ kr.mT).masked_fill(pos[None, :] > pos[:, None], -torch.inf)
        p = p.softmax(-1)
        return ((p * own) @ heads(v) + (p * ~own) @ vr).transpose(0, 1).to(q.dtype)


@torch.inference_mode()
def open_block_study(llm, token_ids: list[int], dtypes=("int8", "fp8_e4m3")) -> dict[str, dict[str, dict]]:
    """Per dtype, `accuracy` against exact K/V with all K/V rounded, and with each query's own block exact."""
    def scores(backend):
        ids, hidden = dense_pass(llm, token_ids, backend)
        lp = llm.engine.model.compute_logits(hidden).float().log_softmax(-1)
        return Scores(lp[:-1].gather(1, ids[1:, None])[:, 0].tolist(), lp[:-1].argmax(-1).tolist())

    ref, cases = scores(_OpenBlock(None)), (("rounded", False), ("own block exact", True))
    return {d: {k: accuracy(ref, scores(_OpenBlock(d, own))) for k, own in cases} for d in dtypes}


# -- capacity -------------------------------------------------------------------------------------------
def pool_tokens(llm) -> int:
    return llm.engine.kv.num_blocks * llm.engine.kv.block_size


def model_kv_bytes_per_token(model, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """K/V bytes per token of `model` (a folder, hub id or .gguf) from its config alone."""
    config = load_config(*resolve_model(model))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return kv_bytes_per_token(config.num_hidden_layers, config.num_key_value_heads, head_dim, dtype, kv_cache_dtype)


@dataclass
class PreemptionResult:
    kv_cache_memory: int
    tokens_needed: int  # every request at its full length at once
    pool_tokens: dict[str, int]
    preemptions: dict[str, int]  # per dtype, in the first round (each round runs the same work)
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per dtype, one per round

    def comparison(self, dtype: str, baseline: str = "auto") -> Comparison:
        """The baseline's time over `dtype`'s, said as every timed comparison is (`timing.Comparison`)."""
        return Comparison(baseline, dtype, self.seconds[baseline], self.seconds[dtype], 1.0, f"{dtype} faster",
                          f"{dtype} slower")


def compare_preemption(model, dtypes=("auto", "int8", "fp8_e4m3"), num_requests: int = 16, prompt_tokens: int = 64,
                       max_tokens: int = 64, pool_fraction: float = 0.55, rounds: int = 5, dtype: str = "bfloat16",
                       **options) -> PreemptionResult:
    """`num_requests` requests queued at once, in a pool of `pool_fraction` of what all of them need at full
    length in `dtype` (so "auto" preempts and the 8-bit pools, ~1.9x the tokens, preempt less or not at all).
    Every round runs each engine once on the same prompts (greedy, ignore_eos), the order rotated."""
    from ..llm import LLM

    torch_dtype = getattr(torch, dtype)
    block = 16
    needed = num_requests * cdiv(prompt_tokens + max_tokens, block) * block
    budget = int(model_kv_bytes_per_token(model, torch_dtype) * needed * pool_fraction)
    llms = {d: LLM(str(model), dtype=dtype, kv_cache_dtype=d, kv_cache_memory=budget, prefix_cache=None,
                   max_num_seqs=num_requests, **options) for d in dtypes}
    ids = evaluation_token_ids(llms[dtypes[0]].tokenizer, prompt_tokens * 4)
    prompts = [(ids[i:] + ids[:i])[:prompt_tokens] for i in range(0, num_requests * 7, 7)]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    preemptions: dict[str, int] = {}

    def run(d):
        def go():
            outs = llms[d].generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
            preemptions.setdefault(d, sum(o.metrics.num_preemptions for o in outs))
        return go

    timings = interleaved({d: run(d) for d in dtypes}, rounds=rounds, warmup=1)
    return PreemptionResult(budget, needed, {d: pool_tokens(llm) for d, llm in llms.items()}, preemptions,
                            timings.samples)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(DEFAULT_GGUF), help="folder, hub id or .gguf (default: SmolLM2-135M GGUF)")
    p.add_argument("--tokens", type=int, default=512, help="length of the scored text")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the preemption workload")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    weights = dict(dtype="float32", quantization="none") if args.model.endswith(".gguf") else dict(dtype="float32")
    ref = scoring_llm(args.model, "auto", **weights)
    token_ids = evaluation_token_ids(ref.tokenizer, args.tokens)
    result = dict(model=args.model, accuracy=compare_accuracy(args.model, token_ids, **weights))
    for d, a in result["accuracy"].items():
        print(f"{d:9s} vs auto over {a['tokens']} tokens: mean |dlogprob| {a['mean_abs_dlogprob']:.4f} nats "
              f"(max {a['max_abs_dlogprob']:.3f}), top-1 agreement {a['top1_agreement']:.1%}")
    result["k_scales"] = k_scale_study(model_keys(ref, token_ids))
    for r in result["k_scales"]:
        errs = [" / ".join(f"{r[k + s]:.4f}" for k in ("per_token", "rotated", "per_channel"))
                for s in ("", "_other_channels")]
        print(f"{r['keys']:9s} {r['kv_cache_dtype']:8s} relative error per token / rotated / per channel per block "
              f"{errs[0]}; other channels {errs[1]} (channel amax / median {r['channel_amax_over_median']:.1f})")
    result["open_block"] = open_block_study(ref, token_ids)
    for d, r in result["open_block"].items():
        print(f"{d:9s} one dense pass: " + "; ".join(
            f"{k}: {a['mean_abs_dlogprob']:.4f} nats, top-1 {a['top1_agreement']:.1%}" for k, a in r.items()))
    run = compare_preemption(args.model, rounds=args.rounds, **{k: v for k, v in weights.items() if k != "dtype"})
    print(f"KV budget {run.kv_cache_memory / 2**20:.2f} MiB for a workload needing {run.tokens_needed:,} tokens:")
    for d in run.seconds:
        line = (f"  {d:9s} {run.pool_tokens[d]:6,} tokens in the pool, {run.preemptions[d]:3} preemptions, "
                f"{statistics.median(run.seconds[d]):.2f} s")
        if d != "auto":
            line += "; " + run.comparison(d).text(unit="s", scale=1)
        print(line)
    result["preemption"] = vars(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
