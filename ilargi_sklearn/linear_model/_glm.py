"""Factorized generalized linear models: Poisson, Gamma and Tweedie regression by
L-BFGS on scikit-learn's objective."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_y, check_is_fitted

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on, to_numpy
from ilargi_sklearn.linear_model._base import (
    _check_n_rows,
    _linear_decision,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._loss import (
    HalfTweedie,
    _objective,
    _raw_prediction,
    _split_coef,
)
from ilargi_sklearn.linear_model._optimize import _minimize_lbfgs
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    device_regression_target,
    host_array,
    validate_fit_inputs,
)

__all__ = [
    "FactorizedGammaRegressor",
    "FactorizedPoissonRegressor",
    "FactorizedTweedieRegressor",
]


def _glm_target(estimator, y, op):
    """The target as a float64 (n_samples,) array where ``op`` lives, checked to be
    in the domain of the estimator's loss (scikit-learn's ``in_y_true_range``).

    A target already next to the data is checked there; any other is validated on
    the host by scikit-learn's ``_check_y`` (a column vector is raveled with a
    ``DataConversionWarning``) and moved next to the data once.
    """
    Y = device_regression_target(estimator, y, op)
    if Y is not None:
        if Y.shape[1] != 1:
            raise ValueError(
                f"y should be a 1d array, got an array of shape {y.shape} instead."
            )
        y = Y[:, 0]
    else:
        y = _check_y(host_array(y), y_numeric=True, estimator=estimator)
        if sp.issparse(y):
            y = y.toarray().ravel()
        y = asarray_on(np.asarray(y, dtype=np.float64), op.xp, op.device)
    _check_n_rows(op, y)
    loss, name = estimator._half_loss()
    if not loss.in_y_range(op.xp, y):
        low, closed = loss.y_domain()
        bound = f"y >= {low:g}" if closed else f"y > {low:g}"
        raise ValueError(
            f"Some value(s) of y are out of the valid range of the loss {name!r}: "
            f"{type(estimator).__name__} needs {bound} (got min(y)="
            f"{float(op.xp.min(y)):g}). Use targets in that range, or another "
            "family (FactorizedTweedieRegressor with another power)."
        )
    return y


def _weighted_mean(xp, y, sample_weight, sw_sum):
    if sample_weight is None:
        return float(xp.sum(y)) / sw_sum
    return float(xp.sum(y * sample_weight)) / sw_sum


def _glm_regression(
    op,
    y,
    *,
    loss,
    sample_weight,
    sw_sum,
    alpha,
    fit_intercept,
    max_iter,
    tol,
    w0,
):
    """A generalized linear model by L-BFGS on scikit-learn's objective, the mean
    ``loss`` plus ``alpha / 2 ||coef||^2``, from the flat parameters ``w0``
    (coefficients, then the intercept).

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    y : array of shape (n_samples,), float64
        Where ``op`` lives, in the loss' domain.
    loss : HalfTweedie
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    sw_sum : float
        ``sum(sample_weight)`` (``n_samples`` for unit weights).
    alpha : float
    fit_intercept : bool
    max_iter : int
    tol : float
        L-BFGS-B's ``gtol``.
    w0 : ndarray of shape (n_features + fit_intercept,)

    Returns
    -------
    coef : ndarray of shape (n_features,), float64
    intercept : ndarray of shape (1,), float64, or None
        None without an intercept.
    n_iter : int
    """
    args = (y, sample_weight, sw_sum, alpha, fit_intercept, 1)
    # BLAS on one thread, as in the logistic fit: L-BFGS' operations on the
    # parameter vector gain nothing from BLAS's threads; the objective's threads
    # come from the compiled kernels' pool.
    with one_blas_thread():
        w, n_iter = _minimize_lbfgs(
            # _minimize_lbfgs <- here <- fit <- _fit_context <- the caller
            _objective(op, loss),
            w0,
            args,
            max_iter,
            tol,
            stacklevel=4,
        )
    coef, intercept = _split_coef(w, op.n_cols, 1, fit_intercept)
    return coef[0], intercept, n_iter


class _FactorizedGLM(DeviceMixin, RegressorMixin, BaseEstimator):
    """The shared machinery of the factorized GLMs; subclasses name their loss."""

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0.0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "solver": [StrOptions({"lbfgs"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0.0, None, closed="neither")],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        alpha=1.0,
        fit_intercept=True,
        solver="lbfgs",
        max_iter=100,
        tol=1e-4,
        warm_start=False,
        verbose=0,
        strategy="factorized",
        device="auto",
    ):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.warm_start = warm_start
        self.verbose = verbose
        self.strategy = strategy
        self.device = device

    def _half_loss(self):
        """``(loss, name)``: the :class:`HalfTweedie` loss and the name of
        scikit-learn's loss class it reproduces (for messages)."""
        raise NotImplementedError

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Target values, in the domain of the loss.
        sample_weight : array-like of shape (n_samples,), default=None
            Sample weights.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        op, y, sample_weight, sw_sum = validate_fit_inputs(
            self, X, y, sample_weight, target=_glm_target, strategy=self.strategy
        )
        loss, _ = self._half_loss()
        xp = op.xp
        n_features = op.n_cols
        if self.warm_start and hasattr(self, "coef_"):
            w0 = np.asarray(to_numpy(self.coef_), dtype=np.float64).ravel()
            if self.fit_intercept:
                w0 = np.append(w0, float(self.intercept_))
        else:
            w0 = np.zeros(n_features + int(self.fit_intercept))
            if self.fit_intercept:
                # scikit-learn's start: the intercept-only model's raw prediction.
                w0[-1] = float(
                    loss.link_fn(np, _weighted_mean(xp, y, sample_weight, sw_sum))
                )
        coef, intercept, n_iter = _glm_regression(
            op,
            y,
            loss=loss,
            sample_weight=sample_weight,
            sw_sum=sw_sum,
            alpha=self.alpha,
            fit_intercept=self.fit_intercept,
            max_iter=self.max_iter,
            tol=self.tol,
            w0=w0,
        )
        # Fitted attributes stay where the fit ran, in the data's dtype; the
        # intercept a scalar, as in scikit-learn.
        _set_linear_fitted(
            self, op, coef, intercept, y_ndim=1, ravel_single=True, n_iter=n_iter
        )
        return self

    def _linear_predictor(self, op):
        """``T coef + intercept`` in float64, shape (n_samples,)."""
        coef = np.asarray(to_numpy(self.coef_), dtype=np.float64)[None, :]
        intercept = np.asarray([float(self.intercept_)])
        return _raw_prediction(op, coef, intercept)[:, 0]

    def predict(self, X):
        """Predict the mean: the inverse link of ``T coef + intercept``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
            Predicted means, in the data's dtype.
        """
        raw, xp, caller = _linear_decision(self, X)
        loss, _ = self._half_loss()
        return caller.give(loss.inverse(xp, raw))

    def score(self, X, y, sample_weight=None):
        """D^2, the fraction of deviance explained.

        ``D^2 = 1 - D(y, y_pred) / D(y, y_null)`` with ``D`` the (sample-weighted)
        mean deviance of the model's loss and ``y_null`` the weighted mean of
        ``y``; a generalization of R^2 (scikit-learn's GLM ``score``). 1 is a
        perfect fit; it can be negative.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Test samples.
        y : array-like of shape (n_samples,)
            True targets, in the domain of the loss.
        sample_weight : array-like of shape (n_samples,), default=None
            Sample weights.

        Returns
        -------
        score : float
            D^2 of ``self.predict(X)`` with respect to ``y``.
        """
        check_is_fitted(self)
        op, y, sample_weight, sw_sum = validate_fit_inputs(
            self, X, y, sample_weight, target=_glm_target, reset=False
        )
        xp = op.xp
        loss, _ = self._half_loss()

        def mean_loss(values):
            if sample_weight is not None:
                values = values * sample_weight
            return float(xp.sum(values)) / sw_sum

        raw = self._linear_predictor(op)
        raw_null = loss.link_fn(np, _weighted_mean(xp, y, sample_weight, sw_sum))
        constant = mean_loss(loss.constant(xp, y))
        deviance = mean_loss(loss.pointwise(xp, raw, y)[0])
        null = mean_loss(loss.pointwise(xp, xp.zeros_like(y) + raw_null, y)[0])
        # The dropped constant terms cancel in the model's loss differences but
        # not in the ratio: both deviances get them back (the factor 2 cancels).
        return float(1.0 - (deviance + constant) / (null + constant))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        try:
            low, _ = self._half_loss()[0].y_domain()
            tags.target_tags.positive_only = low is not None
        except (ValueError, TypeError):
            pass  # an invalid power or link: default tags until fit says why
        return tags


_PARAMETERS = """alpha : float, default=1.0
        Strength of the L2 penalty ``alpha / 2 ||coef||^2`` added to the mean
        loss; 0 fits without penalty (then ``T`` should have full column rank).
        The intercept is never penalized.
    fit_intercept : bool, default=True
        Whether to add an intercept to the linear predictor ``T coef +
        intercept``.
    solver : {"lbfgs"}, default="lbfgs"
        ``scipy.optimize.minimize(method="L-BFGS-B")`` with the loss and its
        gradient computed through the operator and scikit-learn's options
        (``maxiter=max_iter``, ``maxls=50``, ``gtol=tol``, ``ftol=64 eps``).
        scikit-learn's ``"newton-cholesky"`` is not implemented.
    max_iter : int, default=100
        Most L-BFGS iterations.
    tol : float, default=1e-4
        Stop when the largest absolute entry of the gradient is at most ``tol``.
    warm_start : bool, default=False
        Start from the ``coef_`` and ``intercept_`` of the previous fit.
    verbose : int, default=0
        Accepted for compatibility with scikit-learn, which (on SciPy >= 1.15)
        prints nothing either.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``:
        through its factorized operator, or materialized once into a plain matrix.
        Both give the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and the predictions compute: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). On a device the n-length arrays stay there; L-BFGS runs on the
        host over the parameters, which cross once per evaluation. ``coef_``
        stays where the fit ran; predictions come back in the caller's array
        type; pickles hold NumPy arrays."""

_ATTRIBUTES = """coef_ : ndarray of shape (n_features,)
        Coefficients of the linear predictor, in the dtype of the training data.
    intercept_ : float
        Intercept of the linear predictor (0.0 when ``fit_intercept=False``).
    n_iter_ : int
        Iterations run by L-BFGS.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names)."""

_NOTES = """The objective is scikit-learn's: with sample weights ``s``,

        sum_i s_i l(y_i, T_i coef + intercept) / sum(s) + alpha / 2 ||coef||^2,

    ``l`` half the unit deviance up to terms free of the parameters. Its gradient
    with respect to ``coef`` is ``T^T (s * l') / sum(s) + alpha coef``. The
    factorized rewrite needs per evaluation one ``T coef`` (a gather of the
    per-source products ``S_k coef_k``) and one ``T^T g`` (a scatter-add of ``g``
    into each source's rows, then ``S_k^T``); no joined row is formed. L-BFGS
    starts where scikit-learn does (``coef = 0``, ``intercept`` the link of the
    weighted mean of ``y``), so both take the same steps to the same optimum."""


class FactorizedPoissonRegressor(_FactorizedGLM):
    __doc__ = f"""Poisson regression on joined data sources, without building the join.

    A generalized linear model with a Poisson distribution and a log link (the
    mean is ``exp(T coef + intercept)``), for counts and other non-negative
    targets, trained on the joined matrix ``T`` of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse
    matrix). It minimizes the objective of
    :class:`sklearn.linear_model.PoissonRegressor` with the same L-BFGS, so both
    reach the same optimum.

    Parameters
    ----------
    {_PARAMETERS}

    Attributes
    ----------
    {_ATTRIBUTES}

    See Also
    --------
    sklearn.linear_model.PoissonRegressor : The same model on a single matrix.
    FactorizedGammaRegressor : Gamma regression (positive targets).
    FactorizedTweedieRegressor : Tweedie regression of any power.

    Notes
    -----
    The loss is half the Poisson deviance, ``l(y, r) = exp(r) - y r`` (terms free
    of ``r`` dropped), for targets ``y >= 0``.

    {_NOTES}

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedPoissonRegressor
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = rng.poisson(np.exp(0.5 + 0.3 * base[:, 0] - 0.2 * dim[fk, 1]))
    >>> reg = FactorizedPoissonRegressor(alpha=1e-4).fit(ds, y)
    >>> reg.coef_.shape
    (5,)
    >>> bool(np.all(reg.predict(ds[:3]) > 0))
    True
    >>> bool(0 < reg.score(ds, y) < 1)
    True
    """

    def _half_loss(self):
        return HalfTweedie(1.0), "HalfPoissonLoss"


class FactorizedGammaRegressor(_FactorizedGLM):
    __doc__ = f"""Gamma regression on joined data sources, without building the join.

    A generalized linear model with a Gamma distribution and a log link (the mean
    is ``exp(T coef + intercept)``), for positive, right-skewed targets (claim
    sizes, durations), trained on the joined matrix ``T`` of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse
    matrix). It minimizes the objective of
    :class:`sklearn.linear_model.GammaRegressor` with the same L-BFGS, so both
    reach the same optimum.

    Parameters
    ----------
    {_PARAMETERS}

    Attributes
    ----------
    {_ATTRIBUTES}

    See Also
    --------
    sklearn.linear_model.GammaRegressor : The same model on a single matrix.
    FactorizedPoissonRegressor : Poisson regression (counts).
    FactorizedTweedieRegressor : Tweedie regression of any power.

    Notes
    -----
    The loss is half the Gamma deviance, ``l(y, r) = r + y exp(-r)`` (terms free
    of ``r`` dropped), for targets ``y > 0``.

    {_NOTES}

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedGammaRegressor
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> mean = np.exp(1.0 + 0.3 * base[:, 0] - 0.2 * dim[fk, 1])
    >>> y = rng.gamma(shape=2.0, scale=mean / 2.0)
    >>> reg = FactorizedGammaRegressor(alpha=1e-4).fit(ds, y)
    >>> reg.coef_.shape
    (5,)
    >>> bool(np.all(reg.predict(ds[:3]) > 0))
    True
    >>> bool(0 < reg.score(ds, y) < 1)
    True
    """

    def _half_loss(self):
        return HalfTweedie(2.0), "HalfGammaLoss"


_TWEEDIE_PARAMETERS = _PARAMETERS.replace(
    "    solver : {",
    """    link : {"auto", "identity", "log"}, default="auto"
        The link function: the mean is ``T coef + intercept`` ("identity") or
        ``exp(T coef + intercept)`` ("log"). "auto" is "identity" for
        ``power <= 0`` and "log" otherwise.
    solver : {""",
)


class FactorizedTweedieRegressor(_FactorizedGLM):
    __doc__ = f"""Tweedie regression on joined data sources, without building the join.

    A generalized linear model with a Tweedie distribution of power ``power``,
    trained on the joined matrix ``T`` of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse
    matrix). It minimizes the objective of
    :class:`sklearn.linear_model.TweedieRegressor` with the same L-BFGS, so both
    reach the same optimum.

    Parameters
    ----------
    power : float, default=0.0
        The Tweedie power, which sets the distribution and the targets' domain:
        0 normal (any ``y``), 1 Poisson and (1, 2) compound Poisson-Gamma
        (``y >= 0``), 2 Gamma and 3 inverse Gaussian (``y > 0``). No distribution
        exists for 0 < power < 1; scikit-learn (>= 1.8) accepts such powers all
        the same (its loss is still a consistent scoring function of the mean),
        and so does this estimator (``y >= 0``).
    {_TWEEDIE_PARAMETERS}

    Attributes
    ----------
    {_ATTRIBUTES}

    See Also
    --------
    sklearn.linear_model.TweedieRegressor : The same model on a single matrix.
    FactorizedPoissonRegressor : Poisson regression (``power=1``).
    FactorizedGammaRegressor : Gamma regression (``power=2``).

    Notes
    -----
    The loss is scikit-learn's half Tweedie deviance: with the log link and
    ``p = power`` not in {{0, 1, 2}}, ``l(y, r) = exp((2-p) r) / (2-p) -
    y exp((1-p) r) / (1-p)`` (terms free of ``r`` dropped; the Poisson and Gamma
    losses at ``p = 1, 2``, ``(exp(r) - y)^2 / 2`` at ``p = 0``); with the
    identity link the full half deviance of the mean ``r`` (which must stay
    positive for ``p > 0``).

    {_NOTES}

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedTweedieRegressor
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> mean = np.exp(0.5 + 0.3 * base[:, 0] - 0.2 * dim[fk, 1])
    >>> y = rng.poisson(mean) * rng.gamma(2.0, 0.5, 200)  # zeros and positive
    >>> reg = FactorizedTweedieRegressor(power=1.5, alpha=1e-4).fit(ds, y)
    >>> reg.coef_.shape
    (5,)
    >>> bool(np.all(reg.predict(ds[:3]) > 0))
    True
    >>> bool(0 < reg.score(ds, y) < 1)
    True
    """

    _parameter_constraints: dict = {
        **_FactorizedGLM._parameter_constraints,
        "power": [Interval(Real, None, None, closed="neither")],
        "link": [StrOptions({"auto", "identity", "log"})],
    }

    def __init__(
        self,
        *,
        power=0.0,
        alpha=1.0,
        fit_intercept=True,
        link="auto",
        solver="lbfgs",
        max_iter=100,
        tol=1e-4,
        warm_start=False,
        verbose=0,
        strategy="factorized",
        device="auto",
    ):
        super().__init__(
            alpha=alpha,
            fit_intercept=fit_intercept,
            solver=solver,
            max_iter=max_iter,
            tol=tol,
            warm_start=warm_start,
            verbose=verbose,
            strategy=strategy,
            device=device,
        )
        self.power = power
        self.link = link

    def _half_loss(self):
        power = float(self.power)
        link = self.link
        if link == "auto":
            link = "identity" if power <= 0 else "log"
        if link not in ("identity", "log"):
            raise ValueError(
                f"link must be 'auto', 'identity' or 'log', got {self.link!r}."
            )
        name = "HalfTweedieLoss" if link == "log" else "HalfTweedieLossIdentity"
        return HalfTweedie(power, link), name
