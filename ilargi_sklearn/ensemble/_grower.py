"""The best-first tree grower: scikit-learn's ``TreeGrower`` over binned sources.

Nodes are split in order of gain (a heap), up to ``max_leaf_nodes`` leaves and
``max_depth``; a node with fewer than ``2 * min_samples_leaf`` rows stays a leaf;
monotonic constraints bound the children's values by the middle of the siblings'.
The histograms of the smaller child are built (per source, :mod:`._histogram`) and
the larger child's are the parent's minus the smaller's. The same decisions in the
same order as scikit-learn's grower, so that the same data give the same trees.
"""

from __future__ import annotations

from heapq import heappop, heappush

import numpy as np

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable
from ilargi_sklearn.ensemble._histogram import HistogramBuilder
from ilargi_sklearn.ensemble._predictor import PREDICTOR_RECORD_DTYPE, TreePredictor
from ilargi_sklearn.ensemble._splitting import Splitter

__all__ = ["TreeGrower", "TreeNode"]


class TreeNode:
    """A node being grown: its rows are ``partition[start:stop]``."""

    def __init__(self, depth, start, stop, sum_gradients, sum_hessians, value=None):
        self.depth = depth
        self.partition_start = start
        self.partition_stop = stop
        self.n_samples = stop - start
        self.sum_gradients = sum_gradients
        self.sum_hessians = sum_hessians
        self.value = value
        self.is_leaf = False
        self.split_info = None
        self.left_child = None
        self.right_child = None
        self.histograms = None
        self.allowed_features = None
        self.interaction_cst_indices = None
        self.children_lower_bound = -np.inf
        self.children_upper_bound = np.inf

    def set_children_bounds(self, lower, upper):
        self.children_lower_bound = lower
        self.children_upper_bound = upper

    def __lt__(self, other):
        # The heap pops the highest gain first.
        return self.split_info.gain > other.split_info.gain


class TreeGrower:
    """Grows one tree on binned data (scikit-learn's ``TreeGrower`` parameters).

    ``hessians`` of shape ``(1,)`` means constant hessians (the histograms then
    count rows instead of summing hessians). ``histogram_builder`` is shared by
    the trees of a fit (it holds the rows of the nodes and the accumulators of
    the grouped builds). The grower reorders ``gradients`` and ``hessians`` in
    place with the partition of the rows (no copy): they are this tree's.
    """

    def __init__(
        self,
        data,
        gradients,
        hessians,
        histogram_builder: HistogramBuilder,
        *,
        max_leaf_nodes=None,
        max_depth=None,
        min_samples_leaf=20,
        min_gain_to_split=0.0,
        min_hessian_to_split=1e-3,
        n_bins=256,
        n_bins_non_missing=None,
        has_missing_values=None,
        is_categorical=None,
        monotonic_cst=None,
        interaction_cst=None,
        l2_regularization=0.0,
        feature_fraction_per_split=1.0,
        rng=None,
        shrinkage=1.0,
    ):
        F = data.feature_group.shape[0]
        if monotonic_cst is None:
            monotonic_cst = np.zeros(F, dtype=np.int8)
        monotonic_cst = np.asarray(monotonic_cst, dtype=np.int8)
        self.with_monotonic_cst = bool(np.any(monotonic_cst != 0))
        is_categorical = (
            np.zeros(F, dtype=bool) if is_categorical is None else is_categorical
        )
        self.hessians_are_constant = hessians.shape[0] == 1
        self.gradients = gradients
        self.hessians = None if self.hessians_are_constant else hessians
        self.hessian_constant = float(hessians[0]) if hessians.shape[0] else 1.0
        self.histogram_builder = histogram_builder
        histogram_builder.start_tree(gradients, self.hessians)
        self.splitter = Splitter(
            data,
            n_bins_non_missing,
            n_bins - 1,
            has_missing_values,
            is_categorical,
            monotonic_cst,
            l2_regularization,
            min_hessian_to_split=min_hessian_to_split,
            min_samples_leaf=min_samples_leaf,
            min_gain_to_split=min_gain_to_split,
            hessians_are_constant=self.hessians_are_constant,
            feature_fraction_per_split=feature_fraction_per_split,
            rng=rng,
            rows=histogram_builder,
        )
        self.data = data
        self.max_leaf_nodes = max_leaf_nodes
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.has_missing_values = np.asarray(has_missing_values, dtype=bool)
        self.monotonic_cst = monotonic_cst
        self.interaction_cst = interaction_cst
        self.shrinkage = shrinkage
        self.n_bins_non_missing = np.asarray(n_bins_non_missing)
        self.splittable_nodes: list[TreeNode] = []
        self.finalized_leaves: list[TreeNode] = []
        self.n_categorical_splits = 0
        self.n_nodes = 1
        self._initialize_root()

    def _histograms(self, node: TreeNode) -> np.ndarray:
        return self.histogram_builder.build(node.partition_start, node.partition_stop)

    def _initialize_root(self):
        n_samples = self.data.n_rows
        root = TreeNode(0, 0, n_samples, 0.0, 0.0, value=0)
        allowed, first = None, 0
        if self.interaction_cst is not None:
            # A set's iteration order, as scikit-learn builds the array.
            union = set().union(*self.interaction_cst)
            allowed = np.fromiter(union, dtype=np.int64, count=len(union))
            first = int(allowed[0])
        histograms = self._histograms(root)
        # As scikit-learn: the sums from the first allowed feature's histogram.
        root.sum_gradients = histograms[first, :, 0].sum()
        if self.hessians_are_constant:
            root.sum_hessians = self.hessian_constant * n_samples
        else:
            root.sum_hessians = histograms[first, :, 1].sum()
        self.root = root
        if root.n_samples < 2 * self.min_samples_leaf:
            self._finalize_leaf(root)
            return
        if root.sum_hessians < self.splitter.min_hessian_to_split:
            self._finalize_leaf(root)
            return
        if self.interaction_cst is not None:
            root.interaction_cst_indices = range(len(self.interaction_cst))
            root.allowed_features = allowed
        root.histograms = histograms
        self._compute_best_split_and_push(root)

    def _compute_best_split_and_push(self, node):
        node.split_info = self.splitter.find_node_split(
            node.n_samples,
            node.histograms,
            node.sum_gradients,
            node.sum_hessians,
            node.value,
            node.children_lower_bound,
            node.children_upper_bound,
            node.allowed_features,
        )
        if node.split_info.gain <= 0:
            self._finalize_leaf(node)
        else:
            heappush(self.splittable_nodes, node)

    def grow(self):
        while self.splittable_nodes:
            self.split_next()
        for leaf in self.finalized_leaves:
            leaf.value *= self.shrinkage

    def split_next(self):
        node = heappop(self.splittable_nodes)
        info = node.split_info
        right_pos = self.splitter.split_indices(
            info, node.partition_start, node.partition_stop
        )
        depth = node.depth + 1
        n_leaf_nodes = len(self.finalized_leaves) + len(self.splittable_nodes) + 2
        left = TreeNode(
            depth,
            node.partition_start,
            node.partition_start + right_pos,
            info.sum_gradient_left,
            info.sum_hessian_left,
            value=info.value_left,
        )
        right = TreeNode(
            depth,
            left.partition_stop,
            node.partition_stop,
            info.sum_gradient_right,
            info.sum_hessian_right,
            value=info.value_right,
        )
        node.left_child, node.right_child = left, right
        if self.interaction_cst is not None:
            # The constraint sets holding the split feature, and their union.
            allowed, indices = set(), []
            for i in node.interaction_cst_indices:
                if info.feature_idx in self.interaction_cst[i]:
                    indices.append(i)
                    allowed.update(self.interaction_cst[i])
            features = np.fromiter(allowed, dtype=np.int64, count=len(allowed))
            for child in (left, right):
                child.allowed_features = features
                child.interaction_cst_indices = indices
        if not self.has_missing_values[info.feature_idx]:
            # No missing value seen in training: at prediction they go to the
            # child with more rows.
            info.missing_go_to_left = left.n_samples > right.n_samples
        self.n_nodes += 2
        self.n_categorical_splits += int(info.is_categorical)

        if self.max_leaf_nodes is not None and n_leaf_nodes == self.max_leaf_nodes:
            self._finalize_leaf(left)
            self._finalize_leaf(right)
            while self.splittable_nodes:
                self._finalize_leaf(self.splittable_nodes.pop())
            return left, right
        if self.max_depth is not None and depth == self.max_depth:
            self._finalize_leaf(left)
            self._finalize_leaf(right)
            return left, right
        if left.n_samples < self.min_samples_leaf * 2:
            self._finalize_leaf(left)
        if right.n_samples < self.min_samples_leaf * 2:
            self._finalize_leaf(right)

        if self.with_monotonic_cst:
            cst = self.monotonic_cst[info.feature_idx]
            lo, hi = node.children_lower_bound, node.children_upper_bound
            if cst == 0:
                bounds = ((lo, hi), (lo, hi))
            else:
                mid = (left.value + right.value) / 2
                bounds = ((lo, mid), (mid, hi)) if cst == 1 else ((mid, hi), (lo, mid))
            left.set_children_bounds(*bounds[0])
            right.set_children_bounds(*bounds[1])

        if not left.is_leaf or not right.is_leaf:
            small, large = (
                (left, right)
                if left.n_samples < right.n_samples
                else (
                    right,
                    left,
                )
            )
            small.histograms = self._histograms(small)
            # The subtraction trick: the parent's array becomes the larger
            # child's.
            large.histograms = node.histograms
            large.histograms -= small.histograms
            node.histograms = None
            if not left.is_leaf:
                self._compute_best_split_and_push(left)
            if not right.is_leaf:
                self._compute_best_split_and_push(right)
            for child in (left, right):
                if child.is_leaf:
                    child.histograms = None
        node.histograms = None
        return left, right

    def _finalize_leaf(self, node):
        node.is_leaf = True
        self.finalized_leaves.append(node)

    def add_leaf_values(self, out: np.ndarray) -> None:
        """Add each leaf's value to ``out`` (n_rows,) at the rows of the leaf:
        the tree's prediction on its training rows, read off the partition."""
        leaves = self.finalized_leaves
        partition = self.splitter.partition
        if self.histogram_builder.compiled:
            starts = np.fromiter((lf.partition_start for lf in leaves), np.int64)
            stops = np.fromiter((lf.partition_stop for lf in leaves), np.int64)
            values = np.fromiter((lf.value for lf in leaves), np.float64)
            try:
                _launcher.call("tree_leaf_add", partition, starts, stops, values, out)
                return
            except CompiledUnavailable:
                pass
        for leaf in leaves:
            out[partition[leaf.partition_start : leaf.partition_stop]] += leaf.value

    def make_predictor(self, binning_thresholds):
        nodes = np.zeros(self.n_nodes, dtype=PREDICTOR_RECORD_DTYPE)
        bitsets = np.zeros((self.n_categorical_splits, 8), dtype=np.uint32)
        _fill(nodes, bitsets, self.root, binning_thresholds, self.n_bins_non_missing)
        return TreePredictor(nodes, bitsets)


def _fill(nodes, bitsets, root, thresholds, n_bins_non_missing):
    """Depth-first, left before right (scikit-learn's node numbering)."""
    next_node, next_bitset = 0, 0
    stack = [(root, None, None)]
    while stack:
        gnode, parent, side = stack.pop()
        i = next_node
        next_node += 1
        if parent is not None:
            nodes[parent][side] = i
        rec = nodes[i]
        rec["count"] = gnode.n_samples
        rec["depth"] = gnode.depth
        rec["gain"] = gnode.split_info.gain if gnode.split_info is not None else -1
        rec["value"] = gnode.value
        if gnode.is_leaf:
            rec["is_leaf"] = True
            continue
        info = gnode.split_info
        f = info.feature_idx
        rec["feature_idx"] = f
        rec["bin_threshold"] = info.bin_idx
        rec["missing_go_to_left"] = info.missing_go_to_left
        rec["is_categorical"] = info.is_categorical
        if info.bin_idx == n_bins_non_missing[f] - 1:
            rec["num_threshold"] = np.inf
        elif info.is_categorical:
            rec["bitset_idx"] = next_bitset
            bitsets[next_bitset] = info.left_cat_bitset
            next_bitset += 1
        else:
            rec["num_threshold"] = thresholds[f][info.bin_idx]
        # Right pushed first: the left subtree is numbered first.
        stack.append((gnode.right_child, i, "right"))
        stack.append((gnode.left_child, i, "left"))
