"""Compiled (numba) K-Means steps over a factorized matrix: the E-step and M-step.

The k-means iteration over a factorized matrix spends its time in passes over the
target rows: the factorized ``T C^T`` (one ``np.take`` and one add per row group,
through an ``n x k`` array), a row-wise ``argmin`` over a short last axis and a
one-hot scatter for the M-step. These kernels make one pass over the index vectors
of all row groups for the E-step (multiply the identity source, add one precomputed
table row per group, arg-min, all in registers) and one for the M-step sums, with no
``n x k`` array at all. The identity source may be dense or CSR: one kernel source
reads both (a dense one comes without CSR arrays, ``None``, for which numba drops
the CSR loop; a CSR one's dense part has no columns).

The E-step holds a block of 8 centers in one 8-lane vector (:mod:`.._backend._simd`)
and takes four rows per step, so that one row's chain of dependent FMAs, adds and
its arg-min does not leave the CPU waiting; labels and partial distances are bitwise
those of the scalar form. The plain products ``T @ x`` are not fused: NumPy's
``take`` plus add are already SIMD loops and were faster (``benchmarks/README.md``).

Kernel sources take NumPy arrays; ``idxs`` is a tuple of index vectors (int64, -1
for no match), one per row group; the per-group values are stacked into one array
``P`` whose group ``g`` starts at row ``offsets[g]`` and whose row
``offsets[g] + pads[g]`` is what an unmatched target row takes. They register with
:mod:`.._backend._launcher`, which jits, threads and falls back; the estimator
(:mod:`._kmeans`) uses them only where :func:`~.._backend._launcher.numba_available`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ilargi_sklearn._backend import _launcher, _simd

_u = _launcher.U

__all__ = ["fused_accumulate", "fused_assign", "fused_partial_at"]


def _assign_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    C3,
    idxs,
    n_groups,
    P3,
    offsets,
    pads,
    bias2,
    labels,
    best,
    c,
    start,
    stop,
):
    # Centers in blocks of 8, one 8-lane vector per row and block: the vector
    # intrinsics (``_simd``). The arg-min of a block is a vector min tree and the
    # first lane equal to it (as np.argmin). Four rows per step (accumulators a,
    # b, c, d): one row's chain of dependent FMAs, adds and its arg-min leaves the
    # CPU waiting, four independent chains keep it busy.
    n_blocks, dc = C3.shape[0], C3.shape[1]
    d0 = X0.shape[1]
    a, b, c, d = _simd.acc8(), _simd.acc8(), _simd.acc8(), _simd.acc8()
    # Flat views: element offsets into C3 (n_blocks, dc, 8: dc = d0 for a dense
    # base, its number of columns for a CSR one), P3 (total, n_blocks, 8) and
    # bias2 (n_blocks, 8), all C-contiguous.
    Cf = C3.reshape(-1)
    Pf = P3.reshape(-1)
    bf = bias2.reshape(-1)
    row = 8 * n_blocks
    for i in range(start, stop, 4):
        # Past the end, the last rows repeat the first (the same values stored).
        i1 = i + 1 if i + 1 < stop else i
        i2 = i + 2 if i + 2 < stop else i
        i3 = i + 3 if i + 3 < stop else i
        u0, u1, u2, u3 = _u(i), _u(i1), _u(i2), _u(i3)
        la = lb = lc = ld = 0
        ma = mb = mc = md = np.inf
        for blk in range(n_blocks):
            _simd.zero8(a)
            _simd.zero8(b)
            _simd.zero8(c)
            _simd.zero8(d)
            for f in range(d0):
                o = (blk * dc + f) * 8
                of = o0[f]
                _simd.fma8(a, X0[u0, f] - of, Cf, o)
                _simd.fma8(b, X0[u1, f] - of, Cf, o)
                _simd.fma8(c, X0[u2, f] - of, Cf, o)
                _simd.fma8(d, X0[u3, f] - of, Cf, o)
            # A CSR base (ip None for a dense one: the branch is compiled out).
            if ip is not None:
                o = blk * dc
                for q in range(ip[u0], ip[_u(i + 1)]):
                    _simd.fma8(a, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u1], ip[_u(i1 + 1)]):
                    _simd.fma8(b, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u2], ip[_u(i2 + 1)]):
                    _simd.fma8(c, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
                for q in range(ip[u3], ip[_u(i3 + 1)]):
                    _simd.fma8(d, dat[_u(q)], Cf, (o + ind[_u(q)]) * 8)
            for g in range(n_groups):
                # A select, not a branch (which mispredicts on scattered
                # unmatched rows): the pad is loaded either way.
                pad = pads[g]
                ix = idxs[g]
                og = offsets[g]
                r0, r1, r2, r3 = ix[u0], ix[u1], ix[u2], ix[u3]
                _simd.add8(a, Pf, (og + (r0 if r0 >= 0 else pad)) * row + blk * 8)
                _simd.add8(b, Pf, (og + (r1 if r1 >= 0 else pad)) * row + blk * 8)
                _simd.add8(c, Pf, (og + (r2 if r2 >= 0 else pad)) * row + blk * 8)
                _simd.add8(d, Pf, (og + (r3 if r3 >= 0 else pad)) * row + blk * 8)
            m, lane = _simd.argmin8(a, bf, blk * 8)
            t = m < ma
            ma = m if t else ma
            la = blk * 8 + lane if t else la
            m, lane = _simd.argmin8(b, bf, blk * 8)
            t = m < mb
            mb = m if t else mb
            lb = blk * 8 + lane if t else lb
            m, lane = _simd.argmin8(c, bf, blk * 8)
            t = m < mc
            mc = m if t else mc
            lc = blk * 8 + lane if t else lc
            m, lane = _simd.argmin8(d, bf, blk * 8)
            t = m < md
            md = m if t else md
            ld = blk * 8 + lane if t else ld
        labels[u3] = ld
        best[u3] = md
        labels[u2] = lc
        best[u2] = mc
        labels[u1] = lb
        best[u1] = mb
        labels[u0] = la
        best[u0] = ma


def _partial_at_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    C,
    idxs,
    n_groups,
    P,
    offsets,
    pads,
    bias,
    labels,
    best,
    c,
    start,
    stop,
):
    d0 = X0.shape[1]
    for i in range(start, stop):
        u = _u(i)
        j = _u(labels[u])
        acc = 0.0
        for f in range(d0):
            acc += (X0[u, f] - o0[f]) * C[f, j]
        if ip is not None:
            for q in range(ip[u], ip[_u(i + 1)]):
                acc += dat[_u(q)] * C[_u(ind[_u(q)]), j]
        for g in range(n_groups):
            pad = pads[g]
            r = idxs[g][u]
            r = r if r >= 0 else pad
            acc += P[_u(offsets[g] + r), j]
        best[u] = bias[j] - 2.0 * acc


def _accumulate_chunk(
    X0,
    o0,
    ip,
    ind,
    dat,
    idxs,
    n_groups,
    offsets,
    pads,
    weights,
    labels,
    wsum,
    sums0,
    cnt,
    c,
    start,
    stop,
):
    # wsum (chunks, k), sums0 (chunks, k, d0), cnt (chunks, total * k), float64.
    d0 = X0.shape[1]
    k = wsum.shape[1]
    ws = wsum[c]
    sc = sums0[c]
    cc = cnt[c]
    # Unit weights come as None (numba compiles that case without their reads).
    wi = 1.0
    if ip is None and k <= 8 and d0 <= 12:
        # Up to 8 clusters, a dense base of up to 12 columns: the sums in
        # registers, one 8-lane vector per column with a lane per cluster (two
        # sets, for even and odd rows), each row added to its cluster's lane by
        # a select: no stores, no chains through memory when rows share a
        # cluster.
        A = _simd.accs24()
        for q in range(24):
            _simd.zero8(_simd.slot(A, q))
        w0, w1 = _simd.acc8(), _simd.acc8()
        _simd.zero8(w0)
        _simd.zero8(w1)
        wj = 1.0
        for i in range(start, stop - 1, 2):
            u, v = _u(i), _u(i + 1)
            la, lb = labels[u], labels[v]
            if weights is not None:
                wi, wj = weights[u], weights[v]
            for f in range(12):
                if f < d0:
                    _simd.addlane8(_simd.slot(A, f), la, wi * (X0[u, f] - o0[f]))
                    _simd.addlane8(_simd.slot(A, 12 + f), lb, wj * (X0[v, f] - o0[f]))
            _simd.addlane8(w0, la, wi)
            _simd.addlane8(w1, lb, wj)
        if (stop - start) % 2:
            u = _u(stop - 1)
            la = labels[u]
            if weights is not None:
                wi = weights[u]
            for f in range(12):
                if f < d0:
                    _simd.addlane8(_simd.slot(A, f), la, wi * (X0[u, f] - o0[f]))
            _simd.addlane8(w0, la, wi)
        buf = np.zeros(26 * 8)
        for q in range(24):
            _simd.addto8(buf, q * 8, _simd.slot(A, q))
        _simd.addto8(buf, 24 * 8, w0)
        _simd.addto8(buf, 25 * 8, w1)
        for j in range(k):
            ws[j] += buf[24 * 8 + j] + buf[25 * 8 + j]
            for f in range(d0):
                sc[j, f] += buf[f * 8 + j] + buf[(12 + f) * 8 + j]
    else:
        for i in range(start, stop):
            u = _u(i)
            lab = _u(labels[u])
            if weights is not None:
                wi = weights[u]
            ws[lab] += wi
            s = sc[lab]
            Xi = X0[u]
            for f in range(d0):
                s[f] += wi * (Xi[f] - o0[f])
            if ip is not None:
                for q in range(ip[u], ip[_u(i + 1)]):
                    s[_u(ind[_u(q)])] += wi * dat[_u(q)]
    # One index vector at a time: one stream of reads per pass.
    for g in range(n_groups):
        ig = idxs[g]
        base = offsets[g]
        pad = pads[g]
        for i in range(start, stop):
            u = _u(i)
            r = ig[u]
            r = r if r >= 0 else pad
            if weights is not None:
                wi = weights[u]
            cc[_u((base + r) * k + labels[u])] += wi


# About 0.3 ms per chunk at k <= 8 (fewer rows for more centers); the M-step's
# per-chunk sums ask for one chunk per thread.
_launcher.register("assign", _assign_chunk, min_rows=32768)
_launcher.register("partial_at", _partial_at_chunk, min_rows=65536)
_launcher.register("accumulate", _accumulate_chunk, min_rows=131072)


def fused_assign(
    X0: Any,
    o0: np.ndarray,
    C3: np.ndarray,
    idxs: list[np.ndarray],
    P3: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    bias2: np.ndarray,
    labels: np.ndarray,
    best: np.ndarray,
) -> None:
    """Fused k-means E-step: labels and partial distances of all target rows.

    The partial distance of row ``i`` to center ``j = 8 b + l`` is
    ``bias2[b, l] - 2 (sum_f (X0[i, f] - o0[f]) C3[b, f, l]
    + sum_g P3[offsets[g] + r_g, b, l])`` with ``r_g = idxs[g][i]`` (``pads[g]``
    where it is -1): the dense identity source ``X0`` is multiplied in the loop,
    every row group adds one row of its precomputed table. Centers come in blocks
    of 8; padding centers take ``bias2 = inf`` (never chosen). A CSR identity
    source is read entry by entry (``indptr``, ``indices``, ``data``) in the same
    loop.

    Parameters
    ----------
    X0 : ndarray or CSR matrix of shape (n, d0)
        Identity source (``d0`` may be 0): C-contiguous when dense.
    o0 : ndarray of shape (d0,)
        Offsets subtracted from ``X0`` (the centering of its columns); all zero
        for a CSR ``X0`` (centering would densify it).
    C3 : ndarray of shape (n_blocks, d0, 8)
        Centers on the columns of ``X0``, in blocks of 8.
    idxs : list of ndarray of int64 of shape (n,)
        One index vector per row group.
    P3 : ndarray of shape (total, n_blocks, 8)
        Stacked per-group tables (same dtype as ``X0``).
    offsets, pads : ndarray of int64 of shape (n_groups,)
        First row of each group in ``P3`` and the row an unmatched target row takes.
    bias2 : ndarray of shape (n_blocks, 8)
        Per-center constant (``||c_j||^2`` plus offset terms; inf for padding).
    labels : ndarray of int32 of shape (n,)
        Output: index of the closest center.
    best : ndarray of shape (n,)
        Output: partial distance to that center.
    """
    n = labels.shape[0]
    tup, n_groups = _launcher.index_tuple(idxs, n)
    X0d, ip, ind, dat = _launcher.base_arrays(X0, o0)
    # The kernel reads the blocked arrays through flat offsets.
    C3, P3, bias2 = (np.ascontiguousarray(a) for a in (C3, P3, bias2))
    head = (X0d, o0, ip, ind, dat, C3, tup, n_groups, P3, offsets, pads, bias2)
    head += (labels, best)
    threads = _launcher.n_threads()
    _simd.define()
    min_rows = max(1, _launcher.MIN_CHUNK_ROWS["assign"] // C3.shape[0])
    _launcher.launch("assign", head, n, _launcher.chunks(n, min_rows, threads), threads)


def fused_partial_at(
    X0: Any,
    o0: np.ndarray,
    C: np.ndarray,
    idxs: list[np.ndarray],
    P: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    bias: np.ndarray,
    labels: np.ndarray,
    best: np.ndarray,
) -> None:
    """Partial distance of every row to its given center ``labels[i]`` (into ``best``).

    As :func:`fused_assign` with ``C`` of shape ``(d0, k)``, ``P`` of shape
    ``(total, k)`` and ``bias`` of shape ``(k,)``.
    """
    n = labels.shape[0]
    tup, n_groups = _launcher.index_tuple(idxs, n)
    X0d, ip, ind, dat = _launcher.base_arrays(X0, o0)
    head = (X0d, o0, ip, ind, dat, C, tup, n_groups, P, offsets, pads, bias)
    head += (labels, best)
    threads = _launcher.n_threads()
    min_rows = _launcher.MIN_CHUNK_ROWS["partial_at"]
    _launcher.launch(
        "partial_at", head, n, _launcher.chunks(n, min_rows, threads), threads
    )


def fused_accumulate(
    X0: Any,
    o0: np.ndarray,
    idxs: list[np.ndarray],
    offsets: np.ndarray,
    pads: np.ndarray,
    weights: np.ndarray | None,
    labels: np.ndarray,
    n_clusters: int,
    total: int,
    buffers: dict[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fused k-means M-step sums over all target rows.

    ``weights`` None stands for unit weights (the passes then read no weights).
    Returns ``wsum`` (the weight of each cluster, shape ``(k,)``), ``sums0``
    (``sum_i w_i (X0[i] - o0)`` per cluster, ``(k, d0)``; ``X0`` dense or CSR) and ``cnt`` (per
    row group, the weighted number of target rows of each (source row, cluster)
    pair, stacked like the tables, ``(total, k)``), all float64. ``buffers``
    holds the per-thread partial sums between calls.
    """
    n, d0 = X0.shape
    k = int(n_clusters)
    # Per-chunk sums of total * k entries, zeroed and summed on every call: one
    # chunk per thread, each of at least twice as many rows as entries (below
    # that, zeroing and summing the partial tables costs more than a thread saves).
    threads = _launcher.n_threads()
    min_rows = max(_launcher.MIN_CHUNK_ROWS["accumulate"], 2 * total * k)
    n_chunks = _launcher.chunks(n, min_rows, threads, per_thread=1)
    b = {} if buffers is None else buffers
    shape = (n_chunks, total * k)
    if b.get("cnt") is None or b["cnt"].shape != shape or b["sums0"].shape[2] != d0:
        b["cnt"] = np.zeros(shape)
        b["wsum"] = np.zeros((n_chunks, k))
        b["sums0"] = np.zeros((n_chunks, k, d0))
    else:
        b["cnt"].fill(0.0)
        b["wsum"].fill(0.0)
        b["sums0"].fill(0.0)
    tup, n_groups = _launcher.index_tuple(idxs, n)
    X0d, ip, ind, dat = _launcher.base_arrays(X0, o0)
    head = (X0d, o0, ip, ind, dat, tup, n_groups, offsets, pads, weights, labels)
    tail = (b["wsum"], b["sums0"], b["cnt"])
    _simd.define()
    _launcher.launch("accumulate", head + tail, n, n_chunks, threads)
    if n_chunks == 1:
        return b["wsum"][0], b["sums0"][0], b["cnt"][0].reshape(total, k)
    return (
        b["wsum"].sum(axis=0),
        b["sums0"].sum(axis=0),
        b["cnt"].sum(axis=0).reshape(total, k),
    )
