"""The compiled objective of the binary logistic loss and the log-link Tweedie
losses: one row pass over a NumPy operator's fused layout accumulates the losses
and the gradient's sums (:func:`~ilargi_sklearn.linear_model._glm_numba.fused_glm`),
where the array code of :func:`~ilargi_sklearn.linear_model._loss._loss_and_grad`
makes four n-length passes.

A plan (:class:`_FusedBinomial`) holds per-fit tables and copies; the objective of
a fit makes it once (:func:`~ilargi_sklearn.linear_model._loss._objective`, as
:func:`~ilargi_sklearn.cluster._kmeans._lloyd_steps` chooses the Lloyd steps), and
it goes with that objective when the fit ends. The plan computes the data's part
of the objective (sums over the rows); the parameters' layout and the penalty
stay with the generic objective, which also runs the array code where the plan
cannot compile.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.linear_model._glm_numba import fused_glm
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FusedLayout,
    MatrixOperator,
    fused_layout,
)

__all__ = ["fused_objective_plan"]


def fused_objective_plan(op, power=None):
    """The compiled objective of ``op``, or None where its layout has none.

    Parameters
    ----------
    op : Operator
        A NumPy factorized matrix or plain dense/CSR matrix, under
        scaling/centering layers (:func:`_glm_layout`); any other operator
        gets None.
    power : float or None, default=None
        None for the binary logistic loss, else the power of the log-link
        Tweedie loss.

    Returns
    -------
    _FusedBinomial or None
    """
    layout = _glm_layout(op)
    return None if layout is None else _FusedBinomial(layout, power)


# ------------------------------------------------------------- layouts
def _glm_layout(op):
    """A :class:`FusedLayout` of a NumPy operator for the compiled pass, or None.

    Factorized matrices (:func:`fused_layout`) and plain dense or CSR matrices (a
    layout with the matrix as its identity source and no row groups), under
    scaling/centering layers.
    """
    if isinstance(op, AffineOperator):
        if op._xp is not None:
            return None
        inner = _glm_layout(op.base)
        return None if inner is None else inner.with_affine(op.scale, op.offset)
    if isinstance(op, MatrixOperator):
        A = op.A
        if op._xp is not None or not (
            isinstance(A, np.ndarray) or (sp.issparse(A) and A.format == "csr")
        ):
            return None
        m = A.shape[1]
        return FusedLayout(
            A.shape,
            np.dtype(op.dtype),
            A,
            np.arange(m, dtype=np.int64),
            (),
            None,
            None,
            np.ones(m, dtype=np.int64),
        )
    return fused_layout(op)


#: Identity sources up to this many columns get a column-major copy in the plan.
_COLUMN_MAJOR_MAX_COLS = 12


class _FusedBinomial:
    """The binary logistic objective of one operator in compiled row passes, and
    the log-link Tweedie objectives (the same passes with another pointwise loss,
    :func:`~ilargi_sklearn.linear_model._glm_numba.fused_glm`).

    With ``T' = (T - 1 o^T) diag(s)`` and coefficients ``c`` in the coordinates
    of ``T'``, the predictor is ``T' c + b = T e + (b - o . e)`` with ``e = s * c``,
    and ``T = X0 M0^T + sum_g I_g S_g M_g^T`` is read as the identity source's rows
    plus, per row group, one entry of the table ``S_g e_g`` (see
    :func:`~ilargi_sklearn.linear_model._glm_numba.fused_glm`). The gradient
    ``T'^T g = s * (T^T g - o sum(g))`` is assembled from the pass's sums:
    ``X0^T g`` and, per row group, ``S_g^T`` times the sums per source row.
    Unmatched rows (index -1) have zeros in ``T``: they add nothing.

    The rows go through in blocks (:meth:`_block_rows`), each block's products,
    passes and n-length temporaries while they are in the cache.
    """

    def __init__(self, layout, power=None):
        n, m = layout.shape
        self.n_cols = m
        self.power = power
        self.offset = (
            None if layout.offset is None else np.asarray(layout.offset, float)
        )
        self.scale = None if layout.scale is None else np.asarray(layout.scale, float)
        self.base, self.cols0 = layout.base, layout.base_cols
        X0 = self.base
        if (
            isinstance(X0, np.ndarray)
            and 0 < X0.shape[1] <= _COLUMN_MAJOR_MAX_COLS
            and n >= 2 * self._block_rows(n)
        ):
            # The products X0_b e0 and X0_b^T g of a narrow row-major X0 run as
            # dot products of a few elements per row; on a column-major copy
            # they stream whole columns, faster up to about a dozen columns
            # (beyond, the row-major products win). The copy is made once per
            # fit.
            self.base = np.asfortranarray(X0)
        self.groups = [(g.idx, g.S, g.cols) for g in layout.groups]
        # Each group's entries, then one zero entry for its unmatched rows.
        self.pads = np.asarray([S.shape[0] for _, S, _ in self.groups], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.pads + 1)[:-1]])
        self.offsets = self.offsets.astype(np.int64)
        self.total = int(np.sum(self.pads + 1))

    @staticmethod
    def _block_rows(n):
        """Rows per block: 32,768 (measured best of 8,192-65,536 on one thread),
        all rows when fewer than two blocks' worth."""
        block = 32768
        return n if n < 2 * block else block

    def sums(self, coef, intercept, y, sample_weight):
        """The data's part of the objective at ``coef`` (n_features,) and the
        float ``intercept`` (0.0 without one): ``(sum_i s_i l_i, T^T g,
        sum_i g_i)`` with ``g = s * dl/draw`` (unnormalized), from one row pass.
        ``y`` and ``sample_weight`` (or None) as :func:`_loss_and_grad` takes
        them for one output."""
        power = self.power
        e = coef if self.scale is None else coef * self.scale
        bias = float(intercept)
        if self.offset is not None:
            bias -= float(self.offset @ e)
        P = np.zeros(self.total)
        for (_, S, cols), start in zip(self.groups, self.offsets):
            P[start : start + S.shape[0]] = S @ e[cols]
        X0 = self.base
        # In the source's dtype: a float32 source is not copied to float64.
        e0 = None if X0 is None else e[self.cols0].astype(X0.dtype)
        y = np.ascontiguousarray(y, dtype=np.float64)
        sw = (
            None
            if sample_weight is None
            else np.ascontiguousarray(sample_weight, dtype=np.float64)
        )
        idxs = [idx for idx, _, _ in self.groups]
        n = y.shape[0]
        block = self._block_rows(n)
        starts = np.arange(0, n, block)
        # Threads take whole blocks (each block's kernels, BLAS products and NumPy
        # passes on one thread, the GIL released in all three): one hand-out per
        # evaluation, where splitting each block's passes over the threads cost
        # more than it gained. A task sums into its own arrays (summed in task
        # order below): at least 3 blocks and as many rows as its sums have
        # entries, two tasks per thread (two threads: 1.26x at 4e5 rows, 1.33x at
        # 1e6; with tasks of single blocks 0.94x at 1e5, benchmarks/README.md).
        threads = _launcher.n_threads()
        min_rows = max(_launcher.MIN_CHUNK_ROWS["logistic"], self.total)
        min_blocks = -(-min_rows // block)
        n_tasks = _launcher.chunks(starts.size, min_blocks, threads, per_thread=2)
        groups = np.array_split(starts, n_tasks)
        parts = [None] * n_tasks

        def task(t):
            lsum = gsum = 0.0
            bins = np.zeros(self.total)
            g0 = None if X0 is None else np.zeros(e0.shape[0])
            for lo in groups[t]:
                hi = min(n, lo + block)
                Xb = None if X0 is None else X0[lo:hi]
                ls, gs, g, bins_b = fused_glm(
                    None if Xb is None else np.asarray(Xb @ e0, dtype=np.float64),
                    [idx[lo:hi] for idx in idxs],
                    P,
                    self.offsets,
                    self.pads,
                    y[lo:hi],
                    None if sw is None else sw[lo:hi],
                    bias,
                    1,
                    power,
                )
                lsum += ls
                gsum += gs
                bins += bins_b
                if Xb is not None:
                    g0 += Xb.T @ g.astype(X0.dtype, copy=False)
            parts[t] = lsum, gsum, bins, g0

        _launcher.run_tasks(task, n_tasks, threads)
        lsum, gsum, bins, g0 = parts[0]
        for ls, gs, bins_t, g0_t in parts[1:]:
            lsum += ls
            gsum += gs
            bins += bins_t
            if g0 is not None:
                g0 += g0_t
        g_t = np.zeros(self.n_cols)
        if X0 is not None:
            g_t[self.cols0] += g0
        for (_, S, cols), start in zip(self.groups, self.offsets):
            # Columns may repeat across the terms of one group: add.at sums them.
            np.add.at(g_t, cols, S.T @ bins[start : start + S.shape[0]])
        if self.offset is not None:
            g_t -= self.offset * gsum
        if self.scale is not None:
            g_t *= self.scale
        return lsum, g_t, gsum
