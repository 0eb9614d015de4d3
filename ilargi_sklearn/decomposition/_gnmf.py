"""Gaussian NMF (Frobenius loss, multiplicative updates) on the operator protocol.

One kernel, :func:`_fit_multiplicative_update`, a function of an
:class:`~ilargi_sklearn.multisource.Operator` and its array namespace ``xp``, runs the
fit on NumPy, CuPy, ``array_api_strict`` and Dask operators alike. It follows
scikit-learn's ``_fit_multiplicative_update`` for ``beta_loss="frobenius"`` step by
step (update order W then H, ``EPSILON`` replacing zero denominators, the loss
checked every ten iterations), with the only products that touch the data being
``T H^T`` (``matmul``) and ``T^T W`` (``rmatmul``). The Frobenius loss is assembled
from ``||T||_F^2`` and small matrices, so the joined matrix is never built.

The W update, the step that reads the data, comes from one helper,
:func:`_w_update`: the namespace-generic :class:`_ProductNumerator` (one
``matmul`` per ``H``, whole-array operations) by default and, on NumPy, an in-place
pass over row blocks with a compiled element-wise step; on a NumPy factorized
operator (:func:`~ilargi_sklearn.multisource._operators.fused_layout`) ``T H^T`` is
not built at all: :class:`_BlockedNumerator` assembles it block by block from
per-source tables inside the pass (numba's ``mu_rows`` where it applies), which
takes one n x k array off the peak memory.

The initializations (:func:`_initialize_gnmf`, with the randomized SVD of
:mod:`~ilargi_sklearn.decomposition._svd` for NNDSVD) are namespace-generic too;
the random draws always come from scikit-learn's host stream.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from math import sqrt
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array, check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, check_non_negative

from ilargi_sklearn._backend._launcher import (
    CompiledUnavailable,
    numba_available,
    one_blas_thread,
)
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._plan import DEVICE_OPTIONS, STRATEGIES
from ilargi_sklearn.decomposition._gnmf_numba import (
    MU_ROWS_COLUMNS,
    mu_rows,
    mu_rows_gram,
    mu_update,
    segment_sum_rows,
)
from ilargi_sklearn.decomposition._svd import _randomized_svd
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.utils._validation import (
    Caller,
    DeviceMixin,
    input_namespace,
    validate_X,
)

__all__ = ["FactorizedGNMF"]

logger = logging.getLogger(__name__)

# scikit-learn's NMF replaces zero denominators by the float32 machine epsilon.
EPSILON = np.finfo(np.float32).eps


# --------------------------------------------------------------------------- kernels
def _trace_dot(xp, X, Y):
    """``trace(X @ Y.T)``: one dot product of the flattened arrays."""
    return float(xp.reshape(X, (-1,)) @ xp.reshape(Y, (-1,)))


def _gram(xp, W):
    """``W^T W``."""
    return xp.matrix_transpose(W) @ W


def _data_mean(op):
    """Mean of all entries of ``T``, from its column sums."""
    n_samples, n_features = op.shape
    return float(np.asarray(to_numpy(op.col_sums()), dtype=np.float64).sum()) / (
        n_samples * n_features
    )


def _norm_sq(op):
    """``||T||_F^2``, from the column sums of squares."""
    return float(np.asarray(to_numpy(op.col_sq_sums()), dtype=np.float64).sum())


def _frobenius_error(norm_X, W, H, XHt, WtW=None):
    """``||T - W H||_F`` without forming ``W H``.

    ``||T - WH||^2 = ||T||^2 + trace(W^T W H H^T) - 2 trace(W^T (T H^T))``, with
    ``XHt = T H^T`` from the latest ``matmul``.

    Parameters
    ----------
    norm_X : float
        ``||T||_F^2``.
    W : array of shape (n_samples, n_components)
    H : array of shape (n_components, n_features)
    XHt : array of shape (n_samples, n_components)
        ``T @ H.T``.
    WtW : array of shape (n_components, n_components), default=None
        ``W.T @ W`` when already known.

    Returns
    -------
    float
    """
    xp = get_namespace(W)
    if WtW is None:
        WtW = _gram(xp, W)
    return _frobenius_error_from_cross(xp, norm_X, WtW, H, _trace_dot(xp, XHt, W))


def _frobenius_error_from_cross(xp, norm_X, WtW, H, cross_prod):
    """:func:`_frobenius_error` from ``W^T W`` and ``cross_prod = trace(W^T T H^T)``."""
    norm_WH = _trace_dot(xp, WtW @ H, H)
    res = (norm_X + norm_WH - 2.0 * cross_prod) / 2.0
    # The expanded form can go a rounding error below zero at a perfect fit.
    return sqrt(2.0 * max(res, 0.0))


def _guard(xp, denominator, eps):
    """``denominator`` with its zeros replaced by ``eps`` (scikit-learn's guard)."""
    return xp.where(denominator == 0, eps, denominator)


def _t_ht(op, xp, H, dtype):
    """``T @ H.T`` in ``dtype`` (one ``matmul``)."""
    XHt = op.matmul(xp.matrix_transpose(H))
    return XHt if XHt.dtype == dtype else xp.astype(XHt, dtype)


# ------------------------------------------------------------ the W update (numerator)
# The kernel reads the data only through a W-update object, made by _w_update:
#
#   use(H)                     H changed: products of the old H are stale
#   update_w(W, HHt, gram, tw) W <- W o (T H^T) / (W H H^T); returns (W, W^T W or None)
#   rmatmul(W)                 T^T W for the W of the latest update (tw=True)
#   cross(W)                   trace(W^T T H^T) for the current H
#   context()                  held around the whole fit
class _ProductNumerator:
    """The namespace-generic W update: ``T H^T`` from one ``matmul`` per ``H``,
    kept until ``H`` changes, and whole-array operations on ``op``'s device.

    On a device ``W`` (the n-length factor) and every n-length product
    (``T H^T``, ``W H H^T``) stay there, and so do ``H`` and the small products, so
    an iteration transfers nothing; only the loss (every ten iterations) crosses,
    as scalars. ``op.hold`` settles a lazy (Dask) ``W`` once per iteration.
    """

    def __init__(self, op, W):
        self.op = op
        self.xp = op.xp
        self.dtype = W.dtype
        self.eps = self.xp.asarray(float(EPSILON), dtype=W.dtype, device=device_of(W))
        self.H = None
        self.XHt = None

    def context(self):
        return contextlib.nullcontext()

    def use(self, H):
        self.H = H
        self.XHt = None

    def _product(self):
        if self.XHt is None:
            self.XHt = _t_ht(self.op, self.xp, self.H, self.dtype)
        return self.XHt

    def update_w(self, W, HHt, gram, tw):
        xp = self.xp
        W = self.op.hold(W * (self._product() / _guard(xp, W @ HHt, self.eps)))
        return W, (_gram(xp, W) if gram else None)

    def rmatmul(self, W):
        return self.op.rmatmul(W)

    def cross(self, W):
        return _trace_dot(self.xp, self._product(), W)


class _HostProductNumerator(_ProductNumerator):
    """:class:`_ProductNumerator` for NumPy: ``W`` updated in place in one pass
    over row blocks (:func:`_multiplicative_update_w`: the element-wise step
    compiled where numba runs, block-sized temporaries only), ``W^T W`` summed in
    the same pass."""

    def __init__(self, op, W):
        super().__init__(op, W)
        n_components = W.shape[1]
        self.WtW = np.empty((n_components, n_components), dtype=W.dtype)
        self.buffers = None

    def _product(self):
        if self.XHt is None:
            # A C-ordered right-hand side, as the row blocks are read.
            XHt = self.op.matmul(np.ascontiguousarray(self.H.T))
            self.XHt = np.asarray(XHt, dtype=self.dtype)
        return self.XHt

    def update_w(self, W, HHt, gram, tw):
        WtW = self.WtW if gram else None
        self.buffers = _multiplicative_update_w(
            self._product(), W, HHt, WtW, self.buffers
        )
        return W, WtW


def _w_update(op, W):
    """The W update of :func:`_fit_multiplicative_update` for ``op`` (and ``W``'s
    dtype).

    The one place where the NumPy fast variants are chosen: a NumPy factorized
    operator whose layout has ``W``'s dtype gets :class:`_BlockedNumerator` (no
    n x k ``T H^T``; numba's fused row update), another NumPy operator the in-place
    row-block pass :class:`_HostProductNumerator`; every other namespace the
    generic :class:`_ProductNumerator`. The NumPy variants update ``W`` in place
    with block-sized work arrays, which other namespaces (immutable arrays, lazy
    graphs, device kernels per operation) do not allow.
    """
    if not is_numpy_namespace(op.xp):
        return _ProductNumerator(op, W)
    layout = fused_layout(op)
    if layout is not None and np.dtype(layout.dtype) == W.dtype:
        return _BlockedNumerator(layout, W.shape[1], W.dtype)
    return _HostProductNumerator(op, W)


# Elements (rows x n_components) per block of the fused W update: the block's work
# arrays (the numerator, the quotient and its zero mask) and slices of W stay in
# cache (512 KiB each in float64), and each block's BLAS calls are small enough to
# run on one thread (a multi-threaded GEMM/SYRK with k = 8 columns is slower).
# Half this size pays for more per-block calls, twice this size for cache misses
# (timed at 2e5 x 10, k = 10, two gathered groups).
_BLOCK_ELEMENTS = 65_536


# On sparse (CSR) sources the blocked pass trades speed for memory: measured on
# the Hamlet one-hot data (20 iterations, rank 10, one thread) it took 1.05-1.3x
# the time of one n x k product per iteration (Flights 0.21 vs 0.16 s,
# BookCrossing 0.82 vs 0.70 s) at 0.5-0.75x the peak memory (BookCrossing 63 vs
# 84 MB, LastFM 57 vs 90 MB, Walmart 36 vs 86 MB). Memory is what limits GNMF on
# large data, so it runs on every layout.


#: Tables (source rows x k) up to this size are read inside the compiled W update
#: (mu_rows); larger ones are gathered by np.take before it.
_INLINE_TABLE_BYTES = 2 * 2**20


def _block_rows(n_samples, n_components):
    """Rows per block of the W pass."""
    return max(64, _BLOCK_ELEMENTS // max(n_components, 1))


class _BlockedNumerator:
    """``T' H^T`` block by block from a :class:`~ilargi_sklearn.multisource.FusedLayout`,
    never as one n x k array.

    With ``T' = (T - 1 o^T) diag(s)``, ``T = X0 M0^T + sum_g I_g S_g M_g^T`` and
    ``Hs = H diag(s)``,

        ``T' H^T = X0 Hs[:, c0]^T + sum_g I_g G_g - 1 (o^T Hs^T)``,
        ``G_g = S_g Hs[:, c_g]^T``

    (``o^T diag(s) H^T = o^T Hs^T``). :meth:`prepare` computes the per-group
    tables ``G_g`` (source rows x k, with an extra zero row that the unmatched
    target rows, index -1, pick) and the row constant once per H; :meth:`block`
    then assembles the rows ``[start, stop)`` in a block-sized buffer: one small
    GEMM with the identity source and one ``np.take`` per group. Target columns
    covered by several terms are summed, as in ``T``.

    Parameters
    ----------
    layout : FusedLayout
        The operator's layout (:func:`~ilargi_sklearn.multisource._operators.fused_layout`).
    n_components : int
    dtype : dtype
        Dtype of ``W`` and ``H`` (the layout's).
    """

    def __init__(self, layout, n_components, dtype):
        self.dtype = dtype = np.dtype(dtype)
        self.n_rows = layout.shape[0]
        self.base = layout.base
        self.base_sparse = layout.base is not None and sp.issparse(layout.base)
        self.base_cols = layout.base_cols
        self.scale = (
            None if layout.scale is None else np.asarray(layout.scale, np.float64)
        )
        offset = layout.offset
        self.offset = (
            None
            if offset is None or not np.any(offset != 0)
            else np.asarray(offset, np.float64)
        )
        self.groups = [(g.idx, g.S, g.cols) for g in layout.groups]
        # The tables are row slices of one array (which the compiled update reads
        # through offsets). The extra last row of each stays zero:
        # np.take(..., mode="wrap") maps -1 to it.
        sizes = [g.n_source_rows + 1 for g in layout.groups]
        self.offsets = np.cumsum([0] + sizes[:-1], dtype=np.int64)
        self.pads = np.asarray(sizes, dtype=np.int64) - 1
        self.stacked = np.zeros((sum(sizes), n_components), dtype=dtype)
        self.tables = [
            self.stacked[o : o + r] for o, r in zip(self.offsets, sizes, strict=True)
        ]
        # The compiled row update (mu_rows) reads a dense float64 base, or none,
        # and the tables that fit in cache; larger ones are gathered by np.take
        # before it.
        if self.base is None:
            self.rows_base = np.empty((self.n_rows, 0), dtype=dtype)
        elif self.base_sparse:
            self.rows_base = None
        else:
            self.rows_base = self.base
        row_bytes = n_components * dtype.itemsize
        self.inline = [r * row_bytes <= _INLINE_TABLE_BYTES for r in sizes]
        inline = [g for g, small in enumerate(self.inline) if small]
        self.inline_rows = (
            [self.groups[g][0] for g in inline],
            self.offsets[inline],
            self.pads[inline],
        )
        self.no_base_HbT = np.empty((0, n_components), dtype=dtype)
        # mu_rows' sum of W^T W over a pass, in its layout (mu_rows_gram).
        self.rows_WW = np.zeros((n_components, 16))
        self.HbT = None
        self.const = None
        # T'^T W: per group the segment sum I_g^T W, compiled or as a product with
        # the CSC indicator (source rows x n, built at the first use); the
        # dense identity source's X0^T W and the column sums of W are accumulated
        # inside the W pass, while each block of W is in cache.
        self._layout_groups = layout.groups
        self.indicators = None
        self.n_cols = layout.shape[1]
        self.base_acc = (
            np.zeros((len(self.base_cols), n_components), dtype=dtype)
            if self.base is not None and not self.base_sparse
            else None
        )
        self.sum_acc = (
            np.zeros(n_components, dtype=dtype) if self.offset is not None else None
        )
        # The W-update interface (see _ProductNumerator): the tables are built on
        # demand for the latest H given to use().
        self.WtW = np.empty((n_components, n_components), dtype=dtype)
        self.buffers = _pass_buffers(self.n_rows, n_components, dtype, True)
        self.H = None
        self.stale = False

    def context(self):
        """BLAS on one thread for the fit: the blocks' products are small (k
        columns), and BLAS's threads collapse beside a busy core (measured in
        ``benchmarks/bench_load.py``; idle, one thread is as fast)."""
        return one_blas_thread()

    def use(self, H):
        """Use ``H`` from now on (its tables are built at their first use)."""
        self.H, self.stale = H, True

    def _ready(self):
        if self.stale:
            self.prepare(self.H)
            self.stale = False

    def update_w(self, W, HHt, gram, tw):
        """The W update in place (:func:`_multiplicative_update_w`); with ``tw``
        the pass also accumulates the in-pass parts of ``T'^T W``."""
        self._ready()
        WtW = self.WtW if gram else None
        _multiplicative_update_w(self, W, HHt, WtW, self.buffers, tw=tw)
        return W, WtW

    def rmatmul(self, W):
        """``T'^T W`` for the ``W`` of the latest :meth:`update_w` with ``tw``."""
        return self.finish_tw(W)

    def cross(self, W):
        """``trace(W^T T' H^T)`` for the current ``H`` (:func:`_cross_term`)."""
        self._ready()
        return _cross_term(self, W, self.buffers)

    def start_tw(self):
        """Reset the accumulators of :meth:`add_tw`."""
        if self.base_acc is not None:
            self.base_acc.fill(0)
        if self.sum_acc is not None:
            self.sum_acc.fill(0)

    def add_tw(self, start, stop, W_b):
        """Accumulate the block ``W_b = W[start:stop]`` (updated) into the parts
        of ``T'^T W`` that are computed inside the pass."""
        if self.base_acc is not None:
            self.base_acc += np.dot(self.base[start:stop].T, W_b)
        if self.sum_acc is not None:
            self.sum_acc += W_b.sum(axis=0)

    def finish_tw(self, W):
        """``T'^T W`` (n_features x k) from the accumulated parts and, per group,
        ``S_g^T (I_g^T W)``."""
        out = np.zeros((self.n_cols, W.shape[1]), dtype=self.dtype)
        if self.base_acc is not None:
            out[self.base_cols] += self.base_acc
        elif self.base is not None:
            out[self.base_cols] += np.asarray(self.base.T @ W)
        for g, (_, S, cols) in enumerate(self.groups):
            # Target columns may repeat within a group (overlapping terms).
            np.add.at(out, cols, np.asarray(S.T @ self._segment_sum(g, W)))
        if self.sum_acc is None and self.scale is None:
            return out
        out = out.astype(np.float64)
        if self.sum_acc is not None:
            out -= np.multiply.outer(self.offset, self.sum_acc)
        if self.scale is not None:
            out *= self.scale[:, None]
        return out.astype(self.dtype, copy=False)

    def _segment_sum(self, g, W):
        """``I_g^T W`` (source rows x k): a compiled scatter where numba runs
        (no n-length arrays), else a product with the group's CSC indicator."""
        idx, S, _ = self.groups[g]
        if numba_available():
            try:
                return segment_sum_rows(idx, W, S.shape[0]).astype(W.dtype, copy=False)
            except CompiledUnavailable:
                pass  # numba cannot compile here: the indicator product below
        if self.indicators is None:
            self.indicators = _csc_indicators(
                self._layout_groups, self.n_rows, self.dtype
            )
        return self.indicators[g] @ W

    def prepare(self, H):
        """Tables and row constant for ``H`` (call again whenever ``H`` changes)."""
        dtype = self.dtype
        Hs = H if self.scale is None else (H * self.scale).astype(dtype, copy=False)
        if self.base is not None:
            self.HbT = np.ascontiguousarray(Hs[:, self.base_cols].T)
        for (_, S, cols), G in zip(self.groups, self.tables):
            HcT = np.ascontiguousarray(Hs[:, cols].T)
            if sp.issparse(S) or S.dtype != dtype:
                G[:-1] = S @ HcT
            else:
                np.matmul(S, HcT, out=G[:-1])
        self.const = None
        if self.offset is not None:
            self.const = (-(self.offset @ Hs.T.astype(np.float64))).astype(dtype)

    def update_rows(self, W, HHt, start, stop, eps, buffers, gram=True):
        """The W update of rows ``[start, stop)`` by the compiled loop
        (:func:`~ilargi_sklearn.decomposition._gnmf_numba.mu_rows`), the numerator
        assembled in it, and with ``gram`` the rows' ``W^T W`` added to
        ``rows_WW``. Returns False, with ``W`` untouched, where that loop does
        not apply (a CSR base, not float64, fewer than 8 or more than 16
        components): the caller then assembles the block and updates it.

        Tables larger than ``_INLINE_TABLE_BYTES`` are gathered into ``buffers``
        (:func:`_pass_buffers`) by ``np.take`` first: from tables out of cache
        its loop reads faster than the fused one."""
        k = W.shape[1]
        if self.rows_base is None or not MU_ROWS_COLUMNS[0] <= k <= MU_ROWS_COLUMNS[1]:
            return False
        HbT = self.no_base_HbT if self.HbT is None else self.HbT
        idxs, offsets, pads = self.inline_rows
        P = None
        for g, (idx, _, _) in enumerate(self.groups):
            if self.inline[g]:
                continue
            rows = idx[start:stop]
            if P is None:
                P = buffers[2][: stop - start]
                np.take(self.tables[g], rows, axis=0, out=P, mode="wrap")
            else:
                tmp = buffers[0][: stop - start]
                np.take(self.tables[g], rows, axis=0, out=tmp, mode="wrap")
                P += tmp
        return mu_rows(
            self.rows_base,
            HbT,
            idxs,
            self.stacked,
            offsets,
            pads,
            self.const,
            P,
            HHt,
            W,
            eps,
            self.rows_WW if gram else None,
            start,
            stop,
        )

    def block(self, start, stop, out, tmp):
        """Rows ``[start, stop)`` of ``T' H^T`` into ``out`` (``tmp``: same shape)."""
        first = True
        if self.base is not None:
            if self.base_sparse or self.base.dtype != self.dtype:
                out[...] = self.base[start:stop] @ self.HbT
            else:
                np.matmul(self.base[start:stop], self.HbT, out=out)
            first = False
        for (idx, _, _), G in zip(self.groups, self.tables):
            # "wrap" (not the default "raise") lets take write to out unbuffered.
            if first:
                np.take(G, idx[start:stop], axis=0, out=out, mode="wrap")
                first = False
            else:
                np.take(G, idx[start:stop], axis=0, out=tmp, mode="wrap")
                out += tmp
        if first:
            out.fill(0)
        if self.const is not None:
            out += self.const


def _csc_indicators(groups, n_rows, dtype):
    """``I_g^T`` of each :class:`~ilargi_sklearn.multisource.FusedGroup` (source rows x
    n, CSC: one column per target row with a 1 in row ``idx[i]``, none where
    ``idx[i] = -1``).

    The arrays are built in the index dtype SciPy keeps (int32 when it fits, so
    that the constructor copies nothing), and the groups share one array of ones
    and, where no row is unmatched, one ``indptr``: ``n x (8 + 4)`` bytes per group
    and ``n x 12`` once, where separate indicators take ``n x 16`` per group.
    """
    index_dtype = np.int32 if n_rows < np.iinfo(np.int32).max else np.int64
    ones = np.ones(n_rows, dtype=dtype)
    full_indptr = None
    out = []
    for g in groups:
        if g.has_missing:
            valid = g.idx >= 0
            indptr = np.zeros(n_rows + 1, dtype=index_dtype)
            np.cumsum(valid, out=indptr[1:])
            indices = g.idx[valid].astype(index_dtype)
        else:
            if full_indptr is None:
                full_indptr = np.arange(n_rows + 1, dtype=index_dtype)
            indptr = full_indptr
            indices = g.idx.astype(index_dtype)
        data = ones[: indices.shape[0]]
        out.append(
            sp.csc_matrix((data, indices, indptr), shape=(g.n_source_rows, n_rows))
        )
    return out


def _pass_buffers(n_samples, n_components, dtype, blocked):
    """Block-sized work arrays of :func:`_multiplicative_update_w`."""
    rows = min(_block_rows(n_samples, n_components), n_samples)
    shape = (rows, n_components)
    buffers = [np.empty(shape, dtype=dtype), np.empty(shape, dtype=bool)]
    if blocked:
        buffers.append(np.empty(shape, dtype=dtype))
    return tuple(buffers)


def _multiplicative_update_w(XHt, W, HHt, WtW=None, buffers=None, tw=False):
    """``W <- W o (T H^T) / (W H H^T)`` (in place), as scikit-learn's MU step, in
    one pass over row blocks.

    Per block of rows the denominator ``W_b H H^T`` gets ``EPSILON`` for its zeros
    (scikit-learn's guard), the quotient ``(T H^T)_b / (W_b H H^T)`` overwrites it
    in a block-sized buffer, ``W_b`` is multiplied by it, and with ``WtW`` given
    the block's ``W_b^T W_b`` is added to it, so that the H update needs no second
    pass over ``W``. ``XHt`` is not modified. With a :class:`_BlockedNumerator`
    the numerator block is assembled in a block-sized buffer first (no n x k
    ``T H^T``), and the parts of ``T'^T W`` it accumulates in the pass are added
    from the updated block. Where numba runs and the layout allows it (8 to 16
    components, float64, a dense base or none), one compiled loop
    (:meth:`_BlockedNumerator.update_rows`) computes each row's numerator and
    denominator in registers and updates the block, with no block-sized arrays.

    Parameters
    ----------
    XHt : ndarray of shape (n_samples, n_components) or _BlockedNumerator
        ``T @ H.T``, or the blocked numerator that computes its row blocks
        inside the pass (prepared for the current ``H``).
    W : ndarray of shape (n_samples, n_components)
        Updated in place.
    HHt : ndarray of shape (n_components, n_components)
        ``H @ H.T``.
    WtW : ndarray of shape (n_components, n_components), default=None
        Overwritten with ``W^T W`` of the updated ``W``.
    buffers : tuple of ndarrays, default=None
        Block-sized work arrays from an earlier call (allocated when None).
    tw : bool, default=False
        With a blocked numerator as ``XHt``: also accumulate its in-pass parts
        of ``T'^T W``
        for the updated ``W`` (:meth:`_BlockedNumerator.finish_tw`).

    Returns
    -------
    buffers : tuple of ndarrays
    """
    n_samples, n_components = W.shape
    block = _block_rows(n_samples, n_components)
    blocked = isinstance(XHt, _BlockedNumerator)
    if buffers is None:
        buffers = _pass_buffers(n_samples, n_components, W.dtype, blocked)
    tw = tw and blocked
    if tw:
        XHt.start_tw()
    if WtW is not None:
        WtW[...] = 0
    # Where numba runs (looked up once per pass: it reads the environment), a
    # blocked numerator's blocks are updated by one compiled loop that also assembles the
    # numerator (mu_rows), else the element-wise step is compiled (mu_update);
    # without numba, NumPy's operations.
    compiled = numba_available()
    rows = compiled and blocked
    if rows:
        XHt.rows_WW.fill(0)
    summed = False  # whether some block's W^T W is in XHt.rows_WW
    eps = W.dtype.type(EPSILON)
    for start in range(0, n_samples, block):
        stop = min(start + block, n_samples)
        W_b = W[start:stop]
        done = False
        if rows:
            try:
                # The loop applies to every block or to none (the first block
                # decides); it sums the updated rows' W^T W too when wanted.
                done = rows = XHt.update_rows(
                    W, HHt, start, stop, eps, buffers, gram=WtW is not None
                )
            except CompiledUnavailable:
                compiled = rows = False
        if done:
            summed = True
        else:
            compiled = _update_block(XHt, W_b, HHt, start, stop, buffers, compiled, eps)
            if WtW is not None:
                WtW += np.dot(W_b.T, W_b)
        if tw:
            XHt.add_tw(start, stop, W_b)
    if summed and WtW is not None:
        WtW += mu_rows_gram(XHt.rows_WW, n_components)
    return buffers


def _update_block(XHt, W_b, HHt, start, stop, buffers, compiled, eps):
    """One block of :func:`_multiplicative_update_w` without :func:`mu_rows`: the
    numerator block (assembled, or a slice of ``XHt``), ``W_b H H^T``, then the
    element-wise step (compiled where ``compiled``, else NumPy's operations).
    Returns whether the compiled step is still to be used (False once it failed
    to compile)."""
    quotient = buffers[0][: stop - start]
    if isinstance(XHt, _BlockedNumerator):
        numerator = buffers[2][: stop - start]
        # The quotient's buffer is free until the numerator is complete.
        XHt.block(start, stop, numerator, quotient)
    else:
        numerator = XHt[start:stop]
    np.dot(W_b, HHt, out=quotient)
    if compiled:
        try:
            if mu_update(numerator, quotient, W_b, eps):
                return True
        except CompiledUnavailable:
            compiled = False
    mask = buffers[1][: stop - start]
    np.equal(quotient, 0, out=mask)
    np.copyto(quotient, EPSILON, where=mask)
    np.divide(numerator, quotient, out=quotient)
    W_b *= quotient
    return compiled


def _cross_term(blocked, W, buffers):
    """``trace(W^T T H^T)`` for the H the :class:`_BlockedNumerator` ``blocked`` is
    prepared for, block by block (the loss's cross term without the n x k
    product)."""
    n_samples, n_components = W.shape
    block = _block_rows(n_samples, n_components)
    total = 0.0
    for start in range(0, n_samples, block):
        stop = min(start + block, n_samples)
        numerator = buffers[2][: stop - start]
        blocked.block(start, stop, numerator, buffers[0][: stop - start])
        total += _trace_dot(np, numerator, W[start:stop])
    return total


def _multiplicative_update_h(xp, op, H, WtW, TtW, eps):
    """``H <- H o (W^T T) / ((W^T W) H)``, with ``TtW = T^T W`` and ``WtW = W^T W``
    of the updated ``W`` (both from the W update)."""
    numerator = xp.matrix_transpose(TtW)
    if numerator.dtype != H.dtype:
        numerator = xp.astype(numerator, H.dtype)
    return op.hold(H * (numerator / _guard(xp, WtW @ H, eps)))


def _fit_multiplicative_update(
    op, W, H, max_iter=200, tol=1e-4, update_H=True, return_error=False, norm_X=None
):
    """Multiplicative updates for the Frobenius loss, as scikit-learn's ``mu`` solver.

    Updates W then H each iteration (W only when ``update_H`` is False) and every
    ten iterations stops when the relative decrease of ``||T - WH||_F`` since the
    last check, divided by the initial error, is below ``tol``. The W update, which
    also gives ``W^T W`` and (for the H update) ``T^T W``, and the loss's cross term
    ``trace(W^T T H^T)`` come from :func:`_w_update`; everything else is products
    of small matrices in ``op.xp``. With ``tol=0`` no loss is computed during the
    iterations.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        Non-negative data.
    W : array of shape (n_samples, n_components)
        Initial W, in ``op``'s namespace and on its device (NumPy: updated in
        place).
    H : array of shape (n_components, n_features)
        Initial H (not modified).
    max_iter : int, default=200
        Maximum number of iterations.
    tol : float, default=1e-4
        Tolerance of the stopping condition (0 runs ``max_iter`` iterations).
    update_H : bool, default=True
        False solves for W with H fixed (``transform``).
    return_error : bool, default=False
        Compute the loss of the returned factors when the last check did not.
    norm_X : float, default=None
        ``||T||_F^2`` when already known (computed when a loss is needed).

    Returns
    -------
    W, H : arrays
    n_iter : int
    error : float or None
        ``||T - WH||_F`` of the returned factors when the last check computed it
        or ``return_error`` is set.
    """
    xp = op.xp
    check = tol > 0
    if norm_X is None and (check or return_error):
        norm_X = _norm_sq(op)
    step = _w_update(op, W)
    eps = xp.asarray(float(EPSILON), dtype=H.dtype, device=device_of(H))
    with step.context():
        step.use(H)
        error_at_init = None
        if check:
            error_at_init = _frobenius_error_from_cross(
                xp, norm_X, _gram(xp, W), H, step.cross(W)
            )
        previous_error = error_at_init
        error = None
        HHt = None
        WtW = None
        for n_iter in range(1, max_iter + 1):
            if HHt is None:
                HHt = H @ xp.matrix_transpose(H)
            # W^T W: for the H update, or (H fixed) for this iteration's loss check.
            gram = update_H or (check and n_iter % 10 == 0)
            W, WtW = step.update_w(W, HHt, gram=gram, tw=update_H)
            error = None
            if update_H:
                H = _multiplicative_update_h(xp, op, H, WtW, step.rmatmul(W), eps)
                step.use(H)
                HHt = None
            if check and n_iter % 10 == 0:
                error = _frobenius_error_from_cross(xp, norm_X, WtW, H, step.cross(W))
                logger.debug("Epoch %02d, error: %f", n_iter, error)
                # An exact initial fit stays exact (the updates are then
                # identities); scikit-learn divides by zero here and iterates on
                # with NaNs.
                if error_at_init == 0 or (previous_error - error) / error_at_init < tol:
                    break
                previous_error = error
        if error is None and return_error:
            WtW = _gram(xp, W) if WtW is None else WtW
            error = _frobenius_error_from_cross(xp, norm_X, WtW, H, step.cross(W))
    return W, H, n_iter, error


# ---------------------------------------------------------------- initialization
def _fill_zeros(xp, A, values):
    """``A[A == 0] = values`` (row-major order of the zeros) without fancy
    indexing, which not every namespace has: the k-th zero takes ``values[k]``."""
    mask = xp.reshape(A == 0, (-1,))
    rank = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    rank = xp.clip(rank, min=0)
    vals = asarray_on(values, xp, device_of(A), values.dtype)
    flat = xp.where(mask, xp.take(vals, rank, axis=0), xp.reshape(A, (-1,)))
    return xp.reshape(flat, A.shape)


def _initialize_gnmf(op, n_components, init=None, eps=1e-6, random_state=None):
    """Initial W and H on ``op``'s device, as scikit-learn's ``_initialize_nmf``.

    "random" scales half-normal entries by ``sqrt(mean(T) / n_components)`` (the mean
    from the column sums); the NNDSVD variants use :func:`_randomized_svd` on the
    operator. The random draws come from scikit-learn's host stream in its order
    (uploaded once), so that seeded initializations are the same on every device.

    Returns
    -------
    W : array of shape (n_samples, n_components)
    H : array of shape (n_components, n_features)
    """
    n_samples, n_features = op.shape
    xp = op.xp
    dtype = op.dtype
    if (
        init is not None
        and init != "random"
        and n_components > min(n_samples, n_features)
    ):
        raise ValueError(
            f"init = '{init}' can only be used when n_components <= "
            f"min(n_samples, n_features); got n_components={n_components} and "
            f"shape {op.shape}."
        )
    if init is None:
        init = "nndsvda" if n_components <= min(n_samples, n_features) else "random"

    if init == "random":
        avg = np.sqrt(_data_mean(op) / n_components)
        rng = check_random_state(random_state)
        H = avg * rng.standard_normal(size=(n_components, n_features)).astype(
            dtype, copy=False
        )
        W = avg * rng.standard_normal(size=(n_samples, n_components)).astype(
            dtype, copy=False
        )
        np.abs(H, out=H)
        np.abs(W, out=W)
        return asarray_on(W, xp, op.device, dtype), asarray_on(H, xp, op.device, dtype)

    U, S, V = _randomized_svd(op, n_components, random_state)
    S = to_numpy(S)
    zero = xp.zeros_like(U[:, 0])
    w_cols = [float(np.sqrt(S[0])) * xp.abs(U[:, 0])]
    h_rows = [float(np.sqrt(S[0])) * xp.abs(V[0, :])]
    for j in range(1, n_components):
        x, y = U[:, j], V[j, :]
        x_p, y_p = xp.maximum(x, zero), xp.maximum(y, xp.zeros_like(y))
        x_n, y_n = xp.abs(xp.minimum(x, zero)), xp.abs(xp.minimum(y, xp.zeros_like(y)))
        x_p_nrm, y_p_nrm = sqrt(float(x_p @ x_p)), sqrt(float(y_p @ y_p))
        x_n_nrm, y_n_nrm = sqrt(float(x_n @ x_n)), sqrt(float(y_n @ y_n))
        m_p, m_n = x_p_nrm * y_p_nrm, x_n_nrm * y_n_nrm
        if m_p > m_n:
            u, v, sigma = x_p / x_p_nrm, y_p / y_p_nrm, m_p
        else:
            u, v, sigma = x_n / x_n_nrm, y_n / y_n_nrm, m_n
        lbd = float(np.sqrt(S[j] * sigma))
        w_cols.append(lbd * u)
        h_rows.append(lbd * v)
    W = xp.stack(w_cols, axis=1)
    H = xp.stack(h_rows, axis=0)
    W = xp.where(W < eps, xp.zeros_like(W), W)
    H = xp.where(H < eps, xp.zeros_like(H), H)
    if init == "nndsvda":
        avg = _data_mean(op)
        W = xp.where(W == 0, xp.full_like(W, avg), W)
        H = xp.where(H == 0, xp.full_like(H, avg), H)
    elif init == "nndsvdar":
        rng = check_random_state(random_state)
        avg = _data_mean(op)
        # W's draws first, then H's, in the row-major order of their zeros.
        W, H = (_fill_random_zeros(xp, A, avg, rng) for A in (W, H))
    dtype = namespace_dtype(xp, dtype)
    W = W if W.dtype == dtype else xp.astype(W, dtype)
    return W, (H if H.dtype == dtype else xp.astype(H, dtype))


def _fill_random_zeros(xp, A, avg, rng):
    """NNDSVDar's fill: the zeros of ``A`` take ``|avg * N(0, 1) / 100|``."""
    n_zeros = int(xp.sum(xp.astype(A == 0, xp.int64)))
    if not n_zeros:
        return A
    vals = np.abs(avg * rng.standard_normal(size=n_zeros) / 100)
    return _fill_zeros(xp, A, vals.astype(numpy_dtype(A.dtype)))


def _check_init(A, shape, whom):
    """Validate a user-given W or H (shape, non-negative, not all zeros)."""
    A = check_array(A)
    if shape[0] != "auto" and A.shape[0] != shape[0]:
        raise ValueError(
            f"Array with wrong first dimension passed to {whom}. Expected {shape[0]}, "
            f"but got {A.shape[0]}."
        )
    if shape[1] != "auto" and A.shape[1] != shape[1]:
        raise ValueError(
            f"Array with wrong second dimension passed to {whom}. Expected "
            f"{shape[1]}, but got {A.shape[1]}."
        )
    check_non_negative(A, whom)
    if np.max(A) == 0:
        raise ValueError(f"Array passed to {whom} is full of zeros.")
    return A


# ------------------------------------------------------------------------ estimator
class FactorizedGNMF(
    DeviceMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Gaussian NMF (Frobenius loss) on a multi-source dataset without the join.

    Finds non-negative ``W`` (n_samples x n_components) and ``H`` (n_components x
    n_features) minimizing ``0.5 ||T - W H||_F^2`` by multiplicative updates.

    Parameters
    ----------
    n_components : int, "auto" or None, default="auto"
        Rank of the factorization, with scikit-learn's meaning: "auto" is the
        number of rows of a custom ``H`` (``init="custom"``), else ``n_features``;
        None is ``n_features``. On wide one-hot data ``n_features`` makes ``W``
        as wide as the data: give a rank.
    init : {"random", "nndsvd", "nndsvda", "nndsvdar", "custom"} or None, \
            default=None
        Initialization, as scikit-learn's ``NMF``: None is "nndsvda" when
        ``n_components <= min(n_samples, n_features)``, else "random"; "custom"
        takes ``W`` and ``H`` given to :meth:`fit_transform`.
    max_iter : int, default=200
        Maximum number of iterations.
    tol : float, default=1e-4
        Tolerance of the stopping condition, checked every 10 iterations on the
        relative decrease of the loss.
    random_state : int, RandomState instance or None, default=None
        Seeds the "random", "nndsvd*" initializations.
    strategy : {"factorized", "materialized"}, default="factorized"
        For a :class:`~ilargi_sklearn.MultiSourceDataset`: compute on the sources
        ("factorized") or on the joined matrix built once ("materialized"). Arrays
        are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and ``transform`` compute: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). On a device ``W`` (the n-length factor) and every n-length
        product stay there, and so do ``H`` and the small products, so an
        iteration transfers nothing; the "random" initialization is drawn on the
        host (the CPU's random stream) and uploaded once, and the "nndsvd*"
        randomized SVD runs on the device (QR-normalized power iterations, equal
        to the CPU's LU-normalized ones up to rounding). ``components_`` stays
        where the fit ran; ``fit_transform``/``transform`` return ``W`` in the
        caller's array type; pickles hold NumPy arrays. "gpu" without a usable
        GPU raises a
        :class:`~ilargi_sklearn._backend._plan.DeviceUnavailableError` (a
        ``RuntimeError``) with the probe's reason.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        The factor ``H`` (on the device the fit ran on).
    n_components_ : int
        The rank.
    reconstruction_err_ : float
        ``||T - W H||_F`` of the training data at the end of fit.
    n_iter_ : int
        Iterations run.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.decomposition.NMF : The scikit-learn estimator this one reproduces
        (``solver="mu"``, ``beta_loss="frobenius"``).
    FactorizedKMeans : Factorized K-Means clustering.

    Notes
    -----
    With ``T = sum_k I_k S_k M_k^T`` the joined matrix, the updates are

    * ``W <- W o (T H^T) / (W (H H^T))``, ``T H^T`` one factorized ``matmul``;
    * ``H <- H o (T^T W)^T / ((W^T W) H)``, ``T^T W`` one factorized ``rmatmul``;

    every other product is between small dense matrices. The loss is
    ``||T||_F^2 + trace(W^T W H H^T) - 2 trace(W^T T H^T)`` with ``||T||_F^2`` the sum
    of the factorized column sums of squares and ``T H^T`` shared with the next W
    update. The "nndsvd*" initializations take a randomized SVD of ``T`` (Halko et
    al., the same algorithm and defaults as scikit-learn), which also needs only
    these two products.

    On the CPU the W update runs over blocks of rows and builds ``T H^T`` one
    block at a time: per source the table ``S_k (H M_k)^T`` (source rows x
    n_components) is computed once per iteration and gathered into the block, so
    the n x n_components product never exists; the loss's cross term is summed
    over the same blocks. ``T^T W`` is the identity source's ``X_0^T W``, summed
    block by block in the same pass, plus one segment sum ``I_k^T W`` per
    dimension table after it.

    For the same initial W and H and the same number of iterations the factors
    equal those of ``sklearn.decomposition.NMF(solver="mu",
    beta_loss="frobenius", init="custom")`` on the joined matrix up to rounding.
    Unlike scikit-learn, the W and H passed to :meth:`fit_transform` are not
    modified.

    References
    ----------
    Lee, D. D. and Seung, H. S., "Algorithms for Non-negative Matrix
    Factorization", NIPS 2001.

    Sun, Hai et al., "Ilargi: a GPU compatible factorized ML model training
    framework", 2025.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.decomposition import FactorizedGNMF
    >>> base = np.array([[1.0], [2.0], [1.0], [2.0]])
    >>> dim = np.array([[1.0, 0.5], [0.2, 2.0]])
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, np.array([0, 1, 0, 1])])
    >>> gnmf = FactorizedGNMF(n_components=2, random_state=0, max_iter=1000, tol=1e-8)
    >>> W = gnmf.fit_transform(ds)
    >>> W.shape, gnmf.components_.shape
    ((4, 2), (2, 3))
    >>> (W @ gnmf.components_).round(3)
    array([[1. , 1. , 0.5],
           [2. , 0.2, 2. ],
           [1. , 1. , 0.5],
           [2. , 0.2, 2. ]])
    >>> round(gnmf.reconstruction_err_, 6)
    0.0
    """

    _parameter_constraints: dict = {
        "n_components": [
            Interval(Integral, 1, None, closed="left"),
            None,
            StrOptions({"auto"}),
        ],
        "init": [
            StrOptions({"random", "nndsvd", "nndsvda", "nndsvdar", "custom"}),
            None,
        ],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        n_components="auto",
        *,
        init=None,
        max_iter=200,
        tol=1e-4,
        random_state=None,
        strategy="factorized",
        device="auto",
    ):
        self.n_components = n_components
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.strategy = strategy
        self.device = device

    def _check_w_h(self, op, W, H):
        n_samples, n_features = op.shape
        n_components = self.n_components
        if n_components is None:
            n_components = n_features
        if self.init == "custom":
            name = type(self).__name__
            # Checked on the host (a copy when they came from a device).
            W, H = to_numpy(W), to_numpy(H)
            H = _check_init(H, (n_components, n_features), f"{name} (input H)")
            W = _check_init(W, (n_samples, n_components), f"{name} (input W)")
            if H.dtype != op.dtype or W.dtype != op.dtype:
                raise TypeError(
                    "H and W should have the same dtype as X. Got "
                    f"H.dtype = {H.dtype} and W.dtype = {W.dtype}, X.dtype = "
                    f"{op.dtype}."
                )
            if H.shape[0] != W.shape[1]:
                raise ValueError(
                    f"W has {W.shape[1]} columns but H has {H.shape[0]} rows."
                )
            H = asarray_on(H, op.xp, op.device)
            W_op = asarray_on(W, op.xp, op.device)
            # The NumPy W update is in place: never modify the caller's array
            # (an upload to a device is a copy already).
            return (W_op.copy() if W_op is W else W_op), H
        if W is not None or H is not None:
            warnings.warn(
                "When init!='custom', provided W or H are ignored. Set "
                " init='custom' to use them as initialization.",
                RuntimeWarning,
                stacklevel=3,
            )
        if n_components == "auto":
            n_components = n_features
        if self.init == "nndsvd":
            warnings.warn(
                "The multiplicative update solver cannot update zeros present in the "
                "initialization, and so leads to poorer results when used jointly "
                "with init='nndsvd'. You may try init='nndsvda' or init='nndsvdar' "
                "instead.",
                UserWarning,
                stacklevel=3,
            )
        return _initialize_gnmf(
            op, n_components, init=self.init, random_state=self.random_state
        )

    def _warn_max_iter(self, n_iter):
        if n_iter == self.max_iter and self.tol > 0:
            warnings.warn(
                f"Maximum number of iterations {self.max_iter} reached. Increase it "
                "to improve convergence.",
                ConvergenceWarning,
                stacklevel=3,
            )

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None, W=None, H=None):
        """Learn the factorization and return ``W``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative training data.
        y : Ignored
            Not used, present for API consistency.
        W : array-like of shape (n_samples, n_components), default=None
            Initial W when ``init="custom"`` (not modified).
        H : array-like of shape (n_components, n_features), default=None
            Initial H when ``init="custom"`` (not modified).

        Returns
        -------
        W : ndarray of shape (n_samples, n_components)
            The factor ``W`` of the training data.
        """
        caller = Caller(X)
        op = validate_X(
            self,
            X,
            reset=True,
            strategy=self.strategy,
            ensure_non_negative=True,
            device=self.device,
        )
        # Before W and H exist: the column sums of squares may need temporaries
        # the size of a source, which then do not add to the peak of the fit.
        norm_X = _norm_sq(op)
        W, H = self._check_w_h(op, W, H)
        W, H, n_iter, error = _fit_multiplicative_update(
            op,
            W,
            H,
            max_iter=self.max_iter,
            tol=self.tol,
            update_H=True,
            return_error=True,
            norm_X=norm_X,
        )
        self._warn_max_iter(n_iter)
        self.reconstruction_err_ = error
        self.n_components_ = int(H.shape[0])
        # Fitted attributes stay where the fit ran.
        self.components_ = H
        self.n_iter_ = n_iter
        return caller.give(W)

    def fit(self, X, y=None, **params):
        """Learn the factorization.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative training data.
        y : Ignored
            Not used, present for API consistency.
        **params : dict
            ``W`` and ``H`` for ``init="custom"``, passed to :meth:`fit_transform`.

        Returns
        -------
        self : FactorizedGNMF
            Fitted estimator.
        """
        self.fit_transform(X, **params)
        return self

    def transform(self, X):
        """Solve for ``W`` with ``H = components_`` fixed (multiplicative updates).

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative data.

        Returns
        -------
        W : ndarray of shape (n_samples, n_components)
            The factor ``W`` of ``X``.
        """
        check_is_fitted(self)
        caller = Caller(X)
        op = validate_X(
            self,
            X,
            reset=False,
            strategy=self.strategy,
            ensure_non_negative=True,
            device=self.device,
        )
        xp = op.xp
        avg = np.sqrt(_data_mean(op) / self.n_components_)
        # The fitted H where the data is (not modified: H stays fixed).
        H = asarray_on(self.components_, xp, op.device, op.dtype)
        # Before W exists (see fit_transform).
        norm_X = _norm_sq(op) if self.tol > 0 else None
        W = xp.full(
            (op.n_rows, self.n_components_),
            float(avg),
            dtype=namespace_dtype(xp, op.dtype),
            device=op.device,
        )
        W, _, n_iter, _ = _fit_multiplicative_update(
            op,
            W,
            H,
            max_iter=self.max_iter,
            tol=self.tol,
            update_H=False,
            norm_X=norm_X,
        )
        self._warn_max_iter(n_iter)
        return caller.give(W)

    def inverse_transform(self, X):
        """Map ``W`` back to the data space: ``W @ components_``.

        Parameters
        ----------
        X : {ndarray, sparse matrix} of shape (n_samples, n_components)
            Transformed data.

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features)
            The reconstruction (dense: it is the joined matrix's size).
        """
        check_is_fitted(self)
        # The (small) components go to where ``X`` is (no copy when both are
        # NumPy).
        return X @ asarray_on(self.components_, *input_namespace(X))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
