"""Factorized ridge regression with the penalty chosen by cross-validation:
efficient leave-one-out from one eigendecomposition of the centered gram, or K
folds whose candidates are all solved from each fold's statistics."""

from __future__ import annotations

from numbers import Real

import numpy as np
import scipy.linalg
from sklearn.base import (
    BaseEstimator,
    MultiOutputMixin,
    RegressorMixin,
    _fit_context,
)
from sklearn.metrics import check_scoring, get_scorer_names
from sklearn.utils._param_validation import Interval, StrOptions

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on
from ilargi_sklearn.linear_model._base import (
    LinearPredictorMixin,
    _check_alphas,
    _check_device_support,
    _folds,
    _predict64,
    _predict_path,
    _regression_target,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._least_squares import (
    _drop_constant_columns,
    _gram_solver,
)
from ilargi_sklearn.linear_model._ridge import _ridge_regression
from ilargi_sklearn.linear_model._scoring import (
    _accepts_sample_weight,
    _IdentityRegressor,
)
from ilargi_sklearn.multisource._interactions import rowwise_quadratic
from ilargi_sklearn.multisource._statistics import (
    FoldStatistics,
    centered_gram,
    centered_products,
    host64,
)
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    validate_fit_inputs,
)

__all__ = ["FactorizedRidgeCV"]


# -------------------------------------------------------------- ridge kernels
# Candidates up to which the hat diagonal is computed as row-wise quadratic forms
# (one pass of per-source-pair products per alpha); above it, from the rotated
# rows ``T_c V`` in blocks of columns (products with n_features columns in all,
# for every alpha).
# Measured on a star of 300000 rows, 50 features (2-core machine): one quadratic
# form 0.28 s, one product with 50 columns 0.75 s.
_MAX_QUADRATIC_ALPHAS = 2
# Elements of one block of rotated rows ``T_c V[:, J]`` (float64: 32 MiB).
_ROTATED_BLOCK = 1 << 22


def _ridge_loo(op, Y, sample_weight, fit_intercept, stats, alphas):
    """Leave-one-out errors of ridge for every alpha, from one eigendecomposition
    of the centered gram.

    With ``G = V diag(l) V^T`` and ``A_k = V diag(1 / (l + alpha_k)) V^T``, the
    coefficients are ``w_k = A_k rhs`` and the leave-one-out error of row ``i`` is
    scikit-learn's ``sqrt(s_i) r_i / (1 - s_i h_i - s_i / s_sum)`` (the last term
    with an intercept), with ``r_i`` the residual of the fit on all rows and
    ``h_i = (t_i - mu)^T A_k (t_i - mu)`` the hat-matrix diagonal.

    For a few alphas, ``h`` is the row-wise quadratic forms of the ``A_k``
    through the operator (per pair of sources), centered with ``T (A_k mu)``;
    residuals and centering terms share one ``matmul`` with
    ``n_alphas (n_targets + 1)`` columns. For more, the centered rows in the
    gram's eigenbasis, ``Z = T_c V``, are formed a block of columns at a time
    (products with ``n_features`` columns in all): ``h_k = (Z * Z) diag(1 / (l +
    alpha_k))`` and the centered predictions ``Z diag(...) V^T rhs`` for every
    alpha at once. Neither forms anything ``n x n_features`` whole.

    Returns
    -------
    looe : ndarray of shape (n_samples, n_alphas, n_targets)
        Leave-one-out errors scaled by ``sqrt(s)`` (scikit-learn's ``looe``).
    coef : ndarray of shape (n_alphas, n_features, n_targets)
    intercept : ndarray of shape (n_alphas, n_targets)
    """
    xp, device = op.xp, op.device
    G, rhs = _drop_constant_columns(stats.G, stats.rhs, stats.D, op.dtype)
    eigvals, V = scipy.linalg.eigh(G, check_finite=False)
    Dinv = 1.0 / (np.maximum(eigvals, 0.0)[None, :] + alphas[:, None])  # (k, d)
    A = None
    if _eigh_error(G, eigvals, V, alphas) > _EIGH_ERROR:
        # Columns of very different scales (a left-joined column of large mean
        # varies with the join): eigh resolves the small eigenvalues only to eps
        # times the largest. Per alpha, the inverse of the equilibrated penalized
        # gram is exact whatever the scales (one quadratic form per alpha).
        A = _penalized_inverses(G, alphas)
        coef = np.einsum("ijk,jt->kit", A, rhs)
    else:
        VT_rhs = V.T @ rhs
        coef = np.einsum("ij,kj,jt->kit", V, Dinv, VT_rhs)
    intercept = stats.y_mean[None, :] - np.einsum("i,kit->kt", stats.mu, coef)
    # Rows and targets through the shifted design and target (multisource._statistics): with
    # T - 1 mu^T = W - 1 m^T and Y = Y~ + c_y, the hat diagonal, the fitted values
    # and the residuals are formed of small values (a column or a target whose
    # mean is large against its spread keeps its digits).
    W, m = centered_products(op, stats)
    c_y = stats.y_shift
    Yt = Y - asarray_on(c_y, xp, device)[None, :] if np.any(c_y) else Y
    y_center = stats.y_center
    if A is not None or alphas.size <= _MAX_QUADRATIC_ALPHAS:
        if A is None:
            A = np.einsum("ij,kj,lj->ilk", V, Dinv, V)  # (d, d, k)
        h, fitted = _hat_by_quadratic_forms(W, A, m, coef)
        offset = y_center[None, :] - np.einsum("i,kit->kt", m, coef)
        fitted = fitted + asarray_on(offset, xp, device)[None, :, :]
    else:
        h, fitted = _hat_by_rotated_rows(W, V, Dinv, m, VT_rhs)
        fitted = fitted + asarray_on(y_center, xp, device)[None, None, :]
    s = None if sample_weight is None else sample_weight[:, None]
    lev = h if s is None else s * h
    if fit_intercept:
        lev = lev + (1.0 if s is None else s) / stats.sw_sum
    looe = (Yt[:, None, :] - fitted) / (1.0 - lev)[:, :, None]
    if s is not None:
        looe = looe * xp.sqrt(s)[:, :, None]
    return host64(looe), coef, intercept


# Largest relative error of the penalized inverses accepted from one
# eigendecomposition of the gram (eigh's eigenvalues carry about eps times the
# largest): a tenth of the estimators' 1e-8; above it, each penalty's
# equilibrated gram is factored instead.
_EIGH_ERROR = 1e-9


def _eigh_error(G, eigvals, V, alphas):
    """A bound on the relative error of ``1 / (lambda_j + alpha)`` from ``eigh``,
    over the directions of the non-constant columns (the zeroed ones are exact)."""
    if not eigvals.size:
        return 0.0
    live = np.sum(V[np.diag(G) > 0] ** 2, axis=0) > 0.5
    if not live.any():
        return 0.0
    eps = float(np.finfo(np.float64).eps)
    top = float(np.max(np.abs(eigvals)))
    low = float(np.min(np.maximum(eigvals[live], 0.0))) + float(np.min(alphas))
    return np.inf if low <= 0 else eps * top / low


def _penalized_inverses(G, alphas):
    """``(G + alpha_k I)^-1`` for every alpha, ``(d, d, k)``: Cholesky of the
    equilibrated matrix, whose accuracy does not depend on the columns' scales."""
    d = G.shape[0]
    out = np.empty((d, d, alphas.size))
    for k, a in enumerate(alphas):
        P = G + a * np.eye(d)
        s = 1.0 / np.sqrt(np.diag(P))
        c = scipy.linalg.cho_factor(P * s[:, None] * s[None, :], lower=True)
        out[:, :, k] = scipy.linalg.cho_solve(c, np.diag(s)) * s[:, None]
    return out


def _hat_by_quadratic_forms(op, A, mu, coef):
    """``(h (n, k), T w_k (n, k, t))``: the hat diagonal as row-wise quadratic
    forms of the ``A_k`` (``(d, d, k)``) and the uncentered predictions, one
    ``matmul``."""
    xp, device = op.xp, op.device
    n, d = op.n_rows, op.n_cols
    n_alphas, _, n_targets = coef.shape
    A_mu = np.einsum("ijk,j->ik", A, mu)  # (d, k)
    M = np.concatenate(
        [np.transpose(coef, (1, 0, 2)).reshape(d, n_alphas * n_targets), A_mu], axis=1
    )
    P = _predict64(op, M)
    pred = xp.reshape(P[:, : n_alphas * n_targets], (n, n_alphas, n_targets))
    quad = rowwise_quadratic(op, asarray_on(A, xp, device, op.dtype))
    quad = xp.astype(quad, xp.float64, copy=False)
    h = quad - 2.0 * P[:, n_alphas * n_targets :]
    return h + asarray_on(mu @ A_mu, xp, device)[None, :], pred


def _hat_by_rotated_rows(op, V, Dinv, mu, VT_rhs):
    """``(h (n, k), T_c w_k (n, k, t))`` from ``Z = T_c V``, formed a block of
    eigenvectors (columns of ``Z``) at a time: each source product is computed
    once per block and memory stays at one ``n x width`` block."""
    xp, device = op.xp, op.device
    n, d = op.n_rows, op.n_cols
    n_alphas, n_targets = Dinv.shape[0], VT_rhs.shape[1]
    # Centered predictions of every alpha: Z (Dinv_k * V^T rhs), one GEMM.
    B = (Dinv.T[:, :, None] * VT_rhs[:, None, :]).reshape(d, n_alphas * n_targets)
    mu_V = mu @ V
    width = max(1, min(d, _ROTATED_BLOCK // max(n, 1)))
    h = fitted = None
    # Thin products (n x width by width x n_alphas): BLAS threads cost more than
    # they save (0.56 s on one thread, 2.3 s on two under load, 300000 x 50).
    with one_blas_thread():
        for lo in range(0, d, width):
            J = slice(lo, min(lo + width, d))
            Z = _predict64(op, V[:, J]) - asarray_on(mu_V[J], xp, device)[None, :]
            Dinv_J = asarray_on(np.ascontiguousarray(Dinv.T[J]), xp, device)
            h_J = xp.matmul(Z * Z, Dinv_J)
            f_J = xp.matmul(Z, asarray_on(np.ascontiguousarray(B[J]), xp, device))
            h = h_J if h is None else h + h_J
            fitted = f_J if fitted is None else fitted + f_J
    return h, xp.reshape(fitted, (n, n_alphas, n_targets))


def _ridge_coefs(stats, alphas, dtype):
    """``(coef (n_alphas, n_features, n_targets), intercept (n_alphas, n_targets))``
    of ridge for every alpha from one fold's statistics: one factorization per
    alpha (:func:`~ilargi_sklearn.linear_model._least_squares._gram_solver`, the
    solve of ``solver="cholesky"`` without its refinement passes)."""
    n_targets = stats.rhs.shape[1]
    coef = np.empty((alphas.size, stats.G.shape[0], n_targets))
    for k, a in enumerate(alphas):
        solve, _, _, _ = _gram_solver(stats, np.full(n_targets, a), dtype, 0.0)
        coef[k] = solve(stats.rhs)
    intercept = stats.y_mean[None, :] - np.einsum("i,kit->kt", stats.mu, coef)
    return coef, intercept


def _ridge_fold_scores(statistics, y_ndim, alphas, folds, scorer):
    """``(n_folds, n_alphas)`` test scores of ridge: per fold the statistics of
    its training rows (``statistics``, a :class:`FoldStatistics`), every alpha
    solved from them, and the test rows' predictions of all alphas in one
    product, scored through an identity model."""
    op, Y, sample_weight = statistics.op, statistics.Y, statistics.sample_weight
    Y_host = host64(Y)
    # As GridSearchCV: the weights go to the scorer where it takes them.
    sw_host = None
    if sample_weight is not None and _accepts_sample_weight(scorer):
        sw_host = host64(sample_weight)
    scores = np.empty((len(folds), alphas.size))
    for f, (train, test) in enumerate(folds):
        fold = statistics.fold(train, test)
        coef, intercept = _ridge_coefs(fold.train, alphas, op.dtype)
        pred = host64(_predict_path(fold.test_op, coef, intercept))
        y_test = Y_host[test]
        for k in range(alphas.size):
            p, y = pred[:, k, :], y_test
            if y_ndim == 1:
                p, y = p[:, 0], y[:, 0]
            kw = {} if sw_host is None else {"sample_weight": sw_host[test]}
            scores[f, k] = scorer(_IdentityRegressor(), p, y, **kw)
    return scores


# ---------------------------------------------------------------- the searches
def _ridge_gcv_search(
    op,
    Y,
    y_ndim,
    alphas,
    *,
    sample_weight,
    fit_intercept,
    scoring,
    alpha_per_target,
    store_cv_results,
    lineage=None,
):
    """Leave-one-out over ``alphas`` with scikit-learn's ``RidgeCV`` choice (the
    best score, the first alpha on ties; one per target with
    ``alpha_per_target``).

    Returns
    -------
    alpha : float or ndarray of shape (n_targets,)
    best_score : float or ndarray of shape (n_targets,)
    coef : ndarray of shape (n_targets, n_features)
    intercept : ndarray of shape (n_targets,)
    cv_results : ndarray or None
        With ``store_cv_results``: the squared errors (or, with ``scoring``, the
        predictions) of every alpha, ``(n_samples, n_alphas)`` for a 1-D target,
        else ``(n_samples, n_targets, n_alphas)``.
    """
    stats = centered_gram(op, sample_weight, fit_intercept, Y, lineage=lineage)
    looe, coefs, intercepts = _ridge_loo(
        op, Y, sample_weight, fit_intercept, stats, alphas
    )
    n_samples, n_alphas, n_targets = looe.shape
    per_target = alpha_per_target and n_targets > 1
    if scoring is not None:
        scorer = check_scoring(_IdentityRegressor(), scoring=scoring)
        Y_host = host64(Y)
        # Predictions in the target's units: y - r / (1 - h).
        sw = None if sample_weight is None else host64(sample_weight)
        unscaled = looe if sw is None else looe / np.sqrt(sw)[:, None, None]
        predictions = Y_host[:, None, :] - unscaled
        score_params = {} if sw is None else {"sample_weight": sw}
    store = np.empty((n_samples, n_targets, n_alphas)) if store_cv_results else None
    best_k = best_score = None
    for k in range(n_alphas):
        if scoring is None:
            squared = looe[:, k, :] ** 2
            values = squared
            if alpha_per_target:
                score = -squared.mean(axis=0)
                score = score[0] if y_ndim == 1 else score
            else:
                score = -squared.mean()
        else:
            values = predictions[:, k, :]
            score = _loo_score(
                scorer, values, Y_host, y_ndim, score_params, alpha_per_target
            )
        if store is not None:
            store[:, :, k] = values
        if best_score is None:
            best_score = np.array(score, dtype=np.float64, copy=True)
            best_k = np.zeros(n_targets, dtype=np.intp) if per_target else 0
        elif per_target:
            better = score > best_score
            best_k[better] = k
            best_score[better] = score[better]
        elif score > best_score:  # strict: ties keep the first alpha
            best_k, best_score = k, np.array(score, dtype=np.float64)
    targets = np.arange(n_targets)
    if per_target:
        coef = coefs[best_k, :, targets]  # (n_targets, n_features)
        intercept = intercepts[best_k, targets]
        alpha = alphas[best_k]
    else:
        coef, intercept = coefs[best_k].T, intercepts[best_k]
        alpha = float(alphas[best_k])
    best_score = best_score[()] if best_score.ndim == 0 else best_score
    cv_results = None
    if store is not None:
        cv_results = store[:, 0, :] if y_ndim == 1 else store
    return alpha, best_score, coef, intercept, cv_results


def _loo_score(scorer, predictions, y, y_ndim, score_params, alpha_per_target):
    """The score of leave-one-out ``predictions`` (n_samples, n_targets): one
    per target with ``alpha_per_target``, as scikit-learn's RidgeCV."""
    if y_ndim == 1:
        return scorer(_IdentityRegressor(), predictions[:, 0], y[:, 0], **score_params)
    if alpha_per_target:
        return np.array(
            [
                scorer(_IdentityRegressor(), predictions[:, j], y[:, j], **score_params)
                for j in range(y.shape[1])
            ]
        )
    return scorer(_IdentityRegressor(), predictions, y, **score_params)


def _ridge_kfold_search(
    op, Y, y_ndim, alphas, *, sample_weight, fit_intercept, scoring, cv, lineage=None
):
    """K-fold search over ``alphas`` (scikit-learn's GridSearchCV choice: the
    best mean test score, the first on ties), then the refit on all rows.

    The refit is the solver that scored the candidates, the Cholesky solve of
    the penalized centered gram (:func:`_ridge_regression` with
    ``solver="cholesky"``, refined through the operator), on the statistics of
    all rows that the folds were downdated from: no second gram, and never an
    iterative solver stopped at its ``tol`` where the search compared exact
    solutions.

    Returns
    -------
    alpha : float
    best_score : float
    coef : ndarray of shape (n_targets, n_features)
    intercept : ndarray of shape (n_targets,)
    """
    folds = _folds(cv, op.n_rows, host64(Y)[:, 0] if y_ndim == 1 else host64(Y))
    scorer = check_scoring(_IdentityRegressor(), scoring=scoring)
    statistics = FoldStatistics(op, sample_weight, Y, fit_intercept, lineage=lineage)
    scores = _ridge_fold_scores(statistics, y_ndim, alphas, folds, scorer)
    mean = scores.mean(axis=0)
    # GridSearchCV ranks failed (NaN) candidates last.
    mean_ranked = np.where(np.isnan(mean), -np.inf, mean)
    best = int(np.argmax(mean_ranked))
    alpha = float(alphas[best])
    coef, intercept, _, _ = _ridge_regression(
        op,
        Y,
        alpha=alpha,
        sample_weight=sample_weight,
        solver="cholesky",
        positive=False,
        # tol and max_iter have no part in the direct solve.
        tol=0.0,
        max_iter=None,
        fit_intercept=fit_intercept,
        stats=statistics.all_rows,
    )
    return alpha, mean[best], coef, intercept


# ------------------------------------------------------------------ RidgeCV
class FactorizedRidgeCV(
    MultiOutputMixin, LinearPredictorMixin, DeviceMixin, RegressorMixin, BaseEstimator
):
    """Ridge regression with built-in cross-validation on joined data sources,
    without building the join.

    The model and the choice of :class:`sklearn.linear_model.RidgeCV` on the
    materialized table: by default an efficient leave-one-out cross-validation
    over ``alphas``; with ``cv`` the folds of scikit-learn's ``check_cv`` and
    the best mean test score, then a refit on all rows with the chosen alpha.
    Every candidate alpha of a fold is solved from that fold's statistics (one
    centered gram per fold, through the operator), never from another pass over
    the data.

    Parameters
    ----------
    alphas : array-like of shape (n_alphas,), default=(0.1, 1.0, 10.0)
        Candidate L2 penalties, positive for leave-one-out (``cv=None``),
        non-negative with ``cv``.
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never
        copied.
    scoring : str, callable or None, default=None
        Scorer of the predictions (a name of :func:`sklearn.metrics.get_scorer`,
        or ``scorer(estimator, X, y)``; the predictions are scored through an
        estimator whose ``predict`` returns them, as in scikit-learn). None: the
        mean squared leave-one-out error (weighted) for ``cv=None``, the
        :math:`R^2` of each test fold otherwise.
    cv : int, cross-validation generator or iterable, default=None
        None: efficient leave-one-out. Otherwise the splits of
        :func:`sklearn.model_selection.check_cv` (an integer: ``KFold``).
    gcv_mode : {"auto", "svd", "eigen"}, default=None
        Accepted for compatibility with scikit-learn. Every mode computes the
        same leave-one-out errors here, from the eigendecomposition of the
        ``(n_features, n_features)`` centered gram (scikit-learn's ``"svd"`` of
        the centered design and ``"eigen"`` of its covariance give the same
        values); the ``n_samples x n_samples`` kernel of scikit-learn's wide
        case is never formed.
    store_cv_results : bool, default=False
        Keep the leave-one-out values of every alpha in ``cv_results_`` (only
        with ``cv=None``).
    alpha_per_target : bool, default=False
        Choose one alpha per target (only with ``cv=None``).
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``:
        through its factorized operator, or materialized once into a plain
        matrix. Both give the same model.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the products compute (see :class:`FactorizedRidge`); the
        parameter-sized algebra runs on the host. ``coef_`` and ``intercept_``
        stay where the fit ran.

    Attributes
    ----------
    alpha_ : float or ndarray of shape (n_targets,)
        The chosen penalty (one per target with ``alpha_per_target``).
    best_score_ : float or ndarray of shape (n_targets,)
        Score of the chosen penalty: the negative mean squared leave-one-out
        error, the score of ``scoring``, or the mean test score over the folds.
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients of the chosen model; dtype of the training data.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (0.0 when ``fit_intercept=False``).
    cv_results_ : ndarray of shape (n_samples, n_alphas) or \
            (n_samples, n_targets, n_alphas)
        With ``store_cv_results``: the (weighted) squared leave-one-out errors,
        or the leave-one-out predictions when ``scoring`` is given (NumPy).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.RidgeCV : The same search on a single matrix.
    FactorizedRidge : Ridge regression with a given alpha.
    FactorizedLassoCV : Cross-validated L1 penalty.

    Notes
    -----
    Leave-one-out (``cv=None``): with weights ``s``, the centered gram
    ``G = V diag(l) V^T`` (computed once, factorized) and
    ``A_k = V diag(1 / (l + alpha_k)) V^T``, the fit on all rows is
    ``w_k = A_k T_c^T S y`` and the leave-one-out error of row ``i`` is::

        e_i = sqrt(s_i) r_i / (1 - s_i (t_i - mu)^T A_k (t_i - mu) - s_i / s_sum)

    (scikit-learn's formula; the last term with an intercept). For one or two
    alphas the quadratic forms are computed per pair of sources
    (:func:`~ilargi_sklearn.multisource._interactions.rowwise_quadratic`), the
    residuals ``r`` and the centering terms ``T A_k mu`` in one product with
    ``n_alphas (n_targets + 1)`` columns. For more, the rows in the gram's
    eigenbasis ``Z = T_c V`` (the design's ``U S``) give every alpha at once,
    ``h_k = (Z * Z) diag(1 / (l + alpha_k))`` and ``T_c w_k = Z diag(1 / (l +
    alpha_k)) V^T T_c^T S y``, with ``Z`` formed a block of columns at a time
    (never whole). Cost: one gram and one transposed product, then products
    with ``n_features`` columns in all (or one per alpha's quadratic form).

    K folds: per fold the statistics of its training rows (all rows' minus the
    test rows', :class:`~ilargi_sklearn.multisource._statistics.FoldStatistics`), one
    Cholesky factorization per alpha,
    and one product of the test rows with all alphas' coefficients; then the
    refit on all rows by the solver that scored the candidates,
    :class:`FactorizedRidge`'s ``solver="cholesky"`` on the statistics of all
    rows (no second gram). The test folds are scored with
    their sample weights where the scorer takes them, as in scikit-learn's
    ``GridSearchCV``. Ties go to the first alpha.

    Both searches form the dense ``(n_features, n_features)`` gram, also on wide
    sparse data or implicit feature expansions where :class:`FactorizedRidge`
    would iterate on products instead: they suit up to a few thousand
    features.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedRidgeCV
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((40, 2))
    >>> dim = rng.standard_normal((6, 3))
    >>> fk = rng.integers(0, 6, 40)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0]
    >>> y += 8 * rng.standard_normal(40)  # noisy: a large penalty pays
    >>> reg = FactorizedRidgeCV(alphas=[0.1, 10.0, 1000.0]).fit(ds, y)
    >>> reg.alpha_
    10.0
    >>> reg.coef_.round(2) + 0.0  # + 0.0 turns -0.0 into 0.0
    array([ 1.98, -1.04,  0.06,  0.35,  2.83])

    The same choice and model as scikit-learn's on the joined matrix:

    >>> from sklearn.linear_model import RidgeCV
    >>> ref = RidgeCV(alphas=[0.1, 10.0, 1000.0]).fit(ds.materialize(), y)
    >>> float(ref.alpha_)
    10.0
    >>> bool(np.allclose(reg.coef_, ref.coef_, rtol=1e-8))
    True
    """

    _parameter_constraints: dict = {
        "alphas": ["array-like", Interval(Real, 0, None, closed="neither")],
        "fit_intercept": ["boolean"],
        "scoring": [StrOptions(set(get_scorer_names())), callable, None],
        "cv": ["cv_object"],
        "gcv_mode": [StrOptions({"auto", "svd", "eigen"}), None],
        "store_cv_results": ["boolean"],
        "alpha_per_target": ["boolean"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        alphas=(0.1, 1.0, 10.0),
        *,
        fit_intercept=True,
        scoring=None,
        cv=None,
        gcv_mode=None,
        store_cv_results=False,
        alpha_per_target=False,
        strategy="factorized",
        device="auto",
    ):
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.scoring = scoring
        self.cv = cv
        self.gcv_mode = gcv_mode
        self.store_cv_results = store_cv_results
        self.alpha_per_target = alpha_per_target
        self.strategy = strategy
        self.device = device

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`).

        ``cv=None``: the gram, its eigendecomposition and the leave-one-out hat
        diagonal (one product with ``d`` columns, or one per alpha for few alphas);
        K folds: the fold statistics (about two grams), per fold and alpha a
        solve and the test fold's predictions, the refit's solve.
        """
        from ilargi_sklearn.planner._work import Work, n_folds, n_targets

        n, d = float(data["n_rows"]), float(data["n_features"])
        m = n_targets(y)
        a = int(np.size(self.alphas))
        if self.cv is None:
            return Work(
                "ridge",
                "loo",
                m=m,
                passes=1.0,
                grams=1,
                matmuls=float(a if a <= _MAX_QUADRATIC_ALPHAS else 1),
                matmul_m=int(d),
                common_flops=9.0 * d**3 + 4.0 * n * d * a,
                common_bytes=8.0 * n * (d + m) * a,
                fits=a,
            )
        k = n_folds(self.cv)
        solve = d**3 / 3.0 + 2.0 * d * d * m
        return Work(
            "ridge",
            "normal",
            m=m,
            passes=2.0,
            grams=2,
            matmuls=float(a),
            matmul_m=m,
            common_flops=(k * a + 1) * solve,
            fits=k * a + 1,
        )

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Choose alpha by cross-validation and fit the ridge model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Target values.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Individual weights for each sample (a float: the same for all). With
            ``cv=None`` they weight the leave-one-out errors too; with ``cv``
            the test folds' scores where the scorer takes them, as in
            scikit-learn.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        if self.cv is not None:
            if self.store_cv_results:
                raise ValueError("cv!=None and store_cv_results=True are incompatible")
            if self.alpha_per_target:
                raise ValueError("cv!=None and alpha_per_target=True are incompatible")
        alphas = _check_alphas(self.alphas, low_closed=self.cv is not None)
        op, (Y, y_ndim), sample_weight, _, lineage = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_regression_target,
            strategy=self.strategy,
            non_negative_weights=True,
            return_lineage=True,
        )
        _check_device_support(op, type(self).__name__)
        cv_results = None
        if self.cv is None:
            alpha, best_score, coef, intercept, cv_results = _ridge_gcv_search(
                op,
                Y,
                y_ndim,
                alphas,
                sample_weight=sample_weight,
                fit_intercept=self.fit_intercept,
                scoring=self.scoring,
                alpha_per_target=self.alpha_per_target,
                store_cv_results=self.store_cv_results,
                lineage=lineage,
            )
        else:
            alpha, best_score, coef, intercept = _ridge_kfold_search(
                op,
                Y,
                y_ndim,
                alphas,
                sample_weight=sample_weight,
                fit_intercept=self.fit_intercept,
                scoring=self.scoring,
                cv=self.cv,
                lineage=lineage,
            )
        self.alpha_ = alpha
        self.best_score_ = best_score
        if cv_results is not None:
            self.cv_results_ = cv_results
        elif hasattr(self, "cv_results_"):
            del self.cv_results_  # a previous fit's
        _set_linear_fitted(
            self,
            op,
            coef,
            intercept if self.fit_intercept else None,
            y_ndim=y_ndim,
            ravel_single=True,
        )
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        return tags
