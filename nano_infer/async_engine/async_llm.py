"""AsyncLLM: the engine on a thread of its own, streaming tokens to asyncio code.

    llm = AsyncLLM()
    async for out in llm.generate("Hello", SamplingParams(max_tokens=32)):
        print(out.outputs[0].text)     # the whole reply so far (vLLM's default, output_kind CUMULATIVE)

`LLMEngine.step()` is a blocking forward pass (milliseconds on a CPU, tens of
milliseconds for a big model on a GPU). A server that called it on its event loop would
freeze every connection for that long, so the engine gets one background thread that owns
it, and everything else talks to that thread through two one-way channels:

    event loop thread(s)                           engine thread (the only one touching the engine)
    generate() --- inbox.put(AddRequest(...)) --->  takes the inbox between steps: add / abort
    await stream.take() <-- call_soon_threadsafe -- step() -> RequestOutput per request

The inbox is a `queue.Queue`, made for threads: a lock inside, and a blocking `get` that lets an idle
engine thread sleep until work arrives; each message is a dataclass saying what it carries (inbox.py).
The way back is a one-item mailbox per request (`Stream`) that the engine thread never touches: it
belongs to one event loop, and asyncio objects are not thread-safe. A future resolved from another
thread schedules its waiter with `loop.call_soon`, which does not wake a loop asleep in `select()`
(idle: exactly when a client waits for its next token), so the client hangs: a deadlock with no lock
in sight. `loop.call_soon_threadsafe(stream.offer, item)` writes a byte to the loop's self-pipe, which
wakes it; the offer then runs on the loop's own thread. The mailbox keeps only the newest output
(outputs are cumulative): a client that stops reading holds one output, not a queue of them.

Requests wait for the engine in `Admission`, per tenant, and join it by turns within shares (seats,
prompt tokens, logprobs), so one tenant's flood pushes another's first token back a step or two at most.

Nothing slow in a request's preparation runs on the engine thread, where it would pause every stream.
Tokenizing (a prompt, a chat template) runs on a tokenizer thread of its own, queued per tenant and
served in turn (FairQueue), after cheap counts (characters, messages, token ids) have refused any prompt
too long for the model. Compiling a regex or JSON Schema into a token index can take seconds or, for a
hostile schema, forever: worker processes do it, killed past a time limit or when the client leaves
(`constrained.compile_pool`). The engine thread receives token ids and a compiled index.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import uuid
from collections.abc import AsyncIterator

from ..engine.llm_engine import LLMEngine
from ..engine.stats import EngineStats
from ..llm import LLM
from ..outputs import RequestOutput, RequestOutputKind
from ..sampling_params import SamplingParams
from .admission import LOGPROB_SHARE, Admission, logprob_entries
from .chat_limits import check_prompt_size, tokens_per_message
from .compiler import ConstraintCompiler
from .fair_queue import FairQueue
from .inbox import AbortRequest, AddRequest, Shutdown
from .streams import Deltas, Stream, output_kind

TOKENIZE_BACKLOG = 1024  # prompts one tenant may have waiting for the tokenizer (a full request holds 256)
TOKENIZE_DUTY = 0.5  # of the tokenizer thread's time, per tenant: rendering a chat template holds the GIL


class EngineUnavailable(RuntimeError):
    """The engine cannot serve any request (its thread ended, a tensor-parallel worker died)."""


class AsyncLLM:
    def __init__(self, model: str | None = None, engine: LLMEngine | None = None, compile_workers: int | None = None,
                 tokenize_backlog: int = TOKENIZE_BACKLOG, **engine_options):
        self.engine = engine if engine is not None else LLMEngine(model, **engine_options)
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        # prompts waiting to be tokenized, per tenant; past tokenize_backlog, TenantBacklogFull (a 429)
        self._tokenizer_thread = FairQueue(1, tokenize_backlog, "tokenize", duty=TOKENIZE_DUTY)
        tokens_per_message(self.tokenizer)  # measured once now, so the size check before tokenizing only counts
        self._compiler = ConstraintCompiler(self.engine, self._tokenizer_thread, compile_workers)  # pool: at first use
        self._inbox: queue.Queue = queue.Queue()
        scheduler = self.engine.scheduler  # engine thread only:
        self._admission = Admission(scheduler.max_num_seqs, scheduler.max_num_batched_tokens, LOGPROB_SHARE)
        self._streams: dict[str, Stream] = {}  # requests admitted or waiting for admission; engine thread only
        self._lock = threading.Lock()  # orders shutdown against new requests
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="nano_infer-engine", daemon=True)
        self._thread.start()

    apply_chat_template = LLM.apply_chat_template  # the same template code as the sync API

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> AsyncLLM:
        """vLLM's constructor from an AsyncEngineArgs (or EngineArgs): the engine is LLMEngine.from_engine_args'."""
        return cls(engine=LLMEngine.from_engine_args(engine_args), **kwargs)

    @property
    def stats(self) -> EngineStats:
        """The engine's record of its last step, safe from any thread: a new one per step, never changed."""
        return self.engine.stats

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive()

    def failure(self) -> str | None:
        """Why the engine cannot serve any request, or None while it can (what /health reports)."""
        if not self._thread.is_alive():
            return "the engine thread has stopped"
        executor = self.engine.executor
        if executor is not None and (executor.error or any(p.exitcode is not None for p in executor.procs)):
            return executor.error or "a tensor-parallel worker process is gone"
        return None

    # -- the caller's side (any event loop) ----------------------------------------------------
    async def generate(self, prompt: str | list[int] | list[dict], sampling_params: SamplingParams | None = None,
                       request_id: str | None = None, *, stream: bool | None = None, tenant: str | None = None,
                       priority: int = 0, params: SamplingParams | None = None) -> AsyncIterator[RequestOutput]:
        """Run one request; yield RequestOutputs as vLLM does, each holding what `params.output_kind` says:
        CUMULATIVE (the default) every sample's text, token ids and logprobs so far, DELTA only what is new since
        the last output (`"".join(...)` of the texts is the whole reply; only samples with something new are
        included), FINAL_ONLY one output, at the end. n > 1 and beam rows: per output index (beam search cannot
        stream DELTA: a row's hypothesis may be replaced by another). `stream`, this package's older switch,
        wins when given: True is DELTA, False FINAL_ONLY. Streamed text stops short of a possible stop string.
        `prompt` is a string, a list of token ids, or chat messages ([{"role", "content"}]).
        Bad input raises ValueError at the first iteration. Leaving the loop early (break,
        cancellation, a disconnected client) aborts the request and frees its KV blocks.
        `tenant` and `priority` decide when it joins the engine (Admission). `sampling_params` is vLLM's
        name, `params` this package's older one.
        """
        if params is not None and sampling_params is not None:
            raise TypeError("give sampling_params or params (the same argument), not both")
        params = sampling_params if sampling_params is not None else params
        if self._closed:
            raise EngineUnavailable("AsyncLLM is shut down")
        failure = self.failure()
        if failure is not None:
            raise EngineUnavailable(f"the engine cannot serve: {failure}")
        params = params or SamplingParams()
        kind = output_kind(params, stream)
        token_ids = await self.encode(prompt, tenant)
        index = await self._compiler.index(params, tenant=tenant) if params.constrained else None
        s = Stream(request_id or uuid.uuid4().hex, asyncio.get_running_loop())
        self._send(AddRequest(s, tenant, priority, prompt if isinstance(prompt, str) else None, token_ids, params,
                              stream_outputs=kind is not RequestOutputKind.FINAL_ONLY, constraint_index=index))
        deltas = Deltas(params)
        done = False
        try:
            while not done:
                item = await s.take()  # the newest output: a consumer that fell behind skips the rest
                if isinstance(item, BaseException):
                    done = True
                    raise item
                done = item.finished
                out = deltas.next(item)
                if out is not None:
                    yield out if kind is RequestOutputKind.DELTA else deltas.so_far(item)
        finally:
            if not done:
                self._send(AbortRequest(s))

    async def encode(self, prompt: str | list[int] | list[dict], tenant: str | None = None) -> list[int]:
        """Token ids of a text or a chat, on the tokenizer thread in the tenant's turn; a prompt too long for the
        model is refused by counting first (ValueError)."""
        check_prompt_size(self.engine, prompt)
        return await self._tokenizer_thread.run(tenant, self._prompt_ids, prompt)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.encode(prompt)
        return self.apply_chat_template(prompt) if isinstance(prompt[0], dict) else prompt

    async def precompile(self, params: SamplingParams) -> None:
        """Compile a constraint ahead of the requests that will use it, with no time limit (the
        operator's own): `nano-infer serve` does so for `response_format: json_object`, whose
        regex takes several seconds. A request for it meanwhile waits for this compile."""
        await self._compiler.index(params, trusted=True)

    def _send(self, message: AddRequest | AbortRequest) -> None:
        with self._lock:
            if not self._closed:
                self._inbox.put(message)
            elif isinstance(message, AddRequest):
                raise RuntimeError("AsyncLLM is shut down")

    def shutdown(self, timeout: float | None = 30) -> None:
        """Stop the engine thread; requests still running end with a RuntimeError."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._inbox.put(Shutdown())
        self._thread.join(timeout)
        self._tokenizer_thread.close()
        self._compiler.close()  # and none is made after

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException = RuntimeError("AsyncLLM was shut down")
        try:
            # sleep only when idle: nothing in the engine and nothing waiting for admission (a request the
            # engine's last finished one made room for is admitted at once, not at the next message)
            while self._take_inbox(block=not self.engine.has_unfinished_requests() and not self._admission.queues):
                self._admit()
                if not self.engine.has_unfinished_requests():
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as e:  # noqa: BLE001 - the requests get it; the loop lives on
                    failure = self.failure()
                    self._fail_all(e if failure is None else EngineUnavailable(f"the engine cannot serve: {failure}"))
                    continue
                for out in outputs:
                    self._deliver(out)
        except BaseException as e:  # a bug here must not leave clients waiting forever
            error = e
            raise
        finally:
            with self._lock:
                self._closed = True
            self._fail_all(error)

    def _take_inbox(self, block: bool) -> bool:
        """Handle every message waiting in the inbox; when idle, first sleep until one comes.
        Returns False on shutdown."""
        try:
            message = self._inbox.get(block=block)
            while not isinstance(message, Shutdown):
                if isinstance(message, AbortRequest):
                    self._abort(message.stream)
                else:
                    self._queue(message)
                message = self._inbox.get_nowait()
            return False
        except queue.Empty:
            return True

    def _queue(self, add: AddRequest) -> None:
        """Put a request in line for Admission (or refuse an id already in use)."""
        s = add.stream
        if s.request_id in self._streams or s.request_id in self.engine.requests:
            self._push(s, ValueError(f"request id {s.request_id!r} is already in use"))
            return
        ids = len(add.prompt_token_ids)
        s.pending = self._admission.put(add.tenant or "", add.priority, getattr(add.params, "n", 1), add, s.request_id,
                                        ids, logprob_entries(add.params, ids, self.engine.max_model_len))
        self._streams[s.request_id] = s

    def _abort(self, s: Stream) -> None:
        """Its caller left: drop the request, whether the engine runs it or Admission still holds it."""
        if self._streams.get(s.request_id) is s:  # not a rejected duplicate of a live id
            self._forget(s)
            self.engine.abort_request(s.request_id)

    def _admit(self) -> None:
        """Add to the engine what Admission lets in now."""
        for item in self._admission.take(self.engine.requests):
            add: AddRequest = item.message
            try:
                self.engine.add_request(add.stream.request_id, add.prompt, add.params,
                                        prompt_token_ids=add.prompt_token_ids, stream=add.stream_outputs,
                                        constraint_index=add.constraint_index)
            except Exception as e:  # noqa: BLE001 - bad input goes back to its caller only
                self._forget(add.stream)
                self._push(add.stream, e)

    def _forget(self, s: Stream) -> None:
        """The request is done with the engine (or never reached it): release its place."""
        del self._streams[s.request_id]
        if s.pending.cancelled:
            return
        s.pending.cancelled = True
        if s.pending.admitted:
            self._admission.done(s.pending)

    def _deliver(self, out: RequestOutput) -> None:
        s = self._streams.get(out.request_id)
        if s is None:
            return
        if out.finished:
            self._forget(s)
        if out.error is not None:
            self._push(s, out.error)
        elif not self._push(s, out) and not out.finished:  # its event loop is gone
            self._forget(s)
            self.engine.abort_request(out.request_id)

    def _push(self, s: Stream, item) -> bool:
        try:
            s.loop.call_soon_threadsafe(s.offer, item)
            return True
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return False

    def _fail_all(self, error: BaseException) -> None:
        """A step raised: every request in the engine was part of it, or queued behind a
        state the step left half-done. Abort them all (freeing their blocks) and tell their
        callers, those still waiting for admission too; the engine is then empty and clean."""
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
        for s in list(self._streams.values()):
            self._forget(s)
            self._push(s, error)

