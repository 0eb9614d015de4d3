"""Cross-validated lasso and elastic net on joined data sources: scikit-learn's
LinearModelCV search, every candidate of a fold solved by coordinate descent on the
fold's statistics (one centered gram per fold), never by another pass over the
data, then the refit on all rows by the same kernel."""

from __future__ import annotations

import numbers
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions

from ilargi_sklearn.linear_model._base import (
    LinearPredictorMixin,
    _check_alphas,
    _check_device_support,
    _folds,
    _predict_path,
    _regression_target,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._cd_gram import RAND_R_MAX, enet_cd_gram
from ilargi_sklearn.linear_model._coordinate_descent import (
    _MESSAGE_CONV,
    _check_finite_stats,
    _enet_fit_gram,
    _enet_work,
)
from ilargi_sklearn.linear_model._least_squares import (
    _GRAM_NOISE,
    _drop_constant_columns,
)
from ilargi_sklearn.multisource._statistics import FoldStatistics, centered_gram, host64
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    validate_fit_inputs,
)

__all__ = ["FactorizedElasticNetCV", "FactorizedLassoCV"]


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
    one shift (:class:`~ilargi_sklearn.multisource._statistics.FoldStatistics`), the
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


def _enet_fold_mse(
    statistics,
    folds,
    l1_ratios,
    grids,
    *,
    fit_intercept,
    max_iter,
    tol,
    random_state,
    selection,
    positive,
):
    """``(n_l1_ratio, n_folds, n_alphas)`` test errors of the elastic-net paths:
    each fold's statistics (``statistics``, a :class:`FoldStatistics`) computed
    once and shared by every l1_ratio's path, the paths' test errors from the
    test rows' statistics (:func:`_path_mse`)."""
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
            rng = check_random_state(random_state)
            coefs, failed = _enet_path(
                stats,
                grid,
                l1_ratio,
                max_iter=max_iter,
                tol=tol,
                rng=rng,
                selection=selection,
                positive=positive,
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
            stats if fit_intercept else None,
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


#: Coordinate-descent sweeps the planner expects per alpha of a warm-started
#: path (at most ``max_iter``): each alpha starts from the previous solution.
_PATH_SWEEPS_PER_ALPHA = 5


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

    def _l1_ratios(self):
        return np.atleast_1d(getattr(self, "l1_ratio", 1.0)).astype(np.float64)

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`).

        The fold statistics: the gram of all rows and those of the test folds
        (about two grams, with the column sums); then, on the grams alone, each
        fold's path of ``alphas`` per ``l1_ratio``, warm-started (a few sweeps per
        alpha), and the refit's sweeps.
        """
        from ilargi_sklearn.planner._work import n_folds

        d = float(data["n_features"])
        k = n_folds(self.cv)
        n_l1 = self._l1_ratios().size
        n_alphas = (
            self.alphas if isinstance(self.alphas, Integral) else len(self.alphas)
        )
        refit = _enet_work(d, self.max_iter)
        path = k * n_l1 * n_alphas * min(self.max_iter, _PATH_SWEEPS_PER_ALPHA)
        return refit.repeated(
            1,
            passes=2.0,
            grams=2,
            common_flops=refit.common_flops + 2.0 * d * d * path,
            fits=k * n_l1 * n_alphas + 1,
        )

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
        op, (Y, y_ndim), sample_weight, _, lineage = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_single_target,
            strategy=self.strategy,
            non_negative_weights=True,
            return_lineage=True,
        )
        _check_device_support(op, name)
        l1_ratios = self._l1_ratios()
        statistics = FoldStatistics(
            op, sample_weight, Y, self.fit_intercept, lineage=lineage
        )
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
        mse = _enet_fold_mse(
            statistics,
            folds,
            l1_ratios,
            grids,
            fit_intercept=self.fit_intercept,
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=self.random_state,
            selection=self.selection,
            positive=self.positive,
        )
        mean_mse = mse.mean(axis=1)  # (n_l1_ratio, n_alphas): over the folds
        best_mse = np.inf
        for r, grid, curve in zip(l1_ratios, grids, mean_mse):
            i = int(np.argmin(curve))
            if curve[i] < best_mse:
                best_alpha, best_l1_ratio, best_mse = float(grid[i]), float(r), curve[i]

        # The refit on all rows: the kernel of the estimator, on the statistics
        # of all rows already formed for the grid (no second pass).
        coef, intercept, dual_gap, n_iter = _enet_fit_gram(
            stats,
            alpha=best_alpha,
            l1_ratio=best_l1_ratio,
            coef_init=None,
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=self.random_state,
            selection=self.selection,
            positive=self.positive,
            dtype=op.dtype,
        )
        self.mse_path_ = np.squeeze(np.moveaxis(mse, 2, 1))
        self.alpha_ = best_alpha
        if hasattr(self, "l1_ratio"):
            self.l1_ratio_ = best_l1_ratio
        if isinstance(self.alphas, Integral):
            self.alphas_ = grids[0] if l1_ratios.size == 1 else grids
        else:
            self.alphas_ = grids[0]
        _set_linear_fitted(
            self,
            op,
            coef,
            intercept if self.fit_intercept else None,
            y_ndim=y_ndim,
            ravel_single=True,
            n_iter=n_iter[0],
        )
        self.dual_gap_ = dual_gap.astype(op.dtype)[0]
        return self

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
    over each fold's test rows, :class:`~ilargi_sklearn.multisource._statistics.FoldStatistics`;
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
