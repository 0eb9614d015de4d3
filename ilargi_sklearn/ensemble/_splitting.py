"""Split finding and split application, as scikit-learn's ``Splitter`` does them.

The gain of a split is XGBoost's loss reduction with the children's values bounded
for monotonic constraints, ``sum_g * value`` per node; numeric features are scanned
left to right (missing values go right) and, when the feature has missing values,
right to left (they go left); categorical features sort their categories by
``sum_g / (sum_h + 10)`` (categories of little support excluded) and scan both
ends to the middle. Ties go to the first bin and feature found, in scikit-learn's
scan order. :func:`scan_numeric` and :func:`scan_categorical` are the references
of the compiled scans.

Applying a split partitions the node's target rows stably (left rows first, each
side in order, as scikit-learn's threads leave them), reading the split feature's
bin through its group's index vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn.ensemble import _trees_numba  # noqa: F401 (registers the kernels)
from ilargi_sklearn.ensemble._binning import BinnedData

__all__ = [
    "SplitInfo",
    "Splitter",
    "compute_node_value",
    "scan_numeric",
]

#: Categories with less hessian support (hessian times n / sum_h) are not split
#: off on their own (scikit-learn's ``MIN_CAT_SUPPORT``, LightGBM's cat_smooth).
MIN_CAT_SUPPORT = 10.0


def compute_node_value(sum_gradient, sum_hessian, lower, upper, l2):
    """``-G / (H + l2)`` clipped to ``[lower, upper]`` (monotonic bounds)."""
    value = -sum_gradient / (sum_hessian + l2 + 1e-15)
    if value < lower:
        return lower
    if value > upper:
        return upper
    return value


@dataclass
class SplitInfo:
    """The best split of a node (scikit-learn's ``SplitInfo``)."""

    gain: float
    feature_idx: int
    bin_idx: int
    missing_go_to_left: bool
    sum_gradient_left: float
    sum_hessian_left: float
    sum_gradient_right: float
    sum_hessian_right: float
    n_samples_left: int
    n_samples_right: int
    value_left: float
    value_right: float
    is_categorical: bool
    left_cat_bitset: np.ndarray | None


def _values(G, H, lower, upper, l2):
    v = -G / (H + l2 + 1e-15)
    return np.clip(v, lower, upper)


def scan_numeric(
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
):
    """Best bin of each numeric feature in ``feats`` (NumPy reference).

    Returns float64 ``(len(feats), 6)``: gain (-1 if none), bin, missing values
    to the left (0/1), left sums of gradients and hessians, left rows. The
    cumulative sums run bin by bin as scikit-learn's loop does, so the sums are
    the same numbers; the ``break`` conditions of that loop are masks here (the
    counts and hessians only grow).
    """
    res = np.zeros((len(feats), 6))
    res[:, 0] = -1.0
    if len(feats) == 0:
        return res
    loss_cur = sum_g * value
    hh = 2 if const_h else 1
    for q, f in enumerate(feats):
        nbnm = int(n_bins_non_missing[f])
        miss = int(has_missing[f])
        cst = int(monotonic[f])
        # Left to right: bins [0, end), missing values to the right.
        end = nbnm - 1 + miss
        best = -1.0
        if end > 0:
            N = np.cumsum(hist[f, :end, 2])
            Hs = np.cumsum(hist[f, :end, hh])
            Gs = np.cumsum(hist[f, :end, 0])
            gain, ok = _gains(
                Gs,
                Hs,
                N,
                n_samples,
                sum_g,
                sum_h,
                loss_cur,
                lower,
                upper,
                l2,
                cst,
                min_hessian,
                min_samples_leaf,
                left_is_acc=True,
            )
            cand = ok & (gain > min_gain) & (gain > -1.0)
            if cand.any():
                b = int(np.argmax(np.where(cand, gain, -np.inf)))
                best = gain[b]
                res[q] = (best, b, 0.0, Gs[b], Hs[b], N[b])
        if miss and nbnm >= 2:
            # Right to left: bins nbnm-1 down to 1 accumulate on the right (the
            # missing bin never does: missing values go left).
            sl = slice(nbnm - 1, 0, -1)
            N = np.cumsum(hist[f, sl, 2])
            Hs = np.cumsum(hist[f, sl, hh])
            Gs = np.cumsum(hist[f, sl, 0])
            gain, ok = _gains(
                Gs,
                Hs,
                N,
                n_samples,
                sum_g,
                sum_h,
                loss_cur,
                lower,
                upper,
                l2,
                cst,
                min_hessian,
                min_samples_leaf,
                left_is_acc=False,
            )
            cand = ok & (gain > min_gain) & (gain > best)
            if cand.any():
                k = int(np.argmax(np.where(cand, gain, -np.inf)))
                b = nbnm - 2 - k
                res[q] = (
                    gain[k],
                    b,
                    1.0,
                    sum_g - Gs[k],
                    sum_h - Hs[k],
                    n_samples - N[k],
                )
    return res


def _gains(
    Gacc,
    Hacc,
    Nacc,
    n,
    sum_g,
    sum_h,
    loss_cur,
    lower,
    upper,
    l2,
    cst,
    min_hessian,
    min_samples_leaf,
    left_is_acc,
):
    if left_is_acc:
        Gl, Hl, Nl = Gacc, Hacc, Nacc
        Gr, Hr, Nr = sum_g - Gacc, sum_h - Hacc, n - Nacc
    else:
        Gr, Hr, Nr = Gacc, Hacc, Nacc
        Gl, Hl, Nl = sum_g - Gacc, sum_h - Hacc, n - Nacc
    ok = (
        (Nl >= min_samples_leaf)
        & (Nr >= min_samples_leaf)
        & (Hl >= min_hessian)
        & (Hr >= min_hessian)
    )
    vl = _values(Gl, Hl, lower, upper, l2)
    vr = _values(Gr, Hr, lower, upper, l2)
    gain = loss_cur - Gl * vl
    gain = gain - Gr * vr
    if cst == 1:
        gain = np.where(vl > vr, -1.0, gain)
    elif cst == -1:
        gain = np.where(vl < vr, -1.0, gain)
    return gain, ok


def scan_categorical(
    hist_f,
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
):
    """Best split of one categorical feature: ``(gain, bitset of left bins,
    left sums of gradients and hessians, left rows)``, gain -1 if none."""
    support = n_samples / sum_h
    hh = 2 if const_h else 1
    bins = list(range(int(n_bins_non_missing)))
    if has_missing:
        bins.append(int(missing_bin))
    used, vals = [], []
    for b in bins:
        shb = hist_f[b, hh]
        if shb * support >= MIN_CAT_SUPPORT:
            used.append(b)
            vals.append(hist_f[b, 0] / (shb + MIN_CAT_SUPPORT))
    none = (-1.0, None, 0.0, 0.0, 0)
    n_used = len(used)
    if n_used <= 1:
        return none
    order = np.argsort(np.asarray(vals), kind="stable")
    used = [used[i] for i in order]
    loss_cur = sum_g * value
    best, best_thr, best_dir, best_sums = -1.0, -1, 0, None
    for direction in (1, -1):
        middle = (n_used + 1) // 2 if direction == 1 else (n_used + 1) // 2 - 1
        sgl = shl = 0.0
        nl = 0.0
        for i in range(middle):
            s = i if direction == 1 else n_used - 1 - i
            b = used[s]
            nl += hist_f[b, 2]
            nr = n_samples - nl
            shl += hist_f[b, hh]
            shr = sum_h - shl
            sgl += hist_f[b, 0]
            sgr = sum_g - sgl
            if nl < min_samples_leaf or shl < min_hessian:
                continue
            if nr < min_samples_leaf or shr < min_hessian:
                break
            vl = compute_node_value(sgl, shl, lower, upper, l2)
            vr = compute_node_value(sgr, shr, lower, upper, l2)
            gain = loss_cur
            gain -= sgl * vl
            gain -= sgr * vr
            if gain > best and gain > min_gain:
                best, best_thr, best_dir = gain, s, direction
                best_sums = (sgl, shl, nl)
    if best_sums is None:
        return none
    bitset = np.zeros(8, dtype=np.uint32)
    chosen = used[: best_thr + 1] if best_dir == 1 else used[best_thr:]
    for b in chosen:
        bitset[b >> 5] |= np.uint32(1) << np.uint32(b & 31)
    return (best, bitset, best_sums[0], best_sums[1], int(best_sums[2]))


def in_bitset(bitset: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each bin of ``b`` is in ``bitset`` (8 uint32 words)."""
    b = np.asarray(b, dtype=np.uint32)
    return ((bitset[b >> 5] >> (b & 31)) & 1).astype(bool)


class Splitter:
    """Finds and applies the splits of one tree (scikit-learn's ``Splitter``)."""

    def __init__(
        self,
        data: BinnedData,
        n_bins_non_missing,
        missing_values_bin_idx,
        has_missing_values,
        is_categorical,
        monotonic_cst,
        l2_regularization,
        min_hessian_to_split=1e-3,
        min_samples_leaf=20,
        min_gain_to_split=0.0,
        hessians_are_constant=False,
        feature_fraction_per_split=1.0,
        rng=None,
        rows=None,
    ):
        self.data = data
        self.n_bins_non_missing = np.asarray(n_bins_non_missing, dtype=np.int64)
        self.missing_values_bin_idx = int(missing_values_bin_idx)
        self.has_missing_values = np.asarray(has_missing_values, dtype=np.int64)
        self.is_categorical = np.asarray(is_categorical, dtype=bool)
        self.monotonic_cst = np.asarray(monotonic_cst, dtype=np.int64)
        self.l2_regularization = float(l2_regularization)
        self.min_hessian_to_split = float(min_hessian_to_split)
        self.min_samples_leaf = int(min_samples_leaf)
        self.min_gain_to_split = float(min_gain_to_split)
        self.hessians_are_constant = bool(hessians_are_constant)
        self.feature_fraction_per_split = float(feature_fraction_per_split)
        self.rng = rng
        self.n_features = self.is_categorical.shape[0]
        self._all_features = np.arange(self.n_features, dtype=np.int64)
        self._numeric = np.flatnonzero(~self.is_categorical)
        self._categorical = np.flatnonzero(self.is_categorical)
        # Read once per tree (the environment switch is read at every call of
        # numba_available: thousands of nodes).
        self.compiled = numba_available()
        # The rows of the nodes (positions in the partition; a
        # HistogramBuilder, shared by the trees of a fit).
        self.rows = rows

    @property
    def partition(self) -> np.ndarray:
        """The target row at each position: a node's rows are a range of it."""
        return self.rows.partition

    def find_node_split(
        self,
        n_samples,
        histograms,
        sum_gradients,
        sum_hessians,
        value,
        lower_bound=-np.inf,
        upper_bound=np.inf,
        allowed_features=None,
    ) -> SplitInfo:
        F = self.n_features
        # The features this node may split on, in scikit-learn's order (all, or
        # those of the interaction constraints that still apply).
        candidates = (
            self._all_features
            if allowed_features is None
            else np.asarray(allowed_features, dtype=np.int64)
        )
        if allowed_features is None and self.feature_fraction_per_split >= 1.0:
            # Every feature (most nodes): no masks to build.
            numeric, categorical = self._numeric, self._categorical
        else:
            n_allowed = candidates.shape[0]
            sampled = np.ones(n_allowed, dtype=bool)
            if self.feature_fraction_per_split < 1.0:
                # The same draws as scikit-learn, in the same order (one
                # shuffle per node evaluated).
                n_sub = max(1, int(ceil(self.feature_fraction_per_split * n_allowed)))
                mask = np.full(n_allowed, False)
                mask[:n_sub] = True
                self.rng.shuffle(mask)
                sampled = mask
            allowed = np.zeros(F, dtype=bool)
            allowed[candidates[sampled]] = True
            numeric = np.flatnonzero(allowed & ~self.is_categorical)
            categorical = np.flatnonzero(allowed & self.is_categorical)
        args = (
            float(n_samples),
            float(sum_gradients),
            float(sum_hessians),
            float(value),
            float(lower_bound),
            float(upper_bound),
        )
        gains = np.full(F, -1.0)
        res = self._scan(histograms, numeric, *args)
        gains[numeric] = res[:, 0]
        cat_res = self._scan_categorical(histograms, categorical, args)
        for f, out in cat_res.items():
            gains[f] = out[0]
        # scikit-learn's choice: the first feature of strictly greatest gain
        # (argmax returns the first of the greatest).
        best = int(candidates[np.argmax(gains[candidates])])
        l2 = self.l2_regularization
        if gains[best] <= 0:
            return SplitInfo(
                gains[best],
                best,
                0,
                False,
                0.0,
                0.0,
                0.0,
                0.0,
                0,
                0,
                0.0,
                0.0,
                bool(self.is_categorical[best]),
                None,
            )
        n = int(n_samples)
        if self.is_categorical[best]:
            gain, bitset, sgl, shl, nl = cat_res[best]
            missing_left = bool(
                self.has_missing_values[best]
                and in_bitset(bitset, np.asarray([self.missing_values_bin_idx]))[0]
            )
            bin_idx, is_cat = 0, True
        else:
            q = int(np.searchsorted(numeric, best))
            gain, bin_idx, ml, sgl, shl, nl = res[q]
            bin_idx, missing_left, is_cat, bitset = int(bin_idx), bool(ml), False, None
        sgr = args[1] - sgl
        shr = args[2] - shl
        return SplitInfo(
            float(gain),
            int(best),
            bin_idx,
            missing_left,
            float(sgl),
            float(shl),
            float(sgr),
            float(shr),
            int(nl),
            n - int(nl),
            compute_node_value(sgl, shl, lower_bound, upper_bound, l2),
            compute_node_value(sgr, shr, lower_bound, upper_bound, l2),
            is_cat,
            bitset,
        )

    def _scan(self, hist, feats, n, sg, sh, value, lower, upper):
        common = (
            self.n_bins_non_missing,
            self.has_missing_values,
            self.monotonic_cst,
            self.l2_regularization,
            self.min_hessian_to_split,
            float(self.min_samples_leaf),
            self.min_gain_to_split,
            self.hessians_are_constant,
        )
        feats = np.asarray(feats, dtype=np.int64)
        if self.compiled and feats.shape[0]:
            res = np.empty((feats.shape[0], 6))
            try:
                _launcher.call(
                    "tree_scan",
                    hist,
                    feats,
                    n,
                    sg,
                    sh,
                    value,
                    lower,
                    upper,
                    *common,
                    res,
                )
                return res
            except CompiledUnavailable:
                pass
        return scan_numeric(hist, feats, n, sg, sh, value, lower, upper, *common)

    def _scan_categorical(self, hist, feats, args) -> dict:
        """``{feature: (gain, bitset of left bins, left sums of gradients and
        hessians, left rows)}`` of the categorical features ``feats``."""
        feats = np.asarray(feats, dtype=np.int64)
        rest = (
            self.l2_regularization,
            self.min_hessian_to_split,
            float(self.min_samples_leaf),
            self.min_gain_to_split,
            self.hessians_are_constant,
        )
        if self.compiled and feats.shape[0]:
            res = np.empty((feats.shape[0], 4))
            bitsets = np.empty((feats.shape[0], 8), dtype=np.uint32)
            try:
                _launcher.call(
                    "tree_scan_categorical",
                    hist,
                    feats,
                    self.n_bins_non_missing,
                    self.has_missing_values,
                    self.missing_values_bin_idx,
                    *args,
                    *rest,
                    MIN_CAT_SUPPORT,
                    res,
                    bitsets,
                )
                return {
                    int(f): (
                        res[q, 0],
                        bitsets[q] if res[q, 0] > -1.0 else None,
                        res[q, 1],
                        res[q, 2],
                        int(res[q, 3]),
                    )
                    for q, f in enumerate(feats)
                }
            except CompiledUnavailable:
                pass
        return {
            int(f): scan_categorical(
                hist[f],
                self.n_bins_non_missing[f],
                bool(self.has_missing_values[f]),
                self.missing_values_bin_idx,
                *args,
                *rest,
            )
            for f in feats
        }

    def split_indices(self, split_info: SplitInfo, start: int, stop: int) -> int:
        """Partition the node at positions ``[start, stop)`` by the split (left
        rows first); returns the position of the right child in it."""
        return self.rows.split(
            start,
            stop,
            split_info.feature_idx,
            split_info.bin_idx,
            split_info.missing_go_to_left,
            self.missing_values_bin_idx,
            split_info.left_cat_bitset if split_info.is_categorical else None,
        )
