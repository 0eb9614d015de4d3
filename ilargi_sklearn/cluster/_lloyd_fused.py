"""The compiled Lloyd steps of a NumPy factorized matrix: per-fit tables and
workspaces of the fused E- and M-steps, whose row passes are the numba kernels of
:mod:`._lloyd_numba`.

:class:`_FusedLloyd` is a steps object of the Lloyd kernel
(:func:`~ilargi_sklearn.cluster._kmeans._kmeans_single_lloyd`), as the
namespace-generic :class:`~ilargi_sklearn.cluster._kmeans._LloydSteps`: the kernel
runs the iterations, chooses the steps once per fit
(:func:`~ilargi_sklearn.cluster._kmeans._lloyd_steps`) and runs them again on the
generic steps where these cannot compile. No ``n x n_clusters`` array is built,
which halves an iteration's time and the fit's peak memory on a star schema
(``benchmarks/bench_estimators.py``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.utils.extmath import row_norms

from ilargi_sklearn._backend._launcher import numba_available, one_blas_thread
from ilargi_sklearn.cluster._lloyd_numba import (
    fused_accumulate,
    fused_assign,
    fused_partial_at,
)
from ilargi_sklearn.multisource._operators import fused_layout

__all__ = ["fused_lloyd_plan"]


#: Identity sources up to this many columns are multiplied inside the fused loop;
#: wider ones are multiplied by BLAS into an n x k table first.
_INLINE_MAX_COLS = 32
#: The same for a CSR identity source (the loop reads its entries only; the
#: blocked centers, ``d0 x 8`` per block, should stay in cache).
_INLINE_MAX_SPARSE_COLS = 4096


def fused_lloyd_plan(op, n_clusters):
    """A :class:`_FusedLloyd` for ``op``, or None.

    The compiled steps run when numba is available and ``op`` is a NumPy
    factorized matrix (dense or CSR sources) under centering/scaling layers that
    do not center a CSR source.
    """
    if not numba_available():
        return None
    layout = fused_layout(op)
    if layout is None:
        return None
    return _FusedLloyd(layout, n_clusters)


class _FusedLloyd:
    """Per-fit tables and workspaces of the fused Lloyd iteration.

    With ``T' = (T - 1 o^T) diag(s)`` and centers ``C`` in the coordinates of
    ``T'``, the partial distance ``||c_j||^2 - 2 t'_i . c_j`` is

        ``bias_j - 2 (sum_{f in base} (x_if - o_f) e_jf + sum_g P_g[idx_g(i), j])``

    with ``E = C diag(s)``, per row group a table ``P_g = S~_g E_g^T`` of
    ``source rows + 1`` rows (``S~_g``: the source centered on the columns it alone
    covers, plus a last row ``-o`` that unmatched target rows take), and
    ``bias_j = ||c_j||^2 + 2 sum_{f shared} o_f e_jf`` for the columns that several
    terms share (their centering cannot live in one source). Centering inside the
    sources keeps the products as accurate as scikit-learn's on the centered matrix.
    The M-step sums come from the same pass: the base columns' weighted sums per
    cluster and, per group, the weighted (source row, cluster) counts ``N_g``, so
    that ``T'^T A = (N_g^T S~_g ...  - W o_shared^T) diag(s)``.

    A CSR source is never centered (the layout guarantees a zero offset on its
    columns): its table ``P_g = S_g E_g^T`` and its sums ``N_g^T S_g`` are SciPy
    sparse products, its padding row is zero, and a CSR base is read entry by
    entry inside the kernels.

    The steps of :func:`_kmeans_single_lloyd`, as :class:`_LloydSteps`: the E-step
    also gives each row's partial distance to its center (in one n-sized
    workspace), and the kernel can do without the row norms.
    """

    compiled = True
    lazy_row_norms = True

    def __init__(self, layout, n_clusters):
        self.dtype = dtype = np.dtype(layout.dtype)
        n, m = layout.shape
        self.n_rows, self.n_cols, self.k = n, m, n_clusters
        offset = (
            np.zeros(m) if layout.offset is None else np.asarray(layout.offset, float)
        )
        self.scale = None if layout.scale is None else np.asarray(layout.scale, float)
        alone = layout.coverage == 1
        o_in = np.where(alone, offset, 0.0)
        self.o_out = np.where(alone, 0.0, offset)
        self.has_out = bool(np.any(self.o_out != 0))
        groups = [(g.idx, g.S, g.cols) for g in layout.groups]
        base = layout.base
        max_inline = _INLINE_MAX_SPARSE_COLS if sp.issparse(base) else _INLINE_MAX_COLS
        if base is not None and base.shape[1] > max_inline:
            groups.insert(0, (np.arange(n, dtype=np.int64), base, layout.base_cols))
            base = None
        if base is None:
            self.X0 = np.empty((n, 0), dtype=dtype)
            self.cols0 = np.zeros(0, dtype=np.int64)
        else:
            self.X0, self.cols0 = base, layout.base_cols
        self.o0 = o_in[self.cols0].astype(dtype)
        self.idxs, self.tables, self.cols = [], [], []
        offsets, pads = [], []
        total = 0
        for idx, S, cols in groups:
            r = S.shape[0]
            if sp.issparse(S):
                # Uncentered (o_in is zero on its columns): the zero padding row
                # of P is left as allocated.
                St = S
            else:
                St = np.empty((r + 1, S.shape[1]), dtype=dtype)
                np.subtract(S, o_in[cols].astype(dtype), out=St[:r])
                St[r] = -o_in[cols]
            self.idxs.append(idx)
            self.tables.append(St)
            self.cols.append(cols)
            offsets.append(total)
            pads.append(r)
            total += r + 1
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.pads = np.asarray(pads, dtype=np.int64)
        self.total = total
        # Centers in blocks of 8 (the kernel's register block); padding centers
        # have zero coordinates and an infinite bias.
        self.n_blocks = -(-n_clusters // 8)
        kp = 8 * self.n_blocks
        self.P = np.zeros((total, kp), dtype=dtype)
        self.E = np.zeros((kp, m), dtype=dtype)
        self.bias = np.full(kp, np.inf, dtype=dtype)
        self.best = np.empty(n, dtype=dtype)
        self.buffers = {}
        # Two label buffers, taken in turn by the E-steps: the kernel keeps the
        # previous labels for the stopping rule, and a fresh n-length array per
        # iteration would pay its page faults every time.
        self._labels = (np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32))
        self._turn = 0

    def _prepare(self, centers):
        """Tables, blocked centers and biases for ``centers``."""
        dtype, k = self.dtype, self.k
        centers = np.asarray(centers, dtype=dtype)
        E = self.E
        if self.scale is None:
            E[:k] = centers
        else:
            E[:k] = centers * self.scale
        bias = self.bias
        bias[:k] = row_norms(centers, squared=True)
        if self.has_out:
            bias[:k] += (2.0 * (E[:k] @ self.o_out)).astype(dtype)
        C0 = np.ascontiguousarray(E[:, self.cols0].T)
        for St, cols, start in zip(self.tables, self.cols, self.offsets):
            stop = start + St.shape[0]
            Ec = np.ascontiguousarray(E[:, cols].T)
            if sp.issparse(St):
                self.P[start:stop] = St @ Ec
            else:
                np.matmul(St, Ec, out=self.P[start:stop])
        return C0

    def weights(self, sample_weight, unit_weights):
        # The kernel reads float64 weights, or none for unit weights.
        return None if unit_weights else np.asarray(sample_weight, dtype=np.float64)

    def assign(self, centers):
        C0 = self._prepare(centers)
        nb = self.n_blocks
        C3 = np.ascontiguousarray(C0.reshape(C0.shape[0], nb, 8).transpose(1, 0, 2))
        labels = self._labels[self._turn]
        self._turn ^= 1
        fused_assign(
            self.X0,
            self.o0,
            C3,
            self.idxs,
            self.P.reshape(self.total, nb, 8),
            self.offsets,
            self.pads,
            self.bias.reshape(nb, 8),
            labels,
            self.best,
        )
        return labels

    def own_distances(self, labels):
        return self.best

    def partial_scale(self):
        return float(np.max(np.abs(self.best), initial=0.0))

    def distances_at(self, centers, labels):
        C0 = self._prepare(centers)
        fused_partial_at(
            self.X0,
            self.o0,
            C0,
            self.idxs,
            self.P,
            self.offsets,
            self.pads,
            self.bias,
            labels,
            self.best,
        )
        return self.best

    def center_sums(self, labels, weights, dtype):
        """``T'^T A`` from the base columns' sums per cluster and, per group, the
        (source row, cluster) weights times the source (see the class notes)."""
        wsum, sums0, cnt = fused_accumulate(
            self.X0,
            self.o0,
            self.idxs,
            self.offsets,
            self.pads,
            weights,
            labels,
            self.k,
            self.total,
            self.buffers,
        )
        sums = np.zeros((self.k, self.n_cols))
        sums[:, self.cols0] = sums0
        for St, cols, start in zip(self.tables, self.cols, self.offsets):
            block = cnt[start : start + St.shape[0]]
            if sp.issparse(St):
                sums[:, cols] += (St.T @ block).T
            else:
                sums[:, cols] += block.T @ St
        if self.has_out:
            sums -= np.multiply.outer(wsum, self.o_out)
        if self.scale is not None:
            sums *= self.scale
        return sums.astype(dtype), wsum.astype(dtype)

    def context(self):
        """BLAS on one thread around the steps, as scikit-learn's KMeans runs its
        Lloyd iterations: the passes run on the kernels' threads, and BLAS's
        threads cost more than they save on the small per-iteration tables."""
        return one_blas_thread()

    def keep(self, labels):
        """The labels of the last E-step as the caller keeps them: a copy, the
        steps reuse their buffers in the next run."""
        return labels.copy()
