"""Factorized elastic net and lasso: coordinate descent on the implicitly centered
gram, which is computed once per fit and then stands in for the data."""

from __future__ import annotations

import numbers
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._sparse import _align_api_if_sparse

from ilargi_sklearn._backend._namespace import to_numpy
from ilargi_sklearn.linear_model._base import (
    LinearPredictorMixin,
    _check_device_support,
    _regression_target,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._cd_gram import RAND_R_MAX, enet_cd_gram
from ilargi_sklearn.linear_model._least_squares import _drop_constant_columns
from ilargi_sklearn.multisource._statistics import centered_gram
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    validate_fit_inputs,
)

__all__ = ["FactorizedElasticNet", "FactorizedLasso"]

_MESSAGE_CONV = (
    "Objective did not converge. You might want to increase the number of "
    "iterations (max_iter), check the scale of the features or consider "
    "increasing regularisation."
)


def _check_finite_stats(stats, dtype):
    """Refuse a gram or right-hand side that overflowed: coordinate descent would
    read NaN as "no update" and return zeros."""
    if not (np.isfinite(stats.G).all() and np.isfinite(stats.rhs).all()):
        raise ValueError(
            f"The gram of X (or X^T y) overflowed to non-finite values "
            f"(largest finite entry of the dtype: {np.finfo(dtype).max:.3g}); "
            "the data contain values too large for "
            f"{np.dtype(dtype).name}: scale them first (e.g. with "
            "FactorizedStandardScaler)."
        )


def _enet_fit_gram(
    stats,
    *,
    alpha,
    l1_ratio,
    coef_init,
    max_iter,
    tol,
    random_state,
    selection,
    positive,
    dtype,
):
    """The elastic net by coordinate descent on ``stats``, the
    :class:`~ilargi_sklearn.multisource._statistics.GramStats` of the data and the target
    (one column per target, each fitted on its own): scikit-learn's
    ``precompute=True`` path, with no pass over the data.

    Parameters
    ----------
    stats : GramStats
        Centered gram ``G``, right-hand side ``rhs`` (n_features, n_targets),
        means and target variances.
    alpha, l1_ratio : float
        The penalty, scikit-learn's.
    coef_init : ndarray of shape (n_targets, n_features) or None
        The first iterate (None: zeros).
    max_iter : int
        Most sweeps per target.
    tol : float
        scikit-learn's duality-gap tolerance.
    random_state : int, RandomState instance or None
        Seed of the coordinate draws of ``selection="random"``: a fresh generator
        per target, as scikit-learn's path makes one per call.
    selection : {"cyclic", "random"}
    positive : bool
    dtype : dtype
        The data's: what counts as a constant column and as overflow.

    Returns
    -------
    coef : ndarray of shape (n_targets, n_features), float64
    intercept : ndarray of shape (n_targets,), float64
    dual_gap : ndarray of shape (n_targets,), float64
    n_iter : list of int
        Sweeps per target.
    """
    _check_finite_stats(stats, dtype)
    n_features, n_targets = stats.rhs.shape
    G, rhs = _drop_constant_columns(stats.G, stats.rhs, stats.D, dtype)
    if coef_init is None:
        coef_init = np.zeros((n_targets, n_features))
    coef = np.zeros((n_targets, n_features))
    dual_gap = np.zeros(n_targets)
    n_iter = []
    for k in range(n_targets):
        # A fresh generator per target, as scikit-learn's path makes one per
        # call: an integer seed gives every target the same draws.
        seed = check_random_state(random_state).randint(0, RAND_R_MAX)
        coef[k], dual_gap[k], it, converged, gap_tol = enet_cd_gram(
            G,
            np.ascontiguousarray(rhs[:, k]),
            alpha,
            l1_ratio,
            coef_init[k],
            sw_sum=stats.sw_sum,
            y_norm2=float(stats.y_var[k]),
            max_iter=max_iter,
            tol=tol,
            seed=seed,
            random=selection == "random",
            positive=positive,
        )
        n_iter.append(it)
        if not converged:
            warnings.warn(
                f"{_MESSAGE_CONV} Duality gap: {dual_gap[k]:.6e}, tolerance: "
                f"{gap_tol:.3e}",
                ConvergenceWarning,
                stacklevel=3,
            )
    intercept = stats.y_mean - coef @ stats.mu
    if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
        raise ValueError(
            "Coordinate descent iterations resulted in non-finite parameter "
            "values. The input data may contain large values and need to be "
            "preprocessed (e.g. with FactorizedStandardScaler)."
        )
    return coef, intercept, dual_gap, n_iter


def _enet_work(n_features, max_iter):
    """The planner's count of one coordinate-descent fit on the gram: the gram
    once (with the column sums); the sweeps then read only the gram, ``d^2``
    multiply-adds each, about a few dozen at the default ``tol``."""
    from ilargi_sklearn.planner._work import Work

    d = float(n_features)
    sweeps = min(int(max_iter), 50)
    return Work(
        "lasso",
        "cd",
        iterations=sweeps,
        passes=1.0,
        passes_per_iteration=0.0,
        scales_with_iterations=("common_flops",),
        grams=1,
        common_flops=2.0 * d * d * sweeps,
    )


class FactorizedElasticNet(
    LinearPredictorMixin, DeviceMixin, RegressorMixin, BaseEstimator
):
    """Linear regression with combined L1 and L2 penalties on joined data sources,
    without building the join.

    Minimizes scikit-learn's elastic-net objective::

        1 / (2 * n_samples) * ||y - T w - b||^2_2
        + alpha * l1_ratio * ||w||_1
        + 0.5 * alpha * (1 - l1_ratio) * ||w||^2_2

    where ``T`` is the joined matrix of a :class:`~ilargi_sklearn.MultiSourceDataset`
    (or a plain array or sparse matrix); with sample weights the squared error is
    their weighted average. The solution is that of
    :class:`sklearn.linear_model.ElasticNet` on the materialized table: the same
    cyclic (or random) coordinate descent, stopping rule and screening, run on the
    gram (scikit-learn's ``precompute=True`` path), here computed factorized.

    Parameters
    ----------
    alpha : float, default=1.0
        Constant that multiplies the penalty terms. ``alpha = 0`` is ordinary least
        squares, which :class:`~ilargi_sklearn.linear_model.FactorizedLinearRegression`
        solves directly (a ``UserWarning`` says so, as in scikit-learn).
    l1_ratio : float, default=0.5
        The mixing parameter, ``0 <= l1_ratio <= 1``: 1 is the lasso penalty, 0 the
        ridge (L2) penalty.
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never copied.
    precompute : bool or array-like of shape (n_features, n_features), default=False
        Accepted for compatibility with scikit-learn and ignored: the gram is always
        computed, factorized, because it is the only way coordinate descent can
        avoid the joined matrix (and the cheaper one whenever ``n_samples`` exceeds
        ``n_features``). A precomputed array is not used (a ``UserWarning`` says so).
    max_iter : int, default=1000
        The maximum number of coordinate-descent sweeps (per target).
    copy_X : bool, default=True
        Accepted for compatibility with scikit-learn; ``X`` is never modified.
    tol : float, default=1e-4
        scikit-learn's tolerance: once a sweep's largest coefficient update is at
        most ``tol`` times the largest coefficient, the duality gap is computed, and
        the fit stops when it is at most ``tol * ||y - ybar||^2 / n_samples``
        (weighted).
    warm_start : bool, default=False
        When True, start from the previous fit's ``coef_`` (of the same shape).
    positive : bool, default=False
        When True, constrain the coefficients to be non-negative.
    random_state : int, RandomState instance or None, default=None
        Seed of the coordinate draws of ``selection="random"``: the same draws as
        scikit-learn's for the same seed.
    selection : {"cyclic", "random"}, default="cyclic"
        Update the coordinates in order or draw one at random for every update.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``: through
        its factorized operator, or materialized once into a plain matrix. Both give
        the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the gram is computed: "auto" where the data lives, "cpu", or "gpu"
        (CuPy; a dataset is moved once and its device copy cached). Sparse data on a
        device raise ``UnsupportedOnDeviceError`` (use ``device="cpu"``). The
        coordinate descent itself runs on the host in float64 on the
        ``(n_features, n_features)`` gram. ``coef_`` and ``intercept_`` stay where
        the fit ran; ``predict`` returns the caller's array type; pickles hold
        NumPy arrays.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients, 1-D for a single target; dtype of the training data.
    sparse_coef_ : sparse matrix of shape (1, n_features) or (n_targets, n_features)
        ``coef_`` as a CSR matrix.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (0.0 when ``fit_intercept=False``).
    n_iter_ : int or list of int
        Coordinate-descent sweeps run, per target for a 2-D target.
    dual_gap_ : float or ndarray of shape (n_targets,)
        Duality gap of the objective above at the end of each fit.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.ElasticNet : The same model on a single matrix.
    FactorizedLasso : The L1 penalty alone.
    FactorizedLinearRegression : Unpenalized least squares.

    Notes
    -----
    The factorized rewrite: coordinate descent needs the data only through
    ``Q = T_c^T S T_c`` and ``q = T_c^T S y_c`` of the (weighted, ``S = diag(s)``)
    centered data. With ``s_sum = sum(s)`` and the weighted column means ``mu``,
    both come from the factorized gram and one transposed product::

        Q = T^T S T - s_sum mu mu^T
        q = T^T S y - mu (s^T y)

    (:func:`ilargi_sklearn.multisource._statistics.centered_gram`). The gram is assembled from
    per-source blocks and co-occurrence blocks of the sources, and the centering is
    implicit, so no joined row is formed and sparsity survives. Each coordinate
    update is then ``w_j <- soft(q_j - (Q w)_j + Q_jj w_j, l1) / (Q_jj + l2)`` with
    ``Q w`` kept up to date by one row of ``Q`` per change: ``O(n_features)`` per
    update, independent of the number of rows. Penalties are scaled by ``s_sum``
    instead of rescaling the weights to sum to ``n_samples``: the same iterates.

    Cost: one gram and one ``rmatmul`` per fit (one pass over the data), then
    ``O(n_features^2)`` per sweep on the host; a compiled loop runs where numba is
    installed. The dense gram needs ``8 n_features^2`` bytes, so this suits up to a
    few thousand features.

    Columns that are constant up to rounding get a zero coefficient, as in
    scikit-learn. Implicit centering cancels digits on columns (and a target)
    whose mean is far larger than their spread, about ``eps * mean / spread``
    relative (so most in float32): standardize such data first.

    References
    ----------
    .. [1] J. Friedman, T. Hastie, R. Tibshirani, "Regularization paths for
       generalized linear models via coordinate descent", J. Stat. Softw. 33(1),
       2010.
    .. [2] O. Fercoq, A. Gramfort, J. Salmon, "Mind the duality gap: safer rules for
       the Lasso", ICML 2015.
    .. [3] L. Chen, A. Kumar, J. Naughton, J. M. Patel, "Towards linear algebra over
       normalized data", PVLDB 10(11), 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedElasticNet
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0] + 4.0
    >>> reg = FactorizedElasticNet(alpha=0.01, l1_ratio=0.5).fit(ds, y)
    >>> np.round(reg.coef_, 2) + 0.0  # + 0.0 turns -0.0 into 0.0
    array([ 0.99, -1.98,  0.49,  0.  ,  2.98])
    >>> round(reg.score(ds, y), 4)
    0.9999
    """

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left")],
        "l1_ratio": [Interval(Real, 0, 1, closed="both")],
        "fit_intercept": ["boolean"],
        "precompute": ["boolean", "array-like"],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "copy_X": ["boolean"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "positive": ["boolean"],
        "random_state": ["random_state"],
        "selection": [StrOptions({"cyclic", "random"})],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        alpha=1.0,
        l1_ratio=0.5,
        fit_intercept=True,
        precompute=False,
        max_iter=1000,
        copy_X=True,
        tol=1e-4,
        warm_start=False,
        positive=False,
        random_state=None,
        selection="cyclic",
        strategy="factorized",
        device="auto",
    ):
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.fit_intercept = fit_intercept
        self.precompute = precompute
        self.max_iter = max_iter
        self.copy_X = copy_X
        self.tol = tol
        self.warm_start = warm_start
        self.positive = positive
        self.random_state = random_state
        self.selection = selection
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model by coordinate descent on the factorized gram.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Target values; each target is fitted on its own, as in scikit-learn.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Individual weights for each sample (a number: equal weights). Only
            their ratios matter.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        name = type(self).__name__
        if self.alpha == 0:
            warnings.warn(
                f"With alpha=0, {name} does not converge well and is ordinary "
                "least squares: use FactorizedLinearRegression instead.",
                UserWarning,
                stacklevel=2,
            )
        if not isinstance(self.precompute, (bool, np.bool_)):
            warnings.warn(
                f"{name} ignores a precomputed gram (precompute=array): it "
                "computes the centered gram from the data, factorized.",
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
            target=_regression_target,
            strategy=self.strategy,
            return_lineage=True,
        )
        _check_device_support(op, name)
        stats = centered_gram(op, sample_weight, self.fit_intercept, Y, lineage=lineage)
        coef, intercept, dual_gap, n_iter = _enet_fit_gram(
            stats,
            alpha=self.alpha,
            l1_ratio=self.l1_ratio,
            coef_init=self._start(Y.shape[1], op.n_cols),
            max_iter=self.max_iter,
            tol=self.tol,
            random_state=self.random_state,
            selection=self.selection,
            positive=self.positive,
            dtype=op.dtype,
        )
        # A single target gives 1-D coefficients even for a 2-D y, as in
        # scikit-learn's ElasticNet (whose intercept keeps y's shape).
        _set_linear_fitted(
            self,
            op,
            coef,
            intercept if self.fit_intercept else None,
            y_ndim=y_ndim,
            ravel_single=True,
            n_iter=n_iter[0] if len(n_iter) == 1 else n_iter,
        )
        dual_gap = dual_gap.astype(op.dtype)
        self.dual_gap_ = dual_gap[0] if dual_gap.shape[0] == 1 else dual_gap
        return self

    def _start(self, n_targets, n_features):
        """The first iterate: the previous ``coef_`` under ``warm_start``."""
        if not self.warm_start or not hasattr(self, "coef_"):
            return np.zeros((n_targets, n_features))
        coef = np.asarray(to_numpy(self.coef_), dtype=np.float64).reshape(
            -1, np.shape(self.coef_)[-1]
        )
        if coef.shape != (n_targets, n_features):
            raise ValueError(
                f"warm_start=True needs the previous coef_ of shape "
                f"{(n_targets, n_features)} (n_targets, n_features), got "
                f"{coef.shape}; fit with warm_start=False to start afresh."
            )
        return coef

    @property
    def sparse_coef_(self):
        """``coef_`` as a CSR matrix (scikit-learn's configured sparse interface)."""
        coef = np.atleast_2d(to_numpy(self.coef_))
        return _align_api_if_sparse(sp.csr_array(coef))

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`)."""
        return _enet_work(data["n_features"], self.max_iter)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        return tags


class FactorizedLasso(FactorizedElasticNet):
    """Linear regression with an L1 penalty on joined data sources, without building
    the join.

    Minimizes scikit-learn's lasso objective::

        1 / (2 * n_samples) * ||y - T w - b||^2_2 + alpha * ||w||_1

    on the joined matrix ``T`` of a :class:`~ilargi_sklearn.MultiSourceDataset` (or
    a plain array or sparse matrix): :class:`FactorizedElasticNet` with
    ``l1_ratio=1``, and the solution of :class:`sklearn.linear_model.Lasso` on the
    materialized table.

    Parameters
    ----------
    alpha : float, default=1.0
        Constant that multiplies the L1 term. ``alpha = 0`` is ordinary least
        squares (use :class:`FactorizedLinearRegression`).
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never copied.
    precompute : bool or array-like of shape (n_features, n_features), default=False
        Accepted for compatibility with scikit-learn and ignored: the gram is always
        computed, factorized (a precomputed array is not used; a ``UserWarning``
        says so).
    copy_X : bool, default=True
        Accepted for compatibility with scikit-learn; ``X`` is never modified.
    max_iter : int, default=1000
        The maximum number of coordinate-descent sweeps (per target).
    tol : float, default=1e-4
        scikit-learn's tolerance: once a sweep's largest coefficient update is at
        most ``tol`` times the largest coefficient, the duality gap is computed, and
        the fit stops when it is at most ``tol * ||y - ybar||^2 / n_samples``
        (weighted).
    warm_start : bool, default=False
        When True, start from the previous fit's ``coef_`` (of the same shape).
    positive : bool, default=False
        When True, constrain the coefficients to be non-negative.
    random_state : int, RandomState instance or None, default=None
        Seed of the coordinate draws of ``selection="random"``: the same draws as
        scikit-learn's for the same seed.
    selection : {"cyclic", "random"}, default="cyclic"
        Update the coordinates in order or draw one at random for every update.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``: through
        its factorized operator, or materialized once into a plain matrix.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the gram is computed (see :class:`FactorizedElasticNet`); the
        coordinate descent runs on the host.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients, 1-D for a single target; dtype of the training data.
    sparse_coef_ : sparse matrix of shape (1, n_features) or (n_targets, n_features)
        ``coef_`` as a CSR matrix.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (0.0 when ``fit_intercept=False``).
    n_iter_ : int or list of int
        Coordinate-descent sweeps run, per target for a 2-D target.
    dual_gap_ : float or ndarray of shape (n_targets,)
        Duality gap at the end of each fit.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit.

    See Also
    --------
    sklearn.linear_model.Lasso : The same model on a single matrix.
    FactorizedElasticNet : L1 and L2 penalties combined.

    Notes
    -----
    Coordinate descent on the factorized, implicitly centered gram
    ``Q = T^T S T - s_sum mu mu^T`` and ``q = T^T S y - mu (s^T y)``: one pass
    over the data, then ``O(n_features)`` per coordinate update; see
    :class:`FactorizedElasticNet`.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedLasso
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0] + 4.0
    >>> reg = FactorizedLasso(alpha=0.1).fit(ds, y)
    >>> np.round(reg.coef_, 2) + 0.0  # the L1 penalty keeps the zero exact
    array([ 0.88, -1.88,  0.39,  0.  ,  2.89])
    >>> reg.sparse_coef_.nnz
    4
    """

    _parameter_constraints: dict = dict(FactorizedElasticNet._parameter_constraints)
    _parameter_constraints.pop("l1_ratio")

    def __init__(
        self,
        *,
        alpha=1.0,
        fit_intercept=True,
        precompute=False,
        copy_X=True,
        max_iter=1000,
        tol=1e-4,
        warm_start=False,
        positive=False,
        random_state=None,
        selection="cyclic",
        strategy="factorized",
        device="auto",
    ):
        # As scikit-learn's Lasso: an elastic net whose l1_ratio is not a parameter.
        super().__init__(
            alpha=alpha,
            l1_ratio=1.0,
            fit_intercept=fit_intercept,
            precompute=precompute,
            max_iter=max_iter,
            copy_X=copy_X,
            tol=tol,
            warm_start=warm_start,
            positive=positive,
            random_state=random_state,
            selection=selection,
            strategy=strategy,
            device=device,
        )
