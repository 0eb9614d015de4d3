"""Gather, scatter-add and sparse products with fast NumPy/SciPy paths.

The array-API standard leaves scatter-add with repeated indices undefined, and the
fastest gather differs with the number of right-hand-side columns, so both live here
behind one small class, :class:`RowMap`.

Measured on a 2-core machine (1e6 target rows, 1e4 source rows):

* scatter-add, one column: ``np.bincount(idx, weights)`` 1.8 ms, CSR product 2.9 ms,
  ``np.add.at`` slower still; five columns: per-column ``bincount`` 24 ms, CSR product
  22 ms, ``np.add.at`` 56 ms.
* gather, one column: ``np.take`` 2.0 ms, CSR product 2.5 ms; two columns: ``np.take``
  21 ms, CSR product 4.5 ms; ten columns 115 ms vs 47 ms.

So one column goes through ``take``/``bincount`` and several columns through a cached
CSR indicator matrix (built on first use, at most ``n_rows`` stored entries).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["RowMap", "is_sparse", "safe_sparse_dot", "segment_sum", "to_dense"]


def is_sparse(A: Any) -> bool:
    """Return whether ``A`` is a SciPy sparse matrix or array."""
    return sp.issparse(A)


def to_dense(A: Any) -> np.ndarray:
    """Return ``A`` as a dense ndarray (a no-op for ndarrays)."""
    if sp.issparse(A):
        return A.toarray()
    return np.asarray(A)


def safe_sparse_dot(A: Any, B: Any) -> np.ndarray:
    """Product ``A @ B`` that returns a dense ndarray when either side is dense."""
    out = A @ B
    if sp.issparse(out) and not (sp.issparse(A) and sp.issparse(B)):
        out = out.toarray()
    return out


def segment_sum(
    Y: np.ndarray, idx: np.ndarray, n_segments: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Sum the rows of ``Y`` into ``n_segments`` buckets given by ``idx``.

    Entries of ``idx`` equal to -1 are dropped. ``Y`` is 1-D or 2-D; ``weights`` scale
    the rows of ``Y`` before summing.
    """
    valid = idx >= 0
    if not valid.all():
        idx = idx[valid]
        Y = Y[valid]
        if weights is not None:
            weights = weights[valid]
    if weights is not None:
        Y = Y * (weights if Y.ndim == 1 else weights[:, None])
    if Y.ndim == 1:
        return np.bincount(idx, weights=Y, minlength=n_segments).astype(
            Y.dtype, copy=False
        )
    ind = sp.csr_matrix(
        (np.ones(idx.shape[0], dtype=Y.dtype), (idx, np.arange(idx.shape[0]))),
        shape=(n_segments, Y.shape[0]),
    )
    return np.asarray(ind @ Y)


class RowMap:
    """The indicator matrix ``I`` (``n_rows`` x ``n_source_rows``) of one source.

    Stored as an index vector: ``idx[i]`` is the source row that lands in target row
    ``i``, or -1 when none does (the row of ``I`` is all zeros). ``idx=None`` means the
    identity (the base table, before any row selection).

    Parameters
    ----------
    idx : ndarray of int of shape (n_rows,) or None
        Source row of each target row, -1 for no match; None for the identity.
    n_source_rows : int
        Number of rows of the source.
    """

    __slots__ = ("_idx", "n_source_rows", "n_rows", "_gather_csr", "_scatter_csr")

    def __init__(self, idx: np.ndarray | None, n_source_rows: int) -> None:
        if idx is not None:
            idx = np.asarray(idx)
            if idx.dtype.kind not in "iu":
                raise TypeError(f"index vectors must be integers, got dtype {idx.dtype}.")
            idx = idx.astype(np.int64, copy=False)
        self._idx = idx
        self.n_source_rows = int(n_source_rows)
        self.n_rows = int(n_source_rows if idx is None else idx.shape[0])
        self._gather_csr: dict[Any, sp.csr_matrix] = {}
        self._scatter_csr: dict[Any, sp.csr_matrix] = {}

    # -- structure ---------------------------------------------------------------
    @property
    def is_identity(self) -> bool:
        return self._idx is None

    @property
    def idx(self) -> np.ndarray:
        """The index vector (materialized ``arange`` for the identity)."""
        if self._idx is None:
            return np.arange(self.n_rows, dtype=np.int64)
        return self._idx

    @property
    def matched(self) -> np.ndarray:
        """Boolean mask of target rows that take a row of this source."""
        if self._idx is None:
            return np.ones(self.n_rows, dtype=bool)
        return self._idx >= 0

    @property
    def nbytes(self) -> int:
        return 0 if self._idx is None else int(self._idx.nbytes)

    def take(self, rows: np.ndarray) -> RowMap:
        """Row-select the target: ``I[rows]``."""
        if self._idx is None:
            return RowMap(np.asarray(rows, dtype=np.int64), self.n_source_rows)
        return RowMap(self._idx[rows], self.n_source_rows)

    def masked(self, drop: np.ndarray) -> RowMap:
        """A copy with the target rows in boolean mask ``drop`` set to no match."""
        idx = self.idx.copy()
        idx[drop] = -1
        return RowMap(idx, self.n_source_rows)

    def counts(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``I^T w``: (weighted) number of target rows per source row."""
        if self._idx is None:
            if weights is None:
                return np.ones(self.n_rows)
            return np.asarray(weights, dtype=np.float64)
        return segment_sum(
            np.ones(self.n_rows) if weights is None else np.asarray(weights, np.float64),
            self._idx,
            self.n_source_rows,
        )

    def indicator(self, dtype: Any = np.float64) -> sp.csr_matrix:
        """``I`` as a CSR matrix (cached per dtype)."""
        key = np.dtype(dtype)
        ind = self._gather_csr.get(key)
        if ind is None:
            idx = self.idx
            valid = idx >= 0
            # One stored entry per matched row: indptr is the running count.
            indptr = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)
            ind = sp.csr_matrix(
                (np.ones(int(indptr[-1]), dtype=key), idx[valid], indptr),
                shape=(self.n_rows, self.n_source_rows),
            )
            self._gather_csr[key] = ind
        return ind

    def _indicator_t(self, dtype: Any) -> sp.csr_matrix:
        key = np.dtype(dtype)
        ind = self._scatter_csr.get(key)
        if ind is None:
            ind = self.indicator(key).T.tocsr()
            self._scatter_csr[key] = ind
        return ind

    # -- products ----------------------------------------------------------------
    def gather(self, Z: np.ndarray) -> np.ndarray:
        """``I @ Z``: row ``i`` of the result is ``Z[idx[i]]`` (zeros where -1)."""
        if self._idx is None:
            return Z
        if Z.ndim == 1:
            out = np.take(Z, np.maximum(self._idx, 0))
            if not self.matched.all():
                out[self._idx < 0] = 0
            return out
        return np.asarray(self.indicator(Z.dtype) @ Z)

    def scatter(self, Y: np.ndarray) -> np.ndarray:
        """``I^T @ Y``: segment sum of the rows of ``Y`` into source rows."""
        if self._idx is None:
            return Y
        if Y.ndim == 1:
            return segment_sum(Y, self._idx, self.n_source_rows)
        return np.asarray(self._indicator_t(Y.dtype) @ Y)

    def cooccurrence(
        self, other: RowMap, weights: np.ndarray | None = None, dtype: Any = np.float64
    ) -> sp.csr_matrix:
        """``I_self^T diag(w) I_other``: (weighted) co-occurrence counts, as CSR."""
        a, b = self.idx, other.idx
        keep = (a >= 0) & (b >= 0)
        w = np.ones(int(keep.sum()), dtype=dtype) if weights is None else weights[keep]
        return sp.csr_matrix(
            (np.asarray(w, dtype=dtype), (a[keep], b[keep])),
            shape=(self.n_source_rows, other.n_source_rows),
        )

    # -- pickling: drop the caches ----------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"idx": self._idx, "n_source_rows": self.n_source_rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["idx"], state["n_source_rows"])
