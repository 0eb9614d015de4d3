"""GNMF's W update on NumPy in one pass over row blocks, compiled where numba
runs: the in-place multiplicative step (:func:`_multiplicative_update_w`), and on
a NumPy factorized operator the blocked numerator (:class:`_BlockedNumerator`)
that assembles ``T H^T`` block by block from per-source tables inside the pass,
never as one n x k array (numba's ``mu_rows``, kernels in :mod:`._gnmf_numba`).

These are the NumPy variants of the W update of the multiplicative-update kernel
(:func:`~ilargi_sklearn.decomposition._gnmf._fit_multiplicative_update`), chosen
once per fit by :func:`~ilargi_sklearn.decomposition._gnmf._w_update`; each
compiled step falls back to its NumPy operations where numba cannot compile here.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend._launcher import (
    CompiledUnavailable,
    numba_available,
    one_blas_thread,
)
from ilargi_sklearn.decomposition._gnmf_numba import (
    MU_ROWS_COLUMNS,
    mu_rows,
    mu_rows_gram,
    mu_update,
    segment_sum_rows,
)

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
    eps : float
        scikit-learn's guard of a zero denominator (its NMF's ``EPSILON``).
    """

    def __init__(self, layout, n_components, dtype, eps):
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
        self.eps = eps
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
        _multiplicative_update_w(self, W, HHt, WtW, self.buffers, tw=tw, eps=self.eps)
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


def _multiplicative_update_w(XHt, W, HHt, WtW=None, buffers=None, tw=False, *, eps):
    """``W <- W o (T H^T) / (W H H^T)`` (in place), as scikit-learn's MU step, in
    one pass over row blocks.

    Per block of rows the denominator ``W_b H H^T`` gets ``eps`` for its zeros
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
    eps : float
        scikit-learn's guard, the value of a zero denominator (its NMF's
        ``EPSILON``).

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
    eps = W.dtype.type(eps)
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
    np.copyto(quotient, eps, where=mask)
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
        total += float(numerator.reshape(-1) @ W[start:stop].reshape(-1))
    return total
