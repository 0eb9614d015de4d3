"""Sufficient statistics of the gram-based estimators: the implicitly centered gram.

Least squares, ridge, the coordinate-descent models and PCA all start from the same
figures of a weighted design: ``T^T S T``, its column sums and (for the supervised
models) ``T^T S Y``. They are computed here once, through the operator protocol, so
the data are never centered (sparsity and factorization survive) and every estimator
centers the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from ilargi_sklearn._backend._namespace import asarray_on, namespace_dtype, to_numpy
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.multisource import _stats_cache
from ilargi_sklearn.multisource._stats_cache import _STATS, digest

logger = logging.getLogger(__name__)


def host64(a: Any) -> np.ndarray:
    """A parameter-sized array of any namespace as float64 NumPy."""
    return np.asarray(to_numpy(a), dtype=np.float64)


@dataclass(frozen=True)
class GramStats:
    """The centered gram of ``T`` under weights ``s``, on the host in float64.

    With ``s_sum = sum(s)`` and the weighted column means ``mu = s^T T / s_sum``
    (zero without an intercept), ``G = T^T S T - s_sum mu mu^T`` (symmetrized) and
    ``rhs = T^T S Y - mu (s^T Y)``.

    Attributes
    ----------
    G : ndarray of shape (n_features, n_features) or None
        Centered gram (None when it was not formed: ``centered_gram(gram=False)``).
    D : ndarray of shape (n_features,) or None
        Diagonal of the uncentered gram: the scale of the rounding errors of ``G``
        (an entry carries about ``eps * sqrt(D_i D_j)``, which centering keeps).
    mu : ndarray of shape (n_features,)
        Weighted column means (zeros when not centered).
    sw_sum : float
        Sum of the weights (``n_samples`` without weights).
    rhs : ndarray of shape (n_features, n_targets) or None
        Centered ``T^T S Y``.
    y_mean : ndarray of shape (n_targets,) or None
        Weighted target means (zeros when not centered).
    y_sq_norm : ndarray of shape (n_targets,) or None
        ``sum_i s_i y_i^2`` per target (uncentered).
    """

    G: np.ndarray | None
    D: np.ndarray | None
    mu: np.ndarray
    sw_sum: float
    rhs: np.ndarray | None = None
    y_mean: np.ndarray | None = None
    y_sq_norm: np.ndarray | None = None

    @property
    def y_var(self) -> np.ndarray | None:
        """Centered ``sum_i s_i (y_i - y_mean)^2`` per target."""
        if self.y_sq_norm is None:
            return None
        return np.maximum(self.y_sq_norm - self.sw_sum * self.y_mean**2, 0.0)


def centered_gram(
    op: Any,
    sample_weight: Any = None,
    fit_intercept: bool = True,
    Y: Any = None,
    *,
    gram: bool = True,
) -> GramStats:
    """The :class:`GramStats` of ``op`` (and of a target ``Y``, where ``op`` lives).

    When ``op`` came from a :class:`~ilargi_sklearn.MultiSourceDataset` (through
    ``validate_X``), its raw sums are cached on the dataset's lineage (see
    :func:`~ilargi_sklearn.multisource.set_statistics_cache`): the
    candidates of a grid search compute each fold's statistics once. A cached entry
    gives bit for bit what computing does, except a downdated gram (a training
    fold's gram as the root's minus the test rows', :func:`_downdated_sums`),
    which agrees to rounding (guarded, within the estimators' 1e-8).

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    fit_intercept : bool
        Center (implicitly) or not.
    Y : array of shape (n_samples, n_targets), float64, or None
        Where ``op`` lives.
    gram : bool, default=True
        False: the same statistics without the gram (``G`` and ``D`` are None),
        for the iterative solvers that only need the means and ``T^T S Y``
        (one ``col_sums`` and one ``rmatmul`` pass, no ``gram``).
    """
    xs, ys = _raw_sums(op, sample_weight, Y, gram, col_sums=fit_intercept)
    return _centered(xs, ys, fit_intercept, gram, op.n_cols)


def _raw_sums(
    op: Any, sample_weight: Any, Y: Any, gram: bool, col_sums: bool
) -> tuple[_XSums, _YSums | None]:
    """The raw sums of ``op`` (and ``Y``), from the cache where ``op`` has a
    lineage (the cached ones always carry the column sums)."""
    lineage = _stats_cache.lineage_of(op) if _STATS.max_bytes > 0 else None
    if lineage is None:
        xs = _x_sums(op, sample_weight, gram, col_sums=col_sums)
        ys = None if Y is None else _y_sums(op, sample_weight, Y)
        return xs, ys
    w_key = _stats_cache.UNIT if sample_weight is None else digest(sample_weight)
    xs = _cached_x_sums(op, lineage, sample_weight, w_key, gram)
    ys = None
    if Y is not None:
        ys = _STATS.get_or_compute(
            lineage.key() + ("Y", w_key, digest(Y)),
            _accept_any,
            lambda: _sized(_y_sums(op, sample_weight, Y)),
            "target sums",
        )
    return xs, ys


@dataclass(frozen=True)
class _XSums:
    """Additive raw sums of a design: ``sum s``, ``s^T T`` and ``T^T S T``.

    Host float64; ``col_sums`` None when not computed (no intercept, no cache),
    ``gram`` None when not asked for.
    """

    sw_sum: float
    col_sums: np.ndarray | None
    gram: np.ndarray | None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.col_sums, self.gram) if a is not None)


@dataclass(frozen=True)
class _YSums:
    """Additive raw sums of a target: ``T^T S Y``, ``s^T Y`` and ``sum s y^2``."""

    TtSY: np.ndarray
    sy: np.ndarray
    syy: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.TtSY.nbytes + self.sy.nbytes + self.syy.nbytes


def _accept_any(_: Any) -> bool:
    return True


def _has_gram(sums: _XSums) -> bool:
    return sums.gram is not None


def _sized(sums: Any) -> tuple[Any, int]:
    return sums, sums.nbytes


def _x_sums(op: Any, sample_weight: Any, gram: bool, col_sums: bool) -> _XSums:
    if sample_weight is None:
        sw_sum = float(op.n_rows)
    else:
        sw_sum = float(op.xp.sum(sample_weight))
    cs = host64(op.col_sums(sample_weight)) if col_sums else None
    G = host64(op.gram(sample_weight, format="dense")) if gram else None
    return _XSums(sw_sum, cs, G)


def _y_sums(op: Any, sample_weight: Any, Y: Any) -> _YSums:
    xp = op.xp
    SY = Y if sample_weight is None else Y * sample_weight[:, None]
    xdt = namespace_dtype(xp, op.dtype)
    TtSY = host64(op.rmatmul(xp.astype(SY, xdt, copy=False)))
    return _YSums(TtSY, host64(sum_axis0(SY, xp)), host64(sum_axis0(SY * Y, xp)))


def _centered(
    xs: _XSums, ys: _YSums | None, fit_intercept: bool, gram: bool, n_features: int
) -> GramStats:
    """Center the raw sums. Always fresh arrays: a cached entry is never handed
    out (a caller may change what it gets in place)."""
    sw_sum = xs.sw_sum
    if fit_intercept:
        mu = xs.col_sums / sw_sum
    else:
        mu = np.zeros(n_features)
    G = D = None
    if gram:
        G = xs.gram
        D = np.diag(G).copy()
        if fit_intercept:
            G = G - sw_sum * np.outer(mu, mu)
        G = 0.5 * (G + G.T)
    if ys is None:
        return GramStats(G, D, mu, sw_sum)
    rhs = ys.TtSY
    if fit_intercept:
        y_mean = ys.sy / sw_sum
        rhs = rhs - np.outer(mu, sw_sum * y_mean)
    else:
        y_mean = np.zeros(ys.sy.shape[0])
        rhs = rhs.copy()
    return GramStats(G, D, mu, sw_sum, rhs, y_mean, ys.syy.copy())


def _cached_x_sums(
    op: Any, lineage: Any, sample_weight: Any, w_key: str, gram: bool
) -> _XSums:
    def compute() -> tuple[_XSums, int]:
        sums = None
        if gram and sample_weight is None:
            sums = _downdated_sums(lineage)
        if sums is None:
            # Column sums always: the entry then serves fits with and without an
            # intercept (one cheap pass next to the gram's).
            sums = _x_sums(op, sample_weight, gram, col_sums=True)
        return _sized(sums)

    return _STATS.get_or_compute(
        lineage.key() + ("X", w_key),
        _has_gram if gram else _accept_any,
        compute,
        "gram" if gram else "column sums",
    )


# A downdated gram is used only when the test rows carry at most this share of
# every column's squared mass (the root's gram diagonal): the rounding error of the
# difference, about eps * (D_root + D_test), then stays within 3 * eps * D_train,
# well inside the 100 * eps * D that the solvers treat as noise (``_GRAM_NOISE``).
_MAX_TEST_MASS = 0.5
# The root's pass is taken for slices of at least this share of it: K-fold training
# folds with K >= 4. Taken at the second fold, it costs that fold 1 + (1 - share)
# passes instead of share, 2 - 2 share more, and saves 2 share - 1 on each later
# fold: at 3/4 the next fold recovers it. The folds of a nested search
# (cross-validation inside a 75% training split: 0.6 of the root) would need four.
_ROOT_PASS_SHARE = 0.75


def _downdated_sums(lineage: Any) -> _XSums | None:
    """The unit-weight sums of a row slice as its root's minus the other rows'.

    A K-fold search then costs about two passes over the data instead of K: the
    root once, and each fold's test rows. Used for factorized operators of a slice
    with at least half of its root's rows (its test rows are then the smaller
    pass) when the root's sums are cached; the root's sums are computed when a
    second distinct slice of at least ``_ROOT_PASS_SHARE`` of the root is fitted,
    where the pass pays for itself over the folds still to come. A single fit on a
    slice never pays for a pass over the root. None where it does not apply or
    where the guard refuses: the caller computes directly.

    The guard: every column of the test rows carries at most ``_MAX_TEST_MASS`` of
    the root's squared mass, and the centered downdated gram is conditioned well
    enough that the difference's rounding (``eps * max(D_root)``) moves a solution
    by less than ``0.01 * sqrt(eps)`` relative (LAPACK's condition estimate of its
    Cholesky factor; a singular gram is computed directly).
    """
    rows, n_root = lineage.rows, lineage.n_root
    if (
        lineage.strategy != "factorized"
        or lineage.variant
        or rows is None
        or 2 * rows.shape[0] < n_root
    ):
        return None
    root_op = lineage.root
    if root_op is None:
        return None
    root_key = lineage.key(_stats_cache.ROOT) + ("X", _stats_cache.UNIT)
    n_large = 0
    if rows.shape[0] >= _ROOT_PASS_SHARE * n_root:
        n_large = _STATS.note_large_slice(lineage.token, lineage.rows_key)
    root = _STATS.peek(root_key, _has_gram)
    if root is None:
        if n_large < 2:
            return None
        root = _STATS.get_or_compute(
            root_key,
            _has_gram,
            lambda: _sized(_x_sums(root_op, None, True, col_sums=True)),
            "root gram",
        )
    test = np.ones(n_root, dtype=bool)
    test[rows] = False
    n_test = int(np.count_nonzero(test))
    if n_test != n_root - rows.shape[0]:
        return None  # repeated rows (a bootstrap): not a complement
    tsums = _x_sums(root_op.take_rows(np.flatnonzero(test)), None, True, col_sums=True)
    sums, reason = _difference(root, tsums, np.dtype(lineage.dtype))
    if reason is not None:
        _STATS.count(lineage.token, "fallbacks")
        logger.debug(
            "statistics cache: no downdating for %d of %d rows (%s): computing "
            "directly.",
            rows.shape[0],
            n_root,
            reason,
        )
        return None
    _STATS.count(lineage.token, "downdates")
    logger.debug(
        "statistics cache downdate: %d rows = %d root rows - %d test rows.",
        rows.shape[0],
        n_root,
        n_test,
    )
    return sums


def _difference(
    root: _XSums, part: _XSums, dtype: Any
) -> tuple[_XSums | None, str | None]:
    """``root - part`` (the sums of the other rows), or None and why the guard
    refused it: ``part`` carries more than ``_MAX_TEST_MASS`` of a column's
    squared mass, or the difference's centered gram is too ill-conditioned for
    its rounding (``eps * max(D_root)``, ``eps`` of ``dtype``)."""
    eps = float(np.finfo(dtype).eps)
    D_root = np.diag(root.gram)
    if not np.all(np.diag(part.gram) <= _MAX_TEST_MASS * D_root):
        return None, "the test rows carry most of a column's mass"
    sums = _XSums(
        root.sw_sum - part.sw_sum,
        root.col_sums - part.col_sums,
        root.gram - part.gram,
    )
    error = _downdating_error(sums, eps * float(np.max(D_root, initial=0.0)))
    if not error <= 0.01 * np.sqrt(eps):
        return None, f"the gram is ill-conditioned (error bound {error:.2g})"
    return sums, None


def _downdating_error(sums: _XSums, noise: float) -> float:
    """Relative error bound that an absolute ``noise`` on the gram's entries
    causes in a solve with the centered gram (inf where it is singular).

    The centered gram is the smallest one a solver sees (the uncentered one adds
    ``s_sum mu mu^T``, positive semi-definite), so its bound covers both.
    """
    mu = sums.col_sums / sums.sw_sum
    G = sums.gram - sums.sw_sum * np.outer(mu, mu)
    G = 0.5 * (G + G.T)
    if G.shape[0] == 0 or noise == 0.0:
        return 0.0
    anorm = float(np.abs(G).sum(axis=0).max())
    if not (anorm > 0 and np.all(np.isfinite(G))):
        return np.inf
    try:
        c, _ = scipy.linalg.cho_factor(G, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return np.inf
    rc, info = scipy.linalg.lapack.dpocon(c, anorm, uplo="L")
    if info != 0 or not rc > 0:
        return np.inf
    # ||G^-1|| ~ 1 / (anorm rc): the error of a solve is noise * ||G^-1||.
    return noise / (anorm * rc)


class FoldStatistics:
    """The statistics of a K-fold cross-validation of one design, in about two
    passes over the rows instead of K.

    The raw sums of all rows are computed once (from the cache where ``op`` has a
    lineage: the refit on all rows then finds them); per fold, the test rows'
    directly (the smaller pass) and the training rows' as their difference, under
    the guard of :func:`_difference` (and the same bound on the targets' squared
    mass), falling back to the training rows' own pass where it refuses. The
    cross-validated estimators use it: they visit every fold and fit on all rows,
    so the pass over all rows is always paid for.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    Y : array of shape (n_samples, n_targets), float64
        Where ``op`` lives.
    fit_intercept : bool
    """

    def __init__(self, op: Any, sample_weight: Any, Y: Any, fit_intercept: bool):
        self.op, self.sample_weight, self.Y = op, sample_weight, Y
        self.fit_intercept = fit_intercept
        self._all = _raw_sums(op, sample_weight, Y, True, col_sums=True)
        #: Folds whose training statistics were computed directly (the guard).
        self.fallbacks = 0

    @property
    def all_rows(self) -> GramStats:
        """The centered statistics of all rows."""
        return _centered(*self._all, self.fit_intercept, True, self.op.n_cols)

    def fold(self, train: np.ndarray, test: np.ndarray) -> Fold:
        """The fold with host indices ``train`` and ``test`` (a partition of the
        rows: otherwise its training rows are computed directly)."""
        op, xp, device = self.op, self.op.xp, self.op.device
        test_d = asarray_on(test, xp, device)
        test_op = op.take_rows(test_d)
        Y_test = xp.take(self.Y, test_d, axis=0)
        sw_test = _take(self.sample_weight, test_d, xp)
        txs = _x_sums(test_op, sw_test, True, col_sums=True)
        tys = _y_sums(test_op, sw_test, Y_test)
        train_sums = None
        if train.shape[0] + test.shape[0] == op.n_rows:
            train_sums = self._difference(txs, tys, train, test)
        if train_sums is None:
            train_d = asarray_on(train, xp, device)
            train_op = op.take_rows(train_d)
            sw_train = _take(self.sample_weight, train_d, xp)
            train_sums = (
                _x_sums(train_op, sw_train, True, col_sums=True),
                _y_sums(train_op, sw_train, xp.take(self.Y, train_d, axis=0)),
            )
        n = op.n_cols
        return Fold(
            _centered(*train_sums, self.fit_intercept, True, n),
            _centered(txs, tys, True, True, n),
            test_op,
            Y_test,
            sw_test,
        )

    def _difference(self, txs, tys, train, test):
        xs, ys = self._all
        seen = np.zeros(self.op.n_rows, dtype=bool)
        seen[test] = True
        seen[train] = True
        reason = None
        if not seen.all():
            reason = "the folds are not a partition"
        elif not np.all(tys.syy <= _MAX_TEST_MASS * ys.syy):
            reason = "the test rows carry most of the target's mass"
        else:
            diff, reason = _difference(xs, txs, np.dtype(self.op.dtype))
        if reason is not None:
            self.fallbacks += 1
            logger.debug(
                "fold statistics: no downdating for %d of %d rows (%s): computing "
                "directly.",
                train.shape[0],
                self.op.n_rows,
                reason,
            )
            return None
        return diff, _YSums(ys.TtSY - tys.TtSY, ys.sy - tys.sy, ys.syy - tys.syy)


@dataclass(frozen=True)
class Fold:
    """One fold of :class:`FoldStatistics`: the centered statistics of its
    training rows (centered as the fit asks) and of its test rows (centered), the
    test rows' operator, targets and weights (where ``op`` lives)."""

    train: GramStats
    test: GramStats
    test_op: Any
    Y_test: Any
    sw_test: Any


def _take(a: Any, rows: Any, xp: Any) -> Any:
    return None if a is None else xp.take(a, rows, axis=0)
