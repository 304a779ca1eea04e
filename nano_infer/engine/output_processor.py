"""The output side of a step: logit rows in, tokens appended, RequestOutputs out (vLLM's output processor).

After the forward pass every scheduled entry is one of three things: a prefill chunk short of
the prompt's end (no logits: its K/V is simply computed now), an entry whose rows a plug-in
claims (a speculative verify), or an entry that samples one token. An entry of a request that
asks for prompt logprobs also has the rows of the prompt positions it computed: they are scored
first (logprobs.py). Sampling is one batched draw; a request with n > 1 forks its other samples
off the first right here, once its prompt is computed, so they all draw from the same logit row.
Each token then goes through the same path: logprobs, constraint, detokenizer, stop checks.
Anything that raises while handling one request ends that request alone (`RequestOutput.error`);
the step goes on for the others.

It is also what a plug-in changes the step's sequences through (`core.plugin.Sequences`): append a
token, fork, advance or finish a sequence. It reads the engine's table of requests and
never writes it: the engine adds and removes requests.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

from ..core.batch import SchedulerOutput
from ..core.plugin import EnginePlugin, StepContext
from ..core.request import Request
from ..core.sequence import Sequence
from ..outputs import CompletionOutput, Logprob, RequestOutput
from .custom_logits import PersistentBatch
from .logprobs import decode_entries, logprob_entries, score_prompts
from .sampling import sample
from .scheduler import Scheduler
from .sequences import new_sequence

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class OutputProcessor:
    def __init__(self, requests: Mapping[str, Request], scheduler: Scheduler, tokenizer: PreTrainedTokenizerBase,
                 eos_token_ids: set[int], max_model_len: int, device: torch.device):
        self.requests = requests  # the engine's table of live requests, read-only here
        self.scheduler = scheduler
        self.tier = scheduler.kv.tier  # the host tier (chapter 12; a stand-in without one) reports what requests moved
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.device = device
        self.num_generated_tokens = 0
        self.touched: dict[str, Request] = {}  # requests that got tokens (or failed) this step
        self.custom: PersistentBatch | None = None  # vLLM's custom logits processors, when the engine has any

    # -- one step ---------------------------------------------------------------------------------
    def process(self, step: StepContext, logits: torch.Tensor, plugins: list[EnginePlugin]) -> None:
        """Score prompt rows, hand each entry's sample rows to the plug-in that claims them, sample the rest."""
        self.touched = {}
        self._first_scheduled(step.batch, step.start)
        samplers, rows, claimed, scored, row = [], [], {}, [], 0
        for entry in step.batch.scheduled:
            prompt_rows, sample_row = entry.num_prompt_logit_rows, row + entry.num_prompt_logit_rows
            if prompt_rows:
                scored.append((entry, row, prompt_rows))
            owner = next((p for p in plugins if p.claims(entry)), None) if plugins else None
            sample_rows = entry.num_sample_rows
            if owner is not None:
                claimed.setdefault(owner, []).append((entry, sample_row))
            else:
                if sample_rows:
                    samplers.append(entry.seq)
                    rows.append(sample_row)
                self.scheduler.advance(entry.seq, entry.end)
            row = sample_row + sample_rows
        if scored:
            score_prompts(logits, scored, self.token_texts)
        if samplers:
            self._sample(logits, samplers, rows)
        for plugin, items in claimed.items():
            plugin.process(items, logits, self)

    def _first_scheduled(self, batch: SchedulerOutput, start: float) -> None:
        """A request's first step: when it ran, and how much of the prompt the caches served (the first
        sequence starts past it: `KVManager.acquire`)."""
        for entry in batch.scheduled:
            m = self.requests[entry.seq.request_id].metrics
            if m.first_scheduled_time is None:
                m.first_scheduled_time = start
                m.num_cached_tokens = min(entry.start, entry.seq.num_prompt_tokens)

    def _sample(self, logits: torch.Tensor, samplers: list[Sequence], rows: list[int]) -> None:
        for i, seq in enumerate(list(samplers)):
            if seq.num_pending_forks:
                children = self._fork_samples(self.requests[seq.request_id], seq)
                samplers += children
                rows += [rows[i]] * len(children)
        sample_logits = logits if rows == list(range(len(logits))) else logits[rows]  # no copy in the usual case
        try:  # logprobs stay the model's (vLLM's raw logprobs): the processors' logits are only drawn from
            drawn_from = sample_logits if self.custom is None else self.custom(sample_logits, samplers)
            tokens = draw(drawn_from, samplers, self.eos_token_ids)
        except Exception as e:  # noqa: BLE001 - the operator's processor failed: this step's rows fail, the engine goes on
            tokens = [e] * len(samplers)
        logprobs = token_logprobs(sample_logits, samplers, tokens)
        if logprobs:
            decode_entries(list(logprobs.values()), self.token_texts)
        now, touched = time.perf_counter(), self.touched
        for i, (seq, token) in enumerate(zip(samplers, tokens)):  # `isolated`, written out: once per token
            req = touched[seq.request_id] = self.requests[seq.request_id]
            if seq.is_finished:  # a sibling failed the request earlier in this step
                continue
            try:
                if isinstance(token, Exception):
                    raise token
                state = seq.sampling
                if state.logprobs is not None:
                    state.logprobs.append(logprobs[i])
                    state.cumulative_logprob = (state.cumulative_logprob or 0.0) + logprobs[i][token].logprob
                self.append_token(seq, token, now)
            except Exception as e:  # noqa: BLE001 - this request fails; the step goes on for the others
                self.fail(req, e)

    @functools.cached_property
    def token_texts(self) -> list[str]:
        """Each token id's own text, for Logprob.decoded_token: decoded once, when logprobs are first asked for."""
        return self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])

    def isolated(self, seq: Sequence, fn: Callable[..., None], *args) -> None:
        """Run `fn(*args)` for one sequence's rows; if it raises, its request fails alone."""
        req = self.touched[seq.request_id] = self.requests[seq.request_id]
        if seq.is_finished:  # a sibling failed the request earlier in this step
            return
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - this request fails; the step goes on for the others
            self.fail(req, e)

    def fail(self, req: Request, error: Exception) -> None:
        """Finish `req` with `error`: its blocks go back to the pool, the step's other requests go on."""
        req.error = error
        for seq in req.seqs:
            seq.num_pending_forks = 0
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")

    def _fork_samples(self, req: Request, parent: Sequence) -> list[Sequence]:
        """n > 1: the other samples share the prompt's blocks with the first (copy-on-write later)."""
        children = []
        for index in range(1, parent.num_pending_forks + 1):
            child = new_sequence(req, index, self.device, self.tokenizer, parent)
            self.scheduler.fork(parent, child)
            children.append(child)
        req.seqs += children
        parent.num_pending_forks = 0
        return children

    # -- what a plug-in may do to a sequence (core.plugin.Sequences) ------------------------------
    def fork(self, seq: Sequence) -> Sequence:
        child = new_sequence(self.requests[seq.request_id], seq.index, self.device, self.tokenizer, seq)
        self.scheduler.fork(seq, child)
        return child

    def advance(self, seq: Sequence, num_computed_tokens: int) -> None:
        self.scheduler.advance(seq, num_computed_tokens)

    def finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)

    def record_tokens(self, req: Request, num_tokens: int, now: float) -> None:
        self.num_generated_tokens += num_tokens
        self._record_token_time(req, now)

    def _record_token_time(self, req: Request, now: float) -> None:
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
        req.metrics.token_times.append(now)

    # -- one token --------------------------------------------------------------------------------
    def append_token(self, seq: Sequence, token: int, now: float) -> None:
        """Append a token to `seq`: metrics, constraint, text, then whether it ends the sequence."""
        req = self.requests[seq.request_id]
        seq.token_ids.append(token)
        self.num_generated_tokens += 1
        if seq.index == 0:
            self._record_token_time(req, now)
        state = seq.sampling
        if state.constraint is not None:
            state.constraint.advance(token)
        reason, stop_reason = self._stop_string(seq, token) if state.detokenizer is not None else (None, None)
        if reason is None:
            reason, stop_reason = self._stop(seq, token)
        if reason is not None:
            state.stop_reason = stop_reason
            if state.detokenizer is not None and not isinstance(stop_reason, str):
                state.detokenizer.flush()
            self.scheduler.finish(seq, reason)

    @staticmethod
    def _stop_string(seq: Sequence, token: int) -> tuple[str | None, str | None]:
        """Detokenize; a stop string is searched only where the new text could complete it: O(stop length) per
        token, and not before min_tokens (vLLM's rule)."""
        detokenizer = seq.sampling.detokenizer
        delta = detokenizer.add(token)
        text, params = detokenizer.text, seq.params
        for stop in params.stop if delta and seq.num_output_tokens >= params.min_tokens else ():
            at = text.find(stop, max(0, len(text) - len(delta) - len(stop) + 1))
            if at >= 0:
                detokenizer.text = text[: at + len(stop) if params.include_stop_str_in_output else at]
                return "stop", stop
        return None, None

    def _stop(self, seq: Sequence, token: int) -> tuple[str | None, int | None]:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop", token
        if not params.ignore_eos and token in self.eos_token_ids:
            return "stop", None
        if seq.sampling.constraint is not None and seq.sampling.constraint.is_done:
            return "stop", None
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return "length", None
        if len(seq) >= self.max_model_len:
            return "length", None
        return None, None

    # -- outputs ----------------------------------------------------------------------------------
    def step_outputs(self) -> list[RequestOutput]:
        """A RequestOutput for each request touched this step that finished, or that streams."""
        outputs, now = [], time.perf_counter()
        for req in self.touched.values():
            done = req.finished
            if done:
                req.metrics.finished_time = now
            if done or req.stream:
                outputs.append(self.output(req))
        return outputs

    def output(self, req: Request) -> RequestOutput:
        outs = [CompletionOutput(s.index, self._text(s), list(s.output_token_ids), s.finish_reason,
                                 s.sampling.stop_reason, None if s.sampling.logprobs is None else list(s.sampling.logprobs),
                                 s.sampling.cumulative_logprob)
                for s in sorted(req.seqs, key=lambda s: s.index)]
        m = req.metrics
        m.num_preemptions = sum(s.num_preemptions for s in req.seqs)
        self.tier.report(req.request_id, m, done=req.finished)
        scores = req.seqs[0].sampling.prompt_logprobs  # the first sample scores the prompt
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, req.finished, req.metrics, req.error,
                             None if scores is None else list(scores))

    def _text(self, seq: Sequence) -> str:
        if seq.sampling.detokenizer is not None:
            return seq.sampling.detokenizer.text
        if seq.is_finished and seq.params.detokenize:  # detokenize=False (vLLM's): token ids only
            return self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=seq.params.skip_special_tokens)
        return ""


def draw(logits: torch.Tensor, samplers: list[Sequence], eos_token_ids=()) -> list[int | Exception]:
    """One token per row. If the batched draw raises, each row is drawn alone, so the error
    lands on the request that caused it and every other row still gets its token."""
    try:
        return sample(logits, samplers, eos_token_ids)
    except Exception:  # noqa: BLE001
        tokens = []
        for i, seq in enumerate(samplers):
            try:
                tokens += sample(logits[i : i + 1], [seq], eos_token_ids)
            except Exception as e:  # noqa: BLE001
                tokens.append(e)
        return tokens


def token_logprobs(logits: torch.Tensor, samplers: list[Sequence], tokens: list) -> dict[int, dict[int, Logprob]]:
    """For the rows whose request asked for logprobs: {token: Logprob} of the sampled token and the
    k most likely, from the raw logits (computed only for those rows)."""
    rows = [i for i, seq in enumerate(samplers) if seq.params.logprobs is not None and isinstance(tokens[i], int)]
    if not rows:
        return {}
    entries = logprob_entries(logits[rows], [tokens[i] for i in rows], [samplers[i].params.logprobs for i in rows])
    return dict(zip(rows, entries))
