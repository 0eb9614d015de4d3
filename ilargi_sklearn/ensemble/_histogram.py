"""Histograms of a tree node, per source: grouped or row-wise, chosen by cost; the
rows of the nodes and their partition.

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

The rows of a tree's nodes are positions in arrays kept in the order of the
partition (:class:`HistogramBuilder`): the target row, the source row of each
indexed group, the gradient and the hessian. A split moves them all (a stable
partition, :meth:`HistogramBuilder.split`), so a node's rows are one contiguous
range of each and every histogram pass reads them sequentially: gathering a deep
node's scattered rows from the ``n``-length index vectors and gradients instead
costs a cache miss per row and array.

:func:`build_histograms` is the reference (NumPy ``bincount``); the compiled kernel
(:mod:`._trees_numba`) computes the same sums in one pass over the node's rows.

Threads. A node's histograms are split by feature, as scikit-learn's are, not by
rows: a task builds a pair of a group's features row-wise, or a whole group grouped
(its sums per source row made once, where a split by rows would make them once per
thread). Each feature is summed by one task in row order, so the trees do not
depend on the number of threads. A partition computes the rows' sides in chunks of
rows, then moves each carried array on its own (a range of them per thread). Small
nodes stay on the calling thread (:data:`PARALLEL_WORK`, :data:`PARALLEL_MOVES`).
"""

from __future__ import annotations

import math

import numpy as np

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn.ensemble._binning import ROW_DTYPE, BinnedData
from ilargi_sklearn.ensemble._trees_numba import GROUPED, GROUPED_DENSE, ROWWISE

__all__ = ["HistogramBuilder", "build_histograms", "choose_modes", "group_costs"]

#: Costs of the grouped builds in units of one bin read-and-add of the row-wise
#: build (measured with the compiled kernel on a 1,000,000-row star, two
#: dimensions of 50,000 rows: benchmarks/README.md, "Trees over joins"): summing
#: a node row into its source row's accumulators; listing it besides (mode 1);
#: reading a listed source row's sums and bins (in the order met: cache misses);
#: sweeping one source row (mode 2: in order, absent ones included).
_SCATTER_COST = 1.1
_LIST_COST = 0.7
_LISTED_ROW_COST = 6.0
_SWEEP_COST = 0.5

#: The least work of a node's histograms (bin reads) worth a second thread:
#: waking one and handing it tasks costs tens of microseconds.
PARALLEL_WORK = 1 << 17

#: The least work of a node's partition (rows times the arrays moved) worth a
#: second thread: the moves are bound by memory, and below about 130,000 rows
#: (four arrays) two threads were measured slower than one
#: (benchmarks/README.md, "Trees over joins").
PARALLEL_MOVES = 1 << 19


def group_costs(
    data: BinnedData, n_node: int, distinct: np.ndarray, widths: np.ndarray
) -> np.ndarray:
    """Per group, the cost of each build of a node of ``n_node`` rows, in bin
    reads of the row-wise build: ``(n_groups, 3)``, row-wise, grouped with a
    list, grouped sweeping all source rows (inf where a group has no grouped
    build: the identity, one column).

    ``distinct[g]`` is the number of distinct source rows of group ``g`` among
    the training rows; in a node of ``n_node`` rows drawn from them the expected
    number of distinct rows is ``d (1 - (1 - 1/d)^n_node)``.
    """
    costs = np.full((data.n_groups, 3), np.inf)
    for g in range(data.n_groups):
        c = float(widths[g])
        costs[g, ROWWISE] = n_node * c
        if data.idx[g].shape[0] == 0 or c <= 1:
            continue
        d = max(float(distinct[g]), 1.0)
        u = d * -math.expm1(n_node * math.log1p(-1.0 / d)) if d > 1 else 1.0
        u = min(u, float(n_node))
        m = float(data.bins[g].shape[0])
        costs[g, GROUPED] = n_node * (_SCATTER_COST + _LIST_COST) + u * (
            c + _LISTED_ROW_COST
        )
        costs[g, GROUPED_DENSE] = n_node * _SCATTER_COST + m * (c + _SWEEP_COST)
    return costs


def choose_modes(
    data: BinnedData, n_node: int, distinct: np.ndarray, widths: np.ndarray
) -> np.ndarray:
    """Per group, the cheapest build for a node of ``n_node`` rows
    (:func:`group_costs`; the first of equal costs). Identity groups (the base
    table) are always row-wise."""
    return np.argmin(group_costs(data, n_node, distinct, widths), axis=1)


def build_histograms(
    data: BinnedData,
    sources: list[np.ndarray],
    gradients: np.ndarray,
    hessians: np.ndarray | None,
    modes: np.ndarray,
    n_bins: int,
) -> np.ndarray:
    """The histograms of a node (NumPy reference).

    ``sources[g]`` holds the row of ``data.bins[g]`` of each of the node's rows
    (``data.rows_of(g, rows)`` for target rows ``rows``); ``gradients`` and
    ``hessians`` (None: constant) are the node's, one per row. Returns float64
    ``(n_features, n_bins, 3)``: summed gradients, hessians (zero when
    constant) and counts, built per group in ``modes`` (row-wise or grouped)."""
    F = data.feature_group.shape[0]
    hist = np.zeros((F, n_bins, 3))
    g = np.asarray(gradients, dtype=np.float64)
    h = None if hessians is None else np.asarray(hessians, dtype=np.float64)
    for grp in range(data.n_groups):
        feats = data.group_features(grp)
        if feats.shape[0] == 0:
            continue
        B = data.bins[grp]
        src = sources[grp]
        if modes[grp] != ROWWISE:
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


def split_rows(
    carried: tuple,
    keys: np.ndarray,
    bins_col: np.ndarray,
    threshold: int,
    missing_left: bool,
    missing_bin: int,
    bitset: np.ndarray | None,
) -> int:
    """Stable partition of the node's ``carried`` arrays (NumPy reference).

    ``keys`` are the node's rows of ``bins_col`` (the split feature's binned
    column); ``bitset`` the bins that go left at a categorical split (None:
    numeric, bins up to ``threshold`` and, when ``missing_left``, the missing
    bin go left). Returns the number of left rows."""
    b = bins_col[keys]
    if bitset is not None:
        bb = b.astype(np.uint32)
        left = ((bitset[bb >> 5] >> (bb & 31)) & 1).astype(bool)
    else:
        left = b <= threshold
        if missing_left:
            left |= b == missing_bin
    for a in carried:
        a[:] = np.concatenate([a[left], a[~left]])
    return int(left.sum())


class HistogramBuilder:
    """The rows of one fit's tree nodes: their histograms and their partition.

    Holds, in the order of the partition, the target row of each position
    (:attr:`partition`, all rows in order at :meth:`start_tree`) and its row of
    every indexed group, the accumulators of the grouped builds (zero between
    calls) and the number of distinct source rows per group among the training
    rows. The trees of a fit share it, one at a time: between
    :meth:`start_tree` and :meth:`end_tree` the index vectors of ``data`` are
    reordered in place with the partition (the builder's keys are those arrays,
    not copies: ``n`` int32 a dimension less memory), so nothing else may read
    ``data`` during a tree.
    """

    def __init__(self, data: BinnedData, n_bins: int) -> None:
        self.data = data
        self.n_bins = int(n_bins)
        self.widths = np.asarray([b.shape[1] for b in data.bins], dtype=np.int64)
        self.distinct = np.zeros(data.n_groups)
        n = data.n_rows
        indexed = [g for g in range(data.n_groups) if data.idx[g].shape[0]]
        for g in range(data.n_groups):
            ix = data.idx[g]
            if ix.shape[0] == 0:
                self.distinct[g] = n
            else:
                seen = np.zeros(data.bins[g].shape[0], dtype=bool)
                seen[ix] = True
                self.distinct[g] = seen.sum()
        self.fmaps = tuple(
            data.group_features(g).astype(np.int64) for g in range(data.n_groups)
        )
        # Key 0: the target row (the partition); key k: the row of the k-th
        # indexed group, its index vector itself, permuted in place during a
        # tree and put back in target order after it (end_tree): no copy of
        # the n-length index vectors. Identity groups read their bins through
        # key 0.
        self.key_of = np.zeros(data.n_groups, dtype=np.int64)
        keys = [np.empty(n, dtype=ROW_DTYPE)]
        for k, g in enumerate(indexed, start=1):
            self.key_of[g] = k
            ix = data.idx[g]
            if not (
                ix.dtype == ROW_DTYPE and ix.flags.c_contiguous and ix.flags.writeable
            ):
                ix = np.ascontiguousarray(ix, dtype=ROW_DTYPE).copy()
            keys.append(ix)
        self.keys = tuple(keys)
        # Buffers of n rows for the partition's moves: one for the calling
        # thread, and one per task running at once on the pool (taken and given
        # back: list.pop and append are atomic).
        self._buffer = np.empty(n, dtype=ROW_DTYPE)
        self._free_buffers: list[np.ndarray] = []
        self._serial_tasks: dict[bytes, np.ndarray] = {}
        self._mask = np.empty(n, dtype=np.uint8)
        self._bins = _launcher.uniform_tuple(data.bins)
        self._n_threads = 1
        self.gradients = np.zeros(0, dtype=np.float32)
        self.hessians = np.zeros(0, dtype=np.float32)
        self._accs: tuple | None = None
        self._touched: tuple | None = None
        self.compiled = numba_available()

    @property
    def partition(self) -> np.ndarray:
        """The target row at each position of the partition."""
        return self.keys[0]

    def start_tree(self, gradients: np.ndarray, hessians: np.ndarray | None) -> None:
        """All rows in one node (in target-row order) with these gradients and
        hessians (None: constant).

        They are not copied: the partition reorders them in place, so they are
        the tree's own (the fit computes them anew for every tree). The index
        vectors are reordered with them until :meth:`end_tree`."""
        partition = self.keys[0]
        partition[:1] = 0
        partition[1:] = 1
        np.cumsum(partition, out=partition)
        if gradients.dtype != np.float32 or not gradients.flags.c_contiguous:
            raise ValueError("the trees take C-contiguous float32 gradients.")
        self.gradients = gradients
        self.hessians = np.zeros(0, dtype=np.float32) if hessians is None else hessians
        # Read once per tree, not per node (thousands of them): the environment
        # switch and the thread limits a tree's kernels run under.
        self.compiled = numba_available()
        self._n_threads = _launcher.n_threads() if self.compiled else 1

    def end_tree(self) -> None:
        """Put the index vectors back in target-row order (after a tree's
        partition has been read: the leaves' rows)."""
        partition = self.keys[0]
        indexed = self.keys[1:]
        if not indexed:
            return
        if self.compiled:
            work = partition.shape[0] * len(indexed)
            threads = self._n_threads if work >= PARALLEL_MOVES else 1
            try:
                self._run_tasks(
                    lambda a, buf: _launcher.call(
                        "tree_unpartition", indexed, a, a + 1, partition, buf
                    ),
                    len(indexed),
                    threads,
                )
                return
            except CompiledUnavailable:
                self.compiled = False
        buf = self._take_buffer()
        for ix in indexed:
            buf[partition] = ix
            ix[:] = buf
        self._free_buffers.append(buf)

    def _take_buffer(self) -> np.ndarray:
        try:
            return self._free_buffers.pop()
        except IndexError:
            return np.empty(self.data.n_rows, dtype=ROW_DTYPE)

    def _run_tasks(self, task, n_tasks: int, threads: int) -> None:
        """``task(t, buffer)`` for ``t`` in ``range(n_tasks)`` on up to
        ``threads`` threads, each task with a buffer of n rows of its own."""

        def run(t: int) -> None:
            buf = self._take_buffer()
            try:
                task(t, buf)
            finally:
                self._free_buffers.append(buf)

        _launcher.run_kernel_tasks(run, n_tasks, threads)

    def _carried(self) -> tuple:
        """The arrays a split moves, as one homogeneous tuple of int32 arrays
        (the gradients' and hessians' bits: a partition only moves them)."""
        arrays = list(self.keys)
        arrays.append(self.gradients.view(ROW_DTYPE))
        if self.hessians.shape[0]:
            arrays.append(self.hessians.view(ROW_DTYPE))
        return tuple(arrays)

    def _buffers(self) -> tuple[tuple, tuple]:
        if self._accs is None:
            accs, touched = [], []
            for g in range(self.data.n_groups):
                # Every indexed group gets accumulators (the kernel trusts its
                # modes: a grouped build without them would write out of bounds).
                if self.data.idx[g].shape[0] == 0:
                    accs.append(np.zeros((1, 3)))
                    touched.append(np.zeros(1, dtype=np.int64))
                else:
                    m = self.data.bins[g].shape[0]
                    accs.append(np.zeros((m, 3)))
                    # One more than the source rows: the list's end is written
                    # at every node row, also once all rows are listed.
                    touched.append(np.zeros(m + 1, dtype=np.int64))
            self._accs = _launcher.uniform_tuple(accs)
            self._touched = _launcher.uniform_tuple(touched)
        return self._accs, self._touched

    def modes(self, n_node: int) -> np.ndarray:
        return choose_modes(self.data, n_node, self.distinct, self.widths)

    def build(self, start: int, stop: int) -> np.ndarray:
        """Histograms of the node at positions ``[start, stop)``."""
        modes = self.modes(stop - start)
        if self.compiled:
            try:
                return self._build_compiled(start, stop, modes)
            except CompiledUnavailable:
                self.compiled = False
        h = self.hessians[start:stop] if self.hessians.shape[0] else None
        return build_histograms(
            self.data,
            [self.keys[k][start:stop] for k in self.key_of],
            self.gradients[start:stop],
            h,
            modes,
            self.n_bins,
        )

    def _tasks(self, n: int, modes: np.ndarray, ordered: bool) -> np.ndarray:
        """The tasks of a node's histograms, ``(group, first, last feature)``
        of the group's features (:attr:`fmaps`): a pair of features per
        row-wise task (the kernel's pass), a whole group per grouped one (its
        sums per source row are made once). ``ordered``: costliest first, so
        that the threads finish together."""
        if not ordered:
            # The same few mode patterns recur at every node.
            cached = self._serial_tasks.get(modes.tobytes())
            if cached is not None:
                return cached
        tasks, work = [], []
        costs = (
            group_costs(self.data, n, self.distinct, self.widths) if ordered else None
        )
        for g, fm in enumerate(self.fmaps):
            nf = fm.shape[0]
            if nf == 0:
                continue
            if modes[g] == ROWWISE:
                for k in range(0, nf, 2):
                    tasks.append((g, k, min(k + 2, nf)))
                    work.append(n * min(2, nf - k))
            else:
                tasks.append((g, 0, nf))
                work.append(costs[g, modes[g]] if ordered else 0.0)
        tasks = np.asarray(tasks, dtype=np.int64).reshape(-1, 3)
        if ordered:
            return tasks[np.argsort(-np.asarray(work), kind="stable")]
        self._serial_tasks[modes.tobytes()] = tasks
        return tasks

    def _build_compiled(self, start, stop, modes) -> np.ndarray:
        F = self.data.feature_group.shape[0]
        # n F bin reads bound the work (the grouped builds read fewer).
        threads = self._n_threads if (stop - start) * F >= PARALLEL_WORK else 1
        tasks = self._tasks(stop - start, modes, ordered=threads > 1)
        accs, touched = self._buffers()
        out = np.zeros((F, self.n_bins, 3))
        head = (
            self.keys,
            self.key_of,
            self.gradients,
            self.hessians,
            self._bins,
            self.fmaps,
            modes,
            accs,
            touched,
            tasks,
            out,
            start,
            stop,
        )
        n_tasks = tasks.shape[0]
        if threads == 1 or n_tasks == 1:
            _launcher.call("tree_hist", *head, 0, n_tasks)
        else:
            _launcher.run_kernel_tasks(
                lambda t: _launcher.call("tree_hist", *head, t, t + 1),
                n_tasks,
                threads,
            )
        return out

    def split(
        self,
        start: int,
        stop: int,
        feature: int,
        threshold: int,
        missing_left: bool,
        missing_bin: int,
        bitset: np.ndarray | None,
    ) -> int:
        """Partition the node at ``[start, stop)`` by tree feature ``feature``:
        its rows that go left first (bins up to ``threshold``, or in ``bitset``
        at a categorical split, and missing values when ``missing_left``);
        returns their number."""
        data = self.data
        g = int(data.feature_group[feature])
        col = int(data.feature_col[feature])
        key = int(self.key_of[g])
        carried = self._carried()
        if self.compiled:
            rule = (
                data.bins[g],
                col,
                int(threshold),
                bool(missing_left),
                int(missing_bin),
                bitset is not None,
                np.zeros(8, dtype=np.uint32) if bitset is None else bitset,
            )
            try:
                return self._split_compiled(carried, key, start, stop, rule)
            except CompiledUnavailable:
                self.compiled = False
        return split_rows(
            tuple(a[start:stop] for a in carried),
            self.keys[key][start:stop],
            data.bins[g][:, col],
            threshold,
            missing_left,
            missing_bin,
            bitset,
        )

    def _split_compiled(self, carried, key, start, stop, rule) -> int:
        """:meth:`split` by the compiled kernels; ``rule``: the split feature's
        binned source, column, threshold, missing-value side, missing bin and
        categorical bitset, as ``tree_sides`` takes them."""
        n = stop - start
        threads = self._n_threads if n * len(carried) >= PARALLEL_MOVES else 1
        n_chunks = _launcher.chunks(
            n, _launcher.MIN_CHUNK_ROWS["tree_sides"], threads, per_thread=1
        )
        counts = np.zeros(n_chunks, dtype=np.int64)
        head = (carried[key], *rule, self._mask, counts, start)
        if threads == 1:
            # Direct calls: most nodes are small, and on a node of 10,000 rows
            # the launches' Python was a quarter of the partition's time.
            _launcher.call("tree_sides", *head, 0, 0, n)
            _launcher.call(
                "tree_move",
                carried,
                0,
                len(carried),
                start,
                stop,
                self._mask,
                self._buffer,
            )
            return int(counts[0])
        _launcher.launch("tree_sides", head, n, n_chunks, threads)
        # The arrays move on their own (no row is read by two tasks): one
        # range of them per thread.
        bounds = np.linspace(0, len(carried), min(threads, len(carried)) + 1)
        bounds = np.round(bounds).astype(np.int64)
        self._run_tasks(
            lambda t, buf: _launcher.call(
                "tree_move",
                carried,
                bounds[t],
                bounds[t + 1],
                start,
                stop,
                self._mask,
                buf,
            ),
            bounds.shape[0] - 1,
            threads,
        )
        return int(counts.sum())
