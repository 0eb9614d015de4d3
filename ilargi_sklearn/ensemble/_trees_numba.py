"""Compiled (numba) kernels of the trees: histograms per source, split scans,
partitions, binning and binned prediction through the index vectors.

The NumPy reference of each lives beside the code that calls it
(:mod:`._histogram`, :mod:`._splitting`, :mod:`._predictor`, :mod:`._binning`,
:mod:`._grower`); these register with :mod:`.._backend._launcher`, which jits,
threads and falls back, and are used only where
:func:`~.._backend._launcher.numba_available`.

A group is a binned source (``bins``, ``uint8``, one row per source row plus a row
of missing bins) with its index vector (empty for the identity) and the histogram
rows of its columns (``fmap``). A histogram is float64 of shape
``(n_features, n_bins, 3)``: summed gradients, hessians and counts per bin. The
rows of a tree's nodes are positions in arrays kept in partition order (the
"carried" arrays, :class:`._histogram.HistogramBuilder`): the target row, the
source row of each indexed group, the gradients and hessians.
"""

from __future__ import annotations

import numpy as np

from ilargi_sklearn._backend import _launcher

_u = _launcher.U

__all__ = [
    "GROUPED",
    "GROUPED_DENSE",
    "ROWWISE",
]

#: Histogram modes of a group, per node (see :func:`._histogram.choose_modes`):
#: row-wise, grouped with a list of the distinct source rows, grouped sweeping
#: all source rows.
ROWWISE, GROUPED, GROUPED_DENSE = 0, 1, 2


def _hist_tasks(
    carried,
    key_of,
    gradients,
    hessians,
    bins,
    fmaps,
    modes,
    accs,
    touched,
    tasks,
    out,
    first,
    last,
    t0,
    t1,
):
    # Tasks t0..t1 of the node's histograms. Task t builds the tree features
    # fmaps[g][k0:k1] of group g = tasks[t, 0] (k0, k1 = tasks[t, 1:3]) into
    # out (F, n_bins, 3), over the node's rows: positions [first, last) of the
    # carried arrays. carried[key_of[g]] holds each row's row of bins[g], and
    # ``gradients`` / ``hessians`` (empty when constant) its gradient and
    # hessian, all in the order of the partition, so that every pass reads them
    # sequentially. A feature is built by one task, in row order: the sums do
    # not depend on how the tasks are spread over threads. accs[g] (m_g, 3) is
    # zero on entry and on exit, touched[g] (m_g + 1,); a grouped task is the
    # only one of its group.
    H = out
    with_h = hessians.shape[0] > 0
    hi = 0.0
    for t in range(t0, t1):
        grp = tasks[t, 0]
        # Unsigned: indices known not negative (no wraparound test).
        k_lo = _u(tasks[t, 1])
        k_hi = _u(tasks[t, 2])
        B = bins[grp]
        keys = carried[key_of[grp]]
        fm = fmaps[grp]
        if (
            modes[grp] == 0
            or accs[grp].shape[0] < B.shape[0]
            or touched[grp].shape[0] <= B.shape[0]
        ):
            # Row-wise: each node row reads its source row's bins (also where
            # the group has no accumulators: the identity). Two features a
            # pass over the node's rows: all of a group's features in one pass
            # spread the adds over more histograms than the first-level cache
            # holds, one a pass reads the rows once per feature (two measured
            # about a quarter faster than either, benchmarks/README.md). An odd
            # last feature pairs with itself, its second adds weighted by 0.0
            # (x + 0.0 is x).
            for k in range(k_lo, k_hi, _u(2)):
                k2 = min(k + _u(1), k_hi - _u(1))
                w = 1.0 if k + _u(1) < k_hi else 0.0
                Hf = H[_u(fm[k])]
                Hg = H[_u(fm[k2])]
                for p in range(first, last):
                    j = _u(keys[_u(p)])
                    b = _u(B[j, k])
                    d = _u(B[j, k2])
                    gi = gradients[_u(p)]
                    Hf[b, 0] += gi
                    Hg[d, 0] += w * gi
                    if with_h:
                        hi = hessians[_u(p)]
                        Hf[b, 1] += hi
                        Hg[d, 1] += w * hi
                    Hf[b, 2] += 1.0
                    Hg[d, 2] += w
            continue
        # Grouped: sum per source row first, then read each distinct source
        # row's bins once. Mode 1 lists the distinct rows (few of them); mode 2
        # sweeps all source rows (most are present). Neither branches on the
        # data: a row is listed by advancing the list's end when it was new, and
        # the sweep adds the zero sums of absent rows (x + 0.0 is x).
        # A grouped task covers its whole group.
        nf = fm.shape[0]
        A = accs[grp]
        T = touched[grp]
        listed = modes[grp] == 1
        nt = _u(0)
        for p in range(first, last):
            j = _u(keys[_u(p)])
            if listed:
                T[nt] = j
                nt += _u(A[j, 2] == 0.0)
            A[j, 0] += gradients[_u(p)]
            if with_h:
                A[j, 1] += hessians[_u(p)]
            A[j, 2] += 1.0
        m = nt if listed else _u(A.shape[0])
        for q in range(m):
            j = _u(T[q]) if listed else _u(q)
            a0 = A[j, 0]
            a1 = A[j, 1]
            a2 = A[j, 2]
            A[j, 0] = 0.0
            A[j, 1] = 0.0
            A[j, 2] = 0.0
            Br = B[j]
            if with_h:
                for k in range(nf):
                    f = _u(fm[k])
                    b = _u(Br[k])
                    H[f, b, 0] += a0
                    H[f, b, 1] += a1
                    H[f, b, 2] += a2
            else:
                for k in range(nf):
                    f = _u(fm[k])
                    b = _u(Br[k])
                    H[f, b, 0] += a0
                    H[f, b, 2] += a2


def _scan_numeric(
    hist,
    feats,
    n_samples,
    sum_g,
    sum_h,
    value,
    lower,
    upper,
    n_bins_non_missing,
    has_missing,
    monotonic,
    l2,
    min_hessian,
    min_samples_leaf,
    min_gain,
    const_h,
    res,
):
    # res (len(feats), 6): gain, bin, missing_go_to_left, sum_g_left,
    # sum_h_left, n_left. scikit-learn's two scans, in its order.
    loss_cur = sum_g * value
    for q in range(feats.shape[0]):
        f = feats[q]
        res[q, 0] = -1.0
        cst = monotonic[f]
        nbnm = n_bins_non_missing[f]
        end = nbnm - 1 + has_missing[f]
        sgl = 0.0
        shl = 0.0
        nl = 0.0
        best = -1.0
        found = False
        for b in range(end):
            nl += hist[f, b, 2]
            nr = n_samples - nl
            if const_h:
                shl += hist[f, b, 2]
            else:
                shl += hist[f, b, 1]
            shr = sum_h - shl
            sgl += hist[f, b, 0]
            sgr = sum_g - sgl
            if nl < min_samples_leaf:
                continue
            if nr < min_samples_leaf:
                break
            if shl < min_hessian:
                continue
            if shr < min_hessian:
                break
            vl = min(max(-sgl / (shl + l2 + 1e-15), lower), upper)
            vr = min(max(-sgr / (shr + l2 + 1e-15), lower), upper)
            if (cst == 1 and vl > vr) or (cst == -1 and vl < vr):
                gain = -1.0
            else:
                gain = loss_cur
                gain -= sgl * vl
                gain -= sgr * vr
            if gain > best and gain > min_gain:
                found = True
                best = gain
                res[q, 0] = gain
                res[q, 1] = b
                res[q, 2] = 0.0
                res[q, 3] = sgl
                res[q, 4] = shl
                res[q, 5] = nl
        if has_missing[f]:
            sgr = 0.0
            shr = 0.0
            nr = 0.0
            for b in range(nbnm - 2, -1, -1):
                nr += hist[f, b + 1, 2]
                nl = n_samples - nr
                if const_h:
                    shr += hist[f, b + 1, 2]
                else:
                    shr += hist[f, b + 1, 1]
                shl = sum_h - shr
                sgr += hist[f, b + 1, 0]
                sgl = sum_g - sgr
                if nr < min_samples_leaf:
                    continue
                if nl < min_samples_leaf:
                    break
                if shr < min_hessian:
                    continue
                if shl < min_hessian:
                    break
                vl = min(max(-sgl / (shl + l2 + 1e-15), lower), upper)
                vr = min(max(-sgr / (shr + l2 + 1e-15), lower), upper)
                if (cst == 1 and vl > vr) or (cst == -1 and vl < vr):
                    gain = -1.0
                else:
                    gain = loss_cur
                    gain -= sgl * vl
                    gain -= sgr * vr
                if gain > best and gain > min_gain:
                    found = True
                    best = gain
                    res[q, 0] = gain
                    res[q, 1] = b
                    res[q, 2] = 1.0
                    res[q, 3] = sgl
                    res[q, 4] = shl
                    res[q, 5] = nl
        if not found:
            res[q, 0] = -1.0


def _scan_categorical(
    hist,
    feats,
    n_bins_non_missing,
    has_missing,
    missing_bin,
    n_samples,
    sum_g,
    sum_h,
    value,
    lower,
    upper,
    l2,
    min_hessian,
    min_samples_leaf,
    min_gain,
    const_h,
    min_cat_support,
    res,
    bitsets,
):
    # res (len(feats), 4): gain (-1: none), sum_g_left, sum_h_left, n_left;
    # bitsets (len(feats), 8): the bins that go left. scikit-learn's scan, in
    # its order (:func:`._splitting.scan_categorical` is the reference): the
    # categories of enough support sorted by sum_g / (sum_h + support), then
    # both ends scanned up to the middle.
    support = n_samples / sum_h
    hh = 2 if const_h else 1
    loss_cur = sum_g * value
    used = np.empty(n_bins_non_missing.max() + 1, dtype=np.int64)
    vals = np.empty(used.shape[0])
    for q in range(feats.shape[0]):
        f = feats[q]
        res[q, 0] = -1.0
        res[q, 1] = 0.0
        res[q, 2] = 0.0
        res[q, 3] = 0.0
        bitsets[q, :] = 0
        n_used = 0
        nb = n_bins_non_missing[f] + (1 if has_missing[f] else 0)
        for k in range(nb):
            b = k if k < n_bins_non_missing[f] else missing_bin
            shb = hist[f, b, hh]
            if shb * support >= min_cat_support:
                used[n_used] = b
                vals[n_used] = hist[f, b, 0] / (shb + min_cat_support)
                n_used += 1
        if n_used <= 1:
            continue
        order = np.argsort(vals[:n_used], kind="mergesort")
        best = -1.0
        best_thr = -1
        best_dir = 0
        for direction in (1, -1):
            middle = (n_used + 1) // 2 if direction == 1 else (n_used + 1) // 2 - 1
            sgl = 0.0
            shl = 0.0
            nl = 0.0
            for i in range(middle):
                s = i if direction == 1 else n_used - 1 - i
                b = used[order[s]]
                nl += hist[f, b, 2]
                nr = n_samples - nl
                shl += hist[f, b, hh]
                shr = sum_h - shl
                sgl += hist[f, b, 0]
                sgr = sum_g - sgl
                if nl < min_samples_leaf or shl < min_hessian:
                    continue
                if nr < min_samples_leaf or shr < min_hessian:
                    break
                vl = min(max(-sgl / (shl + l2 + 1e-15), lower), upper)
                vr = min(max(-sgr / (shr + l2 + 1e-15), lower), upper)
                gain = loss_cur
                gain -= sgl * vl
                gain -= sgr * vr
                if gain > best and gain > min_gain:
                    best = gain
                    best_thr = s
                    best_dir = direction
                    res[q, 1] = sgl
                    res[q, 2] = shl
                    res[q, 3] = nl
        if best_dir == 0:
            continue
        res[q, 0] = best
        lo, hi = (0, best_thr + 1) if best_dir == 1 else (best_thr, n_used)
        for s in range(lo, hi):
            b = used[order[s]]
            bitsets[q, b >> 5] |= np.uint32(1) << np.uint32(b & 31)


def _partition_sides(
    keys,
    bins_g,
    col,
    threshold,
    missing_left,
    missing_bin,
    is_cat,
    bitset,
    mask,
    counts,
    offset,
    c,
    start,
    stop,
):
    # The side of each row at positions [offset + start, offset + stop): 1 to
    # the left (bins up to threshold, the missing bin when missing_left, or in
    # bitset at a categorical split), else 0, to mask; the number of left rows
    # to counts[c]. keys holds each row's row of bins_g.
    nl = 0
    for p in range(offset + start, offset + stop):
        b = bins_g[_u(keys[_u(p)]), col]
        if is_cat:
            left = (bitset[b >> 5] >> (b & 31)) & 1
        else:
            left = (missing_left and b == missing_bin) or b <= threshold
        mask[_u(p)] = left
        nl += left
    counts[c] = nl


def _partition_move(carried, a0, a1, start, stop, mask, buf):
    # Stable partition of positions [start, stop) of carried arrays a0..a1 (in
    # place) by the sides in mask: left rows first, in order, then the right
    # ones (scikit-learn's order). Every array moves without a branch on the
    # side (the sides of consecutive rows are as good as random: a branch would
    # be mispredicted half the time); the right rows wait in buf.
    for a_idx in range(a0, a1):
        a = carried[a_idx]
        lo = _u(start)
        nr = _u(0)
        for p in range(start, stop):
            v = a[_u(p)]
            m = _u(mask[_u(p)])
            a[lo] = v
            buf[nr] = v
            lo += m
            nr += _u(1) - m
        for q in range(nr):
            a[lo + q] = buf[q]


def _unpartition(arrays, a0, a1, partition, buf):
    # Arrays a0..a1 back in target-row order: the value at position p belongs
    # to row partition[p].
    n = partition.shape[0]
    for k in range(a0, a1):
        a = arrays[k]
        for p in range(n):
            buf[_u(partition[_u(p)])] = a[_u(p)]
        for i in range(n):
            a[_u(i)] = buf[_u(i)]


def _add_leaf_values(partition, starts, stops, values, out):
    # out[row] += value of its leaf, for the rows at positions [starts[k],
    # stops[k]) of the partition.
    for k in range(starts.shape[0]):
        v = values[k]
        for p in range(starts[k], stops[k]):
            out[_u(partition[_u(p)])] += v


def _bin_chunk(values, thresholds, missing_bin, out, c, start, stop):
    # out[i]: the bin of values[i], the number of thresholds below it (NumPy's
    # searchsorted, side="left"); NaN to the missing bin. ``thresholds`` is
    # padded to 256 entries with +inf: a binary search of 8 fixed steps that
    # select instead of branching, so that the searches of consecutive values
    # overlap (a loop whose steps branch on the data runs several times
    # slower).
    for i in range(start, stop):
        x = values[i]
        base = 0
        for half in (128, 64, 32, 16, 8, 4, 2, 1):
            base += half * (thresholds[base + half - 1] < x)
        out[i] = missing_bin if x != x else base


def _predict_chunk(
    feature,
    left,
    right,
    is_leaf,
    value,
    threshold,
    missing_left,
    is_cat,
    bitset_idx,
    bitsets,
    feature_group,
    feature_col,
    bins,
    idxs,
    missing_bin,
    out,
    c,
    start,
    stop,
):
    for i in range(start, stop):
        node = 0
        while not is_leaf[node]:
            f = feature[node]
            g = feature_group[f]
            ix = idxs[g]
            j = i if ix.shape[0] == 0 else ix[i]
            b = bins[g][j, feature_col[f]]
            if b == missing_bin:
                go_left = missing_left[node]
            elif is_cat[node]:
                w = bitsets[bitset_idx[node], b >> 5]
                go_left = (w >> (b & 31)) & 1
            else:
                go_left = b <= threshold[node]
            node = left[node] if go_left else right[node]
        out[i] += value[node]


_launcher.register("tree_hist", _hist_tasks)
_launcher.register("tree_scan", _scan_numeric)
# Without FMAs: its gains round as the NumPy reference's and scikit-learn's do,
# so that a categorical split ties with a numeric one as it does there.
_launcher.register("tree_scan_categorical", _scan_categorical, contract=False)
_launcher.register("tree_sides", _partition_sides, min_rows=16384)
_launcher.register("tree_move", _partition_move)
_launcher.register("tree_predict", _predict_chunk, min_rows=16384)
_launcher.register("tree_leaf_add", _add_leaf_values)
_launcher.register("tree_unpartition", _unpartition)
_launcher.register("tree_bin", _bin_chunk, min_rows=65536)
