"""Compiled (numba) steps of GNMF's multiplicative W update over a factorized matrix.

:func:`mu_update` tests, replaces, divides and multiplies a row block in one loop,
with NumPy's operations in NumPy's order (the same rounding, one pass instead of
four). For 8 to 16 components and a dense float64 base, :func:`mu_rows` does the
whole row update in registers instead: the numerator (the base's product, one table
row per group), the denominator ``W_i H H^T`` and the update, four rows per step
through the 8-lane intrinsics of :mod:`.._backend._simd`, then the block's ``W^T W``
in 24 register accumulators. They replace three small GEMMs per block (inner
dimensions 5 to 16, shapes BLAS runs far from its peak), the gathers and the
element-wise step, each a pass over a block in memory. :func:`segment_sum_rows` is
``I^T W`` in one serial pass (no n-length temporary, no per-thread copies).

The kernels register with :mod:`.._backend._launcher` (lazy numba, threads,
fallback); the estimator (:mod:`._gnmf`) uses them only where
:func:`~.._backend._launcher.numba_available`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ilargi_sklearn._backend import _launcher, _simd

_u = _launcher.U

__all__ = [
    "MU_ROWS_COLUMNS",
    "mu_rows",
    "mu_rows_gram",
    "mu_update",
    "segment_sum_rows",
]


def _segment_rows_chunk(idx, W, out, c, start, stop):
    # out (chunks, n_bins + 1, k) float64: row n_bins collects the unmatched rows.
    o = out[c]
    pad = o.shape[0] - 1
    k = W.shape[1]
    for i in range(start, stop):
        u = _u(i)
        r = idx[u]
        orow = o[_u(r if r >= 0 else pad)]
        wi = W[u]
        for j in range(k):
            orow[j] += wi[j]


def _mu_update_chunk(num, den, W, eps):
    # W *= num / den, eps for zero denominators: all C-contiguous, one shape,
    # read as flat arrays (rows of k < 16 elements vectorize poorly).
    nf = num.reshape(-1)
    df = den.reshape(-1)
    wf = W.reshape(-1)
    for q in range(wf.shape[0]):
        v = _u(q)
        d = df[v]
        if d == 0:
            d = eps
        wf[v] *= nf[v] / d


def _mu_rows_chunk(
    X0, HbT, idxs, n_groups, G, offsets, pads, const, P, HHt, W, eps, WW, start, stop
):
    # GNMF's W update of rows [start, stop), 8 <= k <= 16 columns (all float64,
    # C-contiguous), with the numerator assembled in registers: per row
    # num = X0[i] HbT + sum_g G[offsets[g] + r_g] (+ const), den = W[i] HHt, then
    # W[i] *= num / den. Each row's k values are two 8-lane blocks, columns 0..7
    # and k-8..k-1 (overlapping for k < 16), so no load or store leaves the row.
    # Four rows per step: one row's chains (10 dependent FMAs for k = 10) leave
    # the CPU idle, four independent ones keep it busy.
    k = W.shape[1]
    d0 = X0.shape[1]
    h = k - 8
    Hf = HbT.reshape(-1)
    Gf = G.reshape(-1)
    Mf = HHt.reshape(-1)
    Wf = W.reshape(-1)
    # a*: numerators, e*: denominators; *0 / *1 the two blocks; one letter per row.
    # Written out row by row on purpose: the same work as loops over the four
    # rows, with the accumulators indexed like the gram's below, is slower (the
    # rows' operations no longer interleave; benchmarks/README.md).
    aa0, aa1, ae0, ae1 = _simd.acc8(), _simd.acc8(), _simd.acc8(), _simd.acc8()
    ba0, ba1, be0, be1 = _simd.acc8(), _simd.acc8(), _simd.acc8(), _simd.acc8()
    ca0, ca1, ce0, ce1 = _simd.acc8(), _simd.acc8(), _simd.acc8(), _simd.acc8()
    da0, da1, de0, de1 = _simd.acc8(), _simd.acc8(), _simd.acc8(), _simd.acc8()
    for i in range(start, stop, 4):
        # Past the end, the last rows repeat the first (computed, not stored).
        i1 = i + 1 if i + 1 < stop else i
        i2 = i + 2 if i + 2 < stop else i
        i3 = i + 3 if i + 3 < stop else i
        u0, u1, u2, u3 = _u(i), _u(i1), _u(i2), _u(i3)
        _simd.zero8(aa0)
        _simd.zero8(aa1)
        _simd.zero8(ae0)
        _simd.zero8(ae1)
        _simd.zero8(ba0)
        _simd.zero8(ba1)
        _simd.zero8(be0)
        _simd.zero8(be1)
        _simd.zero8(ca0)
        _simd.zero8(ca1)
        _simd.zero8(ce0)
        _simd.zero8(ce1)
        _simd.zero8(da0)
        _simd.zero8(da1)
        _simd.zero8(de0)
        _simd.zero8(de1)
        for f in range(d0):
            o = f * k
            x0, x1, x2, x3 = X0[u0, f], X0[u1, f], X0[u2, f], X0[u3, f]
            _simd.fma8(aa0, x0, Hf, o)
            _simd.fma8(aa1, x0, Hf, o + h)
            _simd.fma8(ba0, x1, Hf, o)
            _simd.fma8(ba1, x1, Hf, o + h)
            _simd.fma8(ca0, x2, Hf, o)
            _simd.fma8(ca1, x2, Hf, o + h)
            _simd.fma8(da0, x3, Hf, o)
            _simd.fma8(da1, x3, Hf, o + h)
        for g in range(n_groups):
            # A select, not a branch: unmatched rows (-1) take the padding row.
            pad = pads[g]
            ix = idxs[g]
            r0, r1, r2, r3 = ix[u0], ix[u1], ix[u2], ix[u3]
            o0 = (offsets[g] + (r0 if r0 >= 0 else pad)) * k
            o1 = (offsets[g] + (r1 if r1 >= 0 else pad)) * k
            o2 = (offsets[g] + (r2 if r2 >= 0 else pad)) * k
            o3 = (offsets[g] + (r3 if r3 >= 0 else pad)) * k
            _simd.add8(aa0, Gf, o0)
            _simd.add8(aa1, Gf, o0 + h)
            _simd.add8(ba0, Gf, o1)
            _simd.add8(ba1, Gf, o1 + h)
            _simd.add8(ca0, Gf, o2)
            _simd.add8(ca1, Gf, o2 + h)
            _simd.add8(da0, Gf, o3)
            _simd.add8(da1, Gf, o3 + h)
        if P is not None:
            # Rows of P: the numerator parts gathered before the loop.
            o0, o1, o2, o3 = (
                (i - start) * k,
                (i1 - start) * k,
                (i2 - start) * k,
                (i3 - start) * k,
            )
            _simd.add8(aa0, P, o0)
            _simd.add8(aa1, P, o0 + h)
            _simd.add8(ba0, P, o1)
            _simd.add8(ba1, P, o1 + h)
            _simd.add8(ca0, P, o2)
            _simd.add8(ca1, P, o2 + h)
            _simd.add8(da0, P, o3)
            _simd.add8(da1, P, o3 + h)
        if const is not None:
            _simd.add8(aa0, const, 0)
            _simd.add8(aa1, const, h)
            _simd.add8(ba0, const, 0)
            _simd.add8(ba1, const, h)
            _simd.add8(ca0, const, 0)
            _simd.add8(ca1, const, h)
            _simd.add8(da0, const, 0)
            _simd.add8(da1, const, h)
        for q in range(k):
            o = q * k
            w0, w1, w2, w3 = W[u0, q], W[u1, q], W[u2, q], W[u3, q]
            _simd.fma8(ae0, w0, Mf, o)
            _simd.fma8(ae1, w0, Mf, o + h)
            _simd.fma8(be0, w1, Mf, o)
            _simd.fma8(be1, w1, Mf, o + h)
            _simd.fma8(ce0, w2, Mf, o)
            _simd.fma8(ce1, w2, Mf, o + h)
            _simd.fma8(de0, w3, Mf, o)
            _simd.fma8(de1, w3, Mf, o + h)
        # Every row's W is read above before any is written here.
        if i3 != i:
            _simd.mu2x8(da0, de0, da1, de1, Wf, i3 * k, i3 * k + h, eps)
        if i2 != i:
            _simd.mu2x8(ca0, ce0, ca1, ce1, Wf, i2 * k, i2 * k + h, eps)
        if i1 != i:
            _simd.mu2x8(ba0, be0, ba1, be1, Wf, i1 * k, i1 * k + h, eps)
        _simd.mu2x8(aa0, ae0, aa1, ae1, Wf, i * k, i * k + h, eps)
    # W^T W of the updated rows (in L1/L2 now) into WW (k, 16): rows 0-7 in both
    # blocks, rows 8 to k-1 in the second only (the rest is their transpose),
    # 24 accumulators in registers, while the rows are in cache (BLAS runs such
    # thin per-block products far from its peak). None: not wanted (transform).
    if WW is None:
        return
    A = _simd.accs24()
    for q in range(24):
        _simd.zero8(_simd.slot(A, q))
    for i in range(start, stop):
        u = _u(i)
        o = i * k
        for q in range(8):
            w = W[u, q]
            _simd.fma8(_simd.slot(A, q), w, Wf, o)
            _simd.fma8(_simd.slot(A, 8 + q), w, Wf, o + h)
        for q in range(8):
            if 8 + q < k:
                _simd.fma8(_simd.slot(A, 16 + q), W[u, 8 + q], Wf, o + h)
    for q in range(8):
        _simd.addto8(WW, q * 16, _simd.slot(A, q))
        _simd.addto8(WW, q * 16 + 8, _simd.slot(A, 8 + q))
        if 8 + q < k:
            _simd.addto8(WW, (8 + q) * 16 + 8, _simd.slot(A, 16 + q))


_launcher.register("segment_rows", _segment_rows_chunk)
_launcher.register("mu_update", _mu_update_chunk)
_launcher.register("mu_rows", _mu_rows_chunk)


def segment_sum_rows(idx: np.ndarray, W: np.ndarray, n_bins: int) -> np.ndarray:
    """``I^T W``: the rows of ``W`` summed per bin ``idx[i]`` (-1: dropped).

    One serial pass over the rows into the (bins x columns) float64 result: no
    n-length temporary (a CSC indicator takes 12-16 bytes per row) and, unlike
    per-thread partial sums, no copy of the result per thread (at tuple ratio 1
    the bins are as many as the rows).

    Parameters
    ----------
    idx : ndarray of int64 of shape (n,)
        Bin of each row, -1 for none.
    W : ndarray of shape (n, k)
        C-contiguous rows.
    n_bins : int

    Returns
    -------
    ndarray of float64 of shape (n_bins, k)
    """
    n, k = W.shape
    out = np.zeros((1, int(n_bins) + 1, k))
    args = (np.ascontiguousarray(idx, dtype=np.int64), np.ascontiguousarray(W), out)
    _launcher.call("segment_rows", *args, 0, 0, n)
    return out[0, :n_bins]


def mu_update(
    numerator: np.ndarray, denominator: np.ndarray, W: np.ndarray, eps: Any
) -> bool:
    """The multiplicative update ``W *= numerator / denominator`` (in place), with
    ``eps`` for zero denominators, in one compiled loop.

    NumPy's zero test, replacement, division and product in NumPy's order, so
    the same rounding, in one pass instead of four. Returns False, with
    ``W`` untouched, where the loop cannot run: arrays not C-contiguous or of
    different shapes or dtypes (the caller then runs NumPy's operations).

    Parameters
    ----------
    numerator, denominator : ndarray of shape (n, k)
    W : ndarray of shape (n, k)
        Updated in place.
    eps : scalar of ``W``'s dtype
    """
    arrays = (numerator, denominator, W)
    if any(
        not a.flags.c_contiguous or a.shape != W.shape or a.dtype != W.dtype
        for a in arrays
    ):
        return False
    _launcher.call("mu_update", *arrays, eps)
    return True


#: Row lengths of W that :func:`mu_rows` takes: two 8-lane blocks per row.
MU_ROWS_COLUMNS = (8, 16)


def mu_rows(
    X0: np.ndarray,
    HbT: np.ndarray,
    idxs: list[np.ndarray],
    G: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    const: np.ndarray | None,
    P: np.ndarray | None,
    HHt: np.ndarray,
    W: np.ndarray,
    eps: float,
    WW: np.ndarray,
    start: int,
    stop: int,
) -> bool:
    """GNMF's multiplicative W update of rows ``[start, stop)`` (in place), the
    numerator and denominator of each row computed in registers, and the
    updated rows' ``W^T W`` added to ``WW``.

    Per row ``i``: ``num = X0[i] @ HbT + sum_g G[offsets[g] + r_g] (+ P[i - start])
    (+ const)`` with ``r_g = idxs[g][i]`` (``pads[g]`` where it is -1),
    ``den = W[i] @ HHt`` (``eps`` where 0), ``W[i] *= num / den``. ``P`` holds
    numerator parts gathered beforehand (the caller's ``np.take`` from tables too
    large for cache, which it reads faster than this loop). This replaces the block's numerator assembly
    (a small GEMM and one ``np.take`` per group), the GEMM ``W_b H H^T`` and the
    element-wise update, which pass over ``n x k`` arrays in memory. Sums run in
    another order than BLAS's, so W agrees with the NumPy pass to rounding.

    Returns False, with ``W`` untouched, where the loop does not apply: ``W`` not
    of 8 to 16 columns (:data:`MU_ROWS_COLUMNS`), an array not float64 or not
    C-contiguous, or shapes that do not match.

    Parameters
    ----------
    X0 : ndarray of shape (n, d0)
        Dense identity source (``d0`` may be 0).
    HbT : ndarray of shape (d0, k)
    idxs : list of ndarray of int64 of shape (n,)
    G : ndarray of shape (total, k)
        The groups' tables, stacked: group ``g`` from row ``offsets[g]``.
    offsets, pads : ndarray of int64 of shape (n_groups,)
    const : ndarray of shape (k,) or None
        Added to every numerator row.
    P : ndarray of shape (stop - start, k) or None
        Added to the numerator rows ``start`` to ``stop``.
    HHt : ndarray of shape (k, k)
    W : ndarray of shape (n, k)
        Updated in place (rows ``start`` to ``stop``).
    eps : float
    WW : ndarray of float64 of shape (k, 16) or None
        ``W^T W`` of the updated rows is added to it in the loop's layout
        (:func:`mu_rows_gram` takes the k x k matrix out); None skips it.
    start, stop : int
    """
    n, k = W.shape
    d0 = X0.shape[1]
    lo, hi = MU_ROWS_COLUMNS
    arrays = [a for a in (X0, HbT, G, HHt, W, const, P, WW) if a is not None]
    if (
        not lo <= k <= hi
        or (WW is not None and WW.shape != (k, 16))
        or any(a.dtype != np.float64 or not a.flags.c_contiguous for a in arrays)
        or X0.shape[0] != n
        or HbT.shape != (d0, k)
        or G.shape[1] != k
        or HHt.shape != (k, k)
        or (const is not None and const.shape != (k,))
        or (P is not None and P.shape != (stop - start, k))
    ):
        return False
    # Without groups the loop reads no index: a one-element stand-in.
    tup, n_groups = _launcher.index_tuple(idxs, n if idxs else 1)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    pads = np.ascontiguousarray(pads, dtype=np.int64)
    _simd.define()
    args = (X0, HbT, tup, n_groups, G, offsets, pads, const, P, HHt, W, float(eps))
    _launcher.call("mu_rows", *args, WW, int(start), int(stop))
    return True


def mu_rows_gram(WW: np.ndarray, k: int) -> np.ndarray:
    """The k x k ``W^T W`` from :func:`mu_rows`' accumulator ``WW`` (k, 16).

    Its first 8 lanes are columns 0 to 7 and its last 8 columns ``k - 8`` to
    ``k - 1``; rows 0 to 7 hold both, rows 8 to ``k - 1`` the second block only,
    and the rest is the transpose of rows 0 to 7.
    """
    G = np.empty((k, k))
    top = WW[:8, 24 - k :]  # rows 0-7, columns 8 to k-1
    G[:8, :8] = WW[:8, :8]
    G[:8, 8:] = top
    G[8:, :8] = top.T
    G[8:, 8:] = WW[8:, 24 - k :]
    return G
