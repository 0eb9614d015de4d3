"""One bounded, thread-safe cache for every cache of the package.

The statistics store, the slice memo, the join cache and AutoPlan's plan history
are least-recently-used maps bounded by entries and bytes, shared by threads (a
threaded grid search), whose entries go with the dataset they were computed from.
The subtle part is written once, here:

* the budgets are read from :mod:`ilargi_sklearn._config` at every store, so a
  change of :func:`~ilargi_sklearn.set_config` takes effect at once;
* the lock guards the maps only: a value is computed outside it, and a key being
  computed by one thread is waited for by the others
  (:meth:`BoundedCache.get_or_compute`), so a threaded search computes a fold's
  statistics once;
* an entry is dropped when an object it depends on is garbage collected
  (:meth:`BoundedCache.watch`, a :func:`weakref.finalize`). A finalizer runs
  wherever the collector runs, possibly in a thread that holds the lock: it never
  waits for it, but leaves the entry on a list that the next call purges first,
  so a dead entry is never found (the id of a collected object may be reused).

Keys are tuples whose first item is the entry's *group* (a root dataset's token):
the unit that is dropped together and whose counters are reported.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["BoundedCache"]

logger = logging.getLogger(__name__)


def _accept_any(_: Any) -> bool:
    return True


def _in_group(key: tuple, group: Any) -> bool:
    # Groups are tokens (compared by identity) or ints.
    return key[0] is group or (type(group) is int and key[0] == group)


class BoundedCache:
    """A least-recently-used map bounded by entries and bytes, thread safe.

    Parameters
    ----------
    name : str
        For the log.
    max_entries : callable returning int or None, optional
        The most entries kept, read at every store (None: no bound).
    max_bytes : callable returning int or None, optional
        The most bytes kept (the sizes given to :meth:`put`), read at every store;
        an entry larger than the bound is not kept, and 0 keeps nothing.

    Notes
    -----
    Counters: ``hits`` and ``misses`` of :meth:`get` and :meth:`get_or_compute`
    (with ``count=True``), ``evictions``, in total and per group, and any named
    per-group counter of :meth:`count`.
    """

    def __init__(
        self,
        name: str,
        *,
        max_entries: Callable[[], int | None] | None = None,
        max_bytes: Callable[[], int | None] | None = None,
    ) -> None:
        self.name = name
        self._max_entries = max_entries or (lambda: None)
        self._max_bytes = max_bytes or (lambda: None)
        self._entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._inflight: dict[tuple, threading.Event] = {}
        # Per group: named counters and sets (``count``, ``note``).
        self._groups: dict[Hashable, dict[str, Any]] = {}
        self._totals = {"hits": 0, "misses": 0, "evictions": 0}
        # (id(obj), group or key) -> its finalizer, so an object is watched once.
        self._watched: dict[tuple[int, Any], weakref.finalize] = {}
        # ("group", g) or ("key", k) of collected objects, dropped by the next call.
        self._dead: list[tuple[str, Any]] = []

    # --------------------------------------------------------------- budgets
    @property
    def max_entries(self) -> int | None:
        return self._max_entries()

    @property
    def max_bytes(self) -> int | None:
        return self._max_bytes()

    @property
    def enabled(self) -> bool:
        """Whether a store may keep anything (no bound is 0)."""
        return self.max_entries != 0 and self.max_bytes != 0

    # ------------------------------------------------------------- lifecycle
    def watch(self, obj: Any, *, group: Any = None, key: tuple | None = None) -> None:
        """Drop ``group``'s entries (or the entry ``key``) when ``obj`` is
        collected. An object that cannot be weakly referenced is not watched."""
        what = ("group", group) if key is None else ("key", key)
        handle = (id(obj), what)
        with self._lock:
            known = self._watched.get(handle)
            if known is not None and known.alive:
                return
            try:
                self._watched[handle] = weakref.finalize(obj, self._collected, handle)
            except TypeError:  # pragma: no cover - not weakly referenceable
                return

    def _collected(self, handle: tuple[int, Any]) -> None:
        # From the collector: never wait for the lock (it may be held by the
        # thread the collector interrupted).
        self._dead.append(handle)
        if self._lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self._lock.release()

    def _purge(self) -> None:
        """Drop what collected objects left (call with the lock held)."""
        while self._dead:
            handle = self._dead.pop()
            known = self._watched.get(handle)
            if known is not None and not known.alive:
                del self._watched[handle]
            kind, what = handle[1]
            if kind == "key":
                self._drop(what)
            else:
                for k in [k for k in self._entries if _in_group(k, what)]:
                    self._drop(k)
                self._groups.pop(what, None)

    def _drop(self, key: tuple) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1]

    def discard_group(self, group: Any) -> None:
        """Drop ``group``'s entries and counters."""
        with self._lock:
            self._dead.append((0, ("group", group)))
            self._purge()

    def clear(self) -> None:
        """Drop every entry and counter."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._groups.clear()
            self._totals = dict.fromkeys(self._totals, 0)
            self._dead.clear()

    # ----------------------------------------------------------------- access
    def _group(self, group: Any) -> dict[str, Any]:
        counters = self._groups.get(group)
        if counters is None:
            counters = self._groups[group] = {"hits": 0, "misses": 0}
        return counters

    def _tally(self, key: tuple, what: str) -> None:
        self._totals[what] += 1
        counters = self._group(key[0])
        counters[what] = counters.get(what, 0) + 1

    def get(
        self,
        key: tuple,
        accept: Callable[[Any], bool] = _accept_any,
        *,
        count: bool = True,
        touch: bool = True,
    ) -> Any:
        """The value at ``key`` if ``accept`` takes it, else None.

        ``count``: count a hit or a miss; ``touch``: make it the most recently
        used (asking whether it is there is not using it).
        """
        with self._lock:
            self._purge()
            entry = self._entries.get(key)
            found = entry is not None and accept(entry[0])
            if count:
                self._tally(key, "hits" if found else "misses")
            if not found:
                return None
            if touch:
                self._entries.move_to_end(key)
            return entry[0]

    def holds(self, key: tuple, accept: Callable[[Any], bool] = _accept_any) -> bool:
        """Whether ``key`` holds a value that ``accept`` takes (not counted, the
        order left as it is)."""
        return self.get(key, accept, count=False, touch=False) is not None

    def put(self, key: tuple, value: Any, nbytes: int = 0) -> bool:
        """Keep ``value`` at ``key`` (``nbytes`` its size); whether it was kept."""
        max_entries, max_bytes = self.max_entries, self.max_bytes
        if max_entries == 0 or max_bytes == 0:
            return False
        if max_bytes is not None and nbytes > max_bytes:
            return False
        with self._lock:
            self._purge()
            self._drop(key)
            self._entries[key] = (value, int(nbytes))
            self._bytes += int(nbytes)
            self._evict(max_entries, max_bytes)
        return True

    def _evict(self, max_entries: int | None, max_bytes: int | None) -> None:
        while self._entries and (
            (max_entries is not None and len(self._entries) > max_entries)
            or (max_bytes is not None and self._bytes > max_bytes)
        ):
            key, (_, n) = self._entries.popitem(last=False)
            self._bytes -= n
            self._tally(key, "evictions")
            logger.debug("%s cache evicted %r", self.name, key[1:])

    def update(self, key: tuple, fn: Callable[[Any], Any], nbytes: int = 0) -> None:
        """Store ``fn(value at key or None)`` at ``key``, atomically (``fn`` runs
        under the lock: it must be quick and must not use this cache)."""
        max_entries = self.max_entries
        if max_entries == 0 or self.max_bytes == 0:
            return
        with self._lock:
            self._purge()
            old = self._entries.get(key)
            value = fn(None if old is None else old[0])
            self._drop(key)
            self._entries[key] = (value, int(nbytes))
            self._bytes += int(nbytes)
            self._evict(max_entries, self.max_bytes)

    def get_or_compute(
        self,
        key: tuple,
        compute: Callable[[], tuple[Any, int]],
        accept: Callable[[Any], bool] = _accept_any,
        what: str = "entry",
    ) -> Any:
        """The value at ``key`` if ``accept`` takes it, else ``compute()``'s value
        (``compute`` returns it and its size; stored). One thread computes a key at
        a time, the others wait for it and then look again."""
        while True:
            with self._lock:
                self._purge()
                entry = self._entries.get(key)
                if entry is not None and accept(entry[0]):
                    self._entries.move_to_end(key)
                    self._tally(key, "hits")
                    logger.debug("%s cache hit: %s %r", self.name, what, key[1:])
                    return entry[0]
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = event = threading.Event()
                    self._tally(key, "misses")
                    break
            event.wait()
        try:
            logger.debug("%s cache miss: %s %r", self.name, what, key[1:])
            value, size = compute()
            self.put(key, value, size)
            return value
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            event.set()

    # --------------------------------------------------------------- counters
    def count(self, group: Any, what: str, n: int = 1) -> None:
        """Add ``n`` to ``group``'s counter ``what``."""
        with self._lock:
            counters = self._group(group)
            counters[what] = counters.get(what, 0) + n

    def note(self, group: Any, what: str, item: Hashable) -> int:
        """Add ``item`` to ``group``'s set ``what``; the set's size."""
        with self._lock:
            seen = self._group(group).setdefault(what, set())
            seen.add(item)
            return len(seen)

    def info(self, group: Any = None) -> dict[str, Any]:
        """Entries, bytes and counters of ``group`` (of the whole cache: None)."""
        with self._lock:
            self._purge()
            if group is None:
                return {
                    "entries": len(self._entries),
                    "bytes": int(self._bytes),
                    **self._totals,
                }
            mine = [n for k, (_, n) in self._entries.items() if _in_group(k, group)]
            counters = {
                k: v
                for k, v in self._groups.get(group, {}).items()
                if not isinstance(v, set)
            }
            return {
                "entries": len(mine),
                "bytes": int(sum(mine)),
                "hits": 0,
                "misses": 0,
                **counters,
            }

    def keys(self, group: Any = None) -> list[tuple]:
        """The keys held (of ``group``), least recently used first."""
        with self._lock:
            self._purge()
            return [k for k in self._entries if group is None or _in_group(k, group)]

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        with self._lock:
            self._purge()
            return int(self._bytes)

    def __len__(self) -> int:
        with self._lock:
            self._purge()
            return len(self._entries)
