"""Sufficient statistics of row slices, cached on a dataset's lineage.

The fits of a hyper-parameter search share their statistics: every candidate of a
cross-validation fold needs the same gram ``T^T S T`` and ``T^T S Y`` of the fold's
training rows. :func:`ilargi_sklearn.utils._stats.centered_gram` keeps the additive
raw sums of each (root dataset, row subset, weights, target) here, so a search
computes each fold's statistics once, and derives the centered figures from them.

This module is the storage: a bounded least-recently-used map of host arrays, the
lineage of the operators that :func:`~ilargi_sklearn.utils._validation.validate_X`
hands out (an operator does not know the dataset it came from), and the counters
that :meth:`~ilargi_sklearn.MultiSourceDataset.cache_info` reports. Entries of a
root dataset are dropped when its operator is garbage collected, as in the
materialization cache (``_cache.py``). Nothing here is pickled with a dataset: a
worker process starts with its own, empty cache.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ilargi_sklearn._backend._namespace import is_numpy_namespace, to_numpy
from ilargi_sklearn._backend._ops import nbytes
from ilargi_sklearn.multisource._cache import _total_memory
from ilargi_sklearn.multisource._operators import AffineOperator

__all__ = [
    "Lineage",
    "clear_statistics_cache",
    "digest",
    "lineage_of",
    "register_lineage",
    "set_statistics_cache",
    "statistics_cache_info",
    "statistics_cached",
]

logger = logging.getLogger(__name__)

# The key's stand-in for "all rows of the root" and for unit weights.
ROOT = "root"
UNIT = "unit"


def _default_max_bytes() -> int:
    # Grams are parameter-sized (8 d^2 bytes): a sixteenth of the memory holds
    # thousands of folds of a few hundred features.
    return _total_memory() // 16


def digest(a: Any) -> str:
    """A content digest of an array (any namespace): shape, dtype and bytes.

    Costs one pass over ``a`` (and a copy to the host for a device array), far less
    than the product it saves.
    """
    h = np.ascontiguousarray(to_numpy(a))
    # SHA-256: collision resistant, and where the CPU has SHA instructions about
    # twice as fast as BLAKE2b (1.6 MB: 8 ms against 17 ms on a 2-core EPYC).
    m = hashlib.sha256()
    m.update(repr((h.shape, h.dtype.str)).encode())
    m.update(memoryview(h).cast("B"))
    return m.hexdigest()[:32]


class Lineage:
    """Where an operator's matrix comes from: rows of a root dataset's operator.

    ``rows`` None means all rows of the root, in order. :meth:`key` identifies the
    matrix exactly: the root's token (a new one for every scaled, cast, moved or
    transformed dataset), the row subset, the strategy (a materialized operator
    sums in another order than the factorized one), dtype and device.
    """

    __slots__ = (
        "_rows_key",
        "device",
        "dtype",
        "n_root",
        "root_ref",
        "rows",
        "strategy",
        "token",
        "variant",
    )

    def __init__(
        self,
        token: Any,
        rows: np.ndarray | None,
        root: Any,
        strategy: str,
        dtype: str,
        device: str,
    ) -> None:
        self.token = token
        self.rows = rows
        self.root_ref = weakref.ref(root)
        self.n_root = int(root.n_rows)
        self.strategy = strategy
        self.dtype = dtype
        self.device = device
        self._rows_key: str | None = ROOT if rows is None else None
        # "" for the rows of the root's own operator; else the implicit scaling
        # applied on top of them (see ``scaled``): no downdating from the root.
        self.variant = ""

    def scaled(self, op: Any) -> Lineage:
        """The lineage of ``op``, an :class:`AffineOperator` over this one's
        operator: the same rows under ``op``'s scale and offset (the digests of
        both are part of the key, so it stays exact)."""
        out = Lineage(
            self.token, self.rows, self.root, self.strategy, self.dtype, self.device
        )
        out._rows_key = self._rows_key
        out.variant = f"{self.variant}|affine:{digest(op.scale)}:{digest(op.offset)}"
        return out

    @property
    def root(self) -> Any:
        """The root's operator (None once collected)."""
        return self.root_ref()

    @property
    def rows_key(self) -> str:
        # Digested on first use: validate_X registers every operator it hands
        # out (predict too), and only a fit's statistics need the key.
        if self._rows_key is None:
            self._rows_key = digest(self.rows)
        return self._rows_key

    def key(self, rows_key: str | None = None) -> tuple:
        return (
            self.token,
            self.rows_key if rows_key is None else rows_key,
            self.strategy,
            self.dtype,
            self.device,
            self.variant,
        )


# Operator -> Lineage. Weak keys: the registry never keeps an operator alive, and a
# slice's operator lives as long as the slice (or the fit) that holds it.
_LINEAGE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LINEAGE_LOCK = threading.Lock()


def _device_name(op: Any) -> str:
    if is_numpy_namespace(op.xp):
        return "cpu"
    return f"{op.xp.__name__}:{op.device}"


def register_lineage(op: Any, ds: Any, strategy: str = "factorized") -> None:
    """Record that ``op`` is ``ds``'s matrix (computed with ``strategy``).

    Called where an estimator turns a dataset into its operator
    (``validate_X``); operators that were never registered (plain arrays,
    operators derived inside a fit) are not cached. A dataset whose lineage does
    not match its operator (shape, dtype, namespace) is not registered.
    """
    token = getattr(ds, "_root_token", None)
    root = getattr(ds, "_root_operator", None)
    # In-memory namespaces only (NumPy, CuPy, array_api_strict: modules): a Dask
    # operator's digests would compute its arrays on the cluster.
    if token is None or root is None or not isinstance(op.xp, types.ModuleType):
        return
    rows = getattr(ds, "_root_rows", None)
    if (
        root.n_cols != op.n_cols
        or np.dtype(root.dtype) != np.dtype(op.dtype)
        or root.xp is not op.xp
        or (rows is None and root.n_rows != op.n_rows)
        or (rows is not None and np.shape(rows) != (op.n_rows,))
    ):
        return
    if rows is not None:
        rows = np.asarray(rows)
    if _registered(op, token, rows, strategy) is not None:
        return  # the same slice fitted again (a search's next candidate): keep its digest
    if isinstance(op, AffineOperator):
        base = lineage_of(op.base)
        if base is not None:
            # A scaler fitted on a fold gives every candidate of a pipeline the same
            # scale and offset over the same fold operator: key by those, not by
            # the scaled dataset's own (new) root, so the candidates share.
            _store(op, base.scaled(op))
            return
    lineage = Lineage(
        token, rows, root, strategy, np.dtype(op.dtype).str, _device_name(op)
    )
    _store(op, lineage)
    _STATS.watch(token, root)


def _registered(op: Any, token: Any, rows: Any, strategy: str) -> Lineage | None:
    """``op``'s lineage if it is already registered for these rows (the same
    index array) of ``token``'s root with ``strategy``, unscaled; else None."""
    known = lineage_of(op)
    if (
        known is not None
        and known.token is token
        and known.rows is rows
        and known.strategy == strategy
        and not known.variant
    ):
        return known
    return None


def _store(op: Any, lineage: Lineage) -> None:
    try:
        with _LINEAGE_LOCK:
            _LINEAGE[op] = lineage
    except TypeError:  # pragma: no cover - an operator that cannot be weakly keyed
        pass


def lineage_of(op: Any) -> Lineage | None:
    """The lineage registered for ``op`` (None: not cacheable)."""
    try:
        with _LINEAGE_LOCK:
            lineage = _LINEAGE.get(op)
    except TypeError:  # pragma: no cover
        return None
    if lineage is None or lineage.root is None:
        return None
    return lineage


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    downdates: int = 0
    fallbacks: int = 0
    large_slices: set = field(default_factory=set)


class _StatsCache:
    """LRU of raw sums, keyed by tuples that start with the root's token.

    Bounded by ``max_bytes``; an entry larger than the bound is not kept. The lock
    guards the maps only: statistics are computed outside it, and a key being
    computed by one thread is waited for by the others (a threaded grid search
    runs the candidates of a fold at the same time).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = _default_max_bytes() if max_bytes is None else max_bytes
        self._entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._counters: dict[int, tuple[Any, _Counters]] = {}
        self._inflight: dict[tuple, threading.Event] = {}
        self._watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Tokens of collected roots whose entries could not be dropped at once (the
        # finalizer ran while the lock was held): dropped by the next call.
        self._dead: list[Any] = []

    # -------------------------------------------------------------- lifecycle
    def watch(self, token: Any, root: Any) -> None:
        """Drop ``token``'s entries when ``root`` (its operator) is collected."""
        with self._lock:
            if root in self._watched:
                return
            self._watched[root] = True
        weakref.finalize(root, self.discard, token)

    def discard(self, token: Any) -> None:
        self._dead.append(token)
        if self._lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self._lock.release()

    def _purge(self) -> None:
        while self._dead:
            token = self._dead.pop()
            for key in [k for k in self._entries if k[0] is token]:
                self._bytes -= self._entries.pop(key)[1]
            self._counters.pop(id(token), None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._counters.clear()
            self._dead.clear()

    # ---------------------------------------------------------------- access
    def counters(self, token: Any) -> _Counters:
        """The counters of ``token`` (call with the lock held)."""
        entry = self._counters.get(id(token))
        if entry is None or entry[0] is not token:
            entry = (token, _Counters())
            self._counters[id(token)] = entry
        return entry[1]

    def count(self, token: Any, what: str) -> None:
        with self._lock:
            c = self.counters(token)
            setattr(c, what, getattr(c, what) + 1)

    def note_large_slice(self, token: Any, rows_key: str) -> int:
        """Record a slice of at least half its root; the number of distinct ones."""
        with self._lock:
            seen = self.counters(token).large_slices
            seen.add(rows_key)
            return len(seen)

    def peek(self, key: tuple, accept: Callable[[Any], bool]) -> Any:
        """The entry at ``key`` if ``accept`` takes it (no counting, no waiting)."""
        with self._lock:
            self._purge()
            entry = self._entries.get(key)
            if entry is None or not accept(entry[0]):
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def get_or_compute(
        self,
        key: tuple,
        accept: Callable[[Any], bool],
        compute: Callable[[], tuple[Any, int]],
        what: str,
    ) -> Any:
        """The entry at ``key`` if ``accept`` takes it, else ``compute()``'s value
        (stored). One thread computes a key at a time; the others wait for it."""
        token = key[0]
        while True:
            with self._lock:
                self._purge()
                entry = self._entries.get(key)
                if entry is not None and accept(entry[0]):
                    self._entries.move_to_end(key)
                    self.counters(token).hits += 1
                    logger.debug("statistics cache hit: %s %s", what, _show(key))
                    return entry[0]
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = event = threading.Event()
                    break
            event.wait()
        try:
            with self._lock:
                self.counters(token).misses += 1
            logger.debug("statistics cache miss: %s %s", what, _show(key))
            value, size = compute()
            self.put(key, value, size)
            return value
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            event.set()

    def put(self, key: tuple, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            self._purge()
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                evicted, (_, n) = self._entries.popitem(last=False)
                self._bytes -= n
                logger.debug("statistics cache evicted %s", _show(evicted))

    def holds(self, key: tuple, accept: Callable[[Any], bool]) -> bool:
        """Whether ``key`` holds an entry that ``accept`` takes (no counting, and
        the LRU order is left as it is: asking is not using)."""
        with self._lock:
            self._purge()
            entry = self._entries.get(key)
            return entry is not None and accept(entry[0])

    def info(self, token: Any) -> dict[str, Any]:
        with self._lock:
            self._purge()
            mine = [(k, n) for k, (_, n) in self._entries.items() if k[0] is token]
            entry = self._counters.get(id(token))
            c = entry[1] if entry is not None and entry[0] is token else _Counters()
            return {
                "entries": len(mine),
                "bytes": int(sum(n for _, n in mine)),
                "hits": c.hits,
                "misses": c.misses,
                "downdates": c.downdates,
                "fallbacks": c.fallbacks,
                "budget_bytes": int(self.max_bytes),
                "total_bytes": int(self._bytes),
            }


def _show(key: tuple) -> str:
    """A key for the log: everything but the token (an anonymous object)."""
    return repr(key[1:])


_STATS = _StatsCache()


class _SliceMemo:
    """The row slices of a search, taken again by every candidate.

    scikit-learn's searches draw their folds once and hand the same index arrays to
    every candidate (``X[train]``, ``X[test]``): the slice of a dataset by the same
    integer array is kept and given again, with what hangs on it (its operator's
    lineage and digest, the planner's figures of it), instead of gathering the
    base rows and digesting the rows anew per candidate. An entry is used only
    while its index array is alive and equal to a copy taken when it was stored
    (a changed array misses). Bounded by ``size`` entries and the statistics
    cache's budget in gathered bytes (off when that is 0); an entry goes with its
    dataset or its index array. Cleared with the statistics cache.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, int], tuple] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, ds: Any, key: Any) -> Any:
        if not _memoizable(key):
            return None
        with self._lock:
            entry = self._entries.get((id(ds), id(key)))
            if entry is None:
                return None
            ds_ref, key_ref, copy, out, _ = entry
            if ds_ref() is not ds or key_ref() is not key:
                return None
            self._entries.move_to_end((id(ds), id(key)))
        # Outside the lock: one pass over the indices, far below a gather's.
        return out if np.array_equal(copy, key) else None

    def put(self, ds: Any, key: Any, out: Any, nbytes: int) -> None:
        if not _memoizable(key) or nbytes > _STATS.max_bytes:
            return  # (with sharing off, max_bytes is 0: nothing is kept)
        k = (id(ds), id(key))
        try:
            ds_ref = weakref.ref(ds, lambda _: self.discard(k))
            key_ref = weakref.ref(key, lambda _: self.discard(k))
        except TypeError:  # pragma: no cover
            return
        with self._lock:
            # Entries whose callback found the lock taken.
            for dead in [
                e for e, v in self._entries.items() if v[0]() is None or v[1]() is None
            ]:
                self._bytes -= self._entries.pop(dead)[4]
            old = self._entries.pop(k, None)
            if old is not None:
                self._bytes -= old[4]
            self._entries[k] = (ds_ref, key_ref, key.copy(), out, nbytes)
            self._bytes += nbytes
            while len(self._entries) > self.size or self._bytes > _STATS.max_bytes:
                self._bytes -= self._entries.popitem(last=False)[1][4]

    def discard(self, k: tuple[int, int]) -> None:
        # From a weakref callback: never wait (a collection inside a held lock).
        if self._lock.acquire(blocking=False):
            try:
                old = self._entries.pop(k, None)
                if old is not None:
                    self._bytes -= old[4]
            finally:
                self._lock.release()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def _memoizable(key: Any) -> bool:
    # What the splitters hand over: 1-D integer arrays (masks and slices are cheap
    # to recognize but rarer; lists cannot be weakly referenced); and only while
    # sharing is on.
    return (
        _STATS.max_bytes > 0
        and isinstance(key, np.ndarray)
        and key.ndim == 1
        and key.dtype.kind in "iu"
    )


_SLICES = _SliceMemo()


def cached_slice(ds: Any, key: Any, take: Callable[[], Any]) -> Any:
    """``ds[key]``: the slice kept for this dataset and index array, else
    ``take()`` (kept when ``key`` is an integer array and sharing is on)."""
    out = _SLICES.get(ds, key)
    if out is None:
        out = take()
        _SLICES.put(ds, key, out, _own_bytes(out))
    return out


def _own_bytes(ds: Any) -> int:
    """Bytes a slice holds of its own: its operator's, less the sources it shares
    with its root (a factorized slice's joined sources; what is left is its base
    rows and index vectors, or a matrix slice's rows)."""
    op = ds.operator
    total = int(op.nbytes)
    mine, root = _factorized(op), _factorized(getattr(ds, "_root_operator", None))
    if mine is None or root is None:
        return total
    shared = {id(t.S) for t in root.terms}
    seen: set[int] = set()
    for t in mine.terms:
        if id(t.S) in shared and id(t.S) not in seen:
            seen.add(id(t.S))
            total -= nbytes(t.S)
    return total


def _factorized(op: Any) -> Any:
    """The factorized matrix under ``op``'s implicit layers (None: there is none)."""
    while op is not None and not hasattr(op, "terms"):
        op = getattr(op, "base", None)
    return op


def set_statistics_cache(max_bytes: int | None = None) -> None:
    """Bound the cache of sufficient statistics that gram-based fits share.

    Every fit of a gram-based estimator (least squares, ridge, the elastic net,
    PCA) on a :class:`~ilargi_sklearn.MultiSourceDataset` or one of its row slices
    keeps the raw sums of its rows here (``T^T S T``, ``s^T T``, ``T^T S Y``, ...),
    so that the candidates of a grid search compute each fold's statistics once.
    Setting the bound clears the cache.

    Parameters
    ----------
    max_bytes : int, optional
        Most bytes kept (least recently used entries go first); default a
        sixteenth of the machine's memory. ``max_bytes=0`` turns caching off.
    """
    _STATS.max_bytes = _default_max_bytes() if max_bytes is None else int(max_bytes)
    _STATS.clear()
    _SLICES.clear()


def clear_statistics_cache() -> None:
    """Drop every cached statistic (frees their memory; results do not change)."""
    _STATS.clear()
    _SLICES.clear()


def statistics_cache_info(ds: Any) -> dict[str, Any]:
    """What the statistics cache holds for ``ds``'s root dataset (see
    :meth:`~ilargi_sklearn.MultiSourceDataset.cache_info`)."""
    return _STATS.info(getattr(ds, "_root_token", None))


def _has_gram_entry(sums: Any) -> bool:
    # The X-sums entry (utils._stats._XSums) of a fit that formed the gram.
    return getattr(sums, "gram", None) is not None


def statistics_cached(ds: Any, strategy: str, sample_weight: Any = None) -> str | None:
    """Whether a gram-based fit of ``ds`` with ``strategy`` would find its gram here.

    What :func:`~ilargi_sklearn.utils._stats.centered_gram` would look up, asked
    without computing anything: the key of ``ds``'s rows (a hash of the row index
    and of ``sample_weight``, as the cache's key has; the sources are not read) is
    built as :func:`register_lineage` builds it, and the entries are only looked
    at (no hit is counted, the LRU order does not change).

    Parameters
    ----------
    ds : MultiSourceDataset
        The dataset (or row slice) a fit would be given.
    strategy : {"factorized", "materialized"}
        The operator the fit computes with (their sums are kept apart).
    sample_weight : array-like, optional

    Returns
    -------
    str or None
        ``"fold"``: the slice's own gram is cached; ``"root"``: its root's is, and
        the slice's would be downdated from it (a factorized slice of at least half
        the root, unit weights, no implicit scaling; the test rows' gram is then
        one pass over the other rows, which the caller counts); None: the fit
        computes its gram (also whenever the key cannot be known for sure: an
        implicitly scaled materialized operator, a device other than the data's).
    """
    token = getattr(ds, "_root_token", None)
    root = getattr(ds, "_root_operator", None)
    op = getattr(ds, "operator", None)
    if _STATS.max_bytes <= 0 or token is None or root is None or op is None:
        return None
    if not isinstance(op.xp, types.ModuleType):
        return None
    rows = getattr(ds, "_root_rows", None)
    w_key = UNIT if sample_weight is None else digest(np.asarray(sample_weight))
    if isinstance(op, AffineOperator):
        base = lineage_of(op.base)
        if base is not None:
            # Keyed as register_lineage keys a scaled fold: by its base fold and the
            # digests of the scale and offset; never downdated.
            if strategy != "factorized":
                return None  # the materialized operator's base is not known here
            lineage = base.scaled(op)
            key = lineage.key() + ("X", w_key)
            return "fold" if _STATS.holds(key, _has_gram_entry) else None
    rows = None if rows is None else np.asarray(rows)
    lineage = _registered(op, token, rows, strategy)
    if lineage is None:
        lineage = Lineage(
            token, rows, root, strategy, np.dtype(op.dtype).str, _device_name(op)
        )
    if _STATS.holds(lineage.key() + ("X", w_key), _has_gram_entry):
        return "fold"
    if (
        strategy == "factorized"
        and sample_weight is None
        and rows is not None
        and not isinstance(op, AffineOperator)
        and 2 * np.shape(rows)[0] >= lineage.n_root
    ):
        root_key = lineage.key(ROOT) + ("X", UNIT)
        if _STATS.holds(root_key, _has_gram_entry):
            return "root"
    return None
