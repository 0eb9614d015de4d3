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
tests), after :meth:`Operator.to_namespace`. Each method is written once, over the
primitives of :mod:`ilargi_sklearn._backend` (gather and scatter-add through
:class:`~ilargi_sklearn._backend.RowMap`, sparse products, placement of
parameter-sized blocks, format conversion), which pick the NumPy/SciPy fast path or
a standard-only one per call; results stay in the sources' namespace and device.
Dense sources only outside NumPy, except CuPy, whose ``cupyx.scipy.sparse``
sources are supported in the products (checked on a GPU by
``benchmarks/gpu_check.py``). Two host-only accelerators remain: the compiled
cross tables of the gram and the bincount of a SciPy sparse right-hand side.
"""

from __future__ import annotations

import types
import weakref
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
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
    same_namespace,
    to_numpy,
)
from ilargi_sklearn._backend._ops import (
    add_block,
    add_rows,
    as_array,
    as_csr,
    as_index,
    astype,
    column_sums,
    contiguous_index,
    diags,
    empty,
    flat,
    matmul_to,
    nbytes,
    put_columns,
    result_dtype,
    row_blocks,
    row_nnz,
    row_sums,
    select_columns,
    select_rows,
    square,
    to_dense,
    to_format,
    zeros,
)
from ilargi_sklearn._backend._ops import is_sparse as _any_sparse
from ilargi_sklearn._backend._sparse import sparse_gram, sparse_join
from ilargi_sklearn.multisource._gram_numba import fused_cross_tables
from ilargi_sklearn.multisource._products_numba import (
    BASE_COO,
    BASE_CSR,
    BASE_NONE,
    BASE_ONE,
    MATMAT_COLUMNS,
    fused_matmat,
    fused_matvec,
    fused_rmatmat,
    fused_rmatvec,
    matmat_pays,
)

__all__ = [
    "AffineOperator",
    "FactorizedMatrix",
    "FusedGroup",
    "FusedLayout",
    "MatrixOperator",
    "Operator",
    "ShiftedMatrix",
    "Term",
    "fused_layout",
    "sample_columns",
    "shift_columns",
]

Format = Literal["auto", "dense", "sparse"]

#: Least target rows per source row of an anchor for the compiled cross pass
#: (``FactorizedMatrix._compiled_cross_blocks``) ...
_CROSS_MIN_RATIO = 5
#: ... unless the target has at most this many rows: both paths then take about a
#: millisecond, and the kernel is loaded by the first, small fit rather than in the
#: middle of a large one.
_CROSS_ALWAYS_ROWS = 16_384

#: Output bytes per block of target rows in the host products (L2-sized).
_BLOCK_BYTES = 1 << 20


def _check_out(out: Any, shape: tuple[int, ...], dtype: Any) -> None:
    """Raise unless ``out`` is a (C-contiguous) array of ``shape`` and ``dtype``."""
    ok = (
        hasattr(out, "shape")
        and not _any_sparse(out)
        and tuple(out.shape) == tuple(shape)
        and numpy_dtype(out.dtype) == np.dtype(dtype)
        and (not isinstance(out, np.ndarray) or out.flags.c_contiguous)
    )
    if not ok:
        got = (
            f"{type(out).__name__} of shape {getattr(out, 'shape', None)} and dtype "
            f"{getattr(out, 'dtype', None)}"
        )
        raise ValueError(
            f"out must be a C-contiguous ndarray of shape {tuple(shape)} and dtype "
            f"{np.dtype(dtype)}, got {got}."
        )


def matmul_into(op: Any, X: Any, out: Any) -> Any:
    """``op.matmul(X)`` written into ``out`` when ``op`` takes ``out=`` (else fresh).

    The operators of this module take an ``out=`` of their own namespace; others
    (a Dask operator) return a fresh array.
    """
    if (
        out is not None
        and isinstance(op, (MatrixOperator, FactorizedMatrix, AffineOperator))
        and same_namespace(get_namespace(out), op.xp)
    ):
        return op.matmul(X, out=out)
    return op.matmul(X)


#: Rows per block of the products of squares below: a dense source is squared a
#: block at a time, never as a whole (a whole squared identity source set the peak
#: memory of a K-Means fit).
_SQ_BLOCK = 8192


def _sq_products(S: Any, v: Any, transpose: bool) -> Any:
    """``(S * S)^T v`` (``transpose``) or ``(S * S) v`` (row sums when ``v`` is
    None) of a source, a dense host one in row blocks of :data:`_SQ_BLOCK`."""
    n, m = S.shape
    xp = get_namespace(S)
    step = row_blocks(n, 1, _SQ_BLOCK, xp=xp, min_rows=1)
    if _any_sparse(S) or n <= step:
        S2 = square(S)
        if transpose:
            return flat(safe_sparse_dot(S2.T, v))
        if v is None:
            return row_sums(S2)
        return flat(safe_sparse_dot(S2, v))
    dtype = numpy_dtype(S.dtype)
    if v is not None:
        dtype = result_dtype(dtype, v)
    out = zeros((m if transpose else n,), dtype, xp=xp, device=device_of(S))
    for lo in range(0, n, step):
        b = S[lo : lo + step, ...]
        b = b * b
        if transpose:
            out += b.T @ v[lo : lo + step, ...]
        elif v is None:
            out[lo : lo + step] = row_sums(b)
        else:
            out[lo : lo + step] = b @ v
    return out


class Operator(ABC):
    """A matrix ``T`` of shape ``(n_rows, n_cols)`` known through its products.

    Subclasses implement the products and reductions below; all of them accept and
    return arrays of the operator's namespace (sparse results only where
    ``format`` asks for them).

    Attributes
    ----------
    prefers_products : bool
        True when the gram is much costlier than matmul/rmatmul: solvers should
        iterate on products (LSQR, L-BFGS) rather than form the normal equations.
    """

    shape: tuple[int, int]
    dtype: np.dtype
    prefers_products: bool = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if any(isinstance(v, types.ModuleType) for v in state.values()):
            # A device operator holds its namespace (a module, which does not
            # pickle) and device arrays: say so, instead of pickle's message.
            raise TypeError(
                f"a dataset on device {self.device!r} cannot be pickled (its "
                f"{type(self).__name__} holds device arrays): move it to the host "
                "first (ds.to_device('cpu'))."
            )
        return state

    @abstractmethod
    def matmul(self, X: np.ndarray) -> np.ndarray:
        """``T @ X`` for ``X`` of shape ``(n_cols,)`` or ``(n_cols, k)``.

        The implementations of this module also take ``out=``: a C-contiguous
        array of the result's shape and dtype to write into (iterative solvers
        reuse one n-sized workspace instead of a fresh array per product).
        """

    @abstractmethod
    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        """``T.T @ Y`` for ``Y`` of shape ``(n_rows,)`` or ``(n_rows, k)``.

        The implementations of this module also take a sparse ``Y`` of shape
        ``(n_rows, k)`` (a one-hot assignment, say) and return a dense array.
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
        """``T`` as a dense array or a CSR matrix."""

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


def _device_namespace(xp: Any) -> Any:
    """None for NumPy (the marker the fast paths test), else ``xp``."""
    return None if is_numpy_namespace(xp) else xp


class MatrixOperator(Operator):
    """The operator protocol over a plain dense or sparse matrix.

    Parameters
    ----------
    A : array or sparse matrix of shape (n_rows, n_cols)
        The matrix (NumPy/SciPy, or of another namespace such as CuPy); sparse
        input is kept as CSR.
    """

    def __init__(self, A: Any) -> None:
        A = as_csr(A) if _any_sparse(A) else as_array(A)
        if len(A.shape) != 2:
            raise ValueError(f"expected a 2-D matrix, got shape {A.shape}.")
        # None on NumPy/SciPy: the marker of the host fast paths (``fused_layout``).
        self._xp = _device_namespace(get_namespace(A))
        self.A = A
        self.shape = (int(A.shape[0]), int(A.shape[1]))
        self.dtype = numpy_dtype(A.dtype)

    @property
    def is_sparse(self) -> bool:
        return _any_sparse(self.A)

    @property
    def xp(self) -> Any:
        return get_namespace() if self._xp is None else self._xp

    @property
    def device(self) -> Any:
        return device_of(self.A)

    def to_namespace(self, xp: Any, device: Any = None) -> MatrixOperator:
        if same_namespace(xp, self.xp) and (
            self._xp is None or device is None or self.device == device
        ):
            return self
        return MatrixOperator(asarray_on(to_numpy(self.A), xp, device))

    @property
    def nbytes(self) -> int:
        return nbytes(self.A)

    def matmul(self, X: Any, out: Any = None) -> Any:
        X = as_array(X)
        if out is None:
            return safe_sparse_dot(self.A, X)
        _check_out(
            out, (self.n_rows,) + tuple(X.shape[1:]), result_dtype(self.dtype, X)
        )
        return matmul_to(self.A, X, out)

    def rmatmul(self, Y: Any) -> Any:
        if _any_sparse(Y):
            # (Y^T A)^T: the sparse operand on the left, a dense (n_cols, k) result.
            return to_dense(Y.T @ self.A).T
        return safe_sparse_dot(self.A.T, as_array(Y))

    def gram(self, weights: Any = None, format: Format = "auto") -> Any:
        A = self.A
        if weights is None:
            G = A.T @ A
        else:
            w = asarray_on(weights, self._xp, self.device, self.dtype)
            G = A.T @ diags(w) @ A if _any_sparse(A) else (A * w[:, None]).T @ A
        return to_format(G, _resolve_format(format, self.is_sparse))

    def col_sums(self, weights: Any = None) -> Any:
        if weights is None:
            return astype(column_sums(self.A), self.dtype, copy=False)
        return flat(safe_sparse_dot(self.A.T, as_array(weights)))

    def col_sq_sums(self, weights: Any = None) -> Any:
        A2 = square(self.A)
        if weights is None:
            return astype(column_sums(A2), self.dtype, copy=False)
        return flat(safe_sparse_dot(A2.T, as_array(weights)))

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        A2 = square(self.A)
        if col_weights is None:
            return astype(row_sums(A2), self.dtype, copy=False)
        return flat(safe_sparse_dot(A2, as_array(col_weights)))

    def take_rows(self, rows: Any) -> MatrixOperator:
        return MatrixOperator(
            select_rows(self.A, as_index(rows, self._xp, self.device))
        )

    def materialize(self, format: Format = "auto") -> Any:
        return to_format(self.A, _resolve_format(format, self.is_sparse))

    def materialized(self) -> MatrixOperator:
        return self

    def astype(self, dtype: Any) -> MatrixOperator:
        return MatrixOperator(astype(self.A, dtype))


def _weak(S: Any) -> Any:
    try:
        return weakref.ref(S)
    except TypeError:  # pragma: no cover - a source type without weak references
        return None


@dataclass(frozen=True)
class Term:
    """One term ``I S M^T`` of a normalized matrix.

    Attributes
    ----------
    S : array or CSR matrix of shape (n_source_rows, n_term_cols)
        Source values (the columns of one source that this term places).
    rows : RowMap
        The indicator ``I`` as an index vector.
    cols : ndarray of int of shape (n_term_cols,)
        Target column of each column of ``S`` (the mapping ``M``), on the host.
    source : int
        Index of the source the term comes from.
    """

    S: Any
    rows: RowMap
    cols: np.ndarray
    source: int
    #: ``cols`` as a slice when contiguous, else ``cols`` (see
    #: ``contiguous_index``): computed once here, not per product and row block
    #: (``np.diff`` cost 8% of a GNMF fit).
    col_index: slice | np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "col_index", contiguous_index(np.asarray(self.cols)))

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
        # None on NumPy/SciPy sources: the marker of the host fast paths (the
        # compiled cross tables, ``fused_layout``); else the device namespace.
        self._xp = _device_namespace(get_namespace(*(t.S for t in self.terms)))
        self._origins: tuple | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The fused-kernel layout is a cache (rebuilt on demand), not state; the
        # origins are weak references (not picklable): an unpickled slice is its
        # own root for the caches.
        state = super().__getstate__()
        state.pop("_fused_layout", None)
        state.pop("_product_plan", None)
        state["_origins"] = None
        return state

    @property
    def xp(self) -> Any:
        return get_namespace() if self._xp is None else self._xp

    @property
    def device(self) -> Any:
        return device_of(self.terms[0].S) if self.terms else "cpu"

    def to_namespace(self, xp: Any, device: Any = None) -> FactorizedMatrix:
        """The same normalized matrix with sources and index vectors in ``xp``.

        Shared sources and row maps are moved once. Column maps stay on the host
        (they are parameter-sized and used to place results).
        """
        if same_namespace(xp, self.xp) and (
            self._xp is None or device is None or self.device == device
        ):
            return self
        host = get_namespace()
        sources: dict[int, Any] = {}
        rowmaps: dict[int, RowMap] = {}
        terms = []
        for t in self.terms:
            if id(t.S) not in sources:
                sources[id(t.S)] = asarray_on(to_numpy(t.S), xp, device)
            if id(t.rows) not in rowmaps:
                rm = t.rows.to_namespace(host)
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
                total += nbytes(t.S)
            total += t.rows.nbytes
        return int(total)

    def _zeros(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        """Zeros in the operator's namespace and device (its dtype by default)."""
        dtype = self.dtype if dtype is None else dtype
        return zeros(shape, dtype, xp=self._xp, device=self.device)

    def _row_groups(self) -> list[tuple[RowMap, list[Term]]]:
        """Terms grouped by shared row map (one gather or scatter per group).

        Identity row maps come first so that their product can start the output.
        """
        groups: dict[int, tuple[RowMap, list[Term]]] = {}
        for t in self.terms:
            groups.setdefault(id(t.rows), (t.rows, []))[1].append(t)
        return sorted(groups.values(), key=lambda g: not g[0].is_identity)

    def matmul(self, X: Any, out: Any = None) -> Any:
        X = as_array(X)
        if isinstance(X, np.ndarray) and not X.flags.c_contiguous:
            # A transposed right-hand side (``components_.T``) is parameter-sized:
            # copied C-ordered, the row blocks' products and gathers stay on BLAS
            # and contiguous rows (7x faster at 5e5 x 25, k = 5).
            X = np.ascontiguousarray(X)
        dtype = result_dtype(self.dtype, X)
        shape = (self.n_rows,) + tuple(X.shape[1:])
        if out is not None:
            _check_out(out, shape, dtype)
        if X.ndim == 0 or X.shape[0] != self.n_cols:
            raise ValueError(
                f"the right-hand side has shape {tuple(X.shape)}; expected "
                f"({self.n_cols},) or ({self.n_cols}, k) for an operator of shape "
                f"{self.shape}."
            )
        if _fused_width(X):
            plan = self._compiled_plan(X, dtype)
            if plan is not None and X.ndim == 2 and not matmat_pays(plan, X.shape[1]):
                plan = None
            if plan is not None:
                target = np.empty(shape, dtype) if out is None else out
                try:
                    if X.ndim == 1:
                        return fused_matvec(plan, X, target)
                    return fused_matmat(plan, X, target)
                except CompiledUnavailable:
                    pass
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
                P = safe_sparse_dot(t.S, select_rows(X, t.col_index))
                Z = P if Z is None else Z + P
            # With an appended zero row when some target rows have no match: the
            # blocked gathers below then need no masking pass.
            parts.append((rows, terms, rows.pad(Z)))
        if not parts:
            if out is not None:
                out[...] = 0
                return out
            return self._zeros(shape, dtype)
        n = self.n_rows
        started = parts[0][0].is_identity and parts[0][2] is not None
        if started:
            # A fresh n-sized product (sparse identity sources) starts the output.
            first = parts.pop(0)[2]
            if out is None:
                out = astype(first, dtype, copy=False)
            else:
                out[...] = first
        elif out is None:
            out = empty(shape, dtype, xp=self._xp, device=self.device)
        # Blocks of target rows whose output fits in cache: each block is written
        # once, no n-sized temporaries (faster, and half the memory of a
        # whole-array pass).
        width = 1 if X.ndim == 1 else max(X.shape[1], 1)
        step = row_blocks(n, dtype.itemsize * width, _BLOCK_BYTES, xp=self._xp)
        for start in range(0, n, step):
            sel = slice(start, min(start + step, n))
            o = out[sel, ...]
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
                    Xt = select_rows(X, t.col_index)
                    if first:
                        matmul_to(t.S[sel, ...], Xt, o)
                    else:
                        o += t.S[sel, ...] @ Xt
                    first = False
        return out

    def rmatmul(self, Y: Any) -> Any:
        if sp.issparse(Y):
            return self._sparse_rmatmul(Y)
        Y = as_array(Y)
        if Y.ndim == 0 or Y.shape[0] != self.n_rows:
            raise ValueError(
                f"the right-hand side has shape {tuple(Y.shape)}; expected "
                f"({self.n_rows},) or ({self.n_rows}, k) for an operator of shape "
                f"{self.shape}."
            )
        if _fused_width(Y):
            dtype = result_dtype(self.dtype, Y)
            plan = self._compiled_plan(Y, dtype)
            if plan is not None:
                if Y.dtype not in (np.float32, np.float64):
                    Y = Y.astype(np.float64)
                Y = np.ascontiguousarray(Y)
                fused = fused_rmatvec if Y.ndim == 1 else fused_rmatmat
                try:
                    return fused(plan, Y).astype(dtype, copy=False)
                except CompiledUnavailable:
                    pass
        out = self._zeros(
            (self.n_cols,) + tuple(Y.shape[1:]), result_dtype(self.dtype, Y)
        )
        for rows, terms in self._row_groups():
            R = rows.scatter(Y)
            for t in terms:
                out = add_rows(out, t.col_index, to_dense(safe_sparse_dot(t.S.T, R)))
        return out

    def _compiled_plan(self, X: Any, dtype: np.dtype) -> ProductPlan | None:
        """The :class:`ProductPlan` for the compiled product of this operator with
        the host vector ``X`` (result ``dtype``), or None for the NumPy path.

        The plan is built on the first such product and cached on the operator
        (it holds the sources' chosen formats, no result).
        """
        if (
            self._xp is not None
            or not isinstance(X, np.ndarray)
            or X.dtype.kind not in "biuf"
            or dtype not in (np.float32, np.float64)
            or not numba_available()
        ):
            return None
        plan = self.__dict__.get("_product_plan", False)
        if plan is False:
            plan = self.__dict__["_product_plan"] = _product_plan(self)
            _LAYOUT_HOLDERS.add(self)
        return plan

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
        dtype = result_dtype(self.dtype, Y)
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
                    out[t.col_index] += to_dense(Y.T @ t.S).T
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
                out[t.col_index] += to_dense(safe_sparse_dot(t.S.T, R))
        return out

    def _compiled_cross_blocks(self, weights: Any) -> dict[tuple[int, int], np.ndarray]:
        """The cross blocks ``S_a^T I_a^T diag(w) I_b S_b`` from compiled row passes.

        Each pair gets an anchor, the side with an index vector (the one with the
        smaller source when both have one), and a partner. Per anchor row map, one
        pass over the target rows sums, per source row, the partner rows of its
        target rows (:func:`fused_cross_tables`, float64): ``I_a^T diag(w) I_b S_b``
        without the sorted co-occurrence matrix; the block is then a small product
        with ``S_a``. Only for dense host (NumPy) sources of one float dtype when
        the compiled kernels are available (they read host memory), and for
        anchors with at least :data:`_CROSS_MIN_RATIO` target rows per source row
        (or small data); the other pairs, sparse sources, device sources and
        everything without numba take :meth:`RowMap.cross_block`. Keys are term
        positions ``(i, j)``, ``i < j``. Below the tuple ratio threshold the tables
        are nearly as long as the data and their random writes lose to the sparse
        path (``benchmarks/README.md``).
        """
        terms = self.terms
        if (
            self._xp is not None
            or len(terms) < 2
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

    def _diag_block(self, t: Term, weights: Any) -> Any:
        """``S^T diag(I^T w) S``."""
        S = t.S
        if t.rows.is_identity and weights is None:
            # A plain S^T S: NumPy hands it to BLAS syrk, no scaled copy of S.
            return S.T @ S
        cnt = astype(t.rows.counts(weights), self.dtype, copy=False)
        if _any_sparse(S):
            return S.T @ as_csr(S.multiply(cnt[:, None]))
        xp = self.xp
        lo, hi = (
            (float(xp.min(cnt)), float(xp.max(cnt))) if cnt.shape[0] else (1.0, 1.0)
        )
        if lo == hi == 1.0:
            return S.T @ S
        if lo >= 0:
            # (S sqrt(c))^T (S sqrt(c)) is a syrk: half the flops of (S c)^T S.
            Ss = S * xp.sqrt(cnt)[:, None]
            return Ss.T @ Ss
        return (S * cnt[:, None]).T @ S

    def gram(self, weights: Any = None, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        if weights is not None:
            weights = as_array(weights)
        blocks = []
        compiled = self._compiled_cross_blocks(weights)
        for i, a in enumerate(self.terms):
            blocks.append((a.cols, a.cols, self._diag_block(a, weights)))
            for j, b in enumerate(self.terms[i + 1 :], i + 1):
                Gab = compiled.get((i, j))
                if Gab is None:
                    Gab = a.rows.cross_block(b.rows, a.S, b.S, weights, self.dtype)
                blocks.append((a.cols, b.cols, Gab))
                blocks.append((b.cols, a.cols, Gab.T))
        n = self.n_cols
        if sparse:
            return sparse_gram(blocks, n, self.dtype, xp=self._xp, device=self.device)
        G = self._zeros((n, n))
        for rc, cc, B in blocks:
            G = add_block(G, rc, cc, B)
        return G

    def col_sums(self, weights: Any = None) -> Any:
        out = self._zeros((self.n_cols,))
        for t in self.terms:
            if t.rows.is_identity and weights is None:
                s = column_sums(t.S)
            else:
                cnt = astype(t.rows.counts(weights), self.dtype, copy=False)
                s = flat(safe_sparse_dot(t.S.T, cnt))
            out = add_rows(out, t.col_index, s)
        return out

    def col_sq_sums(self, weights: Any = None) -> Any:
        out = self._zeros((self.n_cols,))
        for t in self.terms:
            cnt = astype(t.rows.counts(weights), self.dtype, copy=False)
            out = add_rows(out, t.col_index, _sq_products(t.S, cnt, transpose=True))
        return out

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        out = self._zeros((self.n_rows,))
        for t in self.terms:
            if col_weights is None:
                r = _sq_products(t.S, None, transpose=False)
                r = astype(r, self.dtype, copy=False)
            else:
                v = select_rows(col_weights, t.col_index)
                r = _sq_products(t.S, v, transpose=False)
            out += t.rows.gather(r)
        return out

    def take_rows(self, rows: Any) -> FactorizedMatrix:
        """Rows ``rows`` of ``T``: the identity terms (the base table) gather their
        rows, so the slice keeps the identity fast paths (a product reads only the
        slice's base rows, not all of them and then gathers); the other terms
        compose their index vectors."""
        rows = as_index(rows, self._xp, self.device)
        n = int(rows.shape[0])
        maps: dict[int, RowMap] = {}
        gathered: dict[int, Any] = {}
        terms = []
        for t in self.terms:
            if id(t.rows) not in maps:
                maps[id(t.rows)] = (
                    RowMap(None, n).to_namespace(t.rows.xp, t.rows.device)
                    if t.rows.is_identity
                    else t.rows.take(rows)
                )
            S = t.S
            if t.rows.is_identity:
                if id(S) not in gathered:
                    gathered[id(S)] = select_rows(S, rows)
                S = gathered[id(S)]
            terms.append(Term(S, maps[id(t.rows)], t.cols, t.source))
        out = FactorizedMatrix(terms, n, self.n_cols, self.dtype)
        # Which source each term's rows came from (weakly: a slice does not keep
        # its root's base alive), for the caches' check that a slice belongs to
        # its root (``source_of_term``).
        origins = getattr(self, "_origins", None)  # None: pickled before origins
        out._origins = tuple(
            origins[i] if origins is not None else _weak(t.S)
            for i, t in enumerate(self.terms)
        )
        return out

    def source_of_term(self, i: int) -> Any:
        """The source term ``i``'s values were taken from: its ``S``, or for a row
        slice the root's source whose rows it gathered (None once collected)."""
        origins = getattr(self, "_origins", None)
        if origins is None or origins[i] is None:
            return self.terms[i].S
        return origins[i]()

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
        out = self.map_sources(lambda S: astype(S, dtype))
        out.dtype = np.dtype(dtype)
        return out

    def power(self, p: float) -> FactorizedMatrix:
        """``T ** p`` for ``p > 0`` (``ds ** p``), applied to the sources."""
        # Only the source rows that some target row takes are raised to the power;
        # the others become 0. Otherwise a row outside the join (dropped by an inner
        # join or a slice) could turn into NaN (a negative value to a fractional
        # power) or inf, and the reductions (counts of 0 times NaN) would be NaN.
        used: dict[int, np.ndarray] = {}
        for t in self.terms:
            mask = used.setdefault(id(t.S), np.zeros(t.S.shape[0], dtype=bool))
            if t.rows.is_identity:
                mask[:] = True
            else:
                mask[t.rows.idx[t.rows.idx >= 0]] = True

        def power(S: Any) -> Any:
            keep = used[id(S)]
            if sp.issparse(S):
                if not keep.all():
                    S = sp.csr_matrix(sp.diags(keep.astype(S.dtype)) @ S)
                    S.eliminate_zeros()
                return S.power(p)
            if keep.all():
                return S**p
            out = np.zeros_like(S)
            out[keep] = S[keep] ** p
            return out

        return self.map_sources(power)

    def materialize(self, format: Format = "auto") -> Any:
        n, m = self.shape
        if _resolve_format(format, self.is_sparse):
            return sparse_join(
                self.terms, n, m, self.dtype, xp=self._xp, device=self.device
            )
        out = self._zeros((n, m))
        written = np.zeros(m, dtype=bool)
        for t in self.terms:
            S = t.S
            # A sparse source is never densified whole (a few target rows of a
            # wide one-hot source would otherwise cost the full dense source):
            # its rows are gathered sparsely, then only that block is densified.
            # A dense one gets one appended zero row for the blocked gathers (no
            # masking).
            Sp = t.rows.pad(S)
            sel = t.col_index
            # The first owner of these columns writes, later ones add.
            add = bool(written[sel].any())
            written[sel] = True
            # Blocks of target rows: no n-sized gathered temporary.
            row_bytes = S.shape[1] * numpy_dtype(S.dtype).itemsize
            step = row_blocks(n, row_bytes, _BLOCK_BYTES, xp=self._xp)
            for start in range(0, n, step):
                rows = slice(start, min(start + step, n))
                block = to_dense(t.rows.gather(Sp, rows, padded=True))
                out = put_columns(out, rows, sel, block, add)
        return out

    def materialized(self) -> MatrixOperator:
        return MatrixOperator(self.materialize())

    def nnz(self) -> int:
        """Stored non-zeros of the joined matrix, computed without building it."""
        xp = self.xp
        total = 0
        for t in self.terms:
            total += int(float(xp.sum(t.rows.gather(row_nnz(t.S)))))
        return total


class AffineOperator(Operator):
    """``(T - 1 offset^T) diag(scale)`` with centering and scaling kept implicit.

    Parameters
    ----------
    base : Operator
        The operator ``T``.
    scale : array of shape (n_cols,) or None
        Column scales (None: ones).
    offset : array of shape (n_cols,) or None
        Column offsets subtracted before scaling (None: zeros).
    """

    def __init__(
        self,
        base: Operator,
        scale: Any = None,
        offset: Any = None,
    ) -> None:
        n = base.n_cols
        dtype = base.dtype
        self.base = base
        xp, dev = base.xp, base.device
        # None on NumPy: the marker of the host fast paths (``fused_layout``).
        self._xp = _device_namespace(xp)
        self.shape = base.shape
        self.dtype = dtype
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

    @staticmethod
    def _outer(a: Any, b: Any) -> Any:
        return a[:, None] * b[None, :]

    def _w_sum(self, weights: Any) -> float:
        if weights is None:
            return self.n_rows
        return float(self.xp.sum(as_array(weights)))

    @property
    def is_sparse(self) -> bool:
        return self.base.is_sparse and not self.has_offset

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + nbytes(self.scale) + nbytes(self.offset)

    @staticmethod
    def _col(X: Any, v: Any) -> Any:
        return X * (v if X.ndim == 1 else v[:, None])

    def matmul(self, X: Any, out: Any = None) -> Any:
        DX = self._col(as_array(X), self.scale)
        out = self.base.matmul(DX) if out is None else matmul_into(self.base, DX, out)
        if self.has_offset:
            out -= self.offset @ DX  # in place where the library allows it
        return out

    def rmatmul(self, Y: Any) -> Any:
        if not _any_sparse(Y):
            Y = as_array(Y)
        out = self.base.rmatmul(Y)
        if self.has_offset:
            ysum = column_sums(Y, self.xp)
            out = out - (
                self.offset * ysum if Y.ndim == 1 else self._outer(self.offset, ysum)
            )
        return self._col(out, self.scale)

    def gram(self, weights: Any = None, format: Format = "auto") -> Any:
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
        if _any_sparse(G):
            D = diags(d)
            G = D @ G @ D
        else:
            G = G * d[:, None] * d[None, :]
        return to_format(G, sparse)

    def col_sums(self, weights: Any = None) -> Any:
        s = self.base.col_sums(weights)
        w_sum = self._w_sum(weights)
        return (s - w_sum * self.offset) * self.scale

    def col_sq_sums(self, weights: Any = None) -> Any:
        q = self.base.col_sq_sums(weights)
        s = self.base.col_sums(weights)
        w_sum = self._w_sum(weights)
        o = self.offset
        return (q - 2 * o * s + w_sum * o * o) * self.scale**2

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        c = self.scale**2 if col_weights is None else self.scale**2 * col_weights
        out = self.base.row_sq_norms(c)
        if self.has_offset:
            out = (
                out - 2 * self.base.matmul(c * self.offset) + float(c @ self.offset**2)
            )
        return out

    def take_rows(self, rows: Any) -> AffineOperator:
        return AffineOperator(self.base.take_rows(rows), self.scale, self.offset)

    def materialize(self, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        if sparse and self.has_offset:
            raise ValueError(
                "a centered matrix is dense: it cannot be materialized as sparse."
            )
        A = self.base.materialize("sparse" if sparse else "dense")
        if sparse:
            return as_csr(A @ diags(self.scale))
        return (A - self.offset) * self.scale

    def materialized(self) -> AffineOperator:
        return AffineOperator(self.base.materialized(), self.scale, self.offset)

    def astype(self, dtype: Any) -> AffineOperator:
        return AffineOperator(self.base.astype(dtype), self.scale, self.offset)


# ------------------------------------------------------- columns shifted by a pilot
def _as_factorized(op: Operator) -> FactorizedMatrix:
    """``op`` (a factorized matrix, or a dense matrix as one identity term)."""
    if isinstance(op, FactorizedMatrix):
        return op
    if not isinstance(op, MatrixOperator) or op.is_sparse:
        raise TypeError(
            "columns can be shifted in a FactorizedMatrix or a dense MatrixOperator, "
            f"got {type(op).__name__}."
        )
    n, d = op.shape
    rows = RowMap(None, n).to_namespace(op.xp, op.device)
    return FactorizedMatrix([Term(op.A, rows, np.arange(d), 0)], n, d, op.dtype)


def sample_columns(
    op: Operator, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The values of ``op``'s columns on the target rows ``rows``.

    Reads only the sampled rows of each source (a gather of ``len(rows)`` rows per
    term), never the whole matrix: the pilots of :func:`shift_columns` are chosen
    from them.

    Parameters
    ----------
    op : FactorizedMatrix or MatrixOperator
    rows : ndarray of int of shape (m,)
        Host positions of target rows.

    Returns
    -------
    dense : ndarray of int of shape (k,)
        The columns that no sparse source places: the ones that can be shifted
        without densifying a source.
    values : ndarray of shape (m, k), float64, Fortran-ordered, on the host
        ``T[rows, dense]`` (zeros where a left join did not match).
    moments : ndarray of shape (2, n_cols)
        Mean and variance of the sampled values of the other columns (sparse
        sources stay sparse: no dense sample of a wide one-hot source), zeros on
        the dense ones.
    """
    m, d = int(rows.shape[0]), op.n_cols
    moments = np.zeros((2, d))
    none = np.zeros(0, dtype=np.int64)
    if isinstance(op, MatrixOperator):
        sample = select_rows(op.A, as_index(rows, op._xp, op.device))
        if op.is_sparse:
            moments[:] = _sparse_moments(sample, m)
            return none, np.zeros((m, 0), order="F"), moments
        return np.arange(d), np.asfortranarray(to_numpy(sample), np.float64), moments
    if not isinstance(op, FactorizedMatrix):
        return none, np.zeros((m, 0), order="F"), moments
    sparse = np.zeros(d, dtype=bool)
    placed = np.zeros(d, dtype=bool)
    for t in op.terms:
        (sparse if t.is_sparse else placed)[t.cols] = True
    dense = np.flatnonzero(placed & ~sparse)
    # Column-major: each term's columns are written, and each column is then
    # reduced, contiguously.
    values = np.zeros((m, dense.size), order="F")
    position = np.full(d, -1, dtype=np.int64)
    position[dense] = np.arange(dense.size)
    for t in op.terms:
        if t.is_sparse:
            moments[:, t.cols] += _sparse_moments(t.rows.take(rows).gather(t.S), m)
            continue
        pos = position[t.cols]
        keep = pos >= 0  # a column a sparse source also places is not shifted
        if not keep.any():
            continue
        sample = to_numpy(t.rows.take(rows).gather(t.S))
        # Every cell has one owner: adding places each owner's rows.
        values[:, pos[keep]] += sample[:, keep]
    moments[:, dense] = 0.0
    return dense, values, moments


def _sparse_moments(Z: Any, m: int) -> np.ndarray:
    """Column means and variances of a sparse sample of ``m`` rows (two passes
    over the stored values: the variance does not cancel), host."""
    Z = to_numpy(Z)
    Z = sp.csc_matrix(Z) if sp.issparse(Z) else sp.csc_matrix(np.asarray(Z))
    m = max(m, 1)
    mean = np.asarray(Z.sum(axis=0), dtype=np.float64).ravel() / m
    counts = np.diff(Z.indptr)
    dev = Z.data - np.repeat(mean, counts)
    stored = np.bincount(
        np.repeat(np.arange(Z.shape[1]), counts),
        weights=dev * dev,
        minlength=Z.shape[1],
    )
    var = (stored + (m - counts) * mean * mean) / m
    return np.stack([mean, var])


def _unmatched_rows(maps: list[RowMap], n_rows: int) -> RowMap | None:
    """A row map onto one source row for the target rows that none of ``maps``
    matches (None when every row is matched by one of them)."""
    if any(rm.is_identity or not rm.has_missing for rm in maps):
        return None
    xp = maps[0].xp
    unmatched = None
    for rm in maps:
        u = rm.idx < 0
        unmatched = u if unmatched is None else xp.logical_and(unmatched, u)
    if not bool(xp.any(unmatched)):
        return None
    if maps[0]._xp is None:
        return RowMap(np.where(unmatched, 0, -1), 1)
    dev = maps[0].device
    idx = xp.where(
        unmatched,
        xp.zeros(n_rows, dtype=xp.int32, device=dev),
        xp.full(n_rows, -1, dtype=xp.int32, device=dev),
    )
    return RowMap._device_copy(idx, 1, n_rows, xp, dev, True)


def shift_columns(op: Operator, cols: np.ndarray, values: np.ndarray) -> ShiftedMatrix:
    """``T - 1 c^T`` with ``c = values`` on columns ``cols`` (zero elsewhere), as an
    operator whose stored values are the shifted ones.

    The raw sums of a column whose mean is large against its spread cancel when
    they are centered (``sum x^2 - n mean^2`` keeps ``eps (mean / spread)^2`` of
    its relative accuracy); the sums of the shifted column do not. Per term ``I S
    M^T`` that places a shifted column, the shifted values ``S[:, j] - c_j`` are a
    new term on the same row map: a copy of those columns only where they are a
    few columns of a large source (the source itself is not copied: its shifted
    columns move to extra target columns that :class:`ShiftedMatrix` never
    shows), else the shifted copy of the whole source replaces it (a dimension
    table, or a source most of whose columns are shifted, see
    :func:`_copy_whole`). Where a left join leaves a shifted column
    unmatched, ``T`` is 0 and ``T - c`` is ``-c``: one more term, a one-row source
    ``-c`` on the unmatched rows (per set of owning terms). The extra terms are
    parameter-sized or copies of the shifted columns: sparse sources are never
    shifted (their columns are not in ``cols``).

    Parameters
    ----------
    op : FactorizedMatrix or MatrixOperator (dense)
    cols : ndarray of int of shape (k,)
        Target columns to shift (placed only by dense terms).
    values : ndarray of shape (k,)
        Their pilot values, exactly representable in ``op``'s dtype (a value of the
        column, so that the shifted values are exact differences).

    Returns
    -------
    ShiftedMatrix of shape op.shape
    """
    fm = _as_factorized(op)
    n, d = fm.shape
    cols = np.asarray(cols, dtype=np.int64)
    pilot = np.zeros(d)
    pilot[cols] = values
    shifted = np.zeros(d, dtype=bool)
    shifted[cols] = True
    owners: dict[int, list[int]] = {}
    terms: list[Term] = []
    extra = d
    for i, t in enumerate(fm.terms):
        pos = np.flatnonzero(shifted[t.cols])
        if pos.size == 0:
            terms.append(t)
            continue
        if t.is_sparse:
            raise ValueError(
                f"columns {t.cols[pos].tolist()} are placed by a sparse source: "
                "they cannot be shifted without densifying it."
            )
        for j in t.cols[pos]:
            owners.setdefault(int(j), []).append(i)
        if _copy_whole(t, pos.size, n):
            # The whole source shifted (zero on its other columns): the terms
            # keep their structure (no extra partner in the cross passes).
            c = asarray_on(pilot[t.cols], fm._xp, fm.device, fm.dtype)
            terms.append(Term(t.S - c, t.rows, t.cols, t.source))
            continue
        moved = np.array(t.cols, dtype=np.int64)
        moved[pos] = np.arange(extra, extra + pos.size)
        extra += pos.size
        terms.append(Term(t.S, t.rows, moved, t.source))
        c = asarray_on(pilot[t.cols[pos]], fm._xp, fm.device, fm.dtype)
        sel = contiguous_index(pos)
        # A slice is subtracted from in one pass (no gathered copy first).
        part = t.S[:, sel] if isinstance(sel, slice) else select_columns(t.S, pos)
        terms.append(Term(part - c, t.rows, t.cols[pos], t.source))
    groups: dict[tuple[int, ...], list[int]] = {}
    for j, who in owners.items():
        groups.setdefault(tuple(who), []).append(j)
    for who, js in groups.items():
        rows = _unmatched_rows([fm.terms[i].rows for i in who], n)
        if rows is None:
            continue
        J = np.array(sorted(js), dtype=np.int64)
        S = asarray_on(-pilot[J][None, :], fm._xp, fm.device, fm.dtype)
        terms.append(Term(S, rows, J, fm.terms[who[0]].source))
    return ShiftedMatrix(FactorizedMatrix(terms, n, extra, fm.dtype), d)


def _copy_whole(t: Term, n_shifted: int, n_rows: int) -> bool:
    """Whether to shift ``t``'s whole source rather than copy its shifted columns
    into a term of their own: when they are at least half of it (the copy then
    costs at most twice theirs), or when the source is no larger than two
    target-length columns (a dimension table: the copy is small and the
    factorized passes keep one partner per source)."""
    r, k = t.S.shape
    return 2 * n_shifted >= k or r * k <= 2 * n_rows


class ShiftedMatrix(Operator):
    """The first ``n_cols`` columns of a factorized matrix: ``T - 1 c^T`` as
    :func:`shift_columns` builds it.

    Its extra columns hold the unshifted values of the shifted columns (kept in
    place in their sources rather than copied); products pad with zeros for them
    and results leave them out. Every other method is the inner matrix's.

    Parameters
    ----------
    inner : FactorizedMatrix of shape (n_rows, n_inner)
    n_cols : int
        Columns shown (the first ``n_cols`` of ``inner``).
    """

    def __init__(self, inner: FactorizedMatrix, n_cols: int) -> None:
        self.inner = inner
        self.shape = (inner.n_rows, int(n_cols))
        self.dtype = inner.dtype

    @property
    def xp(self) -> Any:
        return self.inner.xp

    @property
    def device(self) -> Any:
        return self.inner.device

    @property
    def is_sparse(self) -> bool:
        return self.inner.is_sparse

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def hold(self, A: Any) -> Any:
        return self.inner.hold(A)

    def _pad(self, X: Any) -> Any:
        """``X`` (n_cols rows) with zero rows for the hidden columns."""
        n_extra = self.inner.n_cols - self.n_cols
        if n_extra == 0:
            return X
        X = as_array(X)
        dtype = numpy_dtype(X.dtype)
        pad = zeros(
            (n_extra,) + tuple(X.shape[1:]),
            dtype,
            xp=self.inner._xp,
            device=self.device,
        )
        if isinstance(X, np.ndarray):
            return np.concatenate([X, pad])
        return get_namespace(X).concat([X, pad], axis=0)

    def _head(self, A: Any) -> Any:
        return A[: self.n_cols, ...]

    def to_namespace(self, xp: Any, device: Any = None) -> ShiftedMatrix:
        inner = self.inner.to_namespace(xp, device)
        return self if inner is self.inner else ShiftedMatrix(inner, self.n_cols)

    def matmul(self, X: Any, out: Any = None) -> Any:
        return self.inner.matmul(self._pad(X), out=out)

    def rmatmul(self, Y: Any) -> Any:
        return self._head(self.inner.rmatmul(Y))

    def gram(self, weights: Any = None, format: Format = "auto") -> Any:
        G = self.inner.gram(weights, format)
        d = self.n_cols
        if _any_sparse(G):
            return as_csr(G[:d, :][:, :d])
        return G[:d, :d]

    def col_sums(self, weights: Any = None) -> Any:
        return self._head(self.inner.col_sums(weights))

    def col_sq_sums(self, weights: Any = None) -> Any:
        return self._head(self.inner.col_sq_sums(weights))

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        if col_weights is None:
            xdt = namespace_dtype(self.xp, self.dtype)
            col_weights = self.xp.ones(self.n_cols, dtype=xdt, device=self.device)
        return self.inner.row_sq_norms(self._pad(col_weights))

    def take_rows(self, rows: Any) -> ShiftedMatrix:
        return ShiftedMatrix(self.inner.take_rows(rows), self.n_cols)

    def materialize(self, format: Format = "auto") -> Any:
        A = self.inner.materialize(format)
        if _any_sparse(A):
            return as_csr(A[:, : self.n_cols])
        return A[:, : self.n_cols]

    def materialized(self) -> MatrixOperator:
        return MatrixOperator(self.materialize())

    def astype(self, dtype: Any) -> ShiftedMatrix:
        return ShiftedMatrix(self.inner.astype(dtype), self.n_cols)


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
        _LAYOUT_HOLDERS.add(op)
    return cached


#: The operators that hold a fused layout or a product plan (weakly), for
#: :func:`drop_fused_layouts`.
_LAYOUT_HOLDERS: weakref.WeakSet = weakref.WeakSet()


def drop_fused_layouts() -> None:
    """Forget every cached :class:`FusedLayout` and :class:`ProductPlan`
    (``ilargi_sklearn.clear_caches``): a layout may hold copies of the sources
    (stacked, made contiguous) and a plan facts about them (whether a source is
    binary, the dense form of a small sparse one), which an in-place change of a
    source would leave stale."""
    for op in list(_LAYOUT_HOLDERS):
        op.__dict__.pop("_fused_layout", None)
        op.__dict__.pop("_product_plan", None)
    _LAYOUT_HOLDERS.clear()


# ------------------------------------------------------ plan of the fused products
#: A sparse identity source with fewer stored entries than this many per row is
#: read as COO in the row passes (its entries, not its rows: CSR's per-row loop of
#: zero or one trips mispredicts), from this many on as CSR (measured crossover,
#: ``benchmarks/README.md``, "Fused products").
_COO_MAX_ENTRIES_PER_ROW = 1.0


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: numba types read-only arrays apart from writable
    ones, so the plan hands the kernels read-only arrays only (one compiled
    specialization, whatever the caller's flags)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _csr_arrays(S: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(indptr, indices, data)`` of a sparse ``S`` for the kernels, read-only
    views of a CSR ``S``'s own arrays (no copy: the kernels compile for its index
    type, int32 or int64)."""
    S = sp.csr_matrix(S)
    itype = np.promote_types(S.indptr.dtype, S.indices.dtype)
    return (
        _frozen(np.ascontiguousarray(S.indptr, dtype=itype)),
        _frozen(np.ascontiguousarray(S.indices, dtype=itype)),
        _frozen(np.ascontiguousarray(S.data)),
    )


def _dense_is_smaller(S: Any) -> bool:
    """Whether a sparse ``S`` takes no more bytes dense than as CSR."""
    n, m = S.shape
    return n * m * S.dtype.itemsize <= nbytes(S)


def _as_dense(S: Any) -> np.ndarray | None:
    """``S`` as the dense rows the plan reads, or None to keep it sparse: a dense
    ``S`` (C-ordered), or a sparse one whose dense form takes no more bytes."""
    if not sp.issparse(S):
        return _frozen(np.ascontiguousarray(S))
    if _dense_is_smaller(S):
        return _frozen(S.toarray())
    return None


@dataclass(frozen=True)
class PlanSource:
    """One term's source in a :class:`ProductPlan`: its part of a group's table.

    Attributes
    ----------
    dense : ndarray of shape (n_rows, width) or None
        The source as dense rows, or None for CSR.
    indptr, indices, data : ndarray
        Its CSR arrays when ``dense`` is None.
    binary : bool
        Whether every stored value is 1 (a one-hot encoding: the kernels do not
        read the values).
    n_rows : int
    cols : slice or ndarray of int
        Target columns of the source's columns (the term's ``col_index``).
    offset : int
        First row of its group's table.
    own_cols : bool
        Whether no other term places values in its target columns (its
        transposed product can then add into them while others run).
    matrix : ndarray or sparse matrix
        The source as the products with several columns read it: ``dense`` where
        there is one, else the term's own sparse matrix (BLAS and SciPy products).
    """

    dense: np.ndarray | None
    indptr: np.ndarray | None
    indices: np.ndarray | None
    data: np.ndarray | None
    binary: bool
    n_rows: int
    width: int
    cols: slice | np.ndarray
    offset: int
    own_cols: bool
    matrix: Any = field(default=None, repr=False)

    @property
    def work(self) -> int:
        """Multiply-adds of one product with a vector (its entries)."""
        if self.dense is None:
            return int(self.indptr[-1])
        return self.n_rows * self.width


@dataclass(frozen=True)
class ProductPlan:
    """A NumPy factorized matrix as the compiled products read it
    (:mod:`._products_numba`), with each source's format chosen once.

    ``T = X0 M0^T + B Mb^T + sum_g I_g (sum_t S_t M_t^T)``: an optional dense
    identity source ``X0`` and an optional sparse one ``B`` (read inside the row
    passes), and the row groups, whose source-side products are stacked in one
    table of ``total`` entries (group ``g`` from ``offsets[g]``, its unmatched rows
    taking entry ``offsets[g] + pads[g]``, a zero).

    The format of each source is chosen from its structure when the plan is built
    (rules measured once, ``benchmarks/README.md``, "Fused products"), never per
    call: a sparse source whose dense form takes no more bytes is read as dense
    rows; a sparse identity source as one entry per row (CSR row pointers
    ``0, 1, ..., n``: a one-hot column), as COO (fewer than
    :data:`_COO_MAX_ENTRIES_PER_ROW` entries per row) or as CSR; the values of a
    binary sparse source (a one-hot encoding) are not read. Every array is a
    read-only view of the sources' own (no copy), except the dense form of a sparse
    source (no bigger than it) and the rows of a COO identity source.
    """

    n_rows: int
    n_cols: int
    dense: np.ndarray | None
    dense_cols: slice | np.ndarray
    kind: int
    indptr: np.ndarray
    rows: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    binary: bool
    sparse_cols: slice | np.ndarray
    sparse_width: int
    idxs: tuple
    offsets: np.ndarray
    pads: np.ndarray
    total: int
    #: The terms of each row group (their products with a vector are summed into
    #: the group's part of the table).
    groups: tuple[tuple[PlanSource, ...], ...]
    #: Placeholder of an absent dense identity source (shape ``(n_rows, 0)``).
    no_dense: np.ndarray = field(repr=False)


def _fused_width(X: Any) -> bool:
    """Whether a product with ``X`` may take the compiled path: a vector, or
    ``2 <= k <=`` :data:`~._products_numba.MATMAT_COLUMNS` columns (wider, the
    NumPy path's BLAS and SciPy products of the gathered blocks are faster; one
    column as a 2-D array, the linear models' statistics with one target, keeps
    the NumPy path's sums, which the elastic net's alpha grid needs to equal
    scikit-learn's bit for bit)."""
    if X.ndim == 1:
        return True
    return X.ndim == 2 and 2 <= X.shape[1] <= MATMAT_COLUMNS


def _product_plan(fm: FactorizedMatrix) -> ProductPlan | None:
    """The :class:`ProductPlan` of a NumPy factorized matrix, or None where the
    compiled products do not apply (device sources, another dtype than float32 or
    float64, no target rows, no row group with an index vector, or more than one
    dense or one sparse identity source: the NumPy path serves those)."""
    n, m = fm.shape
    if (
        fm._xp is not None
        or n == 0
        or fm.dtype not in (np.float32, np.float64)
        or any(np.dtype(t.S.dtype) not in (np.float32, np.float64) for t in fm.terms)
    ):
        return None
    # Terms per target column (overlapping sources share columns).
    coverage = np.zeros(m, dtype=np.int64)
    for t in fm.terms:
        np.add.at(coverage, np.asarray(t.cols, dtype=np.int64), 1)
    dense = base = None
    dense_cols: slice | np.ndarray = slice(0, 0)
    base_cols: slice | np.ndarray = slice(0, 0)
    idxs, offsets, pads, groups = [], [], [], []
    total = 0
    for rows, terms in fm._row_groups():
        if rows.is_identity:
            for t in terms:
                D = _as_dense(t.S)
                if D is None:
                    if base is not None:
                        return None
                    base, base_cols = t.S, t.col_index
                else:
                    if dense is not None:
                        return None
                    dense, dense_cols = D, t.col_index
            continue
        offset = total
        group = []
        for t in terms:
            D = _as_dense(t.S)
            parts = (None, None, None) if D is not None else _csr_arrays(t.S)
            binary = parts[2] is not None and bool(np.all(parts[2] == 1))
            r, width = int(t.S.shape[0]), int(t.S.shape[1])
            own = bool(np.all(coverage[t.cols] == 1))
            matrix = t.S if D is None else D
            src = PlanSource(
                D, *parts, binary, r, width, t.col_index, offset, own, matrix
            )
            group.append(src)
        groups.append(tuple(group))
        r = rows.n_source_rows
        idxs.append(_frozen(np.ascontiguousarray(rows.idx, dtype=np.int64)))
        offsets.append(offset)
        pads.append(r)
        total += r + 1
    if not idxs:
        return None
    kind, width = BASE_NONE, 0
    indptr = indices = coo_rows = _frozen(np.zeros(1, dtype=np.int32))
    data = _frozen(np.zeros(0, dtype=fm.dtype))
    binary = False
    if base is not None:
        indptr, indices, data = _csr_arrays(base)
        binary = bool(np.all(data == 1))
        width = int(base.shape[1])
        nnz = int(indptr[-1])
        if nnz == n and np.array_equal(indptr, np.arange(n + 1)):
            kind = BASE_ONE
        elif nnz < _COO_MAX_ENTRIES_PER_ROW * n:
            kind = BASE_COO
            coo_rows = np.repeat(np.arange(n, dtype=indptr.dtype), np.diff(indptr))
            coo_rows = _frozen(coo_rows)
        else:
            kind = BASE_CSR
    return ProductPlan(
        n_rows=n,
        n_cols=m,
        dense=dense,
        dense_cols=dense_cols,
        kind=kind,
        indptr=indptr,
        rows=coo_rows,
        indices=indices,
        data=data,
        binary=binary,
        sparse_cols=base_cols,
        sparse_width=width,
        idxs=tuple(idxs),
        offsets=_frozen(np.asarray(offsets, dtype=np.int64)),
        pads=_frozen(np.asarray(pads, dtype=np.int64)),
        total=total,
        groups=tuple(groups),
        no_dense=_frozen(np.zeros((n, 0), dtype=fm.dtype)),
    )
