"""Factorized ordinary least squares: normal equations, LSQR and gradient descent."""

from __future__ import annotations

import logging
import warnings
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from ilargi_sklearn._backend._cuml import fit_cuml, use_cuml
from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn.linear_model._base import (
    LinearPredictorMixin,
    _check_device_support,
    _regression_target,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._least_squares import (
    _MAX_DENSE_GRAM_FEATURES,
    _solve_lsqr,
    _solve_normal_equations,
    gram_out_of_reach,
)
from ilargi_sklearn.linear_model._loss import _objective, _split_coef
from ilargi_sklearn.linear_model._optimize import (
    _gradient_descent,
    _lipschitz_constant,
)
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    validate_fit_inputs,
)

__all__ = ["FactorizedLinearRegression"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ kernels
def _linear_regression(
    op,
    Y,
    *,
    sample_weight,
    sw_sum,
    solver,
    fit_intercept,
    tol,
    max_iter,
    learning_rate,
    lineage=None,
):
    """Weighted least squares on ``op`` and ``Y`` (n_samples, n_targets).

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    Y : array of shape (n_samples, n_targets), float64
        Where ``op`` lives.
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    sw_sum : float
        ``sum(sample_weight)`` (``n_samples`` for unit weights).
    solver : {"normal", "gd"}
        The normal equations from the centered gram (LSQR on the operator where
        the gram is out of reach, :func:`gram_out_of_reach`), or gradient descent.
    fit_intercept : bool
    tol : float
        ``lstsq``'s ``cond`` on the normal equations, LSQR's ``atol`` and
        ``btol``; gradient descent's largest absolute gradient entry (0: the
        fixed-iteration mode).
    max_iter : int
        Gradient-descent steps.
    learning_rate : float or None
        Gradient descent's step (None: ``1 / L``, :func:`_lipschitz_constant`).
    lineage : Lineage, default=None
        ``op``'s lineage, on which the normal equations' statistics are shared
        (:func:`~ilargi_sklearn.multisource._statistics.centered_gram`).

    Returns
    -------
    coef : ndarray of shape (n_targets, n_features), float64
    intercept : ndarray of shape (n_targets,), float64
    n_iter : int
        Gradient-descent steps, LSQR iterations (largest over the targets), or 1.
    """
    if solver == "gd":
        # Every product of the power iteration and of the descent has one column
        # per target: on one BLAS thread, as the logistic and GLM solvers run.
        # Multi-threaded, a factorized pass (one small BLAS call per term) spends
        # more on waking BLAS's threads than it saves; on a loaded 2-core machine
        # a factorized fit of 30,000 rows and three one-hot sources took 0.27 s
        # with two OpenBLAS threads, 0.017 s with one (benchmarks/README.md).
        with one_blas_thread():
            return _linear_regression_gd(
                op,
                Y,
                sample_weight=sample_weight,
                sw_sum=sw_sum,
                fit_intercept=fit_intercept,
                tol=tol,
                max_iter=max_iter,
                learning_rate=learning_rate,
            )
    if gram_out_of_reach(op):
        logger.info(
            "%d features (%s): LSQR on the operator instead of a dense gram.",
            op.n_cols,
            "sparse" if op.is_sparse else "products preferred",
        )
        coef, intercept, n_iters = _solve_lsqr(op, Y, sample_weight, fit_intercept, tol)
        return coef, intercept, int(n_iters.max())
    coef, intercept, _ = _solve_normal_equations(
        op, Y, sample_weight, fit_intercept, tol, lineage=lineage
    )
    return coef, intercept, 1


def _linear_regression_gd(
    op, Y, *, sample_weight, sw_sum, fit_intercept, tol, max_iter, learning_rate
):
    """Least squares by fixed-step gradient descent (:func:`_linear_regression`
    with ``solver="gd"``)."""
    n_features = op.n_cols
    n_targets = Y.shape[1]
    if learning_rate is None:
        L = _lipschitz_constant(
            op, sample_weight, sw_sum, 0.0, fit_intercept, "squared"
        )
        learning_rate = 1.0 / L if L > 0 else 1.0
        logger.info("gradient descent step size 1/L = %.3g", learning_rate)
    w0 = np.zeros(n_targets * (n_features + int(fit_intercept)))
    args = (Y, sample_weight, sw_sum, 0.0, fit_intercept, n_targets)
    # tol=0 is the papers' fixed-iteration mode: no gradient test at all.
    gd_tol = tol if tol > 0 else None
    w, n_iter, converged = _gradient_descent(
        _objective(op, "squared"), w0, args, learning_rate, max_iter, gd_tol
    )
    if gd_tol is not None and not converged:
        warnings.warn(
            f"Gradient descent did not reach tol={tol} in "
            f"max_iter={max_iter} iterations; increase max_iter or "
            "learning_rate, or set tol=0 for the fixed-iteration mode.",
            ConvergenceWarning,
            stacklevel=4,
        )
    coef, intercept = _split_coef(w, n_features, n_targets, fit_intercept)
    if intercept is None:
        intercept = np.zeros(n_targets)
    return coef.copy(), intercept.copy(), n_iter


# ------------------------------------------------------------------ estimator
class FactorizedLinearRegression(
    LinearPredictorMixin, DeviceMixin, RegressorMixin, BaseEstimator
):
    """Ordinary least squares on joined data sources, without building the join.

    Fits ``y ~ T coef + intercept`` where ``T`` is the joined matrix of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse matrix).
    The default solver forms the normal equations from the factorized gram
    ``T^T diag(s) T`` and gives the same model as
    :class:`sklearn.linear_model.LinearRegression` on the materialized table; the
    ``"gd"`` solver is the fixed-iteration gradient descent of the factorized-learning
    papers.

    Parameters
    ----------
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never copied.
    solver : {"normal", "gd"}, default="normal"
        * ``"normal"``: exact least squares. The centered gram is solved by Cholesky,
          or, when it is singular or ill-conditioned, by its pseudo-inverse (the
          minimum-norm solution, as ``lstsq`` gives). Sparse problems with more than
          1000 features use LSQR on the operator instead of a dense gram.
        * ``"gd"``: gradient descent with a fixed step,
          ``w <- w - learning_rate * T^T (s * (T w + b - y)) / sum(s)`` and the
          matching intercept step, for at most ``max_iter`` iterations (exactly
          ``max_iter`` with ``tol=0``, as in the papers).
    max_iter : int, default=20
        Most gradient-descent iterations (``solver="gd"`` only).
    learning_rate : float, default=None
        Step size of ``solver="gd"``. None uses ``1 / L`` with ``L`` the largest
        eigenvalue of ``[T, 1]^T diag(s) [T, 1] / sum(s)`` (the Lipschitz constant of
        the gradient, estimated by power iteration), which is always stable.
    tol : float, default=1e-6
        The precision of the solution, with scikit-learn's meaning: on the LSQR
        path of large sparse problems, LSQR's ``atol`` and ``btol``; on the normal
        equations, singular values of the centered design below ``tol`` times the
        largest are treated as zero (``lstsq``'s ``cond``). Smaller values give a
        more precise solution at more LSQR iterations (1e-12 takes 2-5 times
        as many on the Hamlet datasets). For ``solver="gd"``: stop once the largest absolute
        gradient entry is at most ``tol`` (a ``ConvergenceWarning`` when
        ``max_iter`` steps do not get there); ``tol=0`` runs exactly ``max_iter``
        steps, the papers' fixed-iteration mode.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``: through
        its factorized operator, or materialized once into a plain matrix. Both give
        the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and ``predict`` compute: "auto" where the data lives, "cpu",
        or "gpu" (CuPy; a dataset is moved once and its device copy cached). On a
        device the dense normal equations and gradient descent run (sparse data
        raise ``UnsupportedOnDeviceError``: use ``device="cpu"``); the gram, the
        refinement steps' and the solvers' parameter-sized algebra run on the
        host. ``coef_`` and ``intercept_`` stay where the fit ran; ``predict``
        returns the caller's array type; pickles hold NumPy arrays. "gpu" without
        a usable GPU raises a ``RuntimeError`` with the probe's reason. A materialized dense plan on
        the GPU is solved by cuML (``algorithm="eig"``) when cuML is installed.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients, 1-D for a 1-D ``y``; dtype of the training data.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (0.0 when ``fit_intercept=False``).
    n_iter_ : int
        Gradient-descent steps (``solver="gd"``), LSQR iterations (largest over the
        targets) for large sparse problems, or 1 for the direct solve.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.LinearRegression : The same model on a single matrix.
    FactorizedLogisticRegression : Factorized logistic regression.

    Notes
    -----
    The factorized rewrite: with the joined matrix ``T = sum_k I_k S_k M_k^T``,
    weights ``s`` (``S = diag(s)``), ``s_sum = sum(s)`` and weighted column means
    ``mu = s^T T / s_sum``, the normal equations are::

        (T^T S T - s_sum mu mu^T) w = T^T S y - mu (s^T y)
        b = s^T y / s_sum - mu^T w

    The gram ``T^T S T`` is assembled from per-source blocks
    ``S_k^T diag(I_k^T s) S_k`` and co-occurrence blocks ``S_k^T (I_k^T S I_l) S_l``,
    and ``T^T S y`` scatters ``S y`` into each source's rows before one product with
    ``S_k^T``: no joined row is ever formed, and the data are centered only
    implicitly. The solution is refined with residuals computed through the
    operator (one ``T w`` and one ``T^T r`` per step). Gradient descent only needs
    ``T w`` (per-source products, then a gather) and ``T^T r`` (a scatter, then
    per-source products). So does LSQR, which runs the algorithm and stopping rules
    of :func:`scipy.sparse.linalg.lsqr` (and so scikit-learn's iteration counts)
    with its n-length vectors updated in place.

    Accuracy: the gram squares the condition number of ``T``. For well-conditioned
    data the result agrees with :class:`~sklearn.linear_model.LinearRegression` to
    machine precision; on rank-deficient data both return the minimum-norm solution
    (the same predictions), with singular values below ``tol`` (1e-6) times the
    largest treated as zero, as in scikit-learn, and columns that are constant
    up to rounding given a zero coefficient. Implicit centering cancels digits on
    columns whose mean is far larger than their spread: directions whose
    eigenvalue is below that rounding noise are dropped, so very ill-conditioned
    data with such columns (condition number above about 1e4 with means a few times
    the spread) can lose accuracy; standardize them first. A float32 gram is noisier
    still and is cut accordingly.

    References
    ----------
    .. [1] W. Sun, R. Hai et al., "Ilargi: a GPU compatible factorized ML model
       training framework", 2025.
    .. [2] L. Chen, A. Kumar, J. Naughton, J. M. Patel, "Towards linear algebra over
       normalized data", PVLDB 10(11), 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedLinearRegression
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((100, 2))
    >>> dim = rng.standard_normal((10, 3))
    >>> fk = rng.integers(0, 10, 100)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0] + 4.0
    >>> reg = FactorizedLinearRegression().fit(ds, y)
    >>> np.round(reg.coef_, 6) + 0.0  # + 0.0 turns -0.0 into 0.0
    array([ 1. , -2. ,  0.5,  0. ,  3. ])
    >>> round(float(reg.intercept_), 6)
    4.0
    >>> round(reg.score(ds, y), 6)
    1.0
    """

    _parameter_constraints: dict = {
        "fit_intercept": ["boolean"],
        "solver": [StrOptions({"normal", "gd"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        fit_intercept=True,
        solver="normal",
        max_iter=20,
        learning_rate=None,
        tol=1e-6,
        strategy="factorized",
        device="auto",
    ):
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.tol = tol
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the linear model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Individual weights for each sample.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        op, (Y, y_ndim), sample_weight, sw_sum, lineage = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_regression_target,
            strategy=self.strategy,
            non_negative_weights=True,
            return_lineage=True,
        )
        if self.solver == "normal" and use_cuml(op, self.strategy):
            # A materialized dense plan on the GPU is solved by cuML's "eig" solver
            # (_backend._cuml): another library's solver, not a kernel of this
            # package, so it stays a branch of its own.
            fitted = fit_cuml(
                "linear",
                op,
                Y[:, 0] if y_ndim == 1 else Y,
                sample_weight,
                fit_intercept=self.fit_intercept,
            )
            coef, intercept, n_iter = (
                fitted["coef_"],
                fitted["intercept_"],
                fitted["n_iter_"],
            )
        else:
            _check_device_support(op)
            coef, intercept, n_iter = _linear_regression(
                op,
                Y,
                sample_weight=sample_weight,
                sw_sum=sw_sum,
                solver=self.solver,
                fit_intercept=self.fit_intercept,
                tol=self.tol,
                max_iter=self.max_iter,
                learning_rate=self.learning_rate,
                lineage=lineage,
            )
        _set_linear_fitted(
            self,
            op,
            coef,
            intercept if self.fit_intercept else None,
            y_ndim=y_ndim,
            ravel_single=False,
            n_iter=n_iter,
        )
        return self

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`)."""
        from ilargi_sklearn.planner._work import (
            Work,
            guess_lsqr_iterations,
            int_param,
            n_targets,
        )

        m = n_targets(y)
        d = data["n_features"]
        if self.solver == "gd":
            it = int_param(self.get_params(deep=False), "max_iter", 20)
            return Work(
                "linear",
                "gd",
                m=m,
                iterations=it,
                passes=it + 11.0,
                passes_per_iteration=1.0,
            )
        if data["joined_sparse"] and d > _MAX_DENSE_GRAM_FEATURES:
            it = guess_lsqr_iterations(self.tol, None, d, default_tol=1e-12)
            return Work(
                "linear",
                "lsqr",
                m=m,
                iterations=it,
                passes=it + 1.0,
                passes_per_iteration=1.0,
            )
        # The gram, one right-hand side, about two refinement steps, a dense solve.
        return Work(
            "linear", "normal", m=m, passes=3.0, grams=1, common_flops=2.0 * d**3
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        return tags
