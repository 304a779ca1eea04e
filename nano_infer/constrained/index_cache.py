"""The token indexes a vocabulary keeps: each owner's apart, within a memory budget.

A cache shared by every client of a server is a side channel and a lever: a guessed schema
answered at once says another tenant compiled it, and one tenant's many cheap regexes push
another's entries out. So each owner (a server's tenant; None for callers without one, such as
the sync `LLM`) has entries of its own, found and evicted through its own requests only. The
operator's constraints, compiled ahead (`SHARED`), are read by every owner and evicted by none:
no tenant chose them.

An entry is counted at the most its index can hold (`TokenIndex.max_bytes`: its arrays and every
mask row it may keep), so the count stays true however the index is used later. A put keeps its
owner within `per_owner` entries and 1/OWNER_SHARE of the budget, and the cache within the budget,
by evicting the owner's own least recently used entries; when the owner has none left, the new
index is not kept (the requests that asked for it still use it, and it is freed with them).
An entry unused for `idle_seconds` is gone at whoever's request notices: when that happens
depends on its owner's requests and the clock, never on another owner's, and an owner that went
quiet does not hold memory for good.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

SHARED = ("shared",)  # the operator's owner: a tenant's name is a string (or None), never a tuple
OWNER_SHARE = 4  # an owner keeps at most a quarter of the budget, so four busy owners all keep entries


class Sized(Protocol):
    """What the cache keeps: a TokenIndex (which imports the vocabulary that holds this cache)."""

    @property
    def max_bytes(self) -> int: ...


Index = TypeVar("Index", bound=Sized)


@dataclass(eq=False)
class _Entry:
    index: Sized
    nbytes: int
    used: float


@dataclass(eq=False)
class IndexCache:
    per_owner: int = 32  # entries one owner keeps
    idle_seconds: float = 600.0
    clock: Callable[[], float] = time.monotonic
    _owners: dict = field(default_factory=dict, repr=False)  # owner -> OrderedDict[key, _Entry], least recent first
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, owner: Hashable, key: Hashable) -> Sized | None:
        """The index kept for `key` that `owner` may use (the operator's, else its own), or None."""
        with self._lock:
            now = self.clock()
            for who in (SHARED, owner):
                entries = self._owners.get(who)
                entry = entries.get(key) if entries else None
                if entry is None:
                    continue
                if who is not SHARED and now - entry.used > self.idle_seconds:
                    self._drop(who, key)
                    continue
                entries.move_to_end(key)
                entry.used = now
                return entry.index
            return None

    def put(self, owner: Hashable, key: Hashable, index: Index, budget: int) -> Index:
        """Keep `index` for `owner` within `budget` bytes, and return the index to use for `key`:
        one the owner already keeps wins (two requests compiled it at once)."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            entries = self._owners.setdefault(owner, OrderedDict())
            kept = entries.get(key)
            if kept is not None:
                entries.move_to_end(key)
                kept.used = now
                return kept.index
            entries[key] = _Entry(index, index.max_bytes, now)
            while entries and self._over(owner, entries, budget):
                self._drop(owner, next(iter(entries)))
            return index

    def owned(self, owner: Hashable) -> list:
        """The keys `owner` keeps, least recently used first."""
        with self._lock:
            return list(self._owners.get(owner, ()))

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for entries in self._owners.values() for e in entries.values())

    def _over(self, owner, entries: OrderedDict, budget: int) -> bool:
        if len(entries) > self.per_owner:
            return True
        if owner is SHARED:  # the operator's few constraints: counted, never refused for the budget
            return False
        mine = sum(e.nbytes for e in entries.values())
        total = sum(e.nbytes for entries in self._owners.values() for e in entries.values())
        return mine > budget // OWNER_SHARE or total > budget

    def _expire(self, now: float) -> None:
        for owner, entries in list(self._owners.items()):
            while entries and owner is not SHARED and now - next(iter(entries.values())).used > self.idle_seconds:
                self._drop(owner, next(iter(entries)))

    def _drop(self, owner, key) -> None:
        entries = self._owners[owner]
        del entries[key]
        if not entries:
            del self._owners[owner]
