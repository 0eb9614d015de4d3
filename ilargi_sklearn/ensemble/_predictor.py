"""A fitted tree, and its prediction through the index vectors.

A node reads its split feature's bin of a target row through the feature's group
(source) and index vector: no joined row is built. Binned prediction equals
scikit-learn's prediction on raw values (``x <= threshold[b]`` exactly when
``bin(x) <= b``; categories unknown at fit and missing values follow the missing
direction).
"""

from __future__ import annotations

import numpy as np

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn.ensemble._binning import BinnedData

__all__ = ["PREDICTOR_RECORD_DTYPE", "TreePredictor"]

#: The node record of scikit-learn's ``TreePredictor`` (same fields and meaning).
PREDICTOR_RECORD_DTYPE = np.dtype(
    [
        ("value", np.float64),
        ("count", np.uint32),
        ("feature_idx", np.intp),
        ("num_threshold", np.float64),
        ("missing_go_to_left", np.uint8),
        ("left", np.uint32),
        ("right", np.uint32),
        ("gain", np.float64),
        ("depth", np.uint32),
        ("is_leaf", np.uint8),
        ("bin_threshold", np.uint8),
        ("is_categorical", np.uint8),
        ("bitset_idx", np.uint32),
    ]
)


class TreePredictor:
    """One tree: node records and the bitsets of its categorical splits.

    Attributes
    ----------
    nodes : ndarray of PREDICTOR_RECORD_DTYPE
        ``feature_idx`` is a tree feature (the estimator's ``tree_feature_names_``).
    binned_left_cat_bitsets : ndarray of uint32 of shape (n_categorical_splits, 8)
        Bins that go left at each categorical split.
    """

    def __init__(self, nodes: np.ndarray, binned_left_cat_bitsets: np.ndarray):
        self.nodes = nodes
        self.binned_left_cat_bitsets = binned_left_cat_bitsets

    def get_n_leaf_nodes(self) -> int:
        return int(self.nodes["is_leaf"].sum())

    def get_max_depth(self) -> int:
        return int(self.nodes["depth"].max())

    def predict_binned(
        self, data: BinnedData, missing_values_bin_idx: int, out: np.ndarray
    ) -> None:
        """Add the tree's value of each target row of ``data`` to ``out``."""
        nd = self.nodes
        n = data.n_rows
        if numba_available():
            feature = nd["feature_idx"].astype(np.int64)
            head = (
                feature,
                nd["left"].astype(np.int64),
                nd["right"].astype(np.int64),
                nd["is_leaf"].astype(np.bool_),
                nd["value"].astype(np.float64),
                nd["bin_threshold"].astype(np.int64),
                nd["missing_go_to_left"].astype(np.bool_),
                nd["is_categorical"].astype(np.bool_),
                nd["bitset_idx"].astype(np.int64),
                np.ascontiguousarray(
                    self.binned_left_cat_bitsets
                    if self.binned_left_cat_bitsets.shape[0]
                    else np.zeros((1, 8), dtype=np.uint32)
                ),
                data.feature_group,
                data.feature_col,
                _launcher.uniform_tuple(data.bins),
                _launcher.uniform_tuple(data.idx),
                int(missing_values_bin_idx),
                out,
            )
            threads = _launcher.n_threads()
            n_chunks = _launcher.chunks(
                n, _launcher.MIN_CHUNK_ROWS["tree_predict"], threads
            )
            try:
                _launcher.launch("tree_predict", head, n, n_chunks, threads)
                return
            except CompiledUnavailable:
                pass
        out += self._predict_numpy(data, missing_values_bin_idx)

    def _predict_numpy(self, data: BinnedData, missing_bin: int) -> np.ndarray:
        """Level by level: the rows at each internal node move to a child."""
        nd = self.nodes
        node = np.zeros(data.n_rows, dtype=np.int64)
        active = np.flatnonzero(~nd["is_leaf"][node].astype(bool))
        while active.shape[0]:
            cur = node[active]
            new = np.empty_like(cur)
            for k in np.unique(cur):
                sel = cur == k
                rows = active[sel]
                rec = nd[k]
                b = data.column(int(rec["feature_idx"]), rows).astype(np.int64)
                if rec["is_categorical"]:
                    bs = self.binned_left_cat_bitsets[rec["bitset_idx"]]
                    left = ((bs[b >> 5] >> (b & 31)) & 1).astype(bool)
                else:
                    left = b <= rec["bin_threshold"]
                miss = b == missing_bin
                left[miss] = bool(rec["missing_go_to_left"])
                new[sel] = np.where(left, rec["left"], rec["right"])
            node[active] = new
            active = active[~nd["is_leaf"][new].astype(bool)]
        return nd["value"][node]
