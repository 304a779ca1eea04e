"""Compiling constraints for a server: in worker processes, bounded in time, cancellable, cached.

A JSON Schema or regex from a client can take seconds to minutes to compile (see `limits`),
and a thread cannot be stopped once it runs Python code. So a server compiles in a small pool
of worker processes (pebble's ProcessPool) at a lower CPU priority than the engine:

- a compile that runs past `ConstraintLimits.timeout` is killed, and the request gets a
  ValueError naming the limit;
- a client that disconnects while its compile waits or runs cancels it (the worker is
  killed and replaced) unless another request is waiting for the same constraint;
- results are cached by the constraint's canonical text (`constraint_key`) in the vocabulary's
  cache, per tenant (`index_cache`): a tenant never gets, joins or evicts another's compile, so
  timing a guessed schema reveals nothing of what another tenant asked. Only the operator's
  constraints (trusted, compiled ahead, and json_object) are shared. Failures are remembered per
  tenant too, so a schema that was refused once is refused at once the next time;
- a JSON Schema whose regex would be too long is refused before it reaches a worker
  (`schema_size`): its length is computed, not written;
- with `auto` (backend "auto"), a worker answers ToLibrary for a constraint the DFA should not take
  (constraint.compile_index); the caller compiles that one with llguidance, and the answer is kept like a
  failure is, per owner, so the same constraint is not sent to a worker again;
- at most `max_pending` different constraints compile or wait at once; more raise
  `CompilePoolBusy` (a server answers 503);
- one tenant (a server's client) may have at most `per_tenant` of them (default: half the
  workers, at least one), so one client's slow schemas never hold every worker and another
  client's trivial schema finds one free. A request past its tenant's share waits for one of
  that tenant's compiles to end (a client that sends three schemas at once gets them compiled
  one after another), for at most one compile's time limit; then `TenantCompilesBusy` (429).

Workers are forked from a single-threaded fork server, never from the server process itself,
whose engine and HTTP threads could hold locks at the moment of a fork.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace

import pebble

from .backends import ToLibrary
from .constraint import cache_index, check_key, compile_index, constraint_key
from .index_cache import SHARED
from .limits import ConstraintLimits
from .token_index import TokenIndex
from .vocabulary import TokenVocabulary

FAILURES_KEPT = 256  # constraints remembered as refused, and as sent to llguidance
TIMEOUT_REMEMBERED = 60.0  # seconds a timed-out constraint is refused without trying again
WORKER_NICENESS = 10  # compiles yield the CPU to the engine thread
# {"type": "object"} (response_format json_object) is not a client's invention: its cost is known and bounded
# (json_schema.ANY_JSON_DEPTH caps its nesting; `serve` compiles it at start), so it gets no time limit, like a
# trusted constraint.
ANY_OBJECT_KEY = ("json_schema", '{"type":"object"}')


class CompilePoolBusy(RuntimeError):
    """Too many different constraints are compiling or waiting to."""


class TenantCompilesBusy(CompilePoolBusy):
    """This tenant has its share of the compiles running already."""


@dataclass(eq=False)
class _Job:
    work: concurrent.futures.Future  # pebble's: cancelling it kills the worker running it
    done: concurrent.futures.Future  # resolved with a TokenIndex usable in this process, or the error
    waiters: int = 0
    tenant: str | None = None  # who started it: the compile counts toward their share


def default_workers() -> int:
    """Two compile workers at least (one tenant's slow schema must not hold the only one), at most 4."""
    return max(2, min(4, (os.cpu_count() or 2) // 2))


class CompilePool:
    def __init__(self, vocab: TokenVocabulary, limits: ConstraintLimits, workers: int | None = None,
                 max_pending: int = 16, per_tenant: int | None = None, auto: bool = False):
        self.vocab, self.limits, self.max_pending, self.auto = vocab, limits, max_pending, auto
        workers = workers or default_workers()
        self.per_tenant = per_tenant or max(1, workers // 2)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        self._pool = pebble.ProcessPool(max_workers=workers, initializer=_init_worker,
                                        initargs=(vocab.token_bytes, vocab.eos_token_ids), context=context)
        self._lock = threading.Lock()
        self._jobs: dict[tuple, _Job] = {}  # (owner, key) -> its compile
        self._turns: dict[str, list[tuple]] = {}  # tenant -> (loop, asyncio.Event) of its requests waiting for a share
        self._failures: OrderedDict[tuple, tuple[ValueError, float]] = OrderedDict()  # (owner, key) -> (error, until)
        self._routed: OrderedDict[tuple, ToLibrary] = OrderedDict()  # (owner, key) -> auto's answer
        self.started: Counter = Counter()  # compiles sent to a worker, by owner: what each tenant made the pool do

    async def index(self, params, trusted: bool = False, tenant: str | None = None) -> TokenIndex | ToLibrary | None:
        """The token index `params` asks for, None for an unconstrained request, ToLibrary (with `auto`) for one
        llguidance should compile.

        Raises ValueError for a constraint that is invalid or over the limits (including the
        time limit), CompilePoolBusy when too many compile at once. Cancelling the awaiting
        task cancels the compile unless another request of the same owner waits for it.
        `trusted` (the operator's own constraints, compiled ahead) lifts the time limit and shares
        the result with every tenant. Anything else is `tenant`'s own: compiled, cached and counted
        toward its share for it alone.
        """
        if not params.constrained:
            return None
        # a schema's canonical text, and its regex's length, take time that grows with what a client sent: off the
        # event loop. Megabytes, and schemas that stand for gigabytes, never travel to a worker.
        key = await asyncio.to_thread(self._checked_key, params)
        shared = trusted or key == ANY_OBJECT_KEY
        owner = SHARED if shared else tenant
        index = self.vocab.index_cache.get(owner, key) or self._routed.get((owner, key))
        if index is not None:
            return index
        job = await self._turn((owner, key), None if shared else self.limits.timeout, tenant)
        try:
            return await asyncio.shield(asyncio.wrap_future(job.done))
        except asyncio.CancelledError:
            self._leave((owner, key), job)
            raise

    def _checked_key(self, params) -> tuple[str, str]:
        key = constraint_key(params)
        check_key(key, self.limits)
        return key

    async def _turn(self, owned: tuple, timeout: float | None, tenant: str | None) -> _Job:
        """`_join`, waiting while the tenant's share of the compiles is taken: woken when one of them ends,
        for at most one compile's time limit, after which TenantCompilesBusy."""
        deadline = time.monotonic() + self.limits.timeout
        while True:
            left = deadline - time.monotonic()
            turn = (asyncio.get_running_loop(), asyncio.Event()) if left > 0 else None
            job = self._join(owned, timeout, tenant, turn)
            if job is not None:
                return job
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation (a client hanging up)
                async with asyncio.timeout(left):  # that lands as the event is set, and the request then compiles
                    await turn[1].wait()
            except TimeoutError:
                pass  # once more, without waiting: the compile, or the 429

    def _join(self, owned: tuple, timeout: float | None, tenant: str | None, turn: tuple | None = None) -> _Job | None:
        """The compile of `owned` (owner, key): the one running for that owner, else a new one. Past the tenant's
        share: None with `turn` (loop, event) registered to be set when one of its compiles ends, else raises."""
        with self._lock:
            failure = self._failures.get(owned)
            if failure is not None:
                error, until = failure
                if time.monotonic() < until:
                    raise ValueError(str(error))
                del self._failures[owned]
            job = self._jobs.get(owned)
            if job is None:
                if len(self._jobs) >= self.max_pending:
                    raise CompilePoolBusy(f"{len(self._jobs)} constraints are compiling already; try again shortly")
                if tenant is not None and sum(j.tenant == tenant for j in self._jobs.values()) >= self.per_tenant:
                    if turn is not None:
                        self._turns.setdefault(tenant, []).append(turn)
                        return None
                    raise TenantCompilesBusy(f"{self.per_tenant} constraint(s) of yours are compiling already, your "
                                             f"share of the compile workers; retry when they are done")
                work = self._pool.schedule(_compile, args=(owned[1], self.limits, self.auto), timeout=timeout)
                job = self._jobs[owned] = _Job(work, concurrent.futures.Future(), tenant=tenant)
                self.started[owned[0]] += 1
                work.add_done_callback(lambda w: self._finished(owned, job))
            job.waiters += 1
            return job

    def _finished(self, owned: tuple, job: _Job) -> None:
        """Runs on the pool's thread when a compile ends: cache, remember failures, wake the waiters."""
        work, done = job.work, job.done
        with self._lock:
            if self._jobs.get(owned) is job:
                del self._jobs[owned]
        self._wake(job.tenant)
        if work.cancelled():
            done.cancel()
            return
        error = work.exception()
        if error is None and isinstance(work.result(), ToLibrary):
            with self._lock:
                self._routed[owned] = work.result()
                if len(self._routed) > FAILURES_KEPT:
                    self._routed.popitem(last=False)
            done.set_result(work.result())
            return
        if error is None:
            index = replace(work.result(), token_bytes=self.vocab.token_bytes)
            done.set_result(cache_index(owned[1], self.vocab, index, owned[0], self.limits))
            return
        forever = float("inf")
        if isinstance(error, TimeoutError):
            error, until = ValueError(
                f"compiling the constraint took longer than {self.limits.timeout:g} s (ConstraintLimits.timeout); "
                f"simplify the schema or regex"), time.monotonic() + TIMEOUT_REMEMBERED
        elif isinstance(error, pebble.ProcessExpired):
            error, until = ValueError(f"compiling the constraint ended its worker process (exit code "
                                      f"{error.exitcode}); it is likely too large"), forever
        elif isinstance(error, ValueError):
            until = forever
        else:  # a bug, not the client's input: report it as it is, remember nothing
            done.set_exception(error)
            return
        with self._lock:
            self._failures[owned] = (error, until)
            if len(self._failures) > FAILURES_KEPT:
                self._failures.popitem(last=False)
        done.set_exception(error)

    def _leave(self, owned: tuple, job: _Job) -> None:
        """A waiter went away; the last one to go cancels the compile (pebble kills its worker)."""
        with self._lock:
            job.waiters -= 1
            if job.waiters > 0 or job.done.done():
                return
            if self._jobs.get(owned) is job:
                del self._jobs[owned]
        job.work.cancel()
        self._wake(job.tenant)

    def _wake(self, tenant: str | None) -> None:
        """A compile of `tenant`'s ended: its requests waiting for a share try again (from any thread)."""
        with self._lock:
            turns = self._turns.pop(tenant, [])
        for loop, event in turns:
            if not loop.is_closed():  # a request that gave up and whose loop has ended since
                loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=5)


_VOCAB: TokenVocabulary | None = None


def _init_worker(token_bytes, eos_token_ids) -> None:
    global _VOCAB
    os.nice(WORKER_NICENESS)
    _VOCAB = TokenVocabulary(token_bytes, eos_token_ids)


def _compile(key, limits: ConstraintLimits, auto: bool) -> TokenIndex | ToLibrary:
    index = compile_index(key, _VOCAB, limits, auto)
    if isinstance(index, ToLibrary):
        return index
    return replace(index, token_bytes=None)  # the caller has the vocabulary; don't send it back
