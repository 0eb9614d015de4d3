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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend import RowMap, safe_sparse_dot

__all__ = ["AffineOperator", "FactorizedMatrix", "MatrixOperator", "Operator", "Term"]

Format = Literal["auto", "dense", "sparse"]


def _result_dtype(op_dtype: np.dtype, X: Any) -> np.dtype:
    return np.result_type(op_dtype, getattr(X, "dtype", np.float64))


def _sq(S: Any) -> Any:
    return S.multiply(S) if sp.issparse(S) else S * S


class Operator(ABC):
    """A matrix ``T`` of shape ``(n_rows, n_cols)`` known through its products.

    Subclasses implement the products and reductions below; all of them accept and
    return NumPy arrays (sparse results only where ``format`` asks for them).
    """

    shape: tuple[int, int]
    dtype: np.dtype

    @abstractmethod
    def matmul(self, X: np.ndarray) -> np.ndarray:
        """``T @ X`` for ``X`` of shape ``(n_cols,)`` or ``(n_cols, k)``."""

    @abstractmethod
    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        """``T.T @ Y`` for ``Y`` of shape ``(n_rows,)`` or ``(n_rows, k)``."""

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
    def n_cols(self) -> int:
        return self.shape[1]

    def row_sums(self) -> np.ndarray:
        """``T @ 1``."""
        return self.matmul(np.ones(self.n_cols, dtype=self.dtype))

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


class MatrixOperator(Operator):
    """The operator protocol over a plain dense ndarray or SciPy sparse matrix.

    Parameters
    ----------
    A : ndarray or sparse matrix of shape (n_rows, n_cols)
        The matrix; sparse input is kept as CSR.
    """

    def __init__(self, A: Any) -> None:
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
        return sp.issparse(self.A)

    @property
    def nbytes(self) -> int:
        A = self.A
        if sp.issparse(A):
            return int(A.data.nbytes + A.indices.nbytes + A.indptr.nbytes)
        return int(A.nbytes)

    def matmul(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(safe_sparse_dot(self.A, X))

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        return np.asarray(safe_sparse_dot(self.A.T, Y))

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        A = self.A
        if weights is None:
            G = A.T @ A
        elif sp.issparse(A):
            G = A.T @ sp.diags(np.asarray(weights, dtype=A.dtype)) @ A
        else:
            G = (A * np.asarray(weights, dtype=A.dtype)[:, None]).T @ A
        return _to_format(G, _resolve_format(format, self.is_sparse))

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        if weights is None:
            return np.asarray(self.A.sum(axis=0)).ravel().astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(self.A.T, weights)).ravel()

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        A2 = _sq(self.A)
        if weights is None:
            return np.asarray(A2.sum(axis=0)).ravel().astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(A2.T, weights)).ravel()

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        A2 = _sq(self.A)
        if col_weights is None:
            return np.asarray(A2.sum(axis=1)).ravel().astype(self.dtype, copy=False)
        return np.asarray(safe_sparse_dot(A2, col_weights)).ravel()

    def take_rows(self, rows: np.ndarray) -> MatrixOperator:
        return MatrixOperator(self.A[rows])

    def materialize(self, format: Format = "auto") -> Any:
        return _to_format(self.A, _resolve_format(format, self.is_sparse))

    def materialized(self) -> MatrixOperator:
        return self

    def astype(self, dtype: Any) -> MatrixOperator:
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

    @property
    def is_sparse(self) -> bool:
        return sp.issparse(self.S)


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
                if sp.issparse(S):
                    total += S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
                else:
                    total += S.nbytes
            total += t.rows.nbytes
        return int(total)

    def _out(self, X: Any, n: int) -> np.ndarray:
        shape = (n,) if X.ndim == 1 else (n, X.shape[1])
        return np.zeros(shape, dtype=_result_dtype(self.dtype, X))

    def matmul(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        out = self._out(X, self.n_rows)
        for t in self.terms:
            # Multiply the small source first, then gather (never I S first).
            out += t.rows.gather(np.asarray(safe_sparse_dot(t.S, X[t.cols])))
        return out

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y)
        out = self._out(Y, self.n_cols)
        for t in self.terms:
            out[t.cols] += np.asarray(safe_sparse_dot(t.S.T, t.rows.scatter(Y)))
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

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        blocks = []
        for i, a in enumerate(self.terms):
            cnt = a.rows.counts(weights).astype(self.dtype, copy=False)
            if sp.issparse(a.S):
                Gaa = a.S.T @ sp.diags(cnt) @ a.S
            else:
                Gaa = (a.S * cnt[:, None]).T @ a.S
            blocks.append((a.cols, a.cols, Gaa))
            for b in self.terms[i + 1 :]:
                Gab = self._block(a, b, weights)
                blocks.append((a.cols, b.cols, Gab))
                blocks.append((b.cols, a.cols, Gab.T))
        n = self.n_cols
        if not sparse:
            G = np.zeros((n, n), dtype=self.dtype)
            for rc, cc, B in blocks:
                G[np.ix_(rc, cc)] += B.toarray() if sp.issparse(B) else B
            return G
        rows, cols, vals = [], [], []
        for rc, cc, B in blocks:
            B = sp.coo_matrix(B)
            rows.append(rc[B.row])
            cols.append(cc[B.col])
            vals.append(B.data)
        return sp.csr_matrix(
            (np.concatenate(vals).astype(self.dtype), (np.concatenate(rows), np.concatenate(cols))),
            shape=(n, n),
        )

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros(self.n_cols, dtype=self.dtype)
        for t in self.terms:
            cnt = t.rows.counts(weights).astype(self.dtype, copy=False)
            out[t.cols] += np.asarray(safe_sparse_dot(t.S.T, cnt)).ravel()
        return out

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros(self.n_cols, dtype=self.dtype)
        for t in self.terms:
            cnt = t.rows.counts(weights).astype(self.dtype, copy=False)
            out[t.cols] += np.asarray(safe_sparse_dot(_sq(t.S).T, cnt)).ravel()
        return out

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros(self.n_rows, dtype=self.dtype)
        for t in self.terms:
            S2 = _sq(t.S)
            if col_weights is None:
                r = np.asarray(S2.sum(axis=1)).ravel().astype(self.dtype, copy=False)
            else:
                r = np.asarray(safe_sparse_dot(S2, col_weights[t.cols])).ravel()
            out += t.rows.gather(r)
        return out

    def take_rows(self, rows: np.ndarray) -> FactorizedMatrix:
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
        out = self.map_sources(lambda S: S.astype(dtype))
        out.dtype = np.dtype(dtype)
        return out

    def materialize(self, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        n, m = self.shape
        if not sparse:
            out = np.zeros((n, m), dtype=self.dtype)
            for t in self.terms:
                S = t.S.toarray() if sp.issparse(t.S) else t.S
                out[:, t.cols] += t.rows.gather(S)
            return out
        rows, cols, vals = [], [], []
        for t in self.terms:
            P = sp.coo_matrix(t.rows.indicator(self.dtype) @ sp.csr_matrix(t.S))
            keep = P.data != 0
            rows.append(P.row[keep])
            cols.append(t.cols[P.col[keep]])
            vals.append(P.data[keep])
        return sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(n, m),
            dtype=self.dtype,
        )

    def materialized(self) -> MatrixOperator:
        return MatrixOperator(self.materialize())

    def nnz(self) -> int:
        """Stored non-zeros of the joined matrix, computed without building it."""
        total = 0
        for t in self.terms:
            per_row = (
                np.diff(t.S.indptr)
                if sp.issparse(t.S)
                else np.count_nonzero(t.S, axis=1)
            )
            total += int(t.rows.gather(per_row.astype(np.float64)).sum())
        return total


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
        self, base: Operator, scale: np.ndarray | None = None, offset: np.ndarray | None = None
    ) -> None:
        n = base.n_cols
        dtype = base.dtype
        self.base = base
        self.scale = (
            np.ones(n, dtype=dtype) if scale is None else np.asarray(scale, dtype=dtype)
        )
        self.offset = (
            np.zeros(n, dtype=dtype) if offset is None else np.asarray(offset, dtype=dtype)
        )
        self.shape = base.shape
        self.dtype = dtype

    @property
    def has_offset(self) -> bool:
        return bool(np.any(self.offset != 0))

    @property
    def is_sparse(self) -> bool:
        return self.base.is_sparse and not self.has_offset

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.scale.nbytes + self.offset.nbytes

    def _col(self, X: np.ndarray, v: np.ndarray) -> np.ndarray:
        return X * (v if X.ndim == 1 else v[:, None])

    def matmul(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        DX = self._col(X, self.scale)
        out = self.base.matmul(DX)
        if self.has_offset:
            out = out - self.offset @ DX
        return out

    def rmatmul(self, Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y)
        out = self.base.rmatmul(Y)
        if self.has_offset:
            out = out - np.multiply.outer(self.offset, Y.sum(axis=0))
        return self._col(out, self.scale)

    def gram(self, weights: np.ndarray | None = None, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        G = self.base.gram(weights, format="sparse" if (sparse and not self.has_offset) else "dense")
        if self.has_offset:
            s = self.base.col_sums(weights)
            w_sum = self.n_rows if weights is None else float(np.sum(weights))
            o = self.offset
            G = G - np.outer(s, o) - np.outer(o, s) + w_sum * np.outer(o, o)
        d = self.scale
        if sp.issparse(G):
            D = sp.diags(d)
            return _to_format(D @ G @ D, sparse)
        return _to_format(G * d[:, None] * d[None, :], sparse)

    def col_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        s = self.base.col_sums(weights)
        w_sum = self.n_rows if weights is None else float(np.sum(weights))
        return (s - w_sum * self.offset) * self.scale

    def col_sq_sums(self, weights: np.ndarray | None = None) -> np.ndarray:
        q = self.base.col_sq_sums(weights)
        s = self.base.col_sums(weights)
        w_sum = self.n_rows if weights is None else float(np.sum(weights))
        o = self.offset
        return (q - 2 * o * s + w_sum * o * o) * self.scale**2

    def row_sq_norms(self, col_weights: np.ndarray | None = None) -> np.ndarray:
        c = self.scale**2 if col_weights is None else self.scale**2 * col_weights
        out = self.base.row_sq_norms(c)
        if self.has_offset:
            out = out - 2 * self.base.matmul(c * self.offset) + float(c @ self.offset**2)
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
        if sparse:
            return sp.csr_matrix(A @ sp.diags(self.scale))
        return (A - self.offset) * self.scale

    def materialized(self) -> AffineOperator:
        return AffineOperator(self.base.materialized(), self.scale, self.offset)

    def astype(self, dtype: Any) -> AffineOperator:
        return AffineOperator(self.base.astype(dtype), self.scale, self.offset)
