"""K-Means clustering (Lloyd's algorithm) on the operator protocol.

The kernels below are module-level functions over an
:class:`~ilargi_sklearn.multisource.Operator`; the same code runs on a factorized
multi-source dataset and on a plain (materialized) matrix. They mirror
scikit-learn's ``_kmeans_single_lloyd`` step by step (greedy k-means++, empty-cluster
relocation, strict and tolerance-based convergence, the final E-step), so that with
the same initial centers the fit reproduces ``sklearn.cluster.KMeans``.

On a NumPy factorized matrix (dense or CSR sources), and with numba installed, the
iteration runs as two compiled passes over the target rows instead
(:class:`_FusedLloyd`, kernels in ``cluster._lloyd_numba``): the E-step multiplies the
identity source in the loop (a CSR one entry by entry) and adds one precomputed
``(source rows + 1) x k`` table row per row group (a SciPy product for a CSR
table), with the arg-min in registers; the M-step accumulates the base columns per
cluster and the (source row, cluster) weights per group. No ``n x n_clusters`` array
is built. At 2e5 rows, two dimension tables and 8 clusters an iteration went from
about 15 ms to about 7 ms (one thread) and the fit's peak memory from 49 MB to 25 MB.
Other operators (plain matrices, device arrays, a centered CSR source) and
``ILARGI_SKLEARN_NO_NUMBA=1`` keep the NumPy kernels below.
"""

from __future__ import annotations

import logging
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array, check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.extmath import row_norms
from sklearn.utils.validation import _check_sample_weight, check_is_fitted

from ilargi_sklearn._backend._cuml import fit_cuml, use_cuml
from ilargi_sklearn._backend._launcher import (
    CompiledUnavailable,
    numba_available,
    one_blas_thread,
)
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.cluster._lloyd_numba import (
    fused_accumulate,
    fused_assign,
    fused_partial_at,
)
from ilargi_sklearn.multisource import AffineOperator, FactorizedMatrix, MatrixOperator
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    DeviceMixin,
    input_namespace,
    validate_X,
)

__all__ = ["FactorizedKMeans"]

logger = logging.getLogger(__name__)

#: Bytes of partial distances per block of rows in the assignment step (about a
#: quarter of an L2 cache): the block is scaled, shifted and reduced while in cache.
_ASSIGN_BLOCK_BYTES = 1 << 19


# --------------------------------------------------------------------------- kernels
def _tolerance(op, tol):
    """Scale ``tol`` by the mean column variance of ``T`` (as scikit-learn does).

    The variances come from the column sums and the column sums of squares, so the
    data are never centered explicitly.
    """
    if tol == 0:
        return 0.0
    n = op.n_rows
    mean = np.asarray(to_numpy(op.col_sums()), dtype=np.float64) / n
    sq = np.asarray(to_numpy(op.col_sq_sums()), dtype=np.float64) / n
    variances = np.maximum(sq - mean**2, 0.0)
    return float(np.mean(variances) * tol)


def _partial_sq_distances(op, centers):
    """``||c_j||^2 - 2 t_i . c_j`` for every row ``i`` and center ``j``.

    The row norms ``||t_i||^2`` are left out: the arg-min over ``j`` does not depend
    on them. One ``matmul`` with ``n_clusters`` columns.
    """
    centers_sq = row_norms(centers, squared=True)
    # A C-ordered right-hand side keeps the per-source products on the fast path.
    partial = op.matmul(np.ascontiguousarray(centers.T))
    # In place: n_samples x n_clusters temporaries dominate the cost besides T C^T.
    partial *= -2.0
    partial += centers_sq[np.newaxis, :]
    return partial


def _assign(op, centers):
    """E-step: labels of the rows and their partial distances to ``centers``.

    The same values as :func:`_partial_sq_distances` followed by a row-wise
    arg-min, but after the one ``matmul`` the scaling, the shift and the arg-min
    run block by block over rows (``_ASSIGN_BLOCK_BYTES``), so each block of the
    ``n_samples x n_clusters`` product is read from memory once instead of three
    times. The gain is small (about 2% of a Lloyd iteration on a 2e5 x 30 star
    schema with 8 clusters); the products of the operator dominate.

    Returns
    -------
    labels : ndarray of int32 of shape (n_samples,)
    partial : ndarray of shape (n_samples, n_clusters)
        ``||c_j||^2 - 2 t_i . c_j``.
    """
    centers_sq = row_norms(centers, squared=True)
    partial = op.matmul(np.ascontiguousarray(centers.T))
    n_samples, n_clusters = partial.shape
    labels = np.empty(n_samples, dtype=np.int32)
    step = max(256, _ASSIGN_BLOCK_BYTES // (partial.itemsize * max(n_clusters, 1)))
    for start in range(0, n_samples, step):
        block = partial[start : start + step]
        block *= -2.0
        block += centers_sq
        labels[start : start + step] = np.argmin(block, axis=1)
    return labels, partial


def _sq_distances(op, Y, x_squared_norms):
    """Squared Euclidean distances from each row of ``Y`` to every row of ``T``.

    Same arithmetic as scikit-learn's ``_euclidean_distances(Y, X,
    Y_norm_squared=x_squared_norms, squared=True)``; returns shape
    ``(Y.shape[0], n_rows)``.
    """
    YY = row_norms(Y, squared=True)[:, np.newaxis]
    distances = -2.0 * op.matmul(np.ascontiguousarray(Y.T)).T
    distances += YY
    distances += x_squared_norms[np.newaxis, :]
    np.maximum(distances, 0, out=distances)
    return distances


def _take_dense_rows(op, rows):
    """Rows ``T[rows]`` as a dense array (only a handful of rows is extracted)."""
    return np.asarray(op.take_rows(np.asarray(rows)).materialize("dense"))


def _kmeans_plusplus(
    op, n_clusters, x_squared_norms, sample_weight, random_state, n_local_trials=None
):
    """Greedy k-means++ seeding over an operator.

    Follows scikit-learn's ``_kmeans_plusplus``: the first center is drawn with
    probability proportional to ``sample_weight``; every further center is the best
    of ``n_local_trials`` candidates drawn proportionally to the weighted squared
    distance to the closest center so far. Candidate rows are extracted with
    ``op.take_rows``; their distances to all rows take one ``matmul``.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    n_clusters : int
        Number of seeds.
    x_squared_norms : ndarray of shape (n_samples,)
        Squared row norms of ``T``.
    sample_weight : ndarray of shape (n_samples,)
        Weights of the rows.
    random_state : RandomState
        Generator.
    n_local_trials : int, default=None
        Candidates per center; ``2 + int(log(n_clusters))`` when None.

    Returns
    -------
    centers : ndarray of shape (n_clusters, n_features)
    indices : ndarray of shape (n_clusters,)
        Row of ``T`` of each center.
    """
    n_samples, n_features = op.shape
    centers = np.empty((n_clusters, n_features), dtype=op.dtype)
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(n_clusters))

    center_id = random_state.choice(n_samples, p=sample_weight / sample_weight.sum())
    indices = np.full(n_clusters, -1, dtype=int)
    centers[0] = _take_dense_rows(op, [center_id])[0]
    indices[0] = center_id

    closest_dist_sq = _sq_distances(op, centers[0, np.newaxis], x_squared_norms)
    current_pot = closest_dist_sq @ sample_weight

    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        candidate_ids = np.searchsorted(
            np.cumsum(sample_weight * closest_dist_sq), rand_vals
        )
        # Rounding can put a candidate one past the end, as in scikit-learn.
        np.clip(candidate_ids, None, closest_dist_sq.size - 1, out=candidate_ids)

        candidates = _take_dense_rows(op, candidate_ids)
        distance_to_candidates = _sq_distances(op, candidates, x_squared_norms)
        np.minimum(closest_dist_sq, distance_to_candidates, out=distance_to_candidates)
        candidates_pot = distance_to_candidates @ sample_weight.reshape(-1, 1)

        best = int(np.argmin(candidates_pot))
        current_pot = candidates_pot[best]
        closest_dist_sq = distance_to_candidates[best]
        centers[c] = candidates[best]
        indices[c] = candidate_ids[best]

    return centers, indices


def _relocate_empty_clusters(
    op,
    sample_weight,
    x_squared_norms,
    row_partial,
    partial_scale,
    centers_sums,
    weight_in_clusters,
    labels,
):
    """Move empty clusters to the rows farthest from their centers (in place).

    Mirrors scikit-learn's ``_relocate_empty_clusters_*``: the ``n_empty`` rows with
    the largest distance to their (old) center each leave their cluster and seed one
    empty cluster. The distances come from the partial distances of the E-step
    (``row_partial[i]``: that of row ``i`` to its own center; ``partial_scale``: the
    largest absolute partial distance), so no extra product is needed; only the
    chosen rows are extracted.
    """
    empty_clusters = np.flatnonzero(weight_in_clusters == 0)
    n_empty = empty_clusters.shape[0]
    if n_empty == 0:
        return
    distances = x_squared_norms + row_partial
    np.maximum(distances, 0, out=distances)
    # scikit-learn computes ||x - c||^2 directly and gives up when it is exactly 0
    # everywhere (more clusters than distinct rows); the expanded form leaves a
    # rounding residue instead, so "zero" is relative to the magnitudes involved.
    scale = float(x_squared_norms.max(initial=0.0)) + float(partial_scale)
    eps = np.finfo(row_partial.dtype).eps
    if distances.max() <= 8 * (op.n_cols + 2) * eps * scale:
        return
    far_from_centers = np.argpartition(distances, -n_empty)[: -n_empty - 1 : -1]
    far_rows = _take_dense_rows(op, far_from_centers)
    for idx in range(n_empty):
        new_cluster_id = empty_clusters[idx]
        far_idx = far_from_centers[idx]
        weight = sample_weight[far_idx]
        old_cluster_id = labels[far_idx]
        centers_sums[old_cluster_id] -= far_rows[idx] * weight
        centers_sums[new_cluster_id] = far_rows[idx] * weight
        weight_in_clusters[new_cluster_id] = weight
        weight_in_clusters[old_cluster_id] -= weight


def _average_centers(centers_sums, weight_in_clusters):
    """Divide the per-cluster sums by the cluster weights (in place).

    Empty clusters take the location of the heaviest cluster, in the same loop
    order as scikit-learn.
    """
    argmax_weight = int(np.argmax(weight_in_clusters))
    for j in range(centers_sums.shape[0]):
        if weight_in_clusters[j] > 0:
            centers_sums[j] *= 1.0 / weight_in_clusters[j]
        else:
            centers_sums[j] = centers_sums[argmax_weight]


def _takes_sparse(op):
    """Whether ``op.rmatmul`` takes a SciPy sparse right-hand side."""
    if isinstance(op, AffineOperator):
        return _takes_sparse(op.base)
    return isinstance(op, (FactorizedMatrix, MatrixOperator))


def _one_hot(op, labels, sample_weight, n_clusters, dtype):
    """The weighted one-hot assignment ``A`` (``A[i, labels[i]] = w_i``).

    A CSR matrix with one entry per row when ``op`` takes one: its ``rmatmul`` then
    sums the rows by label without an n x k array (the M-step of a 2e5-row,
    three-source factorized fit went from 7-9 ms to 3 ms). Other operators get it
    dense, written through flat positions.
    """
    n_samples = labels.shape[0]
    if _takes_sparse(op):
        return sp.csr_matrix(
            (
                np.asarray(sample_weight, dtype=dtype),
                labels,
                np.arange(n_samples + 1),
            ),
            shape=(n_samples, n_clusters),
        )
    assignment = np.zeros((n_samples, n_clusters), dtype=dtype)
    flat = np.arange(0, n_samples * n_clusters, n_clusters, dtype=np.intp)
    flat += labels
    assignment.reshape(-1)[flat] = sample_weight
    return assignment


def _lloyd_iter(op, sample_weight, centers, x_squared_norms, update_centers=True):
    """One iteration of Lloyd's algorithm over an operator.

    E-step: ``labels = argmin_j ||c_j||^2 - 2 T C^T`` (one ``matmul`` with
    ``n_clusters`` columns, row-wise arg-min). M-step: ``C_new = (T^T A) / counts``
    with ``A`` the weighted one-hot assignment (one ``rmatmul``), empty clusters
    relocated as in scikit-learn.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    sample_weight : ndarray of shape (n_samples,)
        Weights of the rows.
    centers : ndarray of shape (n_clusters, n_features)
        Current centers.
    x_squared_norms : ndarray of shape (n_samples,) or None
        Squared row norms of ``T``; needed only to relocate empty clusters.
    update_centers : bool, default=True
        False runs the E-step only.

    Returns
    -------
    labels : ndarray of int32 of shape (n_samples,)
    partial : ndarray of shape (n_samples, n_clusters)
        ``||c_j||^2 - 2 t_i . c_j`` for the input centers.
    centers_new : ndarray of shape (n_clusters, n_features) or None
    center_shift : ndarray of shape (n_clusters,) or None
        Euclidean distance between old and new centers.
    """
    n_clusters = centers.shape[0]
    labels, partial = _assign(op, centers)
    if not update_centers:
        return labels, partial, None, None

    weight_in_clusters = np.bincount(
        labels, weights=sample_weight, minlength=n_clusters
    ).astype(centers.dtype, copy=False)
    centers_new = np.ascontiguousarray(
        op.rmatmul(_one_hot(op, labels, sample_weight, n_clusters, centers.dtype)).T,
        dtype=centers.dtype,
    )

    if np.any(weight_in_clusters == 0):
        _relocate_empty_clusters(
            op,
            sample_weight,
            x_squared_norms,
            partial[np.arange(labels.shape[0]), labels],
            np.max(np.abs(partial), initial=0.0),
            centers_new,
            weight_in_clusters,
            labels,
        )
    _average_centers(centers_new, weight_in_clusters)
    center_shift = np.sqrt(((centers_new - centers) ** 2).sum(axis=1))
    return labels, partial, centers_new, center_shift


def _inertia_from_partial(x_squared_norms, partial, labels, sample_weight):
    """``sum_i w_i ||t_i - c_{l_i}||^2`` from the partial distances of an E-step."""
    d = x_squared_norms + partial[np.arange(labels.shape[0]), labels]
    np.maximum(d, 0, out=d)
    return float(d @ sample_weight)


def _labels_inertia(
    op, sample_weight, centers, x_squared_norms=None, return_inertia=True
):
    """E-step: labels of the rows of ``T`` and, optionally, the inertia.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    sample_weight : ndarray of shape (n_samples,)
        Weights of the rows.
    centers : ndarray of shape (n_clusters, n_features)
        The centers.
    x_squared_norms : ndarray of shape (n_samples,), default=None
        Squared row norms (computed when None and the inertia is asked for).
    return_inertia : bool, default=True
        Whether to return the inertia too.

    Returns
    -------
    labels : ndarray of int32 of shape (n_samples,)
    inertia : float
        Only when ``return_inertia``.
    """
    fused = _fused_lloyd_plan(op, centers.shape[0])
    if fused is not None:
        # The compiled E-step: no n x n_clusters array.
        try:
            labels, best, _, _ = fused.step(
                np.asarray(centers, dtype=fused.dtype), None, update=False
            )
        except CompiledUnavailable:
            fused = None
    if fused is not None:
        if not return_inertia:
            return labels
        if x_squared_norms is None:
            x_squared_norms = op.row_sq_norms()
        d = x_squared_norms + best
        np.maximum(d, 0, out=d)
        return labels, float(d @ sample_weight)
    labels, partial, _, _ = _lloyd_iter(
        op, sample_weight, centers, x_squared_norms, update_centers=False
    )
    if not return_inertia:
        return labels
    if x_squared_norms is None:
        x_squared_norms = op.row_sq_norms()
    return labels, _inertia_from_partial(
        x_squared_norms, partial, labels, sample_weight
    )


def _lloyd_stop(i, labels, labels_old, center_shift_tot, tol):
    """scikit-learn's stopping rule: "strict" (labels unchanged), "tol" (the
    centers moved at most ``tol``), or "" (go on)."""
    if labels_old is not None and np.array_equal(labels, labels_old):
        logger.debug("Converged at iteration %d: strict convergence.", i)
        return "strict"
    if center_shift_tot <= tol:
        logger.debug(
            "Converged at iteration %d: center shift %g within tolerance %g.",
            i,
            center_shift_tot,
            tol,
        )
        return "tol"
    return ""


def _kmeans_single_lloyd(
    op, sample_weight, centers_init, x_squared_norms, max_iter, tol
):
    """A single run of Lloyd's algorithm, as scikit-learn's ``_kmeans_single_lloyd``.

    Stops at strict convergence (labels unchanged) or when the squared center shift
    is at most ``tol``; in the latter case (and at ``max_iter``) a final E-step makes
    the labels match the returned centers.

    Returns
    -------
    labels : ndarray of int32 of shape (n_samples,)
    inertia : float
    centers : ndarray of shape (n_clusters, n_features)
    n_iter : int
    """
    centers = centers_init
    labels_old = np.full(op.n_rows, -1, dtype=np.int32)
    strict_convergence = False
    for i in range(max_iter):
        labels, _, centers_new, center_shift = _lloyd_iter(
            op, sample_weight, centers, x_squared_norms
        )
        centers = centers_new
        stop = _lloyd_stop(i, labels, labels_old, float((center_shift**2).sum()), tol)
        if stop:
            strict_convergence = stop == "strict"
            break
        labels_old = labels

    if strict_convergence:
        # The labels are those of the previous centers (unchanged): the inertia is
        # measured against the new centers, as scikit-learn does.
        partial = _partial_sq_distances(op, centers)
    else:
        # Rerun the E-step so that the labels match the centers.
        labels, partial, _, _ = _lloyd_iter(
            op, sample_weight, centers, x_squared_norms, update_centers=False
        )
    inertia = _inertia_from_partial(x_squared_norms, partial, labels, sample_weight)
    return labels, inertia, centers, i + 1


# --------------------------------------------------- the compiled (fused) iteration
#: Identity sources up to this many columns are multiplied inside the fused loop;
#: wider ones are multiplied by BLAS into an n x k table first.
_INLINE_MAX_COLS = 32
#: The same for a CSR identity source (the loop reads its entries only; the
#: blocked centers, ``d0 x 8`` per block, should stay in cache).
_INLINE_MAX_SPARSE_COLS = 4096


def _fused_lloyd_plan(op, n_clusters):
    """A :class:`_FusedLloyd` for ``op``, or None (NumPy kernels then run).

    The compiled iteration runs when numba is available and ``op`` is a NumPy
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
    """

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

    def _prepare(self, centers):
        """Tables, blocked centers and biases for ``centers``."""
        dtype, k = self.dtype, self.k
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

    def step(self, centers, weights, *, update, labels_in=None, labels_out=None):
        """One fused E-step (and the M-step sums when ``update``; ``weights`` None
        for unit weights).

        Returns ``(labels, best, sums, cluster_weights)``: ``best[i]`` is the
        partial distance of row ``i`` to its center, ``sums`` the center sums
        ``T'^T A`` (n_clusters x n_features, float64; None unless ``update``).
        With ``labels_in`` only the partial distances to those centers are
        computed.
        """
        C0 = self._prepare(centers)
        common = (self.X0, self.o0)
        if labels_in is not None:
            fused_partial_at(
                *common,
                C0,
                self.idxs,
                self.P,
                self.offsets,
                self.pads,
                self.bias,
                labels_in,
                self.best,
            )
            return labels_in, self.best, None, None
        nb = self.n_blocks
        C3 = np.ascontiguousarray(C0.reshape(C0.shape[0], nb, 8).transpose(1, 0, 2))
        labels = np.empty(self.n_rows, np.int32) if labels_out is None else labels_out
        fused_assign(
            *common,
            C3,
            self.idxs,
            self.P.reshape(self.total, nb, 8),
            self.offsets,
            self.pads,
            self.bias.reshape(nb, 8),
            labels,
            self.best,
        )
        if not update:
            return labels, self.best, None, None
        wsum, sums0, cnt = fused_accumulate(
            *common,
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
        return labels, self.best, sums, wsum


def _kmeans_single_lloyd_fused(
    fused,
    op,
    sample_weight,
    centers_init,
    x_squared_norms,
    max_iter,
    tol,
    unit_weights=False,
):
    """:func:`_kmeans_single_lloyd` with the compiled fused iteration.

    Same iteration, convergence tests, empty-cluster relocation and final E-step;
    no ``n x n_clusters`` array is built and the n-sized workspaces (labels, partial
    distances) are reused across iterations. ``x_squared_norms`` may be None: it is
    then computed only if an empty cluster must be relocated, and the inertia takes
    ``sum_i w_i ||x_i||^2`` from the weighted column sums of squares. With
    ``unit_weights`` (``sample_weight`` all ones, as the caller made it) the M-step
    reads no weights and the column sums of squares use the dataset's cached
    per-row counts.
    """
    dtype = fused.dtype
    n = op.n_rows
    label_buffers = [np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)]
    # The kernel reads float64 weights: convert once, not per iteration.
    weights64 = None if unit_weights else np.asarray(sample_weight, dtype=np.float64)
    centers = centers_init
    labels_old = None
    labels = None
    strict_convergence = False
    for i in range(max_iter):
        labels, best, sums, weights = fused.step(
            centers, weights64, update=True, labels_out=label_buffers[i % 2]
        )
        weight_in_clusters = weights.astype(dtype)
        centers_new = sums.astype(dtype)
        if np.any(weight_in_clusters == 0):
            if x_squared_norms is None:
                x_squared_norms = np.asarray(op.row_sq_norms(), dtype=dtype)
            _relocate_empty_clusters(
                op,
                sample_weight,
                x_squared_norms,
                best,
                np.max(np.abs(best), initial=0.0),
                centers_new,
                weight_in_clusters,
                labels,
            )
        _average_centers(centers_new, weight_in_clusters)
        center_shift_tot = float(((centers_new - centers) ** 2).sum())
        centers = centers_new
        stop = _lloyd_stop(i, labels, labels_old, center_shift_tot, tol)
        if stop:
            strict_convergence = stop == "strict"
            break
        labels_old = labels
    if strict_convergence:
        # The labels of the previous centers, the distances to the new ones.
        _, best, _, _ = fused.step(centers, weights64, update=False, labels_in=labels)
    else:
        labels, best, _, _ = fused.step(
            centers, weights64, update=False, labels_out=label_buffers[0]
        )
    if x_squared_norms is None:
        # sum_i w_i (||x_i||^2 + best_i), each part summed on its own.
        col_weights = None if unit_weights else sample_weight
        norms = float(np.sum(op.col_sq_sums(col_weights), dtype=np.float64))
        inertia = max(norms + float(best @ sample_weight), 0.0)
    else:
        d = x_squared_norms + best
        np.maximum(d, 0, out=d)
        inertia = float(d @ sample_weight)
    return labels.copy(), inertia, centers, i + 1


# ------------------------------------------------------- kernels on a device
# The same algorithm for an operator on a device (CuPy, array_api_strict): every
# n-length array (distances, labels, weights, assignments) stays on the device;
# the centers and the per-cluster sums (n_clusters x n_features) live on the host,
# and only they, a few chosen row indices and scalars cross.


def _partial_sq_distances_xp(op, centers):
    xp = op.xp
    C = asarray_on(centers, xp, op.device)
    centers_sq = asarray_on(row_norms(centers, squared=True), xp, op.device)
    return -2.0 * op.matmul(xp.matrix_transpose(C)) + centers_sq[None, :]


def _sq_distances_xp(op, Y, x_squared_norms):
    xp = op.xp
    Yd = asarray_on(Y, xp, op.device)
    YY = asarray_on(row_norms(Y, squared=True), xp, op.device)
    distances = -2.0 * xp.matrix_transpose(op.matmul(xp.matrix_transpose(Yd)))
    distances = distances + YY[:, None] + x_squared_norms[None, :]
    return xp.maximum(distances, xp.zeros_like(distances))


def _take_rows_xp(op, rows):
    rows = np.asarray(rows, dtype=np.int64)
    return to_numpy(op.take_rows(rows).materialize("dense"))


def _kmeans_plusplus_xp(op, n_clusters, x_squared_norms, sample_weight, random_state):
    """:func:`_kmeans_plusplus` on a device, with the same random stream.

    The first draw repeats ``RandomState.choice(n, p=w / sum(w))`` (a uniform
    variate searched in the normalized cumulative weights) on the device.
    """
    xp, dev = op.xp, op.device
    n_samples, n_features = op.shape
    centers = np.empty((n_clusters, n_features), dtype=op.dtype)
    n_local_trials = 2 + int(np.log(n_clusters))
    cdf = xp.cumulative_sum(sample_weight)
    cdf = cdf / cdf[-1]
    u = asarray_on(
        np.asarray([random_state.random_sample()]), xp, dev, numpy_dtype(cdf.dtype)
    )
    center_id = int(xp.searchsorted(cdf, u, side="right")[0])
    centers[0] = _take_rows_xp(op, [center_id])[0]
    closest_dist_sq = _sq_distances_xp(op, centers[0:1], x_squared_norms)[0, :]
    current_pot = float(xp.sum(closest_dist_sq * sample_weight))
    last = n_samples - 1
    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        cum = xp.cumulative_sum(sample_weight * closest_dist_sq)
        ids = xp.searchsorted(
            cum, asarray_on(rand_vals, xp, dev, numpy_dtype(cum.dtype))
        )
        candidate_ids = np.minimum(to_numpy(ids), last)
        candidates = _take_rows_xp(op, candidate_ids)
        dist = _sq_distances_xp(op, candidates, x_squared_norms)
        dist = xp.minimum(closest_dist_sq[None, :], dist)
        # A product, not a sum along axis 1: CuPy reduces each of the few long
        # rows in one thread block (7 ms per call at 1e7 rows, against 0.1 ms).
        candidates_pot = to_numpy(dist @ sample_weight)
        best = int(np.argmin(candidates_pot))
        current_pot = float(candidates_pot[best])
        closest_dist_sq = dist[best, :]
        centers[c] = candidates[best]
    return centers


def _row_distances_xp(xp, x_squared_norms, partial, labels):
    chosen = xp.take_along_axis(partial, labels[:, None], axis=1)[:, 0]
    d = x_squared_norms + chosen
    return xp.maximum(d, xp.zeros_like(d))


def _lloyd_iter_xp(op, sample_weight, centers, x_squared_norms, update_centers=True):
    """:func:`_lloyd_iter` on a device; labels and partial distances stay there."""
    xp = op.xp
    n_clusters = centers.shape[0]
    partial = _partial_sq_distances_xp(op, centers)
    labels = xp.argmin(partial, axis=1)
    if not update_centers:
        return labels, partial, None, None
    clusters = xp.arange(n_clusters, device=op.device)
    assignment = xp.astype(labels[:, None] == clusters[None, :], partial.dtype)
    assignment = assignment * sample_weight[:, None]
    weight_in_clusters = to_numpy(sum_axis0(assignment, xp)).astype(centers.dtype)
    centers_new = np.ascontiguousarray(
        to_numpy(op.rmatmul(assignment)).T, dtype=centers.dtype
    )
    empty = np.flatnonzero(weight_in_clusters == 0)
    if empty.shape[0]:
        distances = _row_distances_xp(xp, x_squared_norms, partial, labels)
        scale = float(xp.max(x_squared_norms)) + float(xp.max(xp.abs(partial)))
        eps = np.finfo(centers.dtype).eps
        if float(xp.max(distances)) > 8 * (op.n_cols + 2) * eps * scale:
            n_empty = empty.shape[0]
            far = xp.argsort(distances, descending=True, stable=True)[:n_empty]
            far_np = to_numpy(far)
            far_rows = _take_rows_xp(op, far_np)
            weights = to_numpy(xp.take(sample_weight, far))
            old = to_numpy(xp.take(labels, far))
            for idx in range(n_empty):
                new_id, old_id, w = empty[idx], old[idx], weights[idx]
                centers_new[old_id] -= far_rows[idx] * w
                centers_new[new_id] = far_rows[idx] * w
                weight_in_clusters[new_id] = w
                weight_in_clusters[old_id] -= w
    _average_centers(centers_new, weight_in_clusters)
    center_shift = np.sqrt(((centers_new - centers) ** 2).sum(axis=1))
    return labels, partial, centers_new, center_shift


def _inertia_xp(xp, x_squared_norms, partial, labels, sample_weight):
    d = _row_distances_xp(xp, x_squared_norms, partial, labels)
    return float(xp.sum(d * sample_weight))


def _kmeans_single_lloyd_xp(
    op, sample_weight, centers_init, x_squared_norms, max_iter, tol
):
    """:func:`_kmeans_single_lloyd` on a device."""
    xp = op.xp
    centers = centers_init
    labels_old = None
    strict_convergence = False
    n_iter = 0
    for n_iter in range(1, max_iter + 1):  # noqa: B007 (used after the loop)
        labels, _, centers, center_shift = _lloyd_iter_xp(
            op, sample_weight, centers, x_squared_norms
        )
        if labels_old is not None and bool(xp.all(labels == labels_old)):
            strict_convergence = True
            break
        if float((center_shift**2).sum()) <= tol:
            break
        labels_old = labels
    if strict_convergence:
        partial = _partial_sq_distances_xp(op, centers)
    else:
        labels, partial, _, _ = _lloyd_iter_xp(
            op, sample_weight, centers, x_squared_norms, update_centers=False
        )
    inertia = _inertia_xp(xp, x_squared_norms, partial, labels, sample_weight)
    return labels, inertia, centers, n_iter


def _is_same_clustering_xp(xp, labels1, labels2, n_clusters):
    """:func:`_is_same_clustering` on a device, from the (k, k) contingency table."""
    clusters = xp.arange(n_clusters, device=device_of(labels1))
    A = xp.astype(labels1[:, None] == clusters[None, :], xp.float64)
    B = xp.astype(labels2[:, None] == clusters[None, :], xp.float64)
    table = to_numpy(xp.matrix_transpose(A) @ B)
    return bool(np.all((table > 0).sum(axis=1) <= 1))


def _is_same_clustering(labels1, labels2):
    """Whether ``labels1`` maps to ``labels2`` by a function (scikit-learn's test)."""
    pairs = np.unique(np.stack([labels1, labels2]), axis=1)
    return pairs.shape[1] == np.unique(pairs[0]).shape[0]


# ------------------------------------------------------------------------ estimator
class FactorizedKMeans(
    DeviceMixin,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    ClusterMixin,
    BaseEstimator,
):
    """K-Means clustering (Lloyd) on a multi-source dataset without building the join.

    Parameters
    ----------
    n_clusters : int, default=8
        The number of clusters and of centers.
    init : {"k-means++", "random"} or array-like of shape (n_clusters, n_features), \
            default="k-means++"
        Initialization: greedy k-means++ (as scikit-learn), ``n_clusters`` rows drawn
        at random (with probability proportional to ``sample_weight``), or the
        initial centers.
    n_init : "auto" or int, default="auto"
        Number of runs with different seeds; the run with the lowest inertia is
        kept. "auto" means 1 for "k-means++" and an array, 10 for "random".
    max_iter : int, default=300
        Maximum number of Lloyd iterations of one run.
    tol : float, default=1e-4
        Convergence tolerance on the squared shift of the centers, relative to the
        mean variance of the features.
    random_state : int, RandomState instance or None, default=None
        Seeds the initialization.
    strategy : {"factorized", "materialized"}, default="factorized"
        For a :class:`~ilargi_sklearn.MultiSourceDataset`: compute on the sources
        ("factorized") or on the joined matrix built once ("materialized"). Arrays
        are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and the predictions compute: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). On a device the n-length arrays (distances, labels, weights, the
        one-hot assignment) stay there; the centers, the per-cluster sums and the
        k-means++ bookkeeping (candidate indices, potentials) run on the host.
        ``cluster_centers_`` and ``labels_`` stay where the fit ran;
        ``predict``/``transform`` return the caller's array type; pickles hold
        NumPy arrays. "gpu" without a usable GPU raises a ``RuntimeError`` with the
        probe's reason. A materialized dense plan on the GPU is fitted by cuML's
        ``KMeans`` when cuML is installed (its seeding differs: "k-means++"
        becomes k-means||).

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        The centers.
    labels_ : ndarray of int32 of shape (n_samples,)
        Cluster of each training row.
    inertia_ : float
        Weighted sum of squared distances of the rows to their center.
    n_iter_ : int
        Lloyd iterations of the kept run.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.cluster.KMeans : The scikit-learn estimator this one reproduces.
    FactorizedGNMF : Factorized non-negative matrix factorization.

    Notes
    -----
    With ``T = sum_k I_k S_k M_k^T`` the joined matrix, one Lloyd iteration is

    * distances ``D = rowSqNorms(T) 1^T - 2 T C^T + 1 ||C||^2``: one factorized
      ``T @ C^T`` (``n_clusters`` columns); the arg-min is row-wise and does not
      need ``rowSqNorms(T)``;
    * centers ``C = diag(1 / counts) (T^T A)`` with ``A`` the weighted one-hot
      assignment: one factorized ``T^T @ A``.

    The squared row norms (for the inertia and k-means++) and the column variances
    (for ``tol``) are computed once from the sources. Dense data are centered
    implicitly (an affine operator, as scikit-learn subtracts the mean for
    accuracy); sparse data are not. Empty clusters are relocated to the rows
    farthest from their centers, as in scikit-learn, whose distances come from the
    E-step; only those rows and the k-means++ candidates are ever extracted.

    With the same initial centers (``init=array``) the labels, centers and inertia
    equal those of ``sklearn.cluster.KMeans(algorithm="lloyd", n_init=1)`` on the
    joined matrix up to rounding.

    With numba (a default dependency) and dense or CSR sources,
    the Lloyd iterations run as compiled passes over the index vectors (per row:
    the base row's dot products, one table lookup per joined source, arg-min), on as
    many threads as scikit-learn's OpenMP setting allows.

    References
    ----------
    Sun, Hai et al., "Ilargi: a GPU compatible factorized ML model training
    framework", 2025.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.cluster import FactorizedKMeans
    >>> base = np.array([[0.0], [0.1], [10.0], [10.1]])
    >>> dim = np.array([[0.0, 0.0], [5.0, 5.0]])
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, np.array([0, 0, 1, 1])])
    >>> km = FactorizedKMeans(n_clusters=2, random_state=0).fit(ds)
    >>> sorted(np.bincount(km.labels_).tolist())
    [2, 2]
    >>> km.cluster_centers_[np.argsort(km.cluster_centers_[:, 0])].round(2)
    array([[ 0.05,  0.  ,  0.  ],
           [10.05,  5.  ,  5.  ]])
    """

    _parameter_constraints: dict = {
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "init": [StrOptions({"k-means++", "random"}), "array-like"],
        "n_init": [StrOptions({"auto"}), Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        "strategy": [StrOptions({"factorized", "materialized"})],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        n_clusters=8,
        *,
        init="k-means++",
        n_init="auto",
        max_iter=300,
        tol=1e-4,
        random_state=None,
        strategy="factorized",
        device="auto",
    ):
        self.n_clusters = n_clusters
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.strategy = strategy
        self.device = device

    # ----------------------------------------------------------------- helpers
    def _init_is_array(self):
        return not isinstance(self.init, str)

    def _resolve_n_init(self):
        if self.n_init == "auto":
            n_init = 10 if (isinstance(self.init, str) and self.init == "random") else 1
        else:
            n_init = self.n_init
        if self._init_is_array() and n_init != 1:
            warnings.warn(
                "Explicit initial center position passed: performing only one init "
                f"in {type(self).__name__} instead of n_init={n_init}.",
                RuntimeWarning,
                stacklevel=3,
            )
            n_init = 1
        return n_init

    def _check_init_array(self, n_features, dtype):
        init = check_array(self.init, dtype=dtype, copy=True, order="C")
        if init.shape[0] != self.n_clusters:
            raise ValueError(
                f"The shape of the initial centers {init.shape} does not match the "
                f"number of clusters {self.n_clusters}."
            )
        if init.shape[1] != n_features:
            raise ValueError(
                f"The shape of the initial centers {init.shape} does not match the "
                f"number of features of the data {n_features}."
            )
        return init

    def _init_centroids(self, op, x_squared_norms, init, random_state, sample_weight):
        if isinstance(init, str) and init == "k-means++":
            centers, _ = _kmeans_plusplus(
                op, self.n_clusters, x_squared_norms, sample_weight, random_state
            )
            return centers
        if isinstance(init, str) and init == "random":
            seeds = random_state.choice(
                op.n_rows,
                size=self.n_clusters,
                replace=False,
                p=sample_weight / sample_weight.sum(),
            )
            return _take_dense_rows(op, seeds).astype(op.dtype, copy=False)
        return init.copy()

    def _check_sample_weight(self, sample_weight, op):
        # A zero-width stand-in: only the number of rows and the dtype are used.
        return _check_sample_weight(
            sample_weight, np.empty((op.n_rows, 0), dtype=op.dtype), dtype=op.dtype
        )

    def _fit(self, X, sample_weight):
        op = validate_X(self, X, reset=True, strategy=self.strategy, device=self.device)
        xp = op.xp
        on_device = not is_numpy_namespace(xp)
        if on_device and sample_weight is not None and hasattr(sample_weight, "shape"):
            sample_weight = to_numpy(sample_weight)
        n_samples, n_features = op.shape
        if n_samples < self.n_clusters:
            raise ValueError(
                f"n_samples={n_samples} should be >= n_clusters={self.n_clusters}."
            )
        tol = _tolerance(op, self.tol)
        n_init = self._resolve_n_init()
        random_state = check_random_state(self.random_state)
        unit_weights = sample_weight is None
        if on_device and sample_weight is None:
            # Unit weights made where they are used (no n-length upload).
            sample_weight = xp.ones(
                n_samples, dtype=namespace_dtype(xp, op.dtype), device=op.device
            )
        else:
            sample_weight = self._check_sample_weight(sample_weight, op)
            if on_device:
                sample_weight = asarray_on(sample_weight, xp, op.device)

        init = self.init
        if self._init_is_array():
            init = self._check_init_array(n_features, op.dtype)
        if use_cuml(op, self.strategy):
            # cuML's Lloyd on the materialized GPU matrix (_backend._cuml).
            fitted = fit_cuml(
                "kmeans",
                op,
                None,
                sample_weight,
                n_clusters=self.n_clusters,
                init=init,
                n_init=n_init,
                max_iter=self.max_iter,
                tol=self.tol,
                random_state=random_state,
            )
            for name, value in fitted.items():
                setattr(self, name, value)
            self._n_features_out = self.n_clusters
            return op

        # Subtract the mean of dense data for accurate distances, implicitly (as
        # scikit-learn does explicitly); sparse data stay uncentered.
        x_mean = None
        fit_op = op
        if not op.is_sparse:
            col_sums = np.asarray(to_numpy(op.col_sums()), dtype=np.float64)
            x_mean = (col_sums / n_samples).astype(op.dtype)
            fit_op = AffineOperator(op, offset=x_mean)
            if self._init_is_array():
                init -= x_mean
        if on_device:
            x_squared_norms = fit_op.row_sq_norms()
            best_labels, best_centers, best_inertia, best_n_iter = self._fit_xp(
                fit_op, x_squared_norms, init, random_state, sample_weight, n_init, tol
            )
            n_init = 0
        else:
            best_inertia, best_labels = None, None
        fused = None if on_device else _fused_lloyd_plan(fit_op, self.n_clusters)
        if not on_device:
            # The row norms (a pass over the sources, 4-5 ms at 2e5 rows) are read
            # by k-means++ and the NumPy iteration; the compiled one needs them
            # only to relocate an empty cluster (it computes them then).
            x_squared_norms = None
            if fused is None or not self._init_is_array():
                x_squared_norms = np.asarray(fit_op.row_sq_norms(), dtype=op.dtype)
        for _ in range(n_init):
            centers_init = self._init_centroids(
                fit_op, x_squared_norms, init, random_state, sample_weight
            )
            if fused is not None:
                try:
                    # BLAS on one thread, as in scikit-learn's KMeans: the passes
                    # run on the kernels' threads, and BLAS's threads cost more
                    # than they save on the small per-iteration tables (1e6 rows:
                    # 0.47 against 0.57 s; beside a busy core 0.60 against 0.63 s).
                    with one_blas_thread():
                        labels, inertia, centers, n_iter = _kmeans_single_lloyd_fused(
                            fused,
                            fit_op,
                            sample_weight,
                            centers_init,
                            x_squared_norms,
                            self.max_iter,
                            tol,
                            unit_weights,
                        )
                except CompiledUnavailable:
                    fused = None  # the same run on the NumPy kernels, below
            if fused is None:
                if x_squared_norms is None:
                    x_squared_norms = np.asarray(fit_op.row_sq_norms(), dtype=op.dtype)
                labels, inertia, centers, n_iter = _kmeans_single_lloyd(
                    fit_op,
                    sample_weight,
                    centers_init,
                    x_squared_norms,
                    self.max_iter,
                    tol,
                )
            if best_inertia is None or (
                inertia < best_inertia and not _is_same_clustering(labels, best_labels)
            ):
                best_labels, best_centers = labels, centers
                best_inertia, best_n_iter = inertia, n_iter

        if x_mean is not None:
            best_centers = best_centers + x_mean

        if on_device:
            counts = to_numpy(
                xp.sum(
                    xp.astype(
                        best_labels[:, None]
                        == xp.arange(self.n_clusters, device=op.device)[None, :],
                        xp.int64,
                    ),
                    axis=0,
                )
            )
        else:
            # A count per cluster (np.unique sorts the n labels: 2 ms at 2e5).
            counts = np.bincount(best_labels, minlength=self.n_clusters)
        distinct_clusters = int(np.count_nonzero(counts))
        if distinct_clusters < self.n_clusters:
            warnings.warn(
                f"Number of distinct clusters ({distinct_clusters}) found smaller than "
                f"n_clusters ({self.n_clusters}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
                stacklevel=3,
            )

        self._n_features_out = best_centers.shape[0]
        if on_device:
            # Fitted attributes stay where the fit ran.
            best_centers = asarray_on(best_centers, xp, op.device)
            best_labels = xp.astype(best_labels, xp.int32)
        self.cluster_centers_ = best_centers
        self.labels_ = best_labels
        self.inertia_ = best_inertia
        self.n_iter_ = best_n_iter
        return op

    def _fit_xp(
        self, op, x_squared_norms, init, random_state, sample_weight, n_init, tol
    ):
        """The ``n_init`` runs on a device (see the kernels ``*_xp``)."""
        xp = op.xp
        best_inertia = best_labels = best_centers = best_n_iter = None
        for _ in range(n_init):
            if isinstance(init, str) and init == "k-means++":
                centers_init = _kmeans_plusplus_xp(
                    op, self.n_clusters, x_squared_norms, sample_weight, random_state
                )
            elif isinstance(init, str):
                # "random": drawn on the host from the normalized weights (one
                # n-length copy per run, as RandomState.choice needs them).
                w = to_numpy(sample_weight)
                seeds = random_state.choice(
                    op.n_rows, size=self.n_clusters, replace=False, p=w / w.sum()
                )
                centers_init = _take_rows_xp(op, seeds).astype(op.dtype, copy=False)
            else:
                centers_init = init.copy()
            labels, inertia, centers, n_iter = _kmeans_single_lloyd_xp(
                op, sample_weight, centers_init, x_squared_norms, self.max_iter, tol
            )
            if best_inertia is None or (
                inertia < best_inertia
                and not _is_same_clustering_xp(xp, labels, best_labels, self.n_clusters)
            ):
                best_labels, best_centers = labels, centers
                best_inertia, best_n_iter = inertia, n_iter
        return best_labels, best_centers, best_inertia, best_n_iter

    def _transform(self, op):
        xp = op.xp
        if not is_numpy_namespace(xp):
            centers = np.asarray(to_numpy(self.cluster_centers_), dtype=op.dtype)
            d = _sq_distances_xp(op, centers, op.row_sq_norms())
            return xp.sqrt(xp.matrix_transpose(d))
        centers = to_numpy(self.cluster_centers_).astype(np.float64, copy=False)
        d = -2.0 * op.matmul(np.ascontiguousarray(centers.T))
        d += np.asarray(op.row_sq_norms(), dtype=np.float64)[:, np.newaxis]
        d += row_norms(centers, squared=True)[np.newaxis, :]
        np.maximum(d, 0, out=d)
        return np.sqrt(d, out=d).astype(op.dtype, copy=False)

    # ------------------------------------------------------------- public API
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Compute k-means clustering.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training rows.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each row (unused by an array ``init``).

        Returns
        -------
        self : FactorizedKMeans
            Fitted estimator.
        """
        self._fit(X, sample_weight)
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """Fit and return the cluster of each training row.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training rows.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each row.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Index of the cluster each row belongs to.
        """
        xp_in, device_in = input_namespace(X)
        labels = self.fit(X, sample_weight=sample_weight).labels_
        return _to_caller(labels, get_namespace(labels), xp_in, device_in)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None, sample_weight=None):
        """Fit and return the distances of the training rows to the centers.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training rows.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each row.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_clusters)
            Euclidean distance of each row to each center.
        """
        xp_in, device_in = input_namespace(X)
        op = self._fit(X, sample_weight)
        return _to_caller(self._transform(op), op.xp, xp_in, device_in)

    def predict(self, X):
        """Return the closest center of each row.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Rows to assign.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Index of the cluster each row belongs to.
        """
        check_is_fitted(self)
        xp_in, device_in = input_namespace(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        centers = to_numpy(self.cluster_centers_).astype(op.dtype, copy=False)
        if not is_numpy_namespace(op.xp):
            partial = _partial_sq_distances_xp(op, centers)
            labels = op.xp.astype(op.xp.argmin(partial, axis=1), op.xp.int32)
            return _to_caller(labels, op.xp, xp_in, device_in)
        sample_weight = np.ones(op.n_rows, dtype=op.dtype)
        labels = _labels_inertia(op, sample_weight, centers, return_inertia=False)
        return _to_caller(labels, op.xp, xp_in, device_in)

    def transform(self, X):
        """Euclidean distances of the rows to the centers.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Rows to transform.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_clusters)
            Distance of each row to each center.
        """
        check_is_fitted(self)
        xp_in, device_in = input_namespace(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        return _to_caller(self._transform(op), op.xp, xp_in, device_in)

    def score(self, X, y=None, sample_weight=None):
        """Opposite of the inertia of ``X`` with respect to the centers.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Rows to score.
        y : Ignored
            Not used, present for API consistency.
        sample_weight : array-like of shape (n_samples,), default=None
            Weight of each row.

        Returns
        -------
        score : float
            Minus the weighted sum of squared distances to the closest center.
        """
        check_is_fitted(self)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        xp = op.xp
        centers = to_numpy(self.cluster_centers_).astype(op.dtype, copy=False)
        if not is_numpy_namespace(xp):
            if sample_weight is not None and hasattr(sample_weight, "shape"):
                sample_weight = to_numpy(sample_weight)
            sw = asarray_on(self._check_sample_weight(sample_weight, op), xp, op.device)
            partial = _partial_sq_distances_xp(op, centers)
            labels = xp.argmin(partial, axis=1)
            return -_inertia_xp(xp, op.row_sq_norms(), partial, labels, sw)
        sample_weight = self._check_sample_weight(sample_weight, op)
        _, inertia = _labels_inertia(op, sample_weight, centers)
        return -inertia

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


def _to_caller(out, xp, xp_in, device_in):
    """``out`` (computed in ``xp``) in the caller's namespace and on its device."""
    if xp is xp_in or (is_numpy_namespace(xp) and is_numpy_namespace(xp_in)):
        return out
    return asarray_on(out, xp_in, device_in)
