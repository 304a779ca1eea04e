"""Copy or recompute: what it costs to bring K/V back, from rates measured on this machine.

A block of K/V can come back two ways: copied from the host tier (bytes over the copy path),
or recomputed by a prefill (tokens through the model). Which is cheaper depends on the model
and the machine: on a CPU a copy is a memcpy at several GB/s and recomputing a token runs the
whole model, so copying wins at any length; on a GPU a prefill runs at thousands of tokens per
second and the copy crosses PCIe, so for a small model recompute can win (vLLM v0 swapped only
beam-search groups and recomputed everything else).

The engine measures both rates as it runs (`KVOffloader` feeds them in) and decides each
preemption with `prefer_swap`: swapping pays the copy out now and back in later; recomputing
pays a prefill of the tokens no cache would serve.
"""
from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest measurement in the running averages: a rate settles within ~10 steps.
EMA_WEIGHT = 0.2


def swap_seconds(num_blocks: int, bytes_per_block: int, copy_bytes_per_s: float) -> float:
    """A swap copies the blocks out now and back in on re-admission: twice the bytes."""
    return 2 * num_blocks * bytes_per_block / copy_bytes_per_s


def recompute_seconds(num_tokens: int, prefill_tokens_per_s: float) -> float:
    """A recompute prefills again every token no cache would serve."""
    return num_tokens / prefill_tokens_per_s


def prefer_swap(num_blocks: int, num_recompute_tokens: int, bytes_per_block: int,
                copy_bytes_per_s: float, prefill_tokens_per_s: float) -> bool:
    """Swap only when the round trip of the bytes is strictly cheaper than the prefill it saves."""
    return (swap_seconds(num_blocks, bytes_per_block, copy_bytes_per_s)
            < recompute_seconds(num_recompute_tokens, prefill_tokens_per_s))


@dataclass
class CostModel:
    """Running averages of the two rates, and the rule that reads them."""

    bytes_per_block: int  # K and V of one block, every layer (and the draft model's, when there is one)
    copy_bytes_per_s: float | None = None  # device <-> host tier copies
    prefill_tokens_per_s: float | None = None  # forward passes that were mostly prompt tokens

    def observe_copy(self, nbytes: int, seconds: float) -> None:
        if nbytes and seconds > 0:
            self.copy_bytes_per_s = _ema(self.copy_bytes_per_s, nbytes / seconds)

    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        if num_tokens and seconds > 0:
            self.prefill_tokens_per_s = _ema(self.prefill_tokens_per_s, num_tokens / seconds)

    def prefer_swap(self, num_blocks: int, num_recompute_tokens: int) -> bool:
        """Until both rates are measured, swap: it never loses work already done."""
        if self.copy_bytes_per_s is None or self.prefill_tokens_per_s is None:
            return True
        return prefer_swap(num_blocks, num_recompute_tokens, self.bytes_per_block, self.copy_bytes_per_s,
                           self.prefill_tokens_per_s)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new
