"""Cross-validated ridge, lasso and elastic net on joined data sources: every
candidate penalty of a fold is solved from the fold's statistics (one centered
gram per fold), never from another pass over the data."""

from __future__ import annotations

import inspect
import numbers
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.linalg
from sklearn.base import (
    BaseEstimator,
    MultiOutputMixin,
    RegressorMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.metrics import check_scoring, get_scorer_names
from sklearn.model_selection import check_cv
from sklearn.utils import check_random_state, check_scalar
from sklearn.utils._param_validation import Interval, StrOptions

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on
from ilargi_sklearn.linear_model._cd_gram import RAND_R_MAX, enet_cd_gram
from ilargi_sklearn.linear_model._coordinate_descent import (
    _MESSAGE_CONV,
    FactorizedElasticNet,
    FactorizedLasso,
    _check_finite_stats,
    _drop_constant_columns,
)
from ilargi_sklearn.linear_model._linear import (
    _GRAM_NOISE,
    LinearPredictorMixin,
    _check_device_support,
    _gram_solver,
    _predict64,
    _regression_target,
)
from ilargi_sklearn.linear_model._ridge import FactorizedRidge, _fit_ridge
from ilargi_sklearn.multisource._interactions import rowwise_quadratic
from ilargi_sklearn.utils._stats import (
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

__all__ = ["FactorizedElasticNetCV", "FactorizedLassoCV", "FactorizedRidgeCV"]


# ------------------------------------------------------------------ helpers
class _Predictions(RegressorMixin, BaseEstimator):
    """A regressor whose "data" are its predictions: scorers then score
    predictions computed for many penalties at once (scikit-learn's RidgeCV
    scores its leave-one-out predictions the same way)."""

    def predict(self, X):
        return X


def _accepts_sample_weight(scorer):
    """Whether GridSearchCV would hand ``sample_weight`` to ``scorer`` (its rule
    without metadata routing: a scorer object's own answer, else whether the
    callable has a ``sample_weight`` parameter)."""
    accept = getattr(scorer, "_accept_sample_weight", None)
    if accept is not None:
        return bool(accept())
    return "sample_weight" in inspect.signature(scorer).parameters


def _folds(cv, n_samples, y):
    """The (train, test) index pairs of ``check_cv(cv)``, as scikit-learn's
    searches draw them (a regressor's splitter: ``KFold`` for an integer)."""
    stand_in = np.empty((n_samples, 0))  # splitters read the number of rows only
    return list(check_cv(cv, y, classifier=False).split(stand_in, y))


def _check_alphas(alphas, low_closed):
    """The candidate penalties as a float64 vector, checked as scikit-learn's
    ``check_scalar`` does (``alphas[i]`` named in the message)."""
    a = np.asarray(alphas, dtype=np.float64).ravel()
    for i, value in enumerate(a):
        check_scalar(
            float(value),
            f"alphas[{i}]" if a.size > 1 else "alphas",
            target_type=Real,
            min_val=0.0,
            include_boundaries="left" if low_closed else "neither",
        )
    return a


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
    # Rows and targets through the shifted design and target (utils._stats): with
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
    alpha (:func:`~ilargi_sklearn.linear_model._linear._gram_solver`, the solve of
    :class:`FactorizedRidge` without its refinement passes)."""
    n_targets = stats.rhs.shape[1]
    coef = np.empty((alphas.size, stats.G.shape[0], n_targets))
    for k, a in enumerate(alphas):
        solve, _, _, _ = _gram_solver(stats, np.full(n_targets, a), dtype, 0.0)
        coef[k] = solve(stats.rhs)
    intercept = stats.y_mean[None, :] - np.einsum("i,kit->kt", stats.mu, coef)
    return coef, intercept


def _predict_path(op, coef, intercept):
    """``T w_k + b_k`` for every candidate ``k``: one ``matmul`` with
    ``n_alphas * n_targets`` columns. Returns ``(n_rows, n_alphas, n_targets)``
    where ``op`` lives."""
    n_alphas, d, n_targets = coef.shape
    xp = op.xp
    M = np.transpose(coef, (1, 0, 2)).reshape(d, n_alphas * n_targets)
    P = xp.reshape(_predict64(op, M), (op.n_rows, n_alphas, n_targets))
    return P + asarray_on(intercept, xp, op.device)[None, :, :]


def _ridge_fold_scores(
    op, Y, y_ndim, sample_weight, fit_intercept, alphas, folds, scorer
):
    """``(n_folds, n_alphas)`` test scores of ridge: per fold one set of
    statistics of its training rows (:class:`FoldStatistics`), every alpha solved
    from them, and the test rows' predictions of all alphas in one product."""
    Y_host = host64(Y)
    # As GridSearchCV: the weights go to the scorer where it takes them.
    sw_host = None
    if sample_weight is not None and _accepts_sample_weight(scorer):
        sw_host = host64(sample_weight)
    scores = np.empty((len(folds), alphas.size))
    statistics = FoldStatistics(op, sample_weight, Y, fit_intercept)
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
            scores[f, k] = scorer(_Predictions(), p, y, **kw)
    return scores


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
    test rows', :class:`~ilargi_sklearn.utils._stats.FoldStatistics`), one
    Cholesky factorization per alpha,
    and one product of the test rows with all alphas' coefficients; then one
    :class:`FactorizedRidge` fit on all rows. The test folds are scored with
    their sample weights where the scorer takes them, as in scikit-learn's
    ``GridSearchCV``. Ties go to the first alpha.

    Both searches form the dense ``(n_features, n_features)`` gram, also on wide
    sparse data or implicit feature expansions where :class:`FactorizedRidge`
    would iterate on products instead (only the K-fold refit does): they suit up
    to a few thousand features.

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
        op, (Y, y_ndim), sample_weight, _ = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_regression_target,
            strategy=self.strategy,
            non_negative_weights=True,
        )
        _check_device_support(op, type(self).__name__)
        if self.cv is None:
            coef, intercept = self._fit_loo(op, Y, y_ndim, sample_weight, alphas)
        else:
            coef, intercept = self._fit_folds(op, Y, y_ndim, sample_weight, alphas)
        # Fitted attributes stay where the fit ran.
        coef = asarray_on(coef.astype(op.dtype, copy=False), op.xp, op.device)
        intercept = asarray_on(intercept.astype(op.dtype, copy=False), op.xp, op.device)
        self.coef_ = coef[0, :] if coef.shape[0] == 1 else coef
        if not self.fit_intercept:
            self.intercept_ = 0.0
        else:
            self.intercept_ = intercept[0] if y_ndim == 1 else intercept
        return self

    def _fit_loo(self, op, Y, y_ndim, sample_weight, alphas):
        """Leave-one-out over ``alphas``; returns the chosen ``(coef (n_targets,
        n_features), intercept (n_targets,))`` and sets ``alpha_``,
        ``best_score_`` (and ``cv_results_``) with scikit-learn's choice."""
        stats = centered_gram(op, sample_weight, self.fit_intercept, Y)
        looe, coefs, intercepts = _ridge_loo(
            op, Y, sample_weight, self.fit_intercept, stats, alphas
        )
        n_samples, n_alphas, n_targets = looe.shape
        per_target = self.alpha_per_target and n_targets > 1
        if self.scoring is not None:
            scorer = check_scoring(_Predictions(), scoring=self.scoring)
            Y_host = host64(Y)
            # Predictions in the target's units: y - r / (1 - h).
            sw = None if sample_weight is None else host64(sample_weight)
            unscaled = looe if sw is None else looe / np.sqrt(sw)[:, None, None]
            predictions = Y_host[:, None, :] - unscaled
            score_params = {} if sw is None else {"sample_weight": sw}
        store = (
            np.empty((n_samples, n_targets, n_alphas))
            if self.store_cv_results
            else None
        )
        best_k = best_score = None
        for k in range(n_alphas):
            if self.scoring is None:
                squared = looe[:, k, :] ** 2
                values = squared
                if self.alpha_per_target:
                    score = -squared.mean(axis=0)
                    score = score[0] if y_ndim == 1 else score
                else:
                    score = -squared.mean()
            else:
                values = predictions[:, k, :]
                score = self._score(scorer, values, Y_host, y_ndim, score_params)
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
            self.alpha_ = alphas[best_k]
        else:
            coef, intercept = coefs[best_k].T, intercepts[best_k]
            self.alpha_ = float(alphas[best_k])
        self.best_score_ = best_score[()] if best_score.ndim == 0 else best_score
        if store is not None:
            self.cv_results_ = store[:, 0, :] if y_ndim == 1 else store
        elif hasattr(self, "cv_results_"):
            del self.cv_results_
        return coef, intercept

    def _score(self, scorer, predictions, y, y_ndim, score_params):
        """The score of leave-one-out ``predictions`` (n_samples, n_targets): one
        per target with ``alpha_per_target``, as scikit-learn's RidgeCV."""
        if y_ndim == 1:
            return scorer(_Predictions(), predictions[:, 0], y[:, 0], **score_params)
        if self.alpha_per_target:
            return np.array(
                [
                    scorer(_Predictions(), predictions[:, j], y[:, j], **score_params)
                    for j in range(y.shape[1])
                ]
            )
        return scorer(_Predictions(), predictions, y, **score_params)

    def _fit_folds(self, op, Y, y_ndim, sample_weight, alphas):
        """K-fold search over ``alphas`` (scikit-learn's GridSearchCV choice:
        the best mean test score, the first on ties), then a refit on all rows."""
        folds = _folds(
            self.cv, op.n_rows, host64(Y)[:, 0] if y_ndim == 1 else host64(Y)
        )
        scorer = check_scoring(_Predictions(), scoring=self.scoring)
        scores = _ridge_fold_scores(
            op, Y, y_ndim, sample_weight, self.fit_intercept, alphas, folds, scorer
        )
        mean = scores.mean(axis=0)
        # GridSearchCV ranks failed (NaN) candidates last.
        mean_ranked = np.where(np.isnan(mean), -np.inf, mean)
        best = int(np.argmax(mean_ranked))
        self.alpha_ = float(alphas[best])
        self.best_score_ = mean[best]
        if hasattr(self, "cv_results_"):
            del self.cv_results_
        ridge = FactorizedRidge(
            alpha=self.alpha_,
            fit_intercept=self.fit_intercept,
            strategy=self.strategy,
            device=self.device,
        )
        coef, intercept, _, _ = _fit_ridge(ridge, op, Y, sample_weight)
        return coef, intercept

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        return tags


# ------------------------------------------------------- elastic-net paths
def _alpha_grid(stats, l1_ratio, eps, n_alphas, positive):
    """scikit-learn's ``_alpha_grid`` from the full data's statistics: the
    smallest alpha with all coefficients zero, ``max_j |(T_c^T S y)_j| /
    (s_sum l1_ratio)`` (``rhs`` of the centered gram), then a geometric grid down
    to ``eps`` times it."""
    if l1_ratio == 0:
        raise ValueError(
            "Automatic alpha grid generation is not supported for"
            " l1_ratio=0. Please supply a grid by providing "
            "your estimator with the appropriate `alphas=` "
            "argument."
        )
    rhs = stats.rhs
    if positive:
        alpha_max = max(0.0, float(np.max(rhs))) / (stats.sw_sum * l1_ratio)
    else:
        top = float(np.max(np.sum(rhs**2, axis=1)))
        alpha_max = np.sqrt(top) / (stats.sw_sum * l1_ratio)
    resolution = np.finfo(np.float64).resolution
    if alpha_max <= resolution:
        return np.full(n_alphas, resolution)
    return np.geomspace(alpha_max, alpha_max * eps, num=n_alphas)


def _enet_path(
    stats, alphas, l1_ratio, *, max_iter, tol, rng, selection, positive, dtype
):
    """Coefficients ``(n_alphas, n_features, 1)`` of the elastic net along
    ``alphas`` (decreasing) on one fold's statistics: coordinate descent on the
    fold's gram, each alpha started from the last one's solution (warm start),
    the coordinate draws seeded per alpha from ``rng`` as scikit-learn's
    ``enet_path``. Returns the coefficients and the number of alphas that did
    not converge."""
    G, rhs = _drop_constant_columns(stats.G, stats.rhs, stats.D, dtype)
    b = np.ascontiguousarray(rhs[:, 0])
    coef = np.zeros(G.shape[0])
    coefs = np.empty((alphas.size, G.shape[0], 1))
    n_failed = 0
    for k, alpha in enumerate(alphas):
        coef, _, _, converged, _ = enet_cd_gram(
            G,
            b,
            float(alpha),
            float(l1_ratio),
            coef,
            sw_sum=stats.sw_sum,
            y_norm2=float(stats.y_var[0]),
            max_iter=max_iter,
            tol=tol,
            seed=rng.randint(0, RAND_R_MAX),
            random=selection == "random",
            positive=positive,
        )
        coefs[k, :, 0] = coef
        n_failed += not converged
    return coefs, n_failed


# Largest relative rounding error accepted in a test error computed from the
# test rows' statistics; above it (float32 data, a target fitted almost exactly)
# the errors come from the product with the test rows.
_MSE_FROM_STATS_ERROR = 1e-9


def _path_mse(test_op, Y_test, sw_test, coefs, intercepts, stats=None, train=None):
    """(Weighted) mean squared error of every alpha of a path on a fold's test
    rows.

    From the test rows' centered statistics (``mu_t``, ``ybar_t``, ``G_t``,
    ``rhs_t``, ``s_t``) the error of ``(w, b)`` is a quadratic form in the
    parameters, ``(yvar_t - 2 w^T rhs_t + w^T G_t w) / s_t + (ybar_t - b -
    mu_t^T w)^2``: one gram of the test rows (the statistics the per-fold cache
    downdates with) and ``O(n_alphas d^2)`` on the host, with no product of
    ``n_alphas`` columns. The form subtracts large terms when the model fits the
    test rows almost exactly: where the rounding bound (the gram's noise,
    ``eps sqrt(D_i D_j)`` per entry, against the error) exceeds
    :data:`_MSE_FROM_STATS_ERROR`, the residuals are computed instead, one
    product of the test rows with all the path's coefficients. ``stats``: the
    test rows' centered statistics where the caller has them; ``train``: those
    of the training rows the intercepts came from. Where both were formed with
    one shift (:class:`~ilargi_sklearn.utils._stats.FoldStatistics`), the
    offset ``ybar_t - b - mu_t^T w = (ybar_t - ybar) - (mu_t - mu)^T w`` is
    taken of the shifted means, which do not round away the difference of two
    large means.
    """
    W = coefs[:, :, 0].T  # (d, k)
    b = intercepts[:, 0]
    if stats is None:
        stats = centered_gram(test_op, sw_test, True, Y_test)
    sse = (
        stats.y_var[0]
        - 2.0 * (stats.rhs[:, 0] @ W)
        + np.einsum("ik,ij,jk->k", W, stats.G, W)
    )
    if (
        train is not None
        and train.shift is stats.shift
        and np.array_equal(train.y_shift, stats.y_shift)
        and np.any(train.mu)
    ):
        offset = (stats.y_center[0] - train.y_center[0]) - (
            stats.w_center - train.w_center
        ) @ W
    else:
        offset = stats.y_mean[0] - b - stats.mu @ W
    mse = sse / stats.sw_sum + offset**2
    eps = _GRAM_NOISE * float(np.finfo(test_op.dtype).eps)
    scale = stats.y_sq_norm[0] + (np.sqrt(stats.D) @ np.abs(W)) ** 2
    noise = eps * scale / stats.sw_sum
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.all(noise <= _MSE_FROM_STATS_ERROR * mse)
    if exact:
        return mse
    return _path_mse_by_product(test_op, Y_test, sw_test, coefs, intercepts)


def _path_mse_by_product(test_op, Y_test, sw_test, coefs, intercepts):
    """The errors of :func:`_path_mse` from the residuals: one product of the
    test rows with all the path's coefficients."""
    xp = test_op.xp
    R = _predict_path(test_op, coefs, intercepts)[:, :, 0] - Y_test
    R2 = R * R
    if sw_test is None:
        return host64(xp.mean(R2, axis=0))
    return host64(xp.sum(R2 * sw_test[:, None], axis=0)) / float(xp.sum(sw_test))


class _FactorizedLinearModelCV(
    LinearPredictorMixin, DeviceMixin, RegressorMixin, BaseEstimator
):
    """What the cross-validated lasso and elastic net share: scikit-learn's
    LinearModelCV search over the fold statistics, then a refit on all rows."""

    _parameter_constraints: dict = {
        "eps": [Interval(Real, 0, None, closed="neither")],
        "alphas": [Interval(Integral, 1, None, closed="left"), "array-like"],
        "fit_intercept": ["boolean"],
        "precompute": [StrOptions({"auto"}), "array-like", "boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "copy_X": ["boolean"],
        "cv": ["cv_object"],
        "verbose": ["verbose"],
        "n_jobs": [Integral, None],
        "positive": ["boolean"],
        "random_state": ["random_state"],
        "selection": [StrOptions({"cyclic", "random"})],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def _refit_model(self, alpha, l1_ratio):
        raise NotImplementedError

    def _l1_ratios(self):
        return np.atleast_1d(getattr(self, "l1_ratio", 1.0)).astype(np.float64)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Choose alpha (and l1_ratio) by cross-validation along the
        regularization path, then fit on all rows.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Target values.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Sample weights of the fits and of each test fold's mean squared
            error; the cross-validated error is the unweighted mean of the
            folds' (weighted) errors, as in scikit-learn.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        name = type(self).__name__
        if not isinstance(self.precompute, (bool, np.bool_, str)):
            warnings.warn(
                f"{name} ignores a precomputed gram (precompute=array): it "
                "computes the centered gram of every fold from the data, factorized.",
                UserWarning,
                stacklevel=2,
            )
        if isinstance(sample_weight, numbers.Number):
            sample_weight = None  # equal weights, as scikit-learn reads a number
        op, (Y, y_ndim), sample_weight, _ = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_single_target,
            strategy=self.strategy,
            non_negative_weights=True,
        )
        _check_device_support(op, name)
        l1_ratios = self._l1_ratios()
        statistics = FoldStatistics(op, sample_weight, Y, self.fit_intercept)
        stats = statistics.all_rows
        _check_finite_stats(stats, op.dtype)
        if isinstance(self.alphas, Integral):
            grids = np.array(
                [
                    _alpha_grid(stats, r, self.eps, self.alphas, self.positive)
                    for r in l1_ratios
                ]
            )
        else:
            given = _check_alphas(self.alphas, low_closed=True)
            grids = np.tile(np.sort(given)[::-1], (l1_ratios.size, 1))

        folds = _folds(self.cv, op.n_rows, host64(Y)[:, 0])
        mse = self._fold_mse(statistics, folds, l1_ratios, grids)
        mean_mse = mse.mean(axis=1)  # (n_l1_ratio, n_alphas): over the folds
        best_mse = np.inf
        for r, grid, curve in zip(l1_ratios, grids, mean_mse):
            i = int(np.argmin(curve))
            if curve[i] < best_mse:
                best_alpha, best_l1_ratio, best_mse = float(grid[i]), float(r), curve[i]

        model = self._refit_model(best_alpha, best_l1_ratio)
        model._fit_gram(op, stats, y_ndim)
        self.mse_path_ = np.squeeze(np.moveaxis(mse, 2, 1))
        self.alpha_ = best_alpha
        if hasattr(self, "l1_ratio"):
            self.l1_ratio_ = best_l1_ratio
        if isinstance(self.alphas, Integral):
            self.alphas_ = grids[0] if l1_ratios.size == 1 else grids
        else:
            self.alphas_ = grids[0]
        self.coef_ = model.coef_
        self.intercept_ = model.intercept_
        self.dual_gap_ = model.dual_gap_
        self.n_iter_ = model.n_iter_
        return self

    def _fold_mse(self, statistics, folds, l1_ratios, grids):
        """``(n_l1_ratio, n_folds, n_alphas)`` test errors: each fold's
        statistics computed once and shared by every l1_ratio's path."""
        dtype = statistics.op.dtype
        mse = np.empty((l1_ratios.size, len(folds), grids.shape[1]))
        n_failed = 0
        for f, (train, test) in enumerate(folds):
            fold = statistics.fold(train, test)
            stats = fold.train
            paths = []
            for l1_ratio, grid in zip(l1_ratios, grids):
                # One generator per path, as scikit-learn's enet_path makes
                # (an integer seed gives every path the same draws).
                rng = check_random_state(self.random_state)
                coefs, failed = _enet_path(
                    stats,
                    grid,
                    l1_ratio,
                    max_iter=self.max_iter,
                    tol=self.tol,
                    rng=rng,
                    selection=self.selection,
                    positive=self.positive,
                    dtype=dtype,
                )
                n_failed += failed
                paths.append(coefs)
            # Every l1_ratio's path at once on the test rows.
            coefs = np.concatenate(paths, axis=0)
            intercepts = stats.y_mean[None, :] - np.einsum("i,kit->kt", stats.mu, coefs)
            errors = _path_mse(
                fold.test_op,
                fold.Y_test,
                fold.sw_test,
                coefs,
                intercepts,
                fold.test,
                stats if self.fit_intercept else None,
            )
            mse[:, f] = errors.reshape(l1_ratios.size, grids.shape[1])
        if n_failed:
            warnings.warn(
                f"{_MESSAGE_CONV} {n_failed} of the {mse.size} fits along the "
                "folds' paths did not reach the tolerance.",
                ConvergenceWarning,
                stacklevel=3,
            )
        return mse

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.single_output = True
        tags.target_tags.multi_output = False
        return tags


def _single_target(estimator, y, op):
    """A single regression target, as scikit-learn's LinearModelCV takes it: a
    column vector is accepted with a ``DataConversionWarning``, several targets
    refused."""
    Y, y_ndim = _regression_target(estimator, y, op)
    if Y.shape[1] != 1:
        name = type(estimator).__name__
        raise ValueError(
            f"For multi-task outputs, use MultiTask{name.replace('Factorized', '')} "
            f"(scikit-learn); {name} fits one target (got {Y.shape[1]})."
        )
    if y_ndim == 2:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please "
            "change the shape of y to (n_samples, ), for example using ravel().",
            DataConversionWarning,
            stacklevel=4,
        )
    return Y, 1


class FactorizedElasticNetCV(_FactorizedLinearModelCV):
    """Elastic net with cross-validation along the regularization path on joined
    data sources, without building the join.

    The search of :class:`sklearn.linear_model.ElasticNetCV` on the materialized
    table: the same alpha grid, folds, warm-started paths, mean squared errors
    and choice, then a :class:`FactorizedElasticNet` fit on all rows.

    Parameters
    ----------
    l1_ratio : float or list of float, default=0.5
        Mixing parameter(s) in ``[0, 1]`` (1: lasso); a list is searched too.
    eps : float, default=1e-3
        Length of the path: ``alpha_min / alpha_max = eps``.
    alphas : int or array-like, default=100
        An integer: the number of alphas of the automatic grid (per l1_ratio);
        an array: the alphas to try (sorted in decreasing order).
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly.
    precompute : "auto", bool or array-like, default="auto"
        Accepted for compatibility with scikit-learn: the gram is always
        computed, factorized, per fold (a ``UserWarning`` for an array).
    max_iter : int, default=1000
        Most coordinate-descent sweeps per alpha.
    tol : float, default=1e-4
        scikit-learn's duality-gap tolerance of every fit.
    cv : int, cross-validation generator or iterable, default=None
        The splits of :func:`sklearn.model_selection.check_cv` (None: 5-fold
        ``KFold``).
    copy_X : bool, default=True
        Accepted for compatibility; ``X`` is never modified.
    verbose : bool or int, default=0
        Accepted for compatibility; nothing is printed.
    n_jobs : int, default=None
        Accepted for compatibility; the folds run in this process, one after
        the other (they share the dataset's statistics cache).
    positive : bool, default=False
        Constrain the coefficients to be non-negative.
    random_state : int, RandomState instance or None, default=None
        Seed of the coordinate draws of ``selection="random"``.
    selection : {"cyclic", "random"}, default="cyclic"
        Order of the coordinate updates.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the grams and the products compute; the coordinate descent runs
        on the host. ``coef_`` and ``intercept_`` stay where the fit ran.

    Attributes
    ----------
    alpha_ : float
        The chosen penalty.
    l1_ratio_ : float
        The chosen mixing parameter.
    coef_ : ndarray of shape (n_features,)
        Coefficients of the refit.
    intercept_ : float
        Intercept of the refit (0.0 when ``fit_intercept=False``).
    mse_path_ : ndarray of shape (n_alphas, n_folds) or \
            (n_l1_ratio, n_alphas, n_folds)
        Test mean squared error of every alpha (and l1_ratio) and fold.
    alphas_ : ndarray of shape (n_alphas,) or (n_l1_ratio, n_alphas)
        The alphas tried.
    dual_gap_ : float
        Duality gap of the refit.
    n_iter_ : int
        Coordinate-descent sweeps of the refit.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit.

    See Also
    --------
    sklearn.linear_model.ElasticNetCV : The same search on a single matrix.
    FactorizedElasticNet : The elastic net with given penalties.
    FactorizedLassoCV : The L1 penalty alone.

    Notes
    -----
    The factorized rewrite: per fold the centered gram of its training rows, as
    the gram of all rows minus the test rows' (one pass over all rows and one
    over each fold's test rows, :class:`~ilargi_sklearn.utils._stats.FoldStatistics`;
    computed directly where the difference would lose accuracy), then
    the whole path by coordinate descent on that gram, each alpha started from
    the previous solution (scikit-learn's ``precompute=True`` path, which its
    ``precompute="auto"`` takes whenever ``n_samples > n_features``): no pass
    over the data per alpha. The test rows' errors of all alphas are quadratic
    forms of the path's parameters in the test rows' centered statistics
    (``(yvar_t - 2 w^T rhs_t + w^T G_t w) / s_t + (ybar_t - b - mu_t^T w)^2``),
    or, where their rounding could reach 1e-9 of an error (float32 data, a
    target fitted almost exactly), the residuals of one product ``T[test] W``
    with ``n_alphas`` columns. The alpha grid (``alphas``
    an integer) is scikit-learn's: ``alpha_max = max_j |(T_c^T S y)_j| /
    (s_sum l1_ratio)`` from the full data's centered right-hand side, then
    ``alphas`` values on a log scale down to ``eps * alpha_max``. The refit on
    all rows reuses the full data's gram, already formed for the grid.

    Cost: two grams per fold (its training and its test rows) plus one for the
    grid and the refit (with the dataset's per-fold statistics cache, which
    downdates the full gram by the test rows', about two passes over the data
    in all), then ``O(n_features^2)`` per coordinate-descent sweep on the host.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedElasticNetCV
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((300, 2))
    >>> dim = rng.standard_normal((30, 3))
    >>> fk = rng.integers(0, 30, 300)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0]
    >>> y += rng.standard_normal(300)
    >>> reg = FactorizedElasticNetCV(l1_ratio=[0.5, 1.0], tol=1e-8).fit(ds, y)
    >>> reg.mse_path_.shape  # (n_l1_ratio, n_alphas, n_folds)
    (2, 100, 5)

    The same choice as scikit-learn's on the joined matrix:

    >>> from sklearn.linear_model import ElasticNetCV
    >>> ref = ElasticNetCV(l1_ratio=[0.5, 1.0], tol=1e-8).fit(ds.materialize(), y)
    >>> bool(reg.alpha_ == ref.alpha_ and reg.l1_ratio_ == ref.l1_ratio_)
    True
    >>> bool(np.allclose(reg.mse_path_, ref.mse_path_, rtol=1e-6))
    True
    """

    _parameter_constraints: dict = {
        **_FactorizedLinearModelCV._parameter_constraints,
        "l1_ratio": [Interval(Real, 0, 1, closed="both"), "array-like"],
    }

    def __init__(
        self,
        *,
        l1_ratio=0.5,
        eps=1e-3,
        alphas=100,
        fit_intercept=True,
        precompute="auto",
        max_iter=1000,
        tol=1e-4,
        cv=None,
        copy_X=True,
        verbose=0,
        n_jobs=None,
        positive=False,
        random_state=None,
        selection="cyclic",
        strategy="factorized",
        device="auto",
    ):
        self.l1_ratio = l1_ratio
        self.eps = eps
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.precompute = precompute
        self.max_iter = max_iter
        self.tol = tol
        self.cv = cv
        self.copy_X = copy_X
        self.verbose = verbose
        self.n_jobs = n_jobs
        self.positive = positive
        self.random_state = random_state
        self.selection = selection
        self.strategy = strategy
        self.device = device

    def _l1_ratios(self):
        ratios = np.atleast_1d(np.asarray(self.l1_ratio, dtype=np.float64)).ravel()
        if ratios.size == 0 or np.any((ratios < 0) | (ratios > 1)):
            raise ValueError(
                f"l1_ratio must be in [0, 1], got {self.l1_ratio!r}; pass a float "
                "or a non-empty list of floats between 0 and 1."
            )
        return ratios

    def _refit_model(self, alpha, l1_ratio):
        return FactorizedElasticNet(
            alpha=alpha,
            l1_ratio=l1_ratio,
            fit_intercept=self.fit_intercept,
            max_iter=self.max_iter,
            tol=self.tol,
            positive=self.positive,
            random_state=self.random_state,
            selection=self.selection,
            strategy=self.strategy,
            device=self.device,
        )


class FactorizedLassoCV(_FactorizedLinearModelCV):
    """Lasso with cross-validation along the regularization path on joined data
    sources, without building the join.

    The search of :class:`sklearn.linear_model.LassoCV` on the materialized
    table: the same alpha grid, folds, warm-started paths, mean squared errors
    and choice, then a :class:`FactorizedLasso` fit on all rows.

    Parameters
    ----------
    eps : float, default=1e-3
        Length of the path: ``alpha_min / alpha_max = eps``.
    alphas : int or array-like, default=100
        An integer: the number of alphas of the automatic grid; an array: the
        alphas to try (sorted in decreasing order).
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly.
    precompute : "auto", bool or array-like, default="auto"
        Accepted for compatibility with scikit-learn: the gram is always
        computed, factorized, per fold (a ``UserWarning`` for an array).
    max_iter : int, default=1000
        Most coordinate-descent sweeps per alpha.
    tol : float, default=1e-4
        scikit-learn's duality-gap tolerance of every fit.
    copy_X : bool, default=True
        Accepted for compatibility; ``X`` is never modified.
    cv : int, cross-validation generator or iterable, default=None
        The splits of :func:`sklearn.model_selection.check_cv` (None: 5-fold
        ``KFold``).
    verbose : bool or int, default=False
        Accepted for compatibility; nothing is printed.
    n_jobs : int, default=None
        Accepted for compatibility; the folds run in this process.
    positive : bool, default=False
        Constrain the coefficients to be non-negative.
    random_state : int, RandomState instance or None, default=None
        Seed of the coordinate draws of ``selection="random"``.
    selection : {"cyclic", "random"}, default="cyclic"
        Order of the coordinate updates.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the grams and the products compute; the coordinate descent runs
        on the host.

    Attributes
    ----------
    alpha_ : float
        The chosen penalty.
    coef_ : ndarray of shape (n_features,)
        Coefficients of the refit.
    intercept_ : float
        Intercept of the refit (0.0 when ``fit_intercept=False``).
    mse_path_ : ndarray of shape (n_alphas, n_folds)
        Test mean squared error of every alpha and fold.
    alphas_ : ndarray of shape (n_alphas,)
        The alphas tried.
    dual_gap_ : float
        Duality gap of the refit.
    n_iter_ : int
        Coordinate-descent sweeps of the refit.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit.

    See Also
    --------
    sklearn.linear_model.LassoCV : The same search on a single matrix.
    FactorizedLasso : The lasso with a given alpha.
    FactorizedElasticNetCV : L1 and L2 penalties combined.

    Notes
    -----
    The search of :class:`FactorizedElasticNetCV` with ``l1_ratio=1``: per fold
    one centered gram of the training rows, the path by warm-started coordinate
    descent on it (no pass over the data per alpha), the test errors of all
    alphas from the test rows' statistics, and the refit on the full data's
    gram, already formed for scikit-learn's alpha grid.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedLassoCV
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((300, 2))
    >>> dim = rng.standard_normal((30, 3))
    >>> fk = rng.integers(0, 30, 300)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0]
    >>> y += rng.standard_normal(300)
    >>> reg = FactorizedLassoCV(cv=5, tol=1e-8).fit(ds, y)
    >>> reg.mse_path_.shape  # (n_alphas, n_folds)
    (100, 5)

    The same choice as scikit-learn's on the joined matrix:

    >>> from sklearn.linear_model import LassoCV
    >>> ref = LassoCV(cv=5, tol=1e-8).fit(ds.materialize(), y)
    >>> bool(reg.alpha_ == ref.alpha_)
    True
    >>> bool(np.allclose(reg.coef_, ref.coef_, rtol=1e-5, atol=1e-8))
    True
    """

    def __init__(
        self,
        *,
        eps=1e-3,
        alphas=100,
        fit_intercept=True,
        precompute="auto",
        max_iter=1000,
        tol=1e-4,
        copy_X=True,
        cv=None,
        verbose=False,
        n_jobs=None,
        positive=False,
        random_state=None,
        selection="cyclic",
        strategy="factorized",
        device="auto",
    ):
        self.eps = eps
        self.alphas = alphas
        self.fit_intercept = fit_intercept
        self.precompute = precompute
        self.max_iter = max_iter
        self.tol = tol
        self.copy_X = copy_X
        self.cv = cv
        self.verbose = verbose
        self.n_jobs = n_jobs
        self.positive = positive
        self.random_state = random_state
        self.selection = selection
        self.strategy = strategy
        self.device = device

    def _refit_model(self, alpha, l1_ratio):
        return FactorizedLasso(
            alpha=alpha,
            fit_intercept=self.fit_intercept,
            max_iter=self.max_iter,
            tol=self.tol,
            positive=self.positive,
            random_state=self.random_state,
            selection=self.selection,
            strategy=self.strategy,
            device=self.device,
        )
