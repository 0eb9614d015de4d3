"""Degree-2 polynomial features of any operator, never building the n x d^2 matrix.

:class:`InteractionOperator` is ``P = [1, T, T_a * T_b for a <= b]``, the columns of
:class:`sklearn.preprocessing.PolynomialFeatures` (degree 2) of the columns of a
base operator ``T`` (a :class:`~ilargi_sklearn.multisource.FactorizedMatrix`, an
:class:`~ilargi_sklearn.multisource.AffineOperator` after a scaler, a
:class:`~ilargi_sklearn.multisource.MatrixOperator`). It is written once, over the
base's protocol methods, with one faster path for the row-wise quadratic forms of a
factorized matrix:

* ``P w = w_0 + T w_1 + rowsum((T W) * T)`` with ``W`` the symmetric matrix of the
  quadratic weights (off-diagonal entries halved). Over any operator, ``T W`` is
  one product of the base, multiplied row-wise with ``T`` (its materialization, or
  ``T E`` for identity columns ``E`` over blocks of columns when memory is short).
  A factorized matrix takes the pairs of its sources instead
  (:func:`rowwise_quadratic`): within one row map ``rowsum((S_a W_ab) * S_b)`` is
  source-sized, across two only the narrower side's columns are gathered; an
  affine layer (a scaler's centering) is moved into ``W`` and two products.
* ``P^T g = [sum(g), T^T g, triu(T^T diag(g) T)]``: the weighted gram of the base,
  factorized (one per right-hand-side column).
* The gram of ``P`` holds fourth-order sums: it is computed exactly from blocks of
  rows of the materialized ``P`` (the slow path), which is why the operator sets
  ``prefers_products``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
)
from ilargi_sklearn._backend._ops import (
    as_array,
    astype,
    canonical_csr,
    column_sums,
    diags,
    empty,
    flat,
    is_sparse,
    result_dtype,
    row_sums,
    safe_sparse_dot,
    square,
    to_dense,
    to_format,
    zeros,
)
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    Format,
    MatrixOperator,
    Operator,
    _resolve_format,
)

__all__ = [
    "InteractionOperator",
    "n_output_features",
    "pair_columns",
    "rowwise_quadratic",
]

#: Bytes of the n-sized intermediates of one product (``T [W_J | E_J]``, or
#: ``T W`` and ``T``): the quadratic part runs over as many blocks of columns of
#: ``W`` as it takes to stay below this.
_PRODUCT_BYTES = 1 << 27
#: Bytes of one block of materialized polynomial rows (gram, squared sums).
_ROW_BLOCK_BYTES = 1 << 25
#: Rows per block of a sparse base: the width of a sparse block is its stored
#: entries, not ``n_cols``, so the dense sizing above would make tiny blocks.
_SPARSE_BLOCK_ROWS = 16_384


def pair_columns(n_features: int, interaction_only: bool) -> tuple[np.ndarray, ...]:
    """The factors ``(a, b)`` of the degree-2 columns, in scikit-learn's order.

    ``a <= b`` (``a < b`` with ``interaction_only``), ``a`` major: the order of
    ``itertools.combinations_with_replacement`` that ``PolynomialFeatures`` uses.
    """
    return np.triu_indices(n_features, k=1 if interaction_only else 0)


def n_output_features(
    n_features: int, degree: int, interaction_only: bool, include_bias: bool
) -> int:
    """Number of columns of the degree-``degree`` (1 or 2) polynomial features."""
    n_pairs = 0
    if degree == 2:
        n_pairs = n_features * (n_features - 1) // 2
        if not interaction_only:
            n_pairs += n_features
    return int(include_bias) + n_features + n_pairs


class InteractionOperator(Operator):
    """The polynomial features of degree 1 or 2 of an operator, kept implicit.

    Columns, as in :class:`sklearn.preprocessing.PolynomialFeatures`: the bias
    (``include_bias``), the ``d`` columns of ``base``, then the products
    ``T_a * T_b`` for ``a <= b`` (``a < b`` with ``interaction_only``), ``a`` major.

    Parameters
    ----------
    base : Operator
        The operator ``T`` of shape ``(n_rows, d)``.
    degree : {1, 2}, default=2
        1: the bias and ``T`` only.
    interaction_only : bool, default=False
        Leave out the squares ``T_a * T_a``.
    include_bias : bool, default=True
        Start with a column of ones.

    Attributes
    ----------
    prefers_products : bool
        True: the gram is the slow path, iterate on ``matmul`` and ``rmatmul``.

    See Also
    --------
    ilargi_sklearn.preprocessing.FactorizedPolynomialFeatures : The transformer whose
        datasets carry this operator.
    sklearn.preprocessing.PolynomialFeatures : The same columns, materialized.

    Notes
    -----
    ``P w = w_0 + T w_1 + rowsum((T W) * T)`` and
    ``P^T g = [1^T g, T^T g, triu(T^T diag(g) T)]``, with ``W`` the symmetric matrix
    of the pair weights (off-diagonal entries halved).

    Costs for ``k`` right-hand-side columns: ``matmul`` is ``T w_1`` plus, over a
    factorized base, source-sized products ``S_a W_ab`` and ``n min(c_a, c_b) k``
    gathered entries per pair of sources with different row maps; over another
    base, one product with ``k d`` columns and its materialization (or ``d`` more
    product columns, block by block, when the ``n x (k + 1) d`` intermediates
    exceed :data:`_PRODUCT_BYTES`). ``rmatmul`` is ``k`` weighted grams of the base. ``gram``,
    ``col_sq_sums`` and ``row_sq_norms`` read the materialized rows block by block:
    ``O(n p^2)`` and ``O(n p)`` for ``p = n_cols``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.preprocessing import PolynomialFeatures
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.multisource import InteractionOperator
    >>> ds = MultiSourceDataset.from_matrices(
    ...     [np.array([[1.0], [2.0], [3.0]]), np.array([[10.0], [20.0]])],
    ...     [None, np.array([0, 1, -1])])
    >>> op = InteractionOperator(ds.operator)
    >>> op.shape
    (3, 6)
    >>> w = np.arange(6.0)
    >>> op.matmul(w)
    array([ 564., 2214.,   30.])
    >>> P = PolynomialFeatures(2).fit_transform(ds.materialize())
    >>> bool(np.allclose(op.matmul(w), P @ w))
    True
    """

    prefers_products = True

    def __init__(
        self,
        base: Operator,
        *,
        degree: int = 2,
        interaction_only: bool = False,
        include_bias: bool = True,
    ) -> None:
        if degree not in (1, 2):
            raise ValueError(
                f"degree must be 1 or 2 over joins, got {degree!r}; materialize and "
                "use sklearn.preprocessing.PolynomialFeatures for higher degrees."
            )
        self.base = base
        self.degree = int(degree)
        self.interaction_only = bool(interaction_only)
        self.include_bias = bool(include_bias)
        d = base.n_cols
        a, b = pair_columns(d, self.interaction_only) if degree == 2 else ((), ())
        self._a = np.asarray(a, dtype=np.int64)
        self._b = np.asarray(b, dtype=np.int64)
        n_pairs = self._a.shape[0]
        self._n_bias = int(self.include_bias)
        self.shape = (base.n_rows, self._n_bias + d + n_pairs)
        self.dtype = base.dtype
        xp, dev = base.xp, base.device
        # W[a, b] = W[b, a] = half the weight of pair (a, b) (all of it for a square):
        # entry a * d + b of W is row ``_w_index`` of [0, weights * _w_factor]
        # (row 0: no such pair, the squares under ``interaction_only``).
        w_index = np.zeros(d * d, dtype=np.int64)
        w_index[self._a * d + self._b] = np.arange(1, n_pairs + 1)
        w_index[self._b * d + self._a] = np.arange(1, n_pairs + 1)
        factor = np.where(self._a == self._b, 1.0, 0.5)
        self._w_index = asarray_on(w_index, xp, dev)
        self._w_factor = asarray_on(factor, xp, dev, base.dtype)
        # Flat positions of the upper-triangle entries of a d x d gram.
        self._triu = asarray_on(self._a * d + self._b, xp, dev)

    # ----------------------------------------------------------- properties
    @property
    def n_pairs(self) -> int:
        """Number of degree-2 columns."""
        return int(self._a.shape[0])

    @property
    def xp(self) -> Any:
        return self.base.xp

    @property
    def device(self) -> Any:
        return self.base.device

    @property
    def is_sparse(self) -> bool:
        return self.base.is_sparse

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    def hold(self, A: Any) -> Any:
        return self.base.hold(A)

    def _like(self, base: Operator) -> InteractionOperator:
        return InteractionOperator(
            base,
            degree=self.degree,
            interaction_only=self.interaction_only,
            include_bias=self.include_bias,
        )

    def to_namespace(self, xp: Any, device: Any = None) -> InteractionOperator:
        base = self.base.to_namespace(xp, device)
        return self if base is self.base else self._like(base)

    def astype(self, dtype: Any) -> InteractionOperator:
        return self._like(self.base.astype(dtype))

    def take_rows(self, rows: Any) -> InteractionOperator:
        return self._like(self.base.take_rows(rows))

    # ------------------------------------------------------------- products
    def matmul(self, X: Any, out: Any = None) -> Any:
        xp = self.xp
        X = as_array(X)
        n, d, nb = self.n_rows, self.base.n_cols, self._n_bias
        vec = X.ndim == 1
        X2 = xp.reshape(X, (X.shape[0], 1)) if vec else X
        res = self.base.matmul(X2[nb : nb + d, :])
        if self.n_pairs:
            res = res + rowwise_quadratic(self.base, self._pair_matrix(X2[nb + d :, :]))
        if nb:
            res = res + X2[0:1, :]
        res = astype(res, result_dtype(self.dtype, X), copy=False)
        if vec:
            res = xp.reshape(res, (n,))
        if out is not None:
            out[...] = res
            return out
        return res

    def _pair_matrix(self, Xq: Any) -> Any:
        """The symmetric ``(d, d, k)`` weights ``W`` of the pair weights ``Xq``."""
        xp = self.xp
        d, k = self.base.n_cols, int(Xq.shape[1])
        xdt = namespace_dtype(xp, result_dtype(self.dtype, Xq))
        v = xp.concat(
            [
                xp.zeros((1, k), dtype=xdt, device=self.device),
                Xq * self._w_factor[:, None],
            ],
            axis=0,
        )
        return xp.reshape(xp.take(v, self._w_index, axis=0), (d, d, k))

    def rmatmul(self, Y: Any) -> Any:
        xp = self.xp
        sparse = is_sparse(Y)
        if not sparse:
            Y = as_array(Y)
        vec = Y.ndim == 1
        lin = self.base.rmatmul(Y)
        dtype = result_dtype(self.dtype, Y)
        if vec:
            columns = [Y]
        elif sparse:
            Yc = sp.csc_matrix(Y)
            columns = [flat(Yc[:, [r]].toarray()) for r in range(Y.shape[1])]
        else:
            columns = [Y[:, r] for r in range(Y.shape[1])]
        parts = []
        if self._n_bias:
            if sparse:
                s = flat(Y.sum(axis=0))
            else:
                s = xp.sum(Y, axis=0)
            parts.append(xp.reshape(s, (1,) if vec else (1, -1)))
        parts.append(lin)
        if self.n_pairs:
            d = self.base.n_cols
            quad = [
                xp.take(
                    xp.reshape(self.base.gram(g, format="dense"), (d * d,)),
                    self._triu,
                    axis=0,
                )
                for g in columns
            ]
            parts.append(quad[0] if vec else xp.stack(quad, axis=1))
        xdt = namespace_dtype(xp, dtype)
        return xp.concat([xp.astype(p, xdt, copy=False) for p in parts], axis=0)

    # ------------------------------------------------- materialized row blocks
    def _expand(self, T: Any) -> Any:
        """The polynomial rows of a block ``T`` of base rows (dense or sparse)."""
        if sp.issparse(T):
            return self._expand_sparse(T)
        T = to_dense(T)
        xp = get_namespace(T)
        m, d = int(T.shape[0]), self.base.n_cols
        nb = self._n_bias
        out = empty((m, self.n_cols), numpy_dtype(T.dtype), xp=xp, device=self.device)
        if nb:
            out[:, 0:1] = xp.ones((m, 1), dtype=T.dtype, device=self.device)
        out[:, nb : nb + d] = T
        col = nb + d
        if self.n_pairs:
            for a in range(d):
                start = a + 1 if self.interaction_only else a
                if start >= d:
                    break
                out[:, col : col + d - start] = T[:, a : a + 1] * T[:, start:]
                col += d - start
        return out

    def _expand_sparse(self, T: Any) -> sp.csr_matrix:
        """The polynomial rows of a SciPy sparse block, pairs of stored entries only.

        Within a row, each stored entry ``e`` (column ``a``) pairs with the entries
        from ``e`` on (after ``e`` with ``interaction_only``) in sorted column order,
        so ``a <= b`` and the output column follows from ``(a, b)`` directly.
        """
        A = canonical_csr(T)
        A.sort_indices()
        m, d = A.shape
        nb = self._n_bias
        counts = np.diff(A.indptr)
        row = np.repeat(np.arange(m, dtype=np.int64), counts)
        rows, cols, vals = [row], [A.indices.astype(np.int64) + nb], [A.data]
        if nb:
            rows.append(np.arange(m, dtype=np.int64))
            cols.append(np.zeros(m, dtype=np.int64))
            vals.append(np.ones(m, dtype=A.dtype))
        if self.n_pairs:
            skip = int(self.interaction_only)
            pos = np.arange(A.nnz, dtype=np.int64) - A.indptr[row]
            n_partners = np.maximum(counts[row] - pos - skip, 0)
            first = np.repeat(np.arange(A.nnz, dtype=np.int64), n_partners)
            starts = np.repeat(np.cumsum(n_partners) - n_partners, n_partners)
            second = first + skip + (np.arange(first.shape[0]) - starts)
            a = A.indices[first].astype(np.int64)
            b = A.indices[second].astype(np.int64)
            # Offset of pair row a in the upper triangle (without its diagonal).
            if skip:
                pair = a * (d - 1) - a * (a - 1) // 2 + (b - a - 1)
            else:
                pair = a * d - a * (a - 1) // 2 + (b - a)
            rows.append(row[first])
            cols.append(pair + nb + d)
            vals.append(A.data[first] * A.data[second])
        coo = sp.coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(m, self.n_cols),
            dtype=A.dtype,
        )
        return coo.tocsr()

    def _block_rows(self) -> int:
        if self.base.is_sparse:
            return _SPARSE_BLOCK_ROWS
        return max(1, _ROW_BLOCK_BYTES // max(1, self.n_cols * self.dtype.itemsize))

    def _row_blocks(self, sparse: bool) -> Iterator[tuple[slice, Any]]:
        """``(rows, P[rows])`` over blocks of rows, each block materialized alone."""
        n = self.n_rows
        step = self._block_rows()
        fmt = "sparse" if sparse else "dense"
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            T = self.base.take_rows(np.arange(lo, hi)).materialize(fmt)
            yield slice(lo, hi), self._expand(T)

    def _weights(self, weights: Any) -> Any:
        if weights is None:
            return None
        return asarray_on(as_array(weights), self.xp, self.device, self.dtype)

    def gram(self, weights: Any = None, format: Format = "auto") -> Any:
        """``P^T diag(weights) P`` from blocks of materialized rows (the slow path)."""
        sparse = _resolve_format(format, self.is_sparse)
        w = self._weights(weights)
        G = None
        for rows, P in self._row_blocks(self.is_sparse):
            if w is None:
                Pw = P
            elif sp.issparse(P):
                Pw = diags(w[rows]) @ P
            else:
                Pw = P * w[rows][:, None]
            part = Pw.T @ P
            G = part if G is None else G + part
        if G is None:
            G = zeros((self.n_cols,) * 2, self.dtype, xp=self.xp, device=self.device)
        return to_format(G, sparse)

    def col_sums(self, weights: Any = None) -> Any:
        if weights is None:
            xdt = namespace_dtype(self.xp, self.dtype)
            weights = self.xp.ones(self.n_rows, dtype=xdt, device=self.device)
        return self.rmatmul(self._weights(weights))

    def col_sq_sums(self, weights: Any = None) -> Any:
        w = self._weights(weights)
        out = zeros((self.n_cols,), self.dtype, xp=self.xp, device=self.device)
        for rows, P in self._row_blocks(self.is_sparse):
            P2 = square(P)
            out = out + (column_sums(P2) if w is None else flat(P2.T @ w[rows]))
        return out

    def row_sq_norms(self, col_weights: Any = None) -> Any:
        c = self._weights(col_weights)
        parts = [
            row_sums(square(P)) if c is None else flat(square(P) @ c)
            for _, P in self._row_blocks(self.is_sparse)
        ]
        if not parts:
            return zeros((0,), self.dtype, xp=self.xp, device=self.device)
        return parts[0] if len(parts) == 1 else self.xp.concat(parts, axis=0)

    def materialize(self, format: Format = "auto") -> Any:
        sparse = _resolve_format(format, self.is_sparse)
        if sparse and not is_numpy_namespace(self.xp):
            raise TypeError(
                f"the polynomial features of a {self.xp.__name__} operator are "
                "materialized dense only; ask for format='dense'."
            )
        blocks = self._row_blocks(sparse and self.is_sparse)
        if sparse:
            parts = [sp.csr_matrix(P) for _, P in blocks]
            if not parts:
                return sp.csr_matrix((0, self.n_cols), dtype=self.dtype)
            return sp.csr_matrix(sp.vstack(parts, format="csr"))
        out = empty(self.shape, self.dtype, xp=self.xp, device=self.device)
        for rows, P in blocks:
            out[rows, ...] = to_dense(P)
        return out

    def materialized(self) -> MatrixOperator:
        return MatrixOperator(self.materialize())


# ------------------------------------------------------ rowsum((T W) * T) per kind
def rowwise_quadratic(op: Operator, W: Any) -> Any:
    """``rowsum((T W_r) * T)`` for each ``W_r = W[:, :, r]`` (symmetric), ``(n, k)``.

    The quadratic forms ``t_i^T W_r t_i`` of the rows of ``op``. A factorized matrix
    takes its per-source-pair path (:func:`_factorized_quadratic`); an affine layer
    is moved onto its base; any other operator goes through its products
    (:func:`_generic_quadratic`).
    """
    if isinstance(op, AffineOperator):
        return _affine_quadratic(op, W)
    if isinstance(op, FactorizedMatrix):
        return _factorized_quadratic(op, W)
    return _generic_quadratic(op, W)


def _affine_quadratic(op: AffineOperator, W: Any) -> Any:
    """With ``T' = (T - 1 o^T) D`` and ``W' = D W D`` (symmetric):
    ``rowsum((T' W) * T') = rowsum((T W') * T) - 2 T (W' o) + o^T W' o``."""
    s = op.scale
    Ws = W * s[:, None, None] * s[None, :, None]
    out = rowwise_quadratic(op.base, Ws)
    if not op.has_offset:
        return out
    o = op.offset
    Wo = op.xp.sum(Ws * o[None, :, None], axis=1)
    return out - 2 * op.base.matmul(Wo) + (o @ Wo)[None, :]


def _rows_per_block(n: int, width: int, dtype: Any) -> int:
    """Rows whose ``width`` columns of intermediates fit in :data:`_PRODUCT_BYTES`."""
    return max(1, min(n, _PRODUCT_BYTES // max(1, width * np.dtype(dtype).itemsize)))


def _factorized_quadratic(fm: FactorizedMatrix, W: Any) -> Any:
    """``rowsum((T W) * T)`` of ``T = sum_t I_t S_t M_t^T``, one pair of terms at a time.

    ``diag(T W T^T) = sum_{t, u} diag(I_t S_t W_tu S_u^T I_u^T)``. For two terms of
    one row map this is ``I rowsum((S_t W_tu) * S_u)``: source-sized, then one
    gathered column per right-hand side. For two row maps it is
    ``rowsum((I_t (S_t W_tu)) * (I_u S_u))``, with ``t`` the wider side: the
    source-sized ``S_t W_tu`` is computed once and only ``min(c_t, c_u)`` columns
    per side are gathered, block by block of target rows.
    """
    xp = fm.xp
    dev = fm.device
    n, k = fm.n_rows, int(W.shape[2])
    dtype = numpy_dtype(W.dtype)
    out = zeros((n, k), dtype, xp=xp, device=dev)
    terms = fm.terms
    cols = [asarray_on(np.asarray(t.cols, dtype=np.int64), xp, dev) for t in terms]
    for i, t in enumerate(terms):
        Wt = xp.take(W, cols[i], axis=0)
        for j in range(i, len(terms)):
            u = terms[j]
            # Pairs (t, u) and (u, t) contribute alike (W is symmetric).
            factor = 1.0 if i == j else 2.0
            Wtu = xp.take(Wt, cols[j], axis=1)
            if t.rows is u.rows:
                q = _paired_rowsums(t.S, Wtu, u.S)
                out = out + factor * t.rows.gather(q)
                continue
            a, b = (t, u) if t.S.shape[1] >= u.S.shape[1] else (u, t)
            Wab = Wtu if a is t else xp.permute_dims(Wtu, (1, 0, 2))
            c = int(b.S.shape[1])
            A = a.rows.pad(_source_product(a.S, Wab))
            B = b.rows.pad(b.S)
            step = _rows_per_block(n, c * (k + 1), dtype)
            for lo in range(0, n, step):
                sel = slice(lo, min(lo + step, n))
                GA = xp.reshape(a.rows.gather(A, sel, padded=True), (-1, c, k))
                GB = to_dense(b.rows.gather(B, sel, padded=True))
                part = xp.vecdot(
                    xp.permute_dims(GA, (0, 2, 1)), GB[:, None, :], axis=-1
                )
                out[sel, ...] = out[sel, ...] + factor * part
    return out


def _source_product(S: Any, Wab: Any) -> Any:
    """``S W_ab`` as a dense ``(r, c_b * k)`` array (columns ``b`` major)."""
    xp = get_namespace(Wab)
    c_a, c_b, k = (int(x) for x in Wab.shape)
    return to_dense(safe_sparse_dot(S, xp.reshape(Wab, (c_a, c_b * k))))


def _paired_rowsums(Sa: Any, Wab: Any, Sb: Any) -> Any:
    """``rowsum((S_a W_ab[:, :, r]) * S_b)`` for each ``r``: ``(r_source, k)``."""
    xp = get_namespace(Wab)
    c_b, k = int(Wab.shape[1]), int(Wab.shape[2])
    A = xp.reshape(_source_product(Sa, Wab), (-1, c_b, k))
    if is_sparse(Sb):
        return xp.stack([row_sums(Sb.multiply(A[:, :, r])) for r in range(k)], axis=1)
    return xp.vecdot(xp.permute_dims(A, (0, 2, 1)), Sb[:, None, :], axis=-1)


def _generic_quadratic(op: Operator, W: Any) -> Any:
    """``rowsum((T W) * T)`` through the products of any operator.

    ``T W`` is one product of the operator when its ``n x (k + 1) d``
    intermediates fit in :data:`_PRODUCT_BYTES`, with ``T`` its own
    materialization. Otherwise each block ``J`` of columns is one product with
    ``[W_1[:, J] ... W_k[:, J] | E_J]``: ``T E_J`` are the columns ``J`` of ``T``
    (exact: one product with 1 per entry), and nothing ``n x d`` is ever held.
    """
    xp = op.xp
    n, d, k = op.n_rows, int(W.shape[0]), int(W.shape[2])
    dtype = numpy_dtype(W.dtype)
    width = max(1, min(d, _PRODUCT_BYTES // max(1, n * (k + 1) * dtype.itemsize)))
    whole = width == d
    eye = None if whole else xp.eye(d, dtype=W.dtype, device=op.device)
    res = None
    for lo in range(0, d, width):
        hi = min(lo + width, d)
        w = hi - lo
        WJ = xp.reshape(xp.permute_dims(W[:, lo:hi, :], (0, 2, 1)), (d, k * w))
        Z = op.matmul(WJ if whole else xp.concat([WJ, eye[:, lo:hi]], axis=1))
        TJ = to_dense(op.materialize("dense")) if whole else Z[:, k * w :]
        part = xp.vecdot(xp.reshape(Z[:, : k * w], (n, k, w)), TJ[:, None, :], axis=-1)
        res = part if res is None else res + part
    return res
