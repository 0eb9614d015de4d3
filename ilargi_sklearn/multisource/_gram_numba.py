"""Compiled (numba) cross tables of the factorized gram.

A gram's cross term between two row groups, ``I_a^T diag(w) I_b S_b``, is a sum of
partner rows per bin of the target rows: :func:`fused_cross_tables` makes one pass
over the target rows per partner into per-thread float64 tables (no n-length
temporary), summed in chunk order. It registers with :mod:`.._backend._launcher`;
the operators (:mod:`._operators`) use it only for NumPy data where
:func:`~.._backend._launcher.numba_available`.
"""

from __future__ import annotations

import numpy as np

from ilargi_sklearn._backend import _launcher

_u = _launcher.U

__all__ = ["fused_cross_tables"]


def _cross_chunk(idx, Zs, idxs, n_partners, offsets, weights, out, c, start, stop):
    # out (chunks, n_bins, C) float64; partner p fills columns offsets[p]:...
    A = out[c]
    # One partner at a time: one stream of table reads per pass (a single pass
    # reading all partners per row was slower).
    for p in range(n_partners):
        Z = Zs[p]
        ix = idxs[p]
        off = offsets[p]
        k = Z.shape[1]
        direct = ix.shape[0] == 0
        for i in range(start, stop):
            u = _u(i)
            j = idx[u]
            if j < 0:
                continue
            r = i
            if not direct:
                r = ix[u]
                if r < 0:
                    continue
            Aj = A[_u(j)]
            Zr = Z[_u(r)]
            if weights is None:
                for f in range(k):
                    Aj[_u(off + f)] += Zr[f]
            else:
                wi = weights[u]
                for f in range(k):
                    Aj[_u(off + f)] += wi * Zr[f]


# Per-chunk tables of the bins' size: one chunk per thread.
_launcher.register("cross", _cross_chunk, min_rows=131072)


def fused_cross_tables(
    idx: np.ndarray,
    n_bins: int,
    partners: list[tuple[np.ndarray, np.ndarray | None]],
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """``I^T diag(w) [Z_1 | Z_2 | ...]``: per bin, the partners' rows of its target rows.

    Partner ``(Z, g)`` contributes row ``g[i]`` of ``Z`` for target row ``i`` (row
    ``i`` itself when ``g`` is None; nothing where ``g[i]`` is -1): with ``Z`` a
    source and ``g`` its index vector this is ``I^T diag(w) I_g Z``, a gram's cross
    term before the last small product. One pass over the target rows per partner,
    into per-thread float64 tables (``n_bins`` x total columns each), summed.

    Parameters
    ----------
    idx : ndarray of int of shape (n,)
        Bin of each target row, -1 for none.
    n_bins : int
    partners : list of (ndarray of shape (m_p, k_p), ndarray of int of shape (n,) or None)
        Dense values, all of one dtype, and their row of each target row.
    weights : ndarray of shape (n,), optional

    Returns
    -------
    ndarray of float64 of shape (n_bins, sum of k_p)
    """
    n = idx.shape[0]
    m = int(n_bins)
    widths = [int(Z.shape[1]) for Z, _ in partners]
    offsets = np.cumsum([0] + widths[:-1]).astype(np.int64)
    # Per-chunk tables cost n_chunks * m rows: at least 4 target rows per row,
    # one chunk per thread.
    threads = _launcher.n_threads()
    n_chunks = _launcher.chunks(
        n, max(4 * m, _launcher.MIN_CHUNK_ROWS["cross"]), threads, per_thread=1
    )
    out = np.zeros((n_chunks, m, sum(widths)))
    Zs = _launcher.uniform_tuple(np.ascontiguousarray(Z) for Z, _ in partners)
    empty = np.zeros(0, dtype=np.int64)
    idxs = _launcher.uniform_tuple(
        empty if g is None else np.ascontiguousarray(g, dtype=np.int64)
        for _, g in partners
    )
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    head = (np.ascontiguousarray(idx, dtype=np.int64), Zs, idxs, len(Zs), offsets, w)
    _launcher.launch("cross", head + (out,), n, n_chunks, threads)
    return out[0] if n_chunks == 1 else out.sum(axis=0)
