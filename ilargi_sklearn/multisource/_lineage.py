"""Where a fit's matrix comes from: the key of the statistics cache.

A gram-based fit on a row slice of a dataset (a cross-validation fold) computes
statistics that every other fit on the same rows could reuse. What identifies
"the same rows" is the dataset's *lineage*: the token of its root dataset (a new
one for every scaled, cast, moved or transformed dataset), its rows in the root,
the strategy (a materialized operator sums in another order than the factorized
one), dtype and device. :func:`lineage_of` computes it from the dataset, once, at
the estimator's boundary (``validate_X(..., return_lineage=True)``); the fit hands
it explicitly to the statistics that use it
(:func:`~ilargi_sklearn.multisource._statistics.centered_gram` ``lineage=``), and
the planner asks the same function. Nothing is registered anywhere: a fit that
does not pass a lineage computes its statistics.

The target and the weights are part of a statistic's key too
(:func:`array_key`): NumPy arrays by a digest of their bytes, arrays of another
namespace (a GPU) by a fingerprint reduced on their device, never copied to the
host for it.
"""

from __future__ import annotations

import hashlib
import types
import weakref
from typing import Any

import numpy as np

from ilargi_sklearn._backend._namespace import (
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn.multisource._operators import AffineOperator

__all__ = ["ROOT", "UNIT", "Lineage", "array_key", "digest", "lineage_of"]

# The key's stand-in for "all rows of the root" and for unit weights.
ROOT = "root"
UNIT = "unit"


def digest(a: Any) -> str:
    """A content digest of an array: shape, dtype and bytes.

    For host arrays (row indices, targets and weights in NumPy) and
    parameter-sized ones of any namespace (a scaler's scale and offset: a copy of
    ``n_features`` values); :func:`array_key` keys the data-sized arrays of a
    device. Costs one pass over ``a``, far less than the product it saves.
    """
    h = np.ascontiguousarray(to_numpy(a))
    # SHA-256: collision resistant, and where the CPU has SHA instructions about
    # twice as fast as BLAKE2b (1.6 MB: 8 ms against 17 ms on a 2-core EPYC).
    m = hashlib.sha256()
    m.update(repr((h.shape, h.dtype.str)).encode())
    m.update(memoryview(h).cast("B"))
    return m.hexdigest()[:32]


# Irrational multipliers of the row position for the fingerprint's weights:
# pseudo-random in [0, 1), so that no permutation or shift of the rows keeps the
# weighted sums (fractional parts of i * the golden ratio and of i * sqrt(2)).
_WEIGHT_STEPS = (0.6180339887498949, 0.41421356237309503)


def array_key(a: Any) -> str:
    """The key of a target or weights array ``a`` (None: unit weights).

    A NumPy array: :func:`digest` of its bytes (exact). An array of another
    in-memory namespace (CuPy, ``array_api_strict``): a fingerprint computed on
    its device, of which a few scalars cross to the host: the shape, the dtype,
    and in float64 the sum, the sum of squares, two sums weighted by
    pseudo-random row weights, the minimum and the maximum. Copying the array
    to the host to hash it would undo what validating the target on its device
    saves (a round trip of the whole target over the bus).

    The fingerprint is not a cryptographic hash: two arrays with the same
    fingerprint differ by less than the rounding of those sums (a change of one
    value moves the weighted sums unless it is below their last bit), so a
    statistic found under it equals the one the array would give to rounding.
    """
    if a is None:
        return UNIT
    if isinstance(a, np.ndarray):
        return digest(a)
    xp = get_namespace(a)
    n = int(a.size) if isinstance(a.size, int) else int(np.prod(a.shape))
    f64 = namespace_dtype(xp, np.float64)
    x = xp.reshape(xp.astype(a, f64), (n,))
    device = getattr(a, "device", None)
    position = xp.arange(n, dtype=f64, device=device)
    sums = [xp.sum(x), xp.sum(x * x)]
    for step in _WEIGHT_STEPS:
        w = (position * step) % 1.0
        sums.append(xp.sum(x * w))
    if n:
        sums += [xp.min(x), xp.max(x)]
    figures = tuple(float(s) for s in sums)  # scalars cross, not the array
    return f"device:{tuple(a.shape)}:{a.dtype}:{figures!r}"


def _device_name(op: Any) -> str:
    if is_numpy_namespace(op.xp):
        return "cpu"
    return f"{op.xp.__name__}:{op.device}"


class Lineage:
    """Where a fit's operator comes from: rows of a root dataset's operator.

    A frozen record. ``rows`` None means all rows of the root, in order.
    :meth:`key` identifies the matrix exactly: the root's token, a digest of the
    rows, the strategy, dtype, device and ``variant`` (an implicit scaling of
    the rows by a fitted scaler: the digests of its scale and offset).

    Built by :func:`lineage_of`; not to be built by hand.
    """

    __slots__ = (
        "_memo",
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
        strategy: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        *,
        variant: str = "",
        memo: dict[str, Any] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "token", token)
        set_(self, "rows", rows)
        set_(self, "root_ref", weakref.ref(root))
        set_(self, "n_root", int(root.n_rows))
        set_(self, "strategy", strategy)
        set_(self, "dtype", dtype)
        set_(self, "device", device)
        set_(self, "variant", variant)
        # The rows' digest, shared by every dataset of the same gathered rows
        # (the slices of one index array: a search's candidates digest once).
        set_(self, "_memo", {} if memo is None else memo)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Lineage is immutable")

    def __reduce__(self) -> tuple:
        # Not pickled (a weak reference to the root): a dataset that kept one
        # (``_scaled_from``) is keyed by its own root in the process it reaches,
        # whose caches start empty anyway.
        return (_unpickled, ())

    def _replace(self, **changes: Any) -> Lineage:
        fields = {
            "strategy": self.strategy,
            "dtype": self.dtype,
            "device": self.device,
            "variant": self.variant,
            "memo": self._memo,
        }
        fields.update(changes)
        root = self.root
        if root is None:
            raise ReferenceError("the lineage's root dataset was collected")
        return Lineage(self.token, self.rows, root, **fields)

    @property
    def root(self) -> Any:
        """The root's operator (None once collected)."""
        return self.root_ref()

    @property
    def rows_key(self) -> str:
        """A digest of the rows (:data:`ROOT` for all of them)."""
        if self.rows is None:
            return ROOT
        key = self._memo.get("rows_key")
        if key is None:
            key = self._memo["rows_key"] = digest(self.rows)
        return key

    def scaled(self, op: AffineOperator) -> Lineage:
        """The lineage of ``op``, an implicit scaling of this one's operator: the
        same rows under ``op``'s scale and offset (their digests are part of the
        key, so it stays exact)."""
        return self._replace(
            variant=f"{self.variant}|affine:{digest(op.scale)}:{digest(op.offset)}"
        )

    def key(self, rows_key: str | None = None) -> tuple:
        """The statistics cache's key of these rows (of ``rows_key``'s)."""
        return (
            self.token,
            self.rows_key if rows_key is None else rows_key,
            self.strategy,
            self.dtype,
            self.device,
            self.variant,
        )


def _unpickled() -> None:
    return None


def _record(ds: Any) -> Lineage | None:
    """``ds``'s rows in its root, unbound to an operator (None: unknown)."""
    token = getattr(ds, "_root_token", None)
    root = getattr(ds, "_root_operator", None)
    if token is None or root is None:
        return None
    rows = getattr(ds, "_root_rows", None)
    if rows is not None:
        rows = np.asarray(rows)
    return Lineage(token, rows, root, memo=getattr(ds, "_rows_memo", None))


def lineage_of(ds: Any, op: Any, strategy: str = "factorized") -> Lineage | None:
    """The lineage of ``op``, the operator that a fit with ``strategy`` computes
    with on dataset ``ds`` (``ds.operator_for(strategy)``).

    The one key function of the statistics cache: the estimators' boundary and
    the planner both call it. No side effect; costs a digest of the rows at the
    first call for a slice (shared by every slice of the same index array).

    Returns
    -------
    Lineage or None
        None where the statistics cannot be keyed for sure: a dataset whose root
        does not match its operator (shape, dtype, namespace), or an operator of
        a distributed namespace (Dask: a digest would compute on the cluster).
    """
    if not isinstance(op.xp, types.ModuleType):
        return None
    parent = getattr(ds, "_scaled_from", None)
    if (
        parent is not None
        and strategy == "factorized"
        and isinstance(op, AffineOperator)
        and parent.root is not None
    ):
        # A scaler fitted on a fold gives every candidate of a pipeline the same
        # scale and offset over the same fold: keyed by those and the fold's rows,
        # not by the scaled dataset's own (new) root, so the candidates share.
        base = parent._replace(
            strategy=strategy, dtype=np.dtype(op.dtype).str, device=_device_name(op)
        )
        return base.scaled(op)
    record = _record(ds)
    if record is None:
        return None
    root, rows = record.root, record.rows
    if (
        root.n_cols != op.n_cols
        or np.dtype(root.dtype) != np.dtype(op.dtype)
        or root.xp is not op.xp
        or (rows is None and root.n_rows != op.n_rows)
        or (rows is not None and rows.shape != (op.n_rows,))
    ):
        return None
    return record._replace(
        strategy=strategy, dtype=np.dtype(op.dtype).str, device=_device_name(op)
    )


def scaled_from(ds: Any) -> Lineage | None:
    """The record a dataset that scales ``ds``'s operator implicitly keeps (its
    parent's rows), see :func:`lineage_of`."""
    return _record(ds)
