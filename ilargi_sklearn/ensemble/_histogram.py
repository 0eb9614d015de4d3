"""Histograms of a tree node, per source: grouped or row-wise, chosen by cost.

For the tree features of group ``g`` (a binned source and its index vector), the
histogram of a node is ``H[f, b] = sum_{i in node} g_i [bins(idx[i], f) = b]``. The
row-wise build reads the source row of every node row (``n_node * c_g`` bin reads).
The grouped build first sums the node's gradients, hessians and counts per source
row (one pass over the node's rows), then reads each *distinct* source row once
(``u_g * c_g``, ``u_g`` the distinct rows, at most ``min(n_node, r_g)``): many times
cheaper when a dimension is wide and its rows repeat in the node. The choice is per
node and per group (:func:`choose_modes`); the larger child of a split is the
parent's histogram minus the smaller child's (the subtraction trick, in the
grower).

:func:`build_histograms` is the reference (NumPy ``bincount``); the compiled kernel
(:mod:`._trees_numba`) computes the same sums in one pass over the node's rows.
"""

from __future__ import annotations

import numpy as np

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn.ensemble._binning import ROW_DTYPE, BinnedData
from ilargi_sklearn.ensemble._trees_numba import GROUPED, ROWWISE

__all__ = ["HistogramBuilder", "build_histograms", "choose_modes"]

#: Cost of summing one node row into a source row's accumulators, and of one
#: distinct source row's bookkeeping, in units of one bin read-and-add (measured
#: with the compiled kernel: benchmarks/README.md, "Trees over joins").
_SCATTER_COST = 1.5
_TOUCH_COST = 2.0


def choose_modes(
    data: BinnedData, n_node: int, distinct: np.ndarray, widths: np.ndarray
) -> np.ndarray:
    """Per group, the cheaper build for a node of ``n_node`` rows.

    ``distinct[g]`` is the number of distinct source rows of group ``g`` among
    the training rows; in a node of ``n_node`` rows drawn from them the expected
    number of distinct rows is ``d (1 - (1 - 1/d)^n_node)``. Identity groups (the
    base table) are always row-wise.
    """
    modes = np.full(data.n_groups, ROWWISE, dtype=np.int64)
    for g in range(data.n_groups):
        if data.idx[g].shape[0] == 0 or widths[g] <= 1:
            continue
        d = max(float(distinct[g]), 1.0)
        u = d * -np.expm1(n_node * np.log1p(-1.0 / d)) if d > 1 else 1.0
        u = min(u, float(n_node))
        grouped = n_node * _SCATTER_COST + u * (widths[g] + _TOUCH_COST)
        if grouped < n_node * widths[g]:
            modes[g] = GROUPED
    return modes


def build_histograms(
    data: BinnedData,
    rows: np.ndarray,
    gradients: np.ndarray,
    hessians: np.ndarray | None,
    modes: np.ndarray,
    n_bins: int,
) -> np.ndarray:
    """The node's histograms (NumPy reference): float64 ``(n_features, n_bins, 3)``
    of summed gradients, hessians (zero when ``hessians`` is None: constant) and
    counts, built per group in ``modes`` (row-wise or grouped)."""
    F = data.feature_group.shape[0]
    hist = np.zeros((F, n_bins, 3))
    g = gradients[rows].astype(np.float64)
    h = None if hessians is None else hessians[rows].astype(np.float64)
    for grp in range(data.n_groups):
        feats = data.group_features(grp)
        if feats.shape[0] == 0:
            continue
        B = data.bins[grp]
        src = data.rows_of(grp, rows)
        if modes[grp] == GROUPED:
            m = B.shape[0]
            cnt = np.bincount(src, minlength=m).astype(np.float64)
            touched = np.flatnonzero(cnt)
            wg = np.bincount(src, weights=g, minlength=m)[touched]
            wh = (
                None if h is None else np.bincount(src, weights=h, minlength=m)[touched]
            )
            wc = cnt[touched]
            Bt = B[touched]
        else:
            Bt, wg, wh, wc = B[src], g, h, None
        for c, f in enumerate(feats):
            b = Bt[:, c]
            hist[f, :, 0] = np.bincount(b, weights=wg, minlength=n_bins)
            if wh is not None:
                hist[f, :, 1] = np.bincount(b, weights=wh, minlength=n_bins)
            hist[f, :, 2] = np.bincount(b, weights=wc, minlength=n_bins)
    return hist


class HistogramBuilder:
    """Builds node histograms over one fit's binned data, compiled where it can.

    Holds the per-thread accumulators of the grouped builds (zero between calls)
    and the number of distinct source rows per group among the training rows.
    """

    def __init__(self, data: BinnedData, n_bins: int) -> None:
        self.data = data
        self.n_bins = int(n_bins)
        self.widths = np.asarray([b.shape[1] for b in data.bins], dtype=np.int64)
        self.distinct = np.zeros(data.n_groups)
        for g in range(data.n_groups):
            ix = data.idx[g]
            if ix.shape[0] == 0:
                self.distinct[g] = data.n_rows
            else:
                seen = np.zeros(data.bins[g].shape[0], dtype=bool)
                seen[ix] = True
                self.distinct[g] = seen.sum()
        self.fmaps = tuple(
            data.group_features(g).astype(np.int64) for g in range(data.n_groups)
        )
        self._row_buffers: tuple | None = None
        self._accs: tuple | None = None
        self._touched: tuple | None = None
        self._threads = 0

    def _buffers(self, threads: int) -> tuple[tuple, tuple]:
        if self._accs is None or self._threads < threads:
            accs, touched = [], []
            for g in range(self.data.n_groups):
                if self.data.idx[g].shape[0] == 0 or self.widths[g] <= 1:
                    accs.append(np.zeros((threads, 1, 3)))
                    touched.append(np.zeros((threads, 1), dtype=np.int64))
                else:
                    m = self.data.bins[g].shape[0]
                    accs.append(np.zeros((threads, m, 3)))
                    touched.append(np.zeros((threads, m), dtype=np.int64))
            self._accs = _launcher.uniform_tuple(accs)
            self._touched = _launcher.uniform_tuple(touched)
            self._threads = threads
        return self._accs, self._touched

    def row_buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """The partition of the rows and its scratch space, shared by the trees
        of a fit (a tree's partition is read before the next tree grows)."""
        if self._row_buffers is None:
            n = self.data.n_rows
            self._row_buffers = (
                np.empty(n, dtype=ROW_DTYPE),
                np.empty(n, dtype=ROW_DTYPE),
            )
        return self._row_buffers

    def modes(self, n_node: int) -> np.ndarray:
        return choose_modes(self.data, n_node, self.distinct, self.widths)

    def build(
        self,
        rows: np.ndarray,
        gradients: np.ndarray,
        hessians: np.ndarray | None,
    ) -> np.ndarray:
        """Histograms of the node with target rows ``rows``."""
        modes = self.modes(rows.shape[0])
        if numba_available():
            try:
                return self._build_compiled(rows, gradients, hessians, modes)
            except CompiledUnavailable:
                pass
        return build_histograms(
            self.data, rows, gradients, hessians, modes, self.n_bins
        )

    def _build_compiled(self, rows, gradients, hessians, modes) -> np.ndarray:
        n = rows.shape[0]
        F = self.data.feature_group.shape[0]
        threads = _launcher.n_threads()
        # Per-chunk histograms are zeroed and summed: a chunk pays from a few
        # times their size in rows.
        min_rows = max(_launcher.MIN_CHUNK_ROWS["tree_hist"], 4 * F * self.n_bins)
        n_chunks = _launcher.chunks(n, min_rows, threads, per_thread=1)
        accs, touched = self._buffers(max(n_chunks, 1))
        out = np.zeros((n_chunks, F, self.n_bins, 3))
        # The node's gradients in its rows' order: every group's pass reads
        # them sequentially (one random gather here instead of one per group).
        g = np.take(gradients, rows)
        h = (
            np.zeros(0, dtype=np.float32)
            if hessians is None
            else np.take(hessians, rows)
        )
        head = (
            rows,
            g,
            h,
            _launcher.uniform_tuple(self.data.bins),
            _launcher.uniform_tuple(self.data.idx),
            self.fmaps,
            self.data.n_groups,
            modes,
            accs,
            touched,
            out,
        )
        _launcher.launch("tree_hist", head, n, n_chunks, threads)
        return out[0] if n_chunks == 1 else out.sum(axis=0)
