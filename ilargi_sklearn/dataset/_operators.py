"""The operator protocol and its three implementations.

Every algorithm of the package is written against :class:`Operator`: a matrix ``T``
of shape ``(n_rows, n_cols)`` that can be multiplied from either side, reduced and
row-sliced without necessarily being stored.

* :class:`MatrixOperator` wraps a plain dense or sparse matrix (the materialized plan).
* :class:`FactorizedMatrix` is the normalized matrix ``T = sum_t I_t S_t M_t^T`` of
  several sources (the factorized plan).
* :class:`AffineOperator` is ``(T - 1 offset^T) diag(scale)`` over either of them, with
  the centering and scaling kept inside the products (sources and sparsity untouched).

One kernel over this protocol serves every plan, so "factorized equals materialized"
is a property of the operators alone.

The operators hold NumPy/SciPy arrays (the benchmarked fast paths) or arrays of
another namespace on another device (CuPy on a GPU; ``array_api_strict`` in the
tests), after :meth:`Operator.to_namespace`. Each method branches once on the
namespace: the second path uses only the array-API standard plus the backend's
gather and scatter-add, and its results stay in the sources' namespace and device.
Dense sources only there, except CuPy, whose ``cupyx.scipy.sparse`` sources are
supported in the products (checked on a GPU by ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend import RowMap, safe_sparse_dot
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_cupy_namespace,
    is_numpy_namespace,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import is_sparse as _any_sparse
from ilargi_sklearn._backend._ops import xp_column_sums
from ilargi_sklearn.dataset._gram_numba import fused_cross_tables

__all__ = [
    "AffineOperator",
    "FactorizedMatrix",
    "FusedGroup",
    "FusedLayout",
    "MatrixOperator",
    "Operator",
    "Term",
    "fused_layout",
]

Format = Literal["auto", "dense", "sparse"]

#: Least target rows per source row of an anchor for the compiled cross pass
#: (``FactorizedMatrix._compiled_cross_blocks``) ...
_CROSS_MIN_RATIO = 5
#: ... unless the target has at most this many rows: both paths then take about a
#: millisecond (2.1 against 2.5 ms at 2e4 rows, tuple ratio 1), and the kernel is
#: loaded by the first, small fit rather than in the middle of a large one.
_CROSS_ALWAYS_ROWS = 16_384

#: Output bytes per block of target rows in ``FactorizedMatrix.matmul`` (L2-sized).
_BLOCK_BYTES = 1 << 20


def _check_out(out: Any, shape: tuple[int, ...], dtype: Any) -> None:
    """Raise unless ``out`` is a C-contiguous ndarray of ``shape`` and ``dtype``."""
    if (
        not isinstance(out, np.ndarray)
        or out.shape != tuple(shape)
        or out.dtype != np.dtype(dtype)
        or not out.flags.c_contiguous
    ):
        got = (
            f"{type(out).__name__} of shape {getattr(out, 'shape', None)} and dtype "
            f"{getattr(out, 'dtype', None)}"
        )
        raise ValueError(
            f"out must be a C-contiguous ndarray of shape {tuple(shape)} and dtype "
            f"{np.dtype(dtype)}, got {got}."
        )


def matmul_into(op: Any, X: Any, out: np.ndarray | None) -> Any:
    """``op.matmul(X)`` written into ``out`` when ``op`` takes ``out=`` (else fresh).

    The operators of this module take ``out=`` on NumPy arrays; others (a Dask
    operator, device arrays) return a fresh array.
    """
    if out is not None and isinstance(
        op, (MatrixOperator, FactorizedMatrix, AffineOperator)
    ):
        if is_numpy_namespace(op.xp):
            return op.matmul(X, out=out)
    return op.matmul(X)


def _result_dtype(op_dtype: np.dtype, X: Any) -> np.dtype:
    return np.result_type(op_dtype, getattr(X, "dtype", np.float64))


def _sq(S: Any) -> Any:
    return S.multiply(S) if _any_sparse(S) else S * S


#: Rows per block of the products of squares below: a dense source is squared a
#: block at a time, never as a whole (an identity source of 2e5 x 5 took an 8 MB
#: temporary, which set the peak memory of a K-Means fit).
_SQ_BLOCK = 8192


def _sq_products(S: Any, v: np.ndarray | None, transpose: bool) -> np.ndarray:
    """``(S * S)^T v`` (``transpose``) or ``(S * S) v`` (row sums when ``v`` is
    None) of a host source, a dense one in row blocks."""
    if _any_sparse(S) or S.shape[0] <= _SQ_BLOCK:
        S2 = _sq(S)
        if transpose:
            return np.asarray(safe_sparse_dot(S2.T, v)).ravel()
        if v is None:
            return np.asarray(S2.sum(axis=1)).ravel()
        return np.asarray(safe_sparse_dot(S2, v)).ravel()
    n, m = S.shape
    dtype = S.dtype if v is None else np.result_type(S.dtype, v.dtype)
    out = np.zeros(m if transpose else n, dtype=dtype)
    for lo in range(0, n, _SQ_BLOCK):
        b = S[lo : lo + _SQ_BLOCK]
        b = b * b
        if transpose:
            out += b.T @ v[lo : lo + _SQ_BLOCK]
        elif v is None:
            out[lo : lo + _SQ_BLOCK] = b.sum(axis=1)
        else:
            out[lo : lo + _SQ_BLOCK] = b @ v
    return out


def _index(cols: np.ndarray) -> slice | np.ndarray:
    """``cols`` as a slice when it is a contiguous increasing range.

    Indexing with the slice gives a view where the integer array would copy.
    """
    n = cols.shape[0]
    if n and cols[-1] - cols[0] == n - 1 and (n < 3 or np.all(np.diff(cols) == 1)):
        return slice(int(cols[0]), int(cols[0]) + n)
    return cols


def _column_sums(A: Any) -> np.ndarray:
    """Column sums of a host matrix: a GEMV for a dense one (``A.sum(axis=0)`` on a
    C-ordered (n, 5) array took 3.0 ms at 2e5 rows, the product 0.5 ms)."""
    if sp.issparse(A) or A.ndim != 2 or A.dtype.kind != "f":
        return np.asarray(A.sum(axis=0)).ravel()
    return np.ones(A.shape[0], dtype=A.dtype) @ A


def _dense(A: Any) -> Any:
    """A dense copy of a (device) sparse matrix; dense input unchanged."""
    return A.toarray() if _any_sparse(A) else A


def _xp_nbytes(A: Any) -> int:
    if _any_sparse(A):
        return int(A.data.nbytes + A.indices.nbytes + A.indptr.nbytes)
    nbytes = getattr(A, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    size = 1
    for d in A.shape:
        size *= int(d)
    return size * np.dtype(str(A.dtype).rsplit(".", 1)[-1]).itemsize


def _xp_rows(xp: Any, X: Any, cols: np.ndarray) -> Any:
    """``X[cols]`` (rows of a parameter-sized device array) without fancy indexing."""
    sel = _index(cols)
    if isinstance(sel, slice):
        return X[sel, ...]
    return xp.take(X, asarray_on(cols, xp, device_of(X)), axis=0)


def _xp_placement(xp: Any, cols: np.ndarray, n: int, dtype: Any, device: Any) -> Any:
    """One-hot ``(len(cols), n)`` matrix ``E`` with ``E[j, cols[j]] = 1``."""
    E = np.zeros((cols.shape[0], n), dtype=np.dtype(dtype))
    E[np.arange(cols.shape[0]), cols] = 1
    return asarray_on(E, xp, device)


def _xp_add_rows(xp: Any, out: Any, cols: np.ndarray, piece: Any) -> Any:
    """``out[cols] += piece`` for a parameter-sized device ``out``; returns ``out``."""
    sel = _index(cols)
    if isinstance(sel, slice):
        out[sel, ...] += piece
        return out
    E = _xp_placement(xp, cols, out.shape[0], _np_dtype(out), device_of(out))
    return out + xp.matmul(xp.matrix_transpose(E), piece)


def _xp_index(xp: Any, rows: Any, device: Any) -> Any:
    """Row positions (host array, list or device array) as a device array."""
    if isinstance(rows, np.ndarray) or not hasattr(rows, "shape"):
        rows = np.asarray(rows, dtype=np.int64)
    return asarray_on(rows, xp, device)


def _np_dtype(A: Any) -> np.dtype:
    return np.dtype(str(A.dtype).rsplit(".", 1)[-1])


def _xp_col(xp: Any, X: Any, v: Any) -> Any:
    return X * (v if X.ndim == 1 else v[:, None])


class Operator(ABC):
    """A matrix ``T`` of shape ``(n_rows, n_cols)`` known through its products.

    Subclasses implement the products and reductions below; all of them accept and
    return NumPy arrays (sparse results only where ``format`` asks for them).
    """

    shape: tuple[int, int]
    dtype: np.dtype

    @abstractmethod
    def matmul(self, X: np.ndarray) -> np.ndarray:
        """``T @ X`` for ``X`` of shape ``(n_cols,)`` or ``(n_cols, k)``.

        The NumPy implementations also take ``out=``: a C-contiguous array of the
        result's shape and dtype to write into (iterative solvers reuse one
        n-sized workspace instead of a fresh array per product).
        """

    @abstractmethod
    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        """``T.T @ Y`` for ``Y`` of shape ``(n_rows,)`` or ``(n_rows, k)``.

        The NumPy implementations also take a SciPy sparse ``Y`` of shape
        ``(n_rows, k)`` (a one-hot assignment, say) and return a dense ndarray.
        """

    @abstractmethod
    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        """``T.T @ diag(weights) @ T`` (``weights=None``: ``T.T @ T``)."""

    @abstractmethod
    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``weights @ T`` (column sums when ``weights`` is None)."""

    @abstractmethod
    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        """``weights @ (T * T)``."""

    @abstractmethod
    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        """``(T * T) @ col_weights`` (squared row norms when None)."""

    @abstractmethod
    def take_rows(self, rows: np.ndarray) -> Operator:
        """The row subset ``T[rows]`` as an operator of the same kind."""

    @abstractmethod
    def materialize(self, format: Format = "auto") -> Any:
        """``T`` as a dense ndarray or a CSR matrix."""

    @abstractmethod
    def materialized(self) -> Operator:
        """An equivalent operator backed by the materialized matrix."""

    @property
    @abstractmethod
    def is_sparse(self) -> bool:
        """Whether the natural materialized format is sparse."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the operator's arrays."""

    @property
    def n_rows(self) -> int:
        return self.shape[0]

    @property
    def xp(self) -> Any:
        """Array namespace of the operator's arrays (NumPy by default)."""
        return get_namespace()

    @property
    def device(self) -> Any:
        """Device of the operator's arrays (``"cpu"`` for NumPy)."""
        return "cpu"

    def to_namespace(self, xp: Any, device: Any = None) -> Operator:
        """An equivalent operator whose arrays live in ``xp`` on ``device``."""
        raise NotImplementedError(  # pragma: no cover - every subclass overrides
            f"{type(self).__name__} cannot move between namespaces."
        )

    @property
    def n_cols(self) -> int:
        return self.shape[1]

    def hold(self, A: Any) -> Any:
        """Evaluate ``A``, an intermediate that an iterative fit carries forward.

        Eager backends (NumPy, CuPy) return ``A`` itself; a lazy one (Dask) settles
        it so that the next iteration does not recompute its whole history.
        """
        return A

    def row_sums(self) -> np.ndarray:
        """``T @ 1``."""
        xp = self.xp
        if is_numpy_namespace(xp):
            return self.matmul(np.ones(self.n_cols, dtype=self.dtype))
        dtype = namespace_dtype(xp, self.dtype)
        return self.matmul(xp.ones(self.n_cols, dtype=dtype, device=self.device))

    def astype(self, dtype: Any) -> Operator:  # pragma: no cover - overridden
        raise NotImplementedError


def _resolve_format(fmt: Format, sparse_default: bool) -> bool:
    if fmt == "auto":
        return sparse_default
    if fmt not in ("dense", "sparse"):
        raise ValueError(f"format must be 'auto', 'dense' or 'sparse', got {fmt!r}.")
    return fmt == "sparse"


def _to_format(A: Any, sparse: bool) -> Any:
    if sparse:
        return sp.csr_matrix(A)
    return A.toarray() if sp.issparse(A) else np.asarray(A)


def _stack_blocks(
    blocks: list[tuple[np.ndarray, np.ndarray, Any]], n: int, dtype: Any
) -> sp.csr_matrix | None:
    """Assemble ``(row cols, col cols, block)`` triples into one CSR matrix.

    Works when every column set is a contiguous range and distinct ranges do not
    overlap (blocks on the same pair of ranges are summed); returns None otherwise.
    Stacking CSR block rows with ``hstack``/``vstack`` avoids the COO round trip and
    its duplicate-summing sort over all non-zeros (the Yelp gram of Hamlet went
    from 0.49 s to 0.20 s).
    """
    grid: dict[tuple[int, int, int, int], Any] = {}
    spans: set[tuple[int, int]] = set()
    for rc, cc, B in blocks:
        ri, ci = _index(rc), _index(cc)
        if not (isinstance(ri, slice) and isinstance(ci, slice)):
            return None
        r, c = (ri.start, ri.stop), (ci.start, ci.stop)
        spans.update((r, c))
        key = r + c
        grid[key] = B if key not in grid else grid[key] + B
    full: list[tuple[int, int]] = []
    pos = 0
    for start, stop in sorted(spans):
        if start < pos:
            return None  # overlapping ranges
        if start > pos:
            full.append((pos, start))
        full.append((start, stop))
        pos = stop
    if pos < n:
        full.append((pos, n))
    block_rows = []
    for r0, r1 in full:
        row = []
        for c0, c1 in full:
            B = grid.get((r0, r1, c0, c1))
            # A CSC block's transpose is a CSR view: the lower blocks cost nothing.
            row.append(
                sp.csr_matrix((r1 - r0, c1 - c0), dtype=dtype)
                if B is None
                else sp.csr_matrix(B, dtype=dtype)
            )
        block_rows.append(row[0] if len(row) == 1 else sp.hstack(row, format="csr"))
    if len(block_rows) == 1:
        return sp.csr_matrix(block_rows[0])
    return sp.vstack(block_rows, format="csr")


#: Stored entries per block of target rows when the CSR join is written (a few
#: MB of block temporaries).
_JOIN_BLOCK_ENTRIES = 1 << 18


def _join_source(S: Any, dtype: Any) -> Any:
    """A source as it enters the CSR join: explicit zeros of a sparse one dropped
    (a copy only when it has any), a dense one as it is."""
    if not sp.issparse(S):
        return np.asarray(S, dtype=dtype)
    S = sp.csr_matrix(S, dtype=dtype)
    if S.nnz and not S.data.all():
        S = S.copy()
        S.eliminate_zeros()
    return S


def _csr_join(terms: list[Term], n: int, m: int, dtype: Any) -> sp.csr_matrix:
    """The joined matrix ``sum_t I_t S_t M_t^T`` as CSR, written once in place.

    The stored entries of every target row are counted first (from the sources'
    row counts, gathered), so ``indptr`` is exact and ``indices`` and ``data`` are
    allocated once at their final size; each term then writes its rows, a block of
    target rows at a time (SciPy's row gather of the source, then a scatter into the
    rows' next free slots). The peak is the result plus a few MB of block
    temporaries, where per-term COO pieces, concatenated and converted, would hold
    about five copies of the entries at once.
    """
    # In column order, so that a row's entries come out sorted unless the terms'
    # columns interleave.
    terms = sorted(terms, key=lambda t: int(np.min(t.cols, initial=m)))
    sources = [_join_source(t.S, dtype) for t in terms]
    counts = np.zeros(n, dtype=np.int64)
    width = 0.0
    for t, S in zip(terms, sources):
        if sp.issparse(S):
            per_row = np.diff(S.indptr)
            width += S.nnz / max(S.shape[0], 1)
        else:
            per_row = np.count_nonzero(S, axis=1)
            width += S.shape[1]
        counts += t.rows.gather(per_row)
    nnz = int(counts.sum())
    index_dtype = np.int32 if max(nnz, m) < np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(n + 1, dtype=index_dtype)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(nnz, dtype=index_dtype)
    data = np.empty(nnz, dtype=dtype)
    free = counts  # from here on: the next free slot of every row
    free[:] = indptr[:-1]
    step = max(1024, int(_JOIN_BLOCK_ENTRIES / max(width, 1.0)))
    for t, S in zip(terms, sources):
        cols = np.asarray(t.cols, dtype=index_dtype)
        for start in range(0, n, step):
            stop = min(start + step, n)
            valid = None
            if t.rows.is_identity:
                src: Any = slice(start, stop)
            else:
                src = t.rows.idx[start:stop]
                if t.rows.has_missing:
                    valid = np.flatnonzero(src >= 0)
                    src = src[valid]
            block = S[src] if sp.issparse(S) else sp.csr_matrix(S[src])
            if not block.nnz:
                continue
            lens = np.diff(block.indptr)
            if valid is None:
                slots = free[start:stop]
            else:
                valid += start
                slots = free[valid]
            dst = np.repeat(slots - block.indptr[:-1], lens)
            dst += np.arange(block.nnz)
            indices[dst] = cols[block.indices]
            data[dst] = block.data
            if valid is None:
                slots += lens
            else:
                free[valid] += lens
    out = sp.csr_matrix((data, indices, indptr), shape=(n, m), copy=False)
    if not out.has_sorted_indices:
        out.sort_indices()
    return out


class MatrixOperator(Operator):
    """The operator protocol over a plain dense ndarray or SciPy sparse matrix.

    Parameters
    ----------
    A : ndarray or sparse matrix of shape (n_rows, n_cols)
        The matrix; sparse input is kept as CSR.
    """

    def __init__(self, A: Any) -> None:
        self._xp = None
        if not (sp.issparse(A) or isinstance(A, np.ndarray)):
            xp = get_namespace(A)
            if not is_numpy_namespace(xp):
                # A device array (CuPy, array_api_strict) or cupyx sparse matrix.
                if len(A.shape) != 2:
                    raise ValueError(f"expected a 2-D matrix, got shape {A.shape}.")
                self._xp = xp
                self.A = A
                self.shape = (int(A.shape[0]), int(A.shape[1]))
                self.dtype = _np_dtype(A)
                return
        if sp.issparse(A):
            A = sp.csr_matrix(A)
        else:
            A = np.asarray(A)
            if A.ndim != 2:
                raise ValueError(f"expected a 2-D matrix, got shape {A.shape}.")
        self.A = A
        self.shape = (int(A.shape[0]), int(A.shape[1]))
        self.dtype = A.dtype

    @property
    def is_sparse(self) -> bool:
        return _any_sparse(self.A)

    @property
    def xp(self) -> Any:
        return get_namespace() if self._xp is None else self._xp

    @property
    def device(self) -> Any:
        return "cpu" if self._xp is None else device_of(self.A)

    def to_namespace(self, xp: Any, device: Any = None) -> MatrixOperator:
        if is_numpy_namespace(xp) and self._xp is None:
            return self
        if self._xp is xp and (device is None or self.device == device):
            return self
        A = self.A if self._xp is None else to_numpy(self.A)
        return MatrixOperator(asarray_on(A, xp, device))

    @property
    def nbytes(self) -> int:
        A = self.A
        if self._xp is not None:
            return _xp_nbytes(A)
        if sp.issparse(A):
            return int(A.data.nbytes + A.indices.nbytes + A.indptr.nbytes)
        return int(A.nbytes)

    def matmul(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return _dense(self.A @ X)
        if out is None:
            return np.asarray(safe_sparse_dot(self.A, X))
        X = np.asarray(X)
        _check_out(out, (self.n_rows,) + X.shape[1:], _result_dtype(self.dtype, X))
        if sp.issparse(self.A):
            out[...] = self.A @ X
        else:
            np.matmul(self.A, X, out=out)
        return out

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        if self._xp is not None:
            return _dense(self.A.T @ Y)
        if sp.issparse(Y):
            # (Y^T A)^T: the sparse operand on the left, a dense (n_cols, k) result.
            return np.asarray(_dense(Y.T @ self.A)).T
        return np.asarray(safe_sparse_dot(self.A.T, Y))

    def _xp_format(self, G: Any, format: Format) -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        if sparse and is_cupy_namespace(self._xp):
            import cupyx.scipy.sparse as cusp

            return cusp.csr_matrix(G)
        if sparse:
            raise TypeError(
                f"the namespace {self._xp.__name__} has no sparse matrices; "
                "ask for format='dense'."
            )
        return _dense(G)

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        A = self.A
        if self._xp is not None:
            if weights is None:
                G = A.T @ A
            elif _any_sparse(A):
                G = A.T @ A.multiply(weights[:, None])
            else:
                G = self._xp.matrix_transpose(A * weights[:, None]) @ A
            return self._xp_format(G, format)
        if weights is None:
            G = A.T @ A
        elif sp.issparse(A):
            G = A.T @ sp.diags(np.asarray(weights, dtype=A.dtype)) @ A
        else:
            G = (A * np.asarray(weights, dtype=A.dtype)[:, None]).T @ A
        return _to_format(G, _resolve_format(format, self.is_sparse))

    def _xp_reduce(self, A: Any, axis: int, weights: Any) -> Any:
        xp = self._xp
        if weights is not None:
            out = A.T @ weights if axis == 0 else A @ weights
            return xp.reshape(_dense(out), (-1,))
        if _any_sparse(A):
            return xp.reshape(_dense(A.sum(axis=axis)), (-1,))
        if axis == 0:
            return xp_column_sums(A, xp)
        return xp.sum(A, axis=axis)

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return self._xp_reduce(self.A, 0, weights)
        if weights is None:
            return _column_sums(self.A).astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(self.A.T, weights)).ravel()

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        A2 = _sq(self.A)
        if self._xp is not None:
            return self._xp_reduce(A2, 0, weights)
        if weights is None:
            return _column_sums(A2).astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(A2.T, weights)).ravel()

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        A2 = _sq(self.A)
        if self._xp is not None:
            return self._xp_reduce(A2, 1, col_weights)
        if col_weights is None:
            return np.asarray(A2.sum(axis=1)).ravel().astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(A2, col_weights)).ravel()

    def take_rows(self, rows: np.ndarray) -> MatrixOperator:
        if self._xp is not None:
            xp = self._xp
            if _any_sparse(self.A):
                return MatrixOperator(self.A[asarray_on(rows, xp, self.device)])
            return MatrixOperator(
                xp.take(self.A, _xp_index(xp, rows, self.device), axis=0)
            )
        return MatrixOperator(self.A[rows])

    def materialize(self, format: Format = "auto") -> Any:
        if self._xp is not None:
            return self._xp_format(self.A, format)
        return _to_format(self.A, _resolve_format(format, self.is_sparse))

    def materialized(self) -> MatrixOperator:
        return self

    def astype(self, dtype: Any) -> MatrixOperator:
        if self._xp is not None:
            if _any_sparse(self.A):
                return MatrixOperator(self.A.astype(dtype))
            return MatrixOperator(
                self._xp.astype(self.A, namespace_dtype(self._xp, dtype))
            )
        return MatrixOperator(self.A.astype(dtype))


@dataclass(frozen=True)
class Term:
    """One term ``I S M^T`` of a normalized matrix.

    Attributes
    ----------
    S : ndarray or CSR matrix of shape (n_source_rows, n_term_cols)
        Source values (the columns of one source that this term places).
    rows : RowMap
        The indicator ``I`` as an index vector.
    cols : ndarray of int of shape (n_term_cols,)
        Target column of each column of ``S`` (the mapping ``M``).
    source : int
        Index of the source the term comes from.
    """

    S: Any
    rows: RowMap
    cols: np.ndarray
    source: int
    #: ``cols`` as a slice when contiguous, else ``cols`` (see ``_index``): computed
    #: once here, not per product and row block (``np.diff`` cost 8% of a GNMF fit).
    col_index: slice | np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "col_index", _index(np.asarray(self.cols)))

    @property
    def is_sparse(self) -> bool:
        return _any_sparse(self.S)


class FactorizedMatrix(Operator):
    """The normalized matrix ``T = sum_t I_t S_t M_t^T``, never materialized.

    Every target cell has at most one owning term (the ownership rule resolves
    overlapping columns when the terms are built), which is what makes the row norms
    and the element-wise power below exact.

    Parameters
    ----------
    terms : list of Term
        The terms; all row maps have the same ``n_rows``.
    n_rows, n_cols : int
        Shape of ``T``.
    dtype : dtype
        Floating dtype of every source.
    """

    def __init__(self, terms: list[Term], n_rows: int, n_cols: int, dtype: Any) -> None:
        self.terms = list(terms)
        self.shape = (int(n_rows), int(n_cols))
        self.dtype = np.dtype(dtype)
        xp = get_namespace(*(t.S for t in self.terms))
        # None: NumPy/SciPy sources (the fast paths below); else the device namespace.
        self._xp = None if is_numpy_namespace(xp) else xp

    def __getstate__(self) -> dict[str, Any]:
        # The fused-kernel layout is a cache (rebuilt on demand), not state.
        state = dict(self.__dict__)
        state.pop("_fused_layout", None)
        return state

    @property
    def xp(self) -> Any:
        return get_namespace() if self._xp is None else self._xp

    @property
    def device(self) -> Any:
        return (
            device_of(self.terms[0].S) if self._xp is not None and self.terms else "cpu"
        )

    def to_namespace(self, xp: Any, device: Any = None) -> FactorizedMatrix:
        """The same normalized matrix with sources and index vectors in ``xp``.

        Shared sources and row maps are moved once. Column maps stay on the host
        (they are parameter-sized and used to place results).
        """
        to_host = is_numpy_namespace(xp)
        if (to_host and self._xp is None) or (
            self._xp is xp and (device is None or self.device == device)
        ):
            return self
        sources: dict[int, Any] = {}
        rowmaps: dict[int, RowMap] = {}
        terms = []
        for t in self.terms:
            if id(t.S) not in sources:
                S = t.S if self._xp is None else to_numpy(t.S)
                sources[id(t.S)] = asarray_on(S, xp, device)
            if id(t.rows) not in rowmaps:
                rm = (
                    t.rows if self._xp is None else t.rows.to_namespace(get_namespace())
                )
                rowmaps[id(t.rows)] = rm.to_namespace(xp, device)
            terms.append(Term(sources[id(t.S)], rowmaps[id(t.rows)], t.cols, t.source))
        return FactorizedMatrix(terms, self.n_rows, self.n_cols, self.dtype)

    @property
    def is_sparse(self) -> bool:
        return any(t.is_sparse for t in self.terms)

    @property
    def nbytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for t in self.terms:
            if id(t.S) not in seen:
                seen.add(id(t.S))
                S = t.S
                if self._xp is not None:
                    total += _xp_nbytes(S)
                elif sp.issparse(S):
                    total += S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
                else:
                    total += S.nbytes
            total += t.rows.nbytes
        return int(total)

    def _out(self, X: Any, n: int) -> np.ndarray:
        shape = (n,) if X.ndim == 1 else (n, X.shape[1])
        return np.zeros(shape, dtype=_result_dtype(self.dtype, X))

    def _row_groups(self) -> list[tuple[RowMap, list[Term]]]:
        """Terms grouped by shared row map (one gather or scatter per group).

        Identity row maps come first so that their product can start the output.
        """
        groups: dict[int, tuple[RowMap, list[Term]]] = {}
        for t in self.terms:
            groups.setdefault(id(t.rows), (t.rows, []))[1].append(t)
        return sorted(groups.values(), key=lambda g: not g[0].is_identity)

    def matmul(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return self._xp_matmul(X)
        X = np.asarray(X)
        dtype = _result_dtype(self.dtype, X)
        if out is not None:
            _check_out(out, (self.n_rows,) + X.shape[1:], dtype)
        # Per row group: the dense identity terms (multiplied block by block below),
        # or Z = sum_t S_t X_t, source-sized, to gather (small sources first: never
        # I S first).
        parts: list[tuple[RowMap, list[Term], Any]] = []
        for rows, terms in self._row_groups():
            if rows.is_identity and not any(t.is_sparse for t in terms):
                parts.append((rows, terms, None))
                continue
            Z = None
            for t in terms:
                P = np.asarray(safe_sparse_dot(t.S, X[t.col_index]))
                Z = P if Z is None else Z + P
            # With an appended zero row when some target rows have no match: the
            # blocked gathers below then need no masking pass.
            parts.append((rows, terms, rows.pad(Z)))
        if not parts:
            if out is not None:
                out.fill(0)
                return out
            return self._out(X, self.n_rows)
        n = self.n_rows
        started = parts[0][0].is_identity and parts[0][2] is not None
        if started:
            # A fresh n-sized product (sparse identity sources) starts the output.
            first = parts.pop(0)[2]
            if out is None:
                out = first.astype(dtype, copy=False)
            else:
                out[...] = first
        elif out is None:
            out = np.empty((n,) if X.ndim == 1 else (n, X.shape[1]), dtype=dtype)
        # Blocks of target rows whose output fits in cache: each block is written
        # once, no n-sized temporaries (a 1e6 x 8 product ran 1.85x faster and
        # allocated half the memory).
        width = 1 if X.ndim == 1 else max(X.shape[1], 1)
        step = max(1024, _BLOCK_BYTES // (dtype.itemsize * width))
        for start in range(0, n, step):
            sel = slice(start, min(start + step, n))
            o = out[sel]
            first = not started
            for rows, terms, Z in parts:
                if Z is not None:
                    if first:
                        o[...] = rows.gather(Z, sel, padded=True)
                    else:
                        o += rows.gather(Z, sel, padded=True)
                    first = False
                    continue
                for t in terms:
                    Xt = X[t.col_index]
                    if first:
                        np.matmul(t.S[sel], Xt, out=o)
                    else:
                        o += t.S[sel] @ Xt
                    first = False
        return out

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        if self._xp is not None:
            return self._xp_rmatmul(Y)
        if sp.issparse(Y):
            return self._sparse_rmatmul(Y)
        Y = np.asarray(Y)
        out = self._out(Y, self.n_cols)
        for rows, terms in self._row_groups():
            R = rows.scatter(Y)
            for t in terms:
                out[t.col_index] += np.asarray(safe_sparse_dot(t.S.T, R))
        return out

    def _sparse_rmatmul(self, Y: Any) -> np.ndarray:
        """``T.T @ Y`` for a SciPy sparse ``Y`` of shape ``(n_rows, k)``; dense result.

        Per row group, the segment sum ``I^T Y`` is one ``np.bincount`` over the
        stored entries of ``Y`` (bin ``idx[row] * k + col``): for a weighted one-hot
        (one entry per row, the k-means M-step) no n x k array is ever built, and
        the bincount is 2x faster than the CSC scatter of the dense one-hot (and 6x
        faster than the sparse product ``I^T Y``). A segment sum too large to hold
        dense stays a sparse product.
        """
        if Y.ndim != 2 or Y.shape[0] != self.n_rows:
            raise ValueError(
                f"the sparse right-hand side has shape {Y.shape}; expected "
                f"({self.n_rows}, k)."
            )
        Y = sp.csr_matrix(Y)
        n, k = Y.shape
        dtype = _result_dtype(self.dtype, Y)
        out = np.zeros((self.n_cols, k), dtype=dtype)
        indptr = Y.indptr
        cols = Y.indices.astype(np.int64, copy=False)
        data = Y.data
        entry_rows: np.ndarray | None = None
        # One stored entry per row: entry i lies in row i (no row expansion).
        one_per_row = Y.nnz == n and np.array_equal(indptr, np.arange(n + 1))
        for rows, terms in self._row_groups():
            if rows.is_identity:
                # I = identity: S^T Y as (Y^T S)^T, the sparse operand on the left.
                for t in terms:
                    out[t.col_index] += np.asarray(_dense(Y.T @ t.S)).T
                continue
            r = rows.n_source_rows
            if r * k > max(4 * Y.nnz, 1 << 20):
                # A wide, very sparse Y: the dense (r, k) segment sum would
                # dwarf Y itself, so keep it sparse.
                R: Any = rows.scatter(Y)
            else:
                idx = rows.idx
                if not one_per_row:
                    if entry_rows is None:
                        entry_rows = np.repeat(np.arange(n), np.diff(indptr))
                    idx = idx[entry_rows]
                # Bin (idx + shift) * k + col: with shift = 1, a -1 (no match)
                # lands in bin row 0, dropped below.
                shift = 1 if rows.has_missing else 0
                bins = idx * k
                bins += cols + shift * k if shift else cols
                R = np.bincount(bins, weights=data, minlength=(r + shift) * k)
                R = R[shift * k :].reshape(r, k).astype(dtype, copy=False)
            for t in terms:
                out[t.col_index] += np.asarray(_dense(safe_sparse_dot(t.S.T, R)))
        return out

    def _block(self, a: Term, b: Term, weights: np.ndarray | None) -> Any:
        """``S_a^T I_a^T diag(w) I_b S_b`` in the cheaper association order."""
        C = a.rows.cooccurrence(b.rows, weights, dtype=self.dtype)
        nnz_c = C.nnz
        ca, cb = a.S.shape[1], b.S.shape[1]
        ra, rb = a.S.shape[0], b.S.shape[0]
        cost_left = nnz_c * ca + rb * ca * cb  # (C^T S_a)^T S_b
        cost_right = nnz_c * cb + ra * ca * cb  # S_a^T (C S_b)
        if cost_left <= cost_right:
            return safe_sparse_dot(safe_sparse_dot(C.T, a.S).T, b.S)
        return safe_sparse_dot(a.S.T, safe_sparse_dot(C, b.S))

    def _compiled_cross_blocks(
        self, weights: np.ndarray | None
    ) -> dict[tuple[int, int], np.ndarray]:
        """The cross blocks ``S_a^T I_a^T diag(w) I_b S_b`` from compiled row passes.

        Each pair gets an anchor, the side with an index vector (the one with the
        smaller source when both have one), and a partner. Per anchor row map, one
        pass over the target rows sums, per source row, the partner rows of its
        target rows (:func:`fused_cross_tables`, float64): ``I_a^T diag(w) I_b S_b``
        without the sorted co-occurrence matrix; the block is then a small product
        with ``S_a``. Only for dense sources of one float dtype when the compiled
        kernels are available, and for anchors with at least
        :data:`_CROSS_MIN_RATIO` target rows per source row (or small data); the
        other pairs, sparse sources and everything without numba take
        :meth:`_block`. Keys are term positions ``(i, j)``, ``i < j``.

        Measured on 2e5 target rows, two dimension tables, one thread (first gram
        of a fresh dataset, so the sparse path builds its cached indicators): 7.4
        against 11.0 ms at tuple ratio 20 and feature ratio 2, 10.3 against 12.3 ms
        at feature ratio 5, 10.2 against 12.8 ms at tuple ratio 5; at 2e6 rows 120
        against 159 ms (tuple ratio 20). Below tuple ratio 5 the tables are nearly
        as long as the data and their random writes lose: 19.7 against 17.0 ms at
        tuple ratio 3, 49 against 21 ms at tuple ratio 1 and feature ratio 0.5.
        """
        terms = self.terms
        if (
            len(terms) < 2
            or any(t.is_sparse for t in terms)
            or len({np.dtype(t.S.dtype) for t in terms}) != 1
            or np.dtype(terms[0].S.dtype) not in (np.float32, np.float64)
            or not numba_available()
        ):
            return {}
        plan: dict[int, tuple[RowMap, list[int]]] = {}
        pairs = []
        for i, a in enumerate(terms):
            for j in range(i + 1, len(terms)):
                b = terms[j]
                if a.rows is b.rows or (a.rows.is_identity and b.rows.is_identity):
                    continue
                if a.rows.is_identity or (
                    not b.rows.is_identity
                    and b.rows.n_source_rows < a.rows.n_source_rows
                ):
                    anchor, partner = j, i
                else:
                    anchor, partner = i, j
                rows = terms[anchor].rows
                if (
                    self.n_rows < _CROSS_MIN_RATIO * rows.n_source_rows
                    and self.n_rows > _CROSS_ALWAYS_ROWS
                ):
                    continue
                partners = plan.setdefault(id(rows), (rows, []))[1]
                if partner not in partners:
                    partners.append(partner)
                pairs.append((i, j, anchor, partner))
        tables: dict[tuple[int, int], np.ndarray] = {}
        w = None if weights is None else np.asarray(weights)
        for key, (rows, partners) in plan.items():
            sources = [
                (terms[p].S, None if terms[p].rows.is_identity else terms[p].rows.idx)
                for p in partners
            ]
            try:
                A = fused_cross_tables(rows.idx, rows.n_source_rows, sources, w)
            except CompiledUnavailable:
                return {}
            start = 0
            for p in partners:
                stop = start + terms[p].S.shape[1]
                tables[(key, p)] = A[:, start:stop]
                start = stop
        out = {}
        for i, j, anchor, partner in pairs:
            S = terms[anchor].S
            G = S.T @ tables[(id(terms[anchor].rows), partner)].astype(
                S.dtype, copy=False
            )
            out[(i, j)] = G if anchor == i else G.T
        return out

    def _diag_block(self, t: Term, weights: np.ndarray | None) -> Any:
        """``S^T diag(I^T w) S``."""
        S = t.S
        if t.rows.is_identity and weights is None:
            # A plain S^T S: NumPy hands it to BLAS syrk, no scaled copy of S.
            return S.T @ S
        cnt = t.rows.counts(weights).astype(self.dtype, copy=False)
        if sp.issparse(S):
            return S.T @ sp.csr_matrix(S.multiply(cnt[:, None]))
        lo, hi = (float(cnt.min()), float(cnt.max())) if cnt.size else (1.0, 1.0)
        if lo == hi == 1.0:
            return S.T @ S
        if lo >= 0:
            # (S sqrt(c))^T (S sqrt(c)) is a syrk: half the flops of (S c)^T S.
            Ss = S * np.sqrt(cnt)[:, None]
            return Ss.T @ Ss
        return (S * cnt[:, None]).T @ S

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        if self._xp is not None:
            return self._xp_gram(weights, format)
        sparse = _resolve_format(format, self.is_sparse)
        if weights is not None:
            weights = np.asarray(weights)
        blocks = []
        compiled = self._compiled_cross_blocks(weights)
        for i, a in enumerate(self.terms):
            blocks.append((a.cols, a.cols, self._diag_block(a, weights)))
            for j, b in enumerate(self.terms[i + 1 :], i + 1):
                Gab = compiled.get((i, j))
                if Gab is None:
                    Gab = self._block(a, b, weights)
                blocks.append((a.cols, b.cols, Gab))
                blocks.append((b.cols, a.cols, Gab.T))
        n = self.n_cols
        if not sparse:
            G = np.zeros((n, n), dtype=self.dtype)
            for rc, cc, B in blocks:
                ri, ci = _index(rc), _index(cc)
                sel = (
                    (ri, ci)
                    if isinstance(ri, slice) and isinstance(ci, slice)
                    else np.ix_(rc, cc)
                )
                G[sel] += B.toarray() if sp.issparse(B) else B
            return G
        G = _stack_blocks(blocks, n, self.dtype)
        if G is not None:
            return G
        rows, cols, vals = [], [], []
        for rc, cc, B in blocks:
            B = sp.coo_matrix(B)
            rows.append(rc[B.row])
            cols.append(cc[B.col])
            vals.append(B.data)
        return sp.csr_matrix(
            (
                np.concatenate(vals).astype(self.dtype),
                (np.concatenate(rows), np.concatenate(cols)),
            ),
            shape=(n, n),
        )

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return self._xp_col_sums(weights, square=False)
        out = np.zeros(self.n_cols, dtype=self.dtype)
        for t in self.terms:
            if t.rows.is_identity and weights is None:
                s = _column_sums(t.S)
            else:
                cnt = t.rows.counts(weights).astype(self.dtype, copy=False)
                s = np.asarray(safe_sparse_dot(t.S.T, cnt)).ravel()
            out[t.col_index] += s
        return out

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return self._xp_col_sums(weights, square=True)
        out = np.zeros(self.n_cols, dtype=self.dtype)
        for t in self.terms:
            cnt = t.rows.counts(weights).astype(self.dtype, copy=False)
            out[t.col_index] += _sq_products(t.S, cnt, transpose=True)
        return out

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        if self._xp is not None:
            return self._xp_row_sq_norms(col_weights)
        out = np.zeros(self.n_rows, dtype=self.dtype)
        for t in self.terms:
            if col_weights is None:
                r = _sq_products(t.S, None, transpose=False)
                r = r.astype(self.dtype, copy=False)
            else:
                r = _sq_products(t.S, col_weights[t.cols], transpose=False)
            out += t.rows.gather(r)
        return out

    def take_rows(self, rows: np.ndarray) -> FactorizedMatrix:
        if self._xp is not None:
            rows = _xp_index(self._xp, rows, self.device)
            terms = [Term(t.S, t.rows.take(rows), t.cols, t.source) for t in self.terms]
            return FactorizedMatrix(terms, int(rows.shape[0]), self.n_cols, self.dtype)
        rows = np.asarray(rows)
        terms = [Term(t.S, t.rows.take(rows), t.cols, t.source) for t in self.terms]
        return FactorizedMatrix(terms, rows.shape[0], self.n_cols, self.dtype)

    def map_sources(self, func: Any) -> FactorizedMatrix:
        """Apply ``func`` to each source matrix (element-wise maps with f(0) = 0)."""
        cache: dict[int, Any] = {}
        terms = []
        for t in self.terms:
            if id(t.S) not in cache:
                cache[id(t.S)] = func(t.S)
            terms.append(Term(cache[id(t.S)], t.rows, t.cols, t.source))
        return FactorizedMatrix(terms, self.n_rows, self.n_cols, self.dtype)

    def astype(self, dtype: Any) -> FactorizedMatrix:
        xp = self._xp
        if xp is not None and not is_cupy_namespace(xp):
            out = self.map_sources(lambda S: xp.astype(S, namespace_dtype(xp, dtype)))
            out.dtype = np.dtype(dtype)
            return out
        out = self.map_sources(lambda S: S.astype(dtype))
        out.dtype = np.dtype(dtype)
        return out

    def materialize(self, format: Format = "auto") -> Any:
        if self._xp is not None:
            return self._xp_materialize(format)
        sparse = _resolve_format(format, self.is_sparse)
        n, m = self.shape
        if not sparse:
            out = np.zeros((n, m), dtype=self.dtype)
            written = np.zeros(m, dtype=bool)
            for t in self.terms:
                S = t.S
                # A sparse source is never densified whole (a few target rows of a
                # wide one-hot source would otherwise cost the full dense source):
                # gather its rows sparsely, then densify only that block.
                ind = t.rows.indicator(self.dtype) if sp.issparse(S) else None
                # Dense: one appended zero row for the blocked gathers (no masking).
                Sp = t.rows.pad(S) if ind is None else None
                sel = t.col_index
                # The first owner of these columns writes, later ones add.
                add = bool(written[sel].any())
                written[sel] = True
                # Blocks of target rows: no n-sized gathered temporary.
                step = max(1024, _BLOCK_BYTES // max(S.shape[1] * S.dtype.itemsize, 1))
                for start in range(0, n, step):
                    rows = slice(start, min(start + step, n))
                    block = (
                        t.rows.gather(Sp, rows, padded=True)
                        if ind is None
                        else (ind[rows] @ S).toarray()
                    )
                    if add:
                        out[rows, sel] += block
                    else:
                        out[rows, sel] = block
            return out
        return _csr_join(self.terms, n, m, self.dtype)

    def materialized(self) -> MatrixOperator:
        return MatrixOperator(self.materialize())

    def nnz(self) -> int:
        """Stored non-zeros of the joined matrix, computed without building it."""
        if self._xp is not None:
            xp, total = self._xp, 0
            for t in self.terms:
                if _any_sparse(t.S):
                    per_row = xp.astype(t.S.indptr[1:] - t.S.indptr[:-1], xp.float64)
                else:
                    per_row = xp.sum(xp.astype(t.S != 0, xp.float64), axis=1)
                total += int(float(xp.sum(t.rows.gather(per_row))))
            return total
        total = 0
        for t in self.terms:
            per_row = (
                np.diff(t.S.indptr)
                if sp.issparse(t.S)
                else np.count_nonzero(t.S, axis=1)
            )
            total += int(t.rows.gather(per_row.astype(np.float64)).sum())
        return total

    # -- the namespace-generic path (CuPy, array_api_strict) ------------------------
    def _xp_zeros(self, shape: tuple[int, ...], like: Any = None) -> Any:
        """Zeros of the operator's dtype, promoted with that of ``like`` (as NumPy)."""
        xp = self._xp
        dtype = namespace_dtype(xp, self.dtype)
        if like is not None:
            dtype = xp.result_type(dtype, like.dtype)
        return xp.zeros(shape, dtype=dtype, device=self.device)

    def _xp_matmul(self, X: Any) -> Any:
        xp = self._xp
        out = self._xp_zeros((self.n_rows,) + tuple(X.shape[1:]), X)
        for rows, terms in self._row_groups():
            Z = None
            for t in terms:
                P = _dense(t.S @ _xp_rows(xp, X, t.cols))
                Z = P if Z is None else Z + P
            out = out + rows.gather(Z)
        return out

    def _xp_rmatmul(self, Y: Any) -> Any:
        xp = self._xp
        out = self._xp_zeros((self.n_cols,) + tuple(Y.shape[1:]), Y)
        for rows, terms in self._row_groups():
            R = rows.scatter(Y)
            for t in terms:
                out = _xp_add_rows(xp, out, t.cols, _dense(t.S.T @ R))
        return out

    def _xp_counts(self, t: Term, weights: Any) -> Any:
        cnt = t.rows.counts(weights)
        return self._xp.astype(cnt, namespace_dtype(self._xp, self.dtype))

    def _xp_gram(self, weights: Any, format: Format) -> Any:
        xp = self._xp
        sparse = _resolve_format(format, self.is_sparse)
        n = self.n_cols
        G = self._xp_zeros((n, n))
        dt = namespace_dtype(xp, self.dtype)

        def place(G: Any, rc: np.ndarray, cc: np.ndarray, B: Any) -> Any:
            ri, ci = _index(rc), _index(cc)
            if isinstance(ri, slice) and isinstance(ci, slice):
                G[ri, ci] += B
                return G
            Er = _xp_placement(xp, rc, n, self.dtype, self.device)
            Ec = _xp_placement(xp, cc, n, self.dtype, self.device)
            return G + xp.matrix_transpose(Er) @ B @ Ec

        w = None if weights is None else xp.astype(weights, dt)
        for i, a in enumerate(self.terms):
            if a.rows.is_identity and weights is None and not _any_sparse(a.S):
                Gaa = xp.matrix_transpose(a.S) @ a.S
            else:
                cnt = self._xp_counts(a, weights)
                if _any_sparse(a.S):
                    Gaa = _dense(a.S.T @ a.S.multiply(cnt[:, None]))
                else:
                    Gaa = xp.matrix_transpose(a.S * cnt[:, None]) @ a.S
            G = place(G, a.cols, a.cols, Gaa)
            for b in self.terms[i + 1 :]:
                Gab = self._xp_cross_block(a, b, w)
                G = place(G, a.cols, b.cols, Gab)
                G = place(G, b.cols, a.cols, xp.matrix_transpose(Gab))
        if sparse:
            return MatrixOperator(G)._xp_format(G, "sparse")
        return G

    def _xp_cross_block(self, a: Term, b: Term, w: Any) -> Any:
        """``S_a^T I_a^T diag(w) I_b S_b``, summed over the segments of one side.

        ``I_a^T diag(w) I_b S_b`` sums ``S_b``'s rows per row of ``a``'s source;
        its mirror ``I_b^T diag(w) I_a S_a`` sums ``S_a``'s rows per row of ``b``'s.
        A side whose index is the identity has one row per segment, so the sum
        runs over the other side's segments; otherwise over the side whose
        partner has fewer columns to read. Sparse sources are never the side read.
        """
        xp = self._xp
        mirror = _any_sparse(b.S) or (
            not _any_sparse(a.S)
            and not b.rows.is_identity
            and (a.rows.is_identity or a.S.shape[1] < b.S.shape[1])
        )
        if mirror and not _any_sparse(a.S):
            Q = b.rows.cross(a.rows, a.S, w)  # (rows of b's source, c_a)
            return xp.matrix_transpose(_dense(b.S.T @ Q))
        return _dense(a.S.T @ a.rows.cross(b.rows, _dense(b.S), w))

    def _xp_col_sums(self, weights: Any, square: bool) -> Any:
        xp = self._xp
        out = self._xp_zeros((self.n_cols,))
        for t in self.terms:
            cnt = self._xp_counts(t, weights)
            S = _sq(t.S) if square else t.S
            out = _xp_add_rows(xp, out, t.cols, xp.reshape(_dense(S.T @ cnt), (-1,)))
        return out

    def _xp_row_sq_norms(self, col_weights: Any) -> Any:
        xp = self._xp
        out = self._xp_zeros((self.n_rows,))
        for t in self.terms:
            S2 = _sq(t.S)
            if col_weights is None:
                r = (
                    xp.reshape(_dense(S2.sum(axis=1)), (-1,))
                    if _any_sparse(S2)
                    else xp.sum(S2, axis=1)
                )
            else:
                r = xp.reshape(_dense(S2 @ _xp_rows(xp, col_weights, t.cols)), (-1,))
            out = out + t.rows.gather(r)
        return out

    def _xp_materialize(self, format: Format) -> Any:
        xp = self._xp
        sparse = _resolve_format(format, self.is_sparse)
        n, m = self.shape
        if sparse:
            if not is_cupy_namespace(xp):
                raise TypeError(
                    f"the namespace {xp.__name__} has no sparse matrices; "
                    "ask for format='dense'."
                )
            import cupyx.scipy.sparse as cusp

            rows, cols, vals = [], [], []
            for t in self.terms:
                P = cusp.coo_matrix(t.rows.gather(cusp.csr_matrix(t.S)))
                rows.append(P.row)
                cols.append(asarray_on(t.cols, xp, self.device)[P.col])
                vals.append(P.data)
            coo = cusp.coo_matrix(
                (xp.concat(vals), (xp.concat(rows), xp.concat(cols))), shape=(n, m)
            )
            return coo.tocsr()
        out = self._xp_zeros((n, m))
        for t in self.terms:
            block = _dense(t.rows.gather(t.S))
            sel = t.col_index
            if isinstance(sel, slice):
                out[:, sel] += block
            else:
                E = _xp_placement(xp, t.cols, m, self.dtype, self.device)
                out = out + block @ E
        return out


class AffineOperator(Operator):
    """``(T - 1 offset^T) diag(scale)`` with centering and scaling kept implicit.

    Parameters
    ----------
    base : Operator
        The operator ``T``.
    scale : ndarray of shape (n_cols,) or None
        Column scales (None: ones).
    offset : ndarray of shape (n_cols,) or None
        Column offsets subtracted before scaling (None: zeros).
    """

    def __init__(
        self,
        base: Operator,
        scale: np.ndarray | None = None,
        offset: np.ndarray | None = None,
    ) -> None:
        n = base.n_cols
        dtype = base.dtype
        self.base = base
        xp = base.xp
        self._xp = None if is_numpy_namespace(xp) else xp
        self.shape = base.shape
        self.dtype = dtype
        if self._xp is not None:
            dev = base.device
            xdt = namespace_dtype(xp, dtype)
            self.scale = (
                xp.ones(n, dtype=xdt, device=dev)
                if scale is None
                else asarray_on(scale, xp, dev, dtype)
            )
            self.offset = (
                xp.zeros(n, dtype=xdt, device=dev)
                if offset is None
                else asarray_on(offset, xp, dev, dtype)
            )
            self._has_offset = bool(xp.any(self.offset != 0))
            return
        self.scale = (
            np.ones(n, dtype=dtype) if scale is None else np.asarray(scale, dtype=dtype)
        )
        self.offset = (
            np.zeros(n, dtype=dtype)
            if offset is None
            else np.asarray(offset, dtype=dtype)
        )
        self._has_offset = bool(np.any(self.offset != 0))

    @property
    def xp(self) -> Any:
        return self.base.xp

    @property
    def device(self) -> Any:
        return self.base.device

    def hold(self, A: Any) -> Any:
        return self.base.hold(A)

    def to_namespace(self, xp: Any, device: Any = None) -> AffineOperator:
        base = self.base.to_namespace(xp, device)
        if base is self.base:
            return self
        return AffineOperator(base, to_numpy(self.scale), to_numpy(self.offset))

    @property
    def has_offset(self) -> bool:
        return self._has_offset

    def _outer(self, a: Any, b: Any) -> Any:
        if self._xp is None:
            return np.outer(a, b)
        return a[:, None] * b[None, :]

    def _w_sum(self, weights: Any) -> float:
        if weights is None:
            return self.n_rows
        if self._xp is None:
            return float(np.sum(weights))
        return float(self._xp.sum(weights))

    @property
    def is_sparse(self) -> bool:
        return self.base.is_sparse and not self.has_offset

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + _xp_nbytes(self.scale) + _xp_nbytes(self.offset)

    def _col(self, X: np.ndarray, v: np.ndarray) -> np.ndarray:
        return X * (v if X.ndim == 1 else v[:, None])

    def matmul(self, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if self._xp is None:
            X = np.asarray(X)
        DX = self._col(X, self.scale)
        out = self.base.matmul(DX) if out is None else matmul_into(self.base, DX, out)
        if self.has_offset:
            if self._xp is None:
                out -= self.offset @ DX  # in place: out is a fresh n-length array
            else:
                out = out - self.offset @ DX
        return out

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        if self._xp is None:
            sparse_y = sp.issparse(Y)
            if not sparse_y:
                Y = np.asarray(Y)
            out = self.base.rmatmul(Y)
            if self.has_offset:
                if sparse_y:
                    ysum = np.asarray(Y.sum(axis=0)).ravel()
                else:
                    ysum = Y.sum() if Y.ndim == 1 else _column_sums(Y)
                out = out - np.multiply.outer(self.offset, ysum)
            return self._col(out, self.scale)
        xp = self._xp
        out = self.base.rmatmul(Y)
        if self.has_offset:
            ysum = xp_column_sums(Y, xp)
            out = out - (
                self.offset * ysum if Y.ndim == 1 else self._outer(self.offset, ysum)
            )
        return self._col(out, self.scale)

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        G = self.base.gram(
            weights, format="sparse" if (sparse and not self.has_offset) else "dense"
        )
        if self.has_offset:
            s = self.base.col_sums(weights)
            w_sum = self._w_sum(weights)
            o = self.offset
            G = G - self._outer(s, o) - self._outer(o, s) + w_sum * self._outer(o, o)
        d = self.scale
        if self._xp is not None:
            if _any_sparse(G):
                import cupyx.scipy.sparse as cusp

                D = cusp.diags(d)
                G = D @ G @ D
            else:
                G = G * d[:, None] * d[None, :]
            base_format = MatrixOperator(G)
            return base_format._xp_format(G, "sparse" if sparse else "dense")
        if sp.issparse(G):
            D = sp.diags(d)
            return _to_format(D @ G @ D, sparse)
        return _to_format(G * d[:, None] * d[None, :], sparse)

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        s = self.base.col_sums(weights)
        w_sum = self._w_sum(weights)
        return (s - w_sum * self.offset) * self.scale

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        q = self.base.col_sq_sums(weights)
        s = self.base.col_sums(weights)
        w_sum = self._w_sum(weights)
        o = self.offset
        return (q - 2 * o * s + w_sum * o * o) * self.scale**2

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        c = self.scale**2 if col_weights is None else self.scale**2 * col_weights
        out = self.base.row_sq_norms(c)
        if self.has_offset:
            out = (
                out - 2 * self.base.matmul(c * self.offset) + float(c @ self.offset**2)
            )
        return out

    def take_rows(self, rows: np.ndarray) -> AffineOperator:
        return AffineOperator(self.base.take_rows(rows), self.scale, self.offset)

    def materialize(self, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        if sparse and self.has_offset:
            raise ValueError(
                "a centered matrix is dense: it cannot be materialized as sparse."
            )
        A = self.base.materialize("sparse" if sparse else "dense")
        if sparse and self._xp is not None:
            import cupyx.scipy.sparse as cusp

            return cusp.csr_matrix(A @ cusp.diags(self.scale))
        if sparse:
            return sp.csr_matrix(A @ sp.diags(self.scale))
        return (A - self.offset) * self.scale

    def materialized(self) -> AffineOperator:
        return AffineOperator(self.base.materialized(), self.scale, self.offset)

    def astype(self, dtype: Any) -> AffineOperator:
        return AffineOperator(self.base.astype(dtype), self.scale, self.offset)


# ---------------------------------------------------------- layout for fused kernels
@dataclass(frozen=True)
class FusedGroup:
    """One row group of a :class:`FusedLayout`: the terms that share an index vector.

    Attributes
    ----------
    idx : ndarray of int64 of shape (n_rows,)
        Source row of each target row, -1 for no match (C-contiguous).
    S : ndarray or CSR matrix of shape (n_source_rows, n_group_cols)
        The group's sources side by side (the source itself for one term); CSR
        when one of them is sparse.
    cols : ndarray of int64 of shape (n_group_cols,)
        Target column of each column of ``S``.
    has_missing : bool
        Whether some entry of ``idx`` is -1.
    """

    idx: np.ndarray
    S: Any
    cols: np.ndarray
    has_missing: bool

    @property
    def is_sparse(self) -> bool:
        return sp.issparse(self.S)

    @property
    def n_source_rows(self) -> int:
        return int(self.S.shape[0])


@dataclass(frozen=True)
class FusedLayout:
    """A NumPy factorized operator as the compiled row kernels read it.

    ``T' = (T - 1 offset^T) diag(scale)`` with ``T = X0 M0^T + sum_g I_g S_g M_g^T``:
    an optional identity source ``base`` (read row by row by the kernels) and
    row groups whose values are gathered through an index vector. Sources are
    dense or CSR; no offset applies to the columns of a CSR source (centering
    would densify it).

    Attributes
    ----------
    shape : tuple of int
    dtype : dtype
    base : ndarray or CSR matrix of shape (n_rows, d0), or None
        The identity source (C-contiguous when dense).
    base_cols : ndarray of int64 of shape (d0,)
    groups : tuple of FusedGroup
    offset, scale : ndarray of shape (n_cols,) or None
        The affine part (None: zeros, ones).
    coverage : ndarray of int of shape (n_cols,)
        Number of terms that place values in each target column: where it is 1
        and the term covers every row the column can be centered inside the
        sources; elsewhere an offset goes through the per-row constant.
    """

    shape: tuple[int, int]
    dtype: np.dtype
    base: np.ndarray | None
    base_cols: np.ndarray
    groups: tuple[FusedGroup, ...]
    offset: np.ndarray | None
    scale: np.ndarray | None
    coverage: np.ndarray

    def with_affine(
        self, scale: np.ndarray | None, offset: np.ndarray | None
    ) -> FusedLayout | None:
        """The layout of ``(self - 1 offset^T) diag(scale)`` (None if not expressible).

        ``((T - 1 o1^T) D1 - 1 o2^T) D2 = (T - 1 (o1 + o2 / d1)^T) D1 D2``, which
        needs ``d1 != 0`` wherever ``o2 != 0``, and ``o1 + o2 / d1 = 0`` on the
        columns of CSR sources.
        """
        o1 = self.offset
        s1 = self.scale
        o = None if o1 is None else o1.copy()
        if offset is not None and np.any(offset != 0):
            off = np.asarray(offset, dtype=np.float64)
            if s1 is None:
                add = off
            else:
                if np.any((s1 == 0) & (off != 0)):
                    return None
                add = np.divide(off, s1, out=np.zeros_like(off), where=s1 != 0)
            o = add if o is None else o + add
        if o is not None and np.any(o[self.sparse_cols()] != 0):
            return None
        s = None
        if scale is not None and np.any(scale != 1):
            s = np.asarray(scale, dtype=np.float64)
        if s1 is not None:
            s = s1 if s is None else s1 * s
        return FusedLayout(
            self.shape,
            self.dtype,
            self.base,
            self.base_cols,
            self.groups,
            o,
            s,
            self.coverage,
        )

    def sparse_cols(self) -> np.ndarray:
        """Target columns of the CSR sources (int64, possibly empty)."""
        cols = [g.cols for g in self.groups if g.is_sparse]
        if self.base is not None and sp.issparse(self.base):
            cols.append(self.base_cols)
        if not cols:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(cols)


def _kernel_csr(S: Any) -> Any:
    """``S`` as a CSR matrix (shares the arrays of a CSR ``S``; duplicates allowed)."""
    return sp.csr_matrix(S)


def _factorized_layout(fm: FactorizedMatrix) -> FusedLayout | None:
    if fm._xp is not None:
        return None
    n, m = fm.shape
    coverage = np.zeros(m, dtype=np.int64)
    for t in fm.terms:
        np.add.at(coverage, t.cols, 1)
    base = None
    base_cols = np.zeros(0, dtype=np.int64)
    groups = []
    for rows, terms in fm._row_groups():
        if rows.is_identity and base is None and len(terms) == 1:
            S = terms[0].S
            base = _kernel_csr(S) if sp.issparse(S) else np.ascontiguousarray(S)
            base_cols = np.asarray(terms[0].cols, dtype=np.int64)
            continue
        if any(t.is_sparse for t in terms):
            S = _kernel_csr(sp.hstack([t.S for t in terms], format="csr"))
        elif len(terms) == 1:
            S = np.ascontiguousarray(terms[0].S)
        else:
            S = np.ascontiguousarray(np.hstack([t.S for t in terms]))
        cols = np.concatenate([np.asarray(t.cols, dtype=np.int64) for t in terms])
        idx = np.ascontiguousarray(rows.idx, dtype=np.int64)
        groups.append(FusedGroup(idx, S, cols, bool(rows.has_missing)))
    return FusedLayout(
        (n, m), fm.dtype, base, base_cols, tuple(groups), None, None, coverage
    )


def fused_layout(op: Operator) -> FusedLayout | None:
    """The :class:`FusedLayout` of ``op``, or None when the fused kernels cannot run.

    They run on a NumPy :class:`FactorizedMatrix` (dense or CSR sources), possibly
    under :class:`AffineOperator` layers that do not center a CSR source. The
    layout of a factorized matrix is cached on it (product-heavy solvers ask for it
    at every product).
    """
    if isinstance(op, AffineOperator):
        inner = fused_layout(op.base)
        if inner is None or op._xp is not None:
            return None
        return inner.with_affine(op.scale, op.offset)
    if not isinstance(op, FactorizedMatrix):
        return None
    cached = op.__dict__.get("_fused_layout", False)
    if cached is False:
        cached = _factorized_layout(op)
        op.__dict__["_fused_layout"] = cached
    return cached
