"""Where AsyncLLM's constraints are compiled: worker processes started by the first constrained request.

Compiling a regex or JSON Schema into a token index can take seconds or, for a hostile schema, forever:
`constrained.compile_pool` runs it in worker processes, killed past a time limit or when the client leaves.
The pool is made on first use (a server that never sees a constrained request starts no process) and
never after `close()`: a pool made then would outlive the shutdown, its workers still starting.
"""
from __future__ import annotations

import threading

from ..constrained import ConstraintLimits
from ..constrained.backends import ToLibrary, backend_for
from ..constrained.compile_pool import CompilePool
from ..constrained.constraint import compile_any, constraint_key
from ..constrained.params import CONSTRAINT_FIELDS
from ..constrained.token_index import TokenIndex
from ..engine.llm_engine import LLMEngine
from ..sampling_params import SamplingParams
from .fair_queue import FairQueue


class ConstraintCompiler:
    def __init__(self, engine: LLMEngine, tokenizer_thread: FairQueue, workers: int | None = None):
        self.engine, self._tokenizer_thread, self._workers = engine, tokenizer_thread, workers  # None: the pool's default
        self.pool: CompilePool | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def index(self, params: SamplingParams, trusted: bool = False, tenant: str | None = None) -> TokenIndex | None:
        """The constraint's token index, compiled in a worker (`trusted`: the operator's own, no time limit);
        or llguidance's GrammarIndex, checked on the tokenizer thread (its own limits bound the work), for what
        the backend sends there (under "auto", the worker says so: ToLibrary)."""
        kind = next((k for k in CONSTRAINT_FIELDS if getattr(params, k, None) is not None), None)
        backend = self.engine.constraint_backend
        if kind is not None and backend_for(kind, backend) == "guidance":
            return await self._library(params, tenant)
        if self.pool is None:
            vocab = await self._tokenizer_thread.run(None, lambda: self.engine.vocabulary)  # built once, off the loop
            with self._lock:
                if self._closed:
                    raise RuntimeError("AsyncLLM is shut down")
                if self.pool is None:
                    limits = self.engine.config.constraint_limits or ConstraintLimits()
                    self.pool = CompilePool(vocab, limits, workers=self._workers, auto=backend == "auto")
        index = await self.pool.index(params, trusted, tenant)
        return await self._library(params, tenant) if isinstance(index, ToLibrary) else index

    async def _library(self, params: SamplingParams, tenant: str | None):
        limits = self.engine.config.constraint_limits or ConstraintLimits()
        return await self._tokenizer_thread.run(tenant, lambda: compile_any(
            constraint_key(params), self.engine.vocabulary, limits, backend="guidance"))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        if self.pool is not None:
            self.pool.close()
