"""Factorized ridge regression and classification: the penalized normal equations,
LSQR with damping, conjugate gradients and, for positive coefficients, L-BFGS-B."""

from __future__ import annotations

import logging
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.optimize
import scipy.sparse as sp
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    RegressorMixin,
    _fit_context,
    is_regressor,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import column_or_1d, compute_sample_weight
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_y, check_is_fitted

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on, is_numpy_namespace, to_numpy
from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
from ilargi_sklearn.linear_model._base import (
    LinearPredictorMixin,
    _check_device_support,
    _check_n_rows,
    _labels_from_scores,
    _linear_decision,
    _regression_target,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._least_squares import (
    _MAX_DENSE_GRAM_FEATURES,
    _conjugate_gradient,
    _normal_product,
    _solve_lsqr,
    _solve_normal_equations,
    _solve_sparse_cg,
    gram_out_of_reach,
)
from ilargi_sklearn.multisource._statistics import centered_gram, centered_products
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    host_array,
    validate_fit_inputs,
)

__all__ = ["FactorizedRidge", "FactorizedRidgeClassifier"]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------- kernels
def _check_alpha(alpha, n_targets):
    """The penalties as a float64 array of shape (n_targets,).

    A scalar is checked by ``_parameter_constraints``; an array is checked here,
    where the number of targets is known (scikit-learn's message for a wrong
    length; negative entries, which scikit-learn lets through to a solver that
    then minimizes a non-convex objective, are refused).
    """
    a = np.asarray(alpha, dtype=np.float64).ravel()
    if a.shape[0] not in (1, n_targets):
        raise ValueError(
            "Number of targets and number of penalties do not correspond: "
            f"{a.shape[0]} != {n_targets}. Pass one alpha, or one per target "
            "(per class for a classifier with more than two classes)."
        )
    if not (np.all(np.isfinite(a)) and np.all(a >= 0)):
        raise ValueError(
            f"alpha must be finite and non-negative, got {alpha!r}; use 0 for no "
            "penalty on a target."
        )
    return np.broadcast_to(a, (n_targets,)).copy()


def _resolve_solver(solver, positive, op):
    """The solver that runs: scikit-learn's checks of ``solver`` against
    ``positive``, then the choice of ``"auto"``."""
    if positive and solver not in ("auto", "lbfgs"):
        raise ValueError(
            f"solver='{solver}' does not support positive fitting. Please set the "
            "solver to 'auto' or 'lbfgs', or set `positive=False`"
        )
    if solver == "lbfgs" and not positive:
        raise ValueError(
            "'lbfgs' solver can be used only when positive=True. Please use "
            "another solver."
        )
    on_host = is_numpy_namespace(op.xp)
    if solver == "auto":
        if positive:
            solver = "lbfgs"
        elif _implicit_and_wide(op):
            # Implicit polynomial features: LSQR's stopping rule (tol=1e-4)
            # left ill-conditioned expansions 0.25 away from the solution;
            # scikit-learn's conjugate gradients, then the exact solve when they
            # would cost more than it (_solve_products_then_gram).
            solver = "sparse_cg_then_cholesky"
        elif gram_out_of_reach(op):
            # LSQR's loop is NumPy code over n-length vectors; CG keeps only
            # parameter-sized vectors and so runs wherever the operator does.
            solver = "lsqr" if on_host else "sparse_cg"
        else:
            solver = "cholesky"
        logger.info(
            "ridge: solver='auto' runs %r (%d features, %s%s).",
            solver,
            op.n_cols,
            "sparse" if op.is_sparse else "dense",
            ", products preferred to a gram"
            if getattr(op, "prefers_products", False)
            else "",
        )
    if solver == "lsqr" and not on_host:
        raise UnsupportedOnDeviceError(
            f"solver='lsqr' runs on NumPy data only (got {op.xp.__name__}); "
            "use solver='sparse_cg' or 'cholesky', or device='cpu'."
        )
    return solver


def _implicit_and_wide(op):
    """An implicit feature expansion (``prefers_products``) too wide for the
    gram to be formed without a second thought."""
    return bool(getattr(op, "prefers_products", False) and gram_out_of_reach(op))


def _gram_cost_in_iterations(op):
    """Conjugate-gradient iterations that cost about as much as the gram.

    The gram of ``p`` implicit degree-2 features of a ``d``-column base is
    formed from materialized row blocks, ``n p^2`` multiply-adds; one iteration
    is one product each way through the operator, about ``2 n d^2`` each
    (``InteractionOperator``'s costs). So about ``p^2 / (4 d^2)`` iterations
    (``d^2 / 16`` for degree 2), at least 10.
    """
    p = op.n_cols
    d = getattr(getattr(op, "base", None), "n_cols", None) or max(1.0, (2 * p) ** 0.5)
    return max(10, int(np.ceil(p * p / (4.0 * d * d))))


#: The relative residual at which conjugate gradients stand in for an exact solve.
_EXACT_RTOL = 1e-10


def _solve_products_then_gram(
    op, Y, sample_weight, fit_intercept, alphas, tol, max_iter, *, lineage=None
):
    """Ridge on an implicit feature expansion with scikit-learn's default
    accuracy on the materialized matrix, without forming the gram when it need not.

    Conjugate gradients (scikit-learn's ``sparse_cg`` iteration) run for as many
    iterations as forming the gram would cost: to ``tol`` on sparse data (the
    answer of scikit-learn's default there, ``sparse_cg``), to a relative
    residual of ``1e-10`` on dense data (where scikit-learn's default is the
    exact Cholesky solve). Where they have not converged by then, the exact
    solve on the gram. Well-conditioned expansions converge in tens of
    iterations, far below the gram's cost; ill-conditioned ones (unscaled, or
    one-hot products) get the direct solve's answer in at most about twice its
    time.

    Returns ``(coef, intercept, n_iter, solver)``: ``solver`` is the one whose
    answer is returned.
    """
    stats = centered_gram(
        op, sample_weight, fit_intercept, Y, gram=False, lineage=lineage
    )
    product = _normal_product(*centered_products(op, stats), sample_weight)
    budget = _gram_cost_in_iterations(op)
    if max_iter is not None:
        budget = min(budget, int(max_iter))
    # scikit-learn's default on the materialized matrix: sparse_cg at ``tol`` for
    # sparse data, and the exact Cholesky solve for dense data, which ``tol``
    # does not touch: there the iterations go on to a residual at the rounding
    # of the right-hand side's norm.
    rtol = tol if op.is_sparse else min(tol, _EXACT_RTOL)
    coef, n_iter, converged = _conjugate_gradient(
        product, stats.rhs, alphas, rtol, budget
    )
    if converged.all():
        return coef.T, stats.y_mean - stats.mu @ coef, n_iter, "sparse_cg"
    logger.info(
        "%d conjugate-gradient iterations did not reach tol=%g (they cost about "
        "as much as the gram): solving the normal equations instead.",
        budget,
        tol,
    )
    coef, intercept, _ = _solve_normal_equations(
        op, Y, sample_weight, fit_intercept, cond=0.0, alpha=alphas, lineage=lineage
    )
    return coef, intercept, n_iter + 1, "cholesky"


def _solve_positive(
    op, Y, sample_weight, fit_intercept, alphas, tol, max_iter, *, lineage=None
):
    """Ridge with ``coef >= 0`` by L-BFGS-B, as scikit-learn's
    ``Ridge(positive=True)``.

    The objective is scikit-learn's, ``||sqrt(s) (y_c - T_c w)||^2 / 2 +
    alpha ||w||^2 / 2``, written as ``y_var / 2 - rhs^T w + w^T (N + alpha I) w /
    2`` (the same values, so L-BFGS-B's relative ``ftol`` test stops alike): ``N``
    is the centered gram where it can be formed (then no iteration touches the
    data), else ``T_c^T S T_c`` through the operator (one pass per evaluation).

    Returns ``(coef (n_targets, n_features), intercept (n_targets,), n_iter)``.
    """
    use_gram = not gram_out_of_reach(op)
    stats = centered_gram(
        op, sample_weight, fit_intercept, Y, gram=use_gram, lineage=lineage
    )
    if use_gram:
        G = stats.G

        def product(V):
            return G @ V

    else:
        product = _normal_product(*centered_products(op, stats), sample_weight)
    n_features, n_targets = stats.rhs.shape
    options = {} if max_iter is None else {"maxiter": max_iter}
    coef = np.zeros((n_targets, n_features))
    n_iter = np.zeros(n_targets, dtype=np.int32)
    for j in range(n_targets):
        b, a, c = stats.rhs[:, j], alphas[j], 0.5 * stats.y_var[j]

        def objective(w, b=b, a=a, c=c):
            Nw = product(w[:, None])[:, 0] + a * w
            return c - b @ w + 0.5 * (w @ Nw), Nw - b

        result = scipy.optimize.minimize(
            objective,
            np.zeros(n_features),
            method="L-BFGS-B",
            jac=True,
            tol=tol,
            bounds=[(0, np.inf)] * n_features,
            options=options,
        )
        if not result.success:
            warnings.warn(
                "The lbfgs solver did not converge. Try increasing max_iter or tol. "
                f"Currently: max_iter={max_iter} and tol={tol}",
                ConvergenceWarning,
                stacklevel=4,
            )
        coef[j], n_iter[j] = result.x, result.nit
    return coef, stats.y_mean - coef @ stats.mu, n_iter


def _ridge_regression(
    op,
    Y,
    *,
    alpha,
    sample_weight,
    solver,
    positive,
    tol,
    max_iter,
    fit_intercept,
    stats=None,
    lineage=None,
):
    """Ridge regression on ``op`` and ``Y``, scikit-learn's ``_ridge_regression``.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    Y : array of shape (n_samples, n_targets), float64
        Where ``op`` lives.
    alpha : float or array-like of shape (n_targets,)
        The L2 penalties, one or one per target (checked here).
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    solver : {"auto", "cholesky", "lsqr", "sparse_cg", "lbfgs"}
        As :class:`FactorizedRidge`'s (``"auto"`` chosen here, logged).
    positive : bool
        Non-negative coefficients (``"auto"`` or ``"lbfgs"`` only).
    tol : float
        Precision of the iterative solvers (no effect on ``"cholesky"``).
    max_iter : int or None
        Most iterations of the iterative solvers.
    fit_intercept : bool
    stats : GramStats, default=None
        The centered statistics of ``op`` and ``Y`` for ``"cholesky"``, where the
        caller holds them (a cross-validated search); None computes them.
    lineage : Lineage, default=None
        ``op``'s lineage, on which the statistics are shared
        (:func:`~ilargi_sklearn.multisource._statistics.centered_gram`).

    Returns
    -------
    coef : ndarray of shape (n_targets, n_features), float64
    intercept : ndarray of shape (n_targets,), float64
    n_iter : ndarray of shape (n_targets,), int32
        Iterations per target (1 for the direct solve).
    solver : str
        The solver whose answer is returned.
    """
    alphas = _check_alpha(alpha, Y.shape[1])
    solver = _resolve_solver(solver, positive, op)
    args = (op, Y, sample_weight, fit_intercept)
    if solver == "cholesky":
        # tol has no part in the direct solve (as in scikit-learn): no singular
        # value is cut on purpose, only directions below the gram's rounding noise
        # (none while alpha is above it).
        coef, intercept, _ = _solve_normal_equations(
            *args, cond=0.0, alpha=alphas, stats=stats, lineage=lineage
        )
        # One direct solve; scikit-learn's None fails its own n_iter_ check.
        n_iter = np.ones(Y.shape[1], dtype=np.int32)
    elif solver == "lsqr":
        coef, intercept, n_iter = _solve_lsqr(
            *args, tol, alpha=alphas, max_iter=max_iter
        )
    elif solver == "sparse_cg_then_cholesky":
        with one_blas_thread():
            coef, intercept, n_iter, solver = _solve_products_then_gram(
                *args, alphas, tol, max_iter, lineage=lineage
            )
    else:
        solve = _solve_sparse_cg if solver == "sparse_cg" else _solve_positive
        # The solvers' vector operations gain nothing from BLAS threads.
        with one_blas_thread():
            coef, intercept, n_iter = solve(
                *args, alphas, tol, max_iter, lineage=lineage
            )
    return coef, intercept, n_iter, solver


# ------------------------------------------------------------- estimators
class _RidgeFit:
    """What ridge regression and classification share: the parameters'
    constraints, the fit of a float target and the fitted attributes."""

    _parameter_constraints: dict = {
        "alpha": [Interval(Real, 0, None, closed="left"), "array-like"],
        "fit_intercept": ["boolean"],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "solver": [StrOptions({"auto", "cholesky", "lsqr", "sparse_cg", "lbfgs"})],
        "positive": ["boolean"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def _fit_targets(self, op, Y, sample_weight, y_ndim, lineage=None):
        """Fit ``Y`` (n_samples, n_targets) and set the fitted attributes with
        scikit-learn's shapes: a 1-D ``coef_`` for one target, a float
        ``intercept_`` for a 1-D ``y``, 0.0 without an intercept."""
        _check_device_support(op, type(self).__name__)
        coef, intercept, n_iter, solver = _ridge_regression(
            op,
            Y,
            alpha=self.alpha,
            sample_weight=sample_weight,
            solver=self.solver,
            positive=self.positive,
            tol=self.tol,
            max_iter=self.max_iter,
            fit_intercept=self.fit_intercept,
            lineage=lineage,
        )
        _set_linear_fitted(
            self,
            op,
            coef,
            intercept if self.fit_intercept else None,
            y_ndim=y_ndim,
            ravel_single=True,
            n_iter=n_iter,
        )
        self.solver_ = solver

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`)."""
        from ilargi_sklearn.planner._work import (
            Work,
            guess_lsqr_iterations,
            n_classes,
            n_targets,
        )

        d = data["n_features"]
        if y is not None and not is_regressor(self):
            k = n_classes(y)
            m = 1 if k == 2 else k
        else:
            m = n_targets(y)
        iterative = self.solver in ("lsqr", "sparse_cg") or (
            self.solver == "auto"
            and data["joined_sparse"]
            and d > _MAX_DENSE_GRAM_FEATURES
        )
        if iterative:
            it = guess_lsqr_iterations(self.tol, self.max_iter, d, default_tol=1e-4)
            return Work(
                "ridge",
                "lsqr",
                m=m,
                iterations=it,
                passes=it + 1.0,
                passes_per_iteration=1.0,
            )
        # The gram, one right-hand side, a Cholesky factorization per alpha.
        return Work(
            "ridge",
            "normal",
            m=m,
            passes=1.0,
            grams=1,
            common_flops=d**3 / 3.0 + 2.0 * d * d * m,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class FactorizedRidge(
    LinearPredictorMixin, _RidgeFit, DeviceMixin, RegressorMixin, BaseEstimator
):
    """Ridge regression on joined data sources, without building the join.

    Minimizes ``||sqrt(s) (y - T w - b)||^2 + alpha ||w||^2`` (the intercept is not
    penalized) where ``T`` is the joined matrix of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse
    matrix): the model of :class:`sklearn.linear_model.Ridge` on the materialized
    table. Multi-output targets, one penalty per target, sample weights.

    Parameters
    ----------
    alpha : float or array-like of shape (n_targets,), default=1.0
        Strength of the L2 penalty, non-negative; an array gives one penalty per
        target (their number must match). ``alpha=0`` is least squares (prefer
        :class:`~ilargi_sklearn.linear_model.FactorizedLinearRegression`).
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never copied.
    max_iter : int, default=None
        Most iterations of the iterative solvers: LSQR (None: ``2 * n_features``),
        conjugate gradients (None: ``10 * n_features``), L-BFGS-B (None: SciPy's
        15000).
    tol : float, default=1e-4
        Precision of the iterative solvers, with scikit-learn's meaning: LSQR's
        ``atol`` and ``btol``; conjugate gradients stop when the residual norm is
        below ``tol`` times that of the right-hand side; L-BFGS-B's ``tol``. No
        effect on ``"cholesky"``.
    solver : {"auto", "cholesky", "lsqr", "sparse_cg", "lbfgs"}, default="auto"
        * ``"cholesky"``: the penalized normal equations
          ``(G + alpha I) w = T_c^T S y`` from the implicitly centered gram ``G``,
          one Cholesky factorization per distinct alpha, refined with residuals
          computed through the operator where the gram's rounding could matter.
        * ``"lsqr"``: LSQR with damping ``sqrt(alpha)`` on the implicitly centered
          operator (the stopping rules of :func:`scipy.sparse.linalg.lsqr`, as
          scikit-learn); NumPy data only.
        * ``"sparse_cg"``: conjugate gradients on the penalized normal equations,
          each iteration one ``T v`` and one ``T^T u`` (all targets at once).
        * ``"lbfgs"``: L-BFGS-B with ``coef >= 0``, only with ``positive=True``.
        * ``"auto"``: ``"lbfgs"`` when ``positive``; above 1000 features of an
          operator whose gram is costly to form (``prefers_products``: implicit
          polynomial features), ``"sparse_cg"`` for as many iterations as the
          gram would cost (to ``tol`` on sparse data, to a relative residual of
          1e-10 on dense data), then ``"cholesky"`` if they have not converged:
          the accuracy of scikit-learn's default on the materialized matrix
          (``sparse_cg`` on sparse, Cholesky on dense data), never an answer
          stopped early by LSQR's looser rule; ``"lsqr"`` (``"sparse_cg"``
          on a device) above 1000 features of sparse data; otherwise
          ``"cholesky"``. The choice is logged at INFO and the solver whose
          answer was kept is ``solver_``. Unlike scikit-learn (``"sparse_cg"``
          for every sparse input), sparse data of moderate width get the exact
          solve.
    positive : bool, default=False
        Force the coefficients to be non-negative (``solver="lbfgs"``). L-BFGS-B
        then runs on the centered gram (no pass over the data per iteration)
        where it can be formed.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``:
        through its factorized operator, or materialized once into a plain matrix.
        Both give the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and ``predict`` compute: "auto" where the data lives, "cpu",
        or "gpu" (CuPy; a dataset is moved once and its device copy cached). On a
        device dense data are supported by ``"cholesky"``, ``"sparse_cg"`` and
        ``"lbfgs"`` (the n-length products stay there, the parameter-sized
        algebra runs on the host); sparse data, and ``"lsqr"``, raise
        ``UnsupportedOnDeviceError`` (use ``device="cpu"``). ``coef_`` and
        ``intercept_`` stay where the fit ran; ``predict`` returns the caller's
        array type; pickles hold NumPy arrays.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients (1-D for one target); dtype of the training data.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (a float for a 1-D ``y``; 0.0 when ``fit_intercept=False``).
    n_iter_ : ndarray of shape (n_targets,)
        Iterations per target of ``"lsqr"``, ``"sparse_cg"`` and ``"lbfgs"``; 1
        for ``"cholesky"`` (scikit-learn: None, and None for ``"sparse_cg"`` and
        ``"lbfgs"`` too).
    solver_ : str
        The solver that ran.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.Ridge : The same model on a single matrix.
    FactorizedRidgeClassifier : Ridge regression on ``{-1, 1}`` class codes.
    FactorizedLinearRegression : The unpenalized model.

    Notes
    -----
    The factorized rewrite: with weights ``s`` (``S = diag(s)``),
    ``s_sum = sum(s)``, weighted column means ``mu = s^T T / s_sum`` and the
    centered gram ``G = T^T S T - s_sum mu mu^T`` (assembled from per-source blocks
    and co-occurrence blocks of the sources, no joined row formed)::

        (G + alpha I) w = T^T S y - mu (s^T y)
        b = s^T y / s_sum - mu^T w

    scikit-learn rescales the rows by ``sqrt(s)`` and centers them explicitly;
    both give the same normal equations. The iterative solvers apply
    ``T_c = T - 1 mu^T`` inside the products: ``T_c v = T v - (mu^T v) 1`` and
    ``T_c^T u = T^T u - mu (1^T u)``, so sparsity and factorization survive.

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
    >>> from ilargi_sklearn.linear_model import FactorizedRidge
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((100, 2))
    >>> dim = rng.standard_normal((10, 3))
    >>> fk = rng.integers(0, 10, 100)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0] + 4.0
    >>> reg = FactorizedRidge(alpha=1.0).fit(ds, y)
    >>> reg.solver_
    'cholesky'
    >>> reg.coef_.round(2) + 0.0  # + 0.0 turns -0.0 into 0.0
    array([ 0.99, -1.98,  0.5 ,  0.  ,  2.97])

    The same model as scikit-learn's on the joined matrix:

    >>> from sklearn.linear_model import Ridge
    >>> ref = Ridge(alpha=1.0, solver="cholesky").fit(ds.materialize(), y)
    >>> bool(np.allclose(reg.coef_, ref.coef_, rtol=1e-10, atol=1e-12))
    True
    """

    def __init__(
        self,
        alpha=1.0,
        *,
        fit_intercept=True,
        max_iter=None,
        tol=1e-4,
        solver="auto",
        positive=False,
        strategy="factorized",
        device="auto",
    ):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.solver = solver
        self.positive = positive
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the ridge model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Target values.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Individual weights for each sample (a float: the same for all).

        Returns
        -------
        self : object
            Fitted estimator.
        """
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
        self._fit_targets(op, Y, sample_weight, y_ndim, lineage)
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


def _class_codes_target(estimator, y, op):
    """``(binarizer, Y, y)``: the fitted ``LabelBinarizer(neg_label=-1)``, the
    ``{-1, 1}`` codes (n_samples, n_outputs) as float64 where ``op`` lives, and the
    labels on the host (for ``class_weight``)."""
    y = _check_y(host_array(y), multi_output=True, estimator=estimator)
    _check_n_rows(op, y)
    binarizer = LabelBinarizer(pos_label=1, neg_label=-1)
    Y = binarizer.fit_transform(y)
    if sp.issparse(Y):
        Y = Y.toarray()
    if not binarizer.y_type_.startswith("multilabel"):
        y = column_or_1d(y, warn=True)
    Y = asarray_on(np.asarray(Y, dtype=np.float64), op.xp, op.device)
    return binarizer, Y, y


class FactorizedRidgeClassifier(_RidgeFit, DeviceMixin, ClassifierMixin, BaseEstimator):
    """Ridge classifier on joined data sources, without building the join.

    Codes the classes as ``{-1, 1}`` (one column per class, one column in all for
    two classes, one per label for multilabel targets) and fits
    :class:`FactorizedRidge` to the codes: the model of
    :class:`sklearn.linear_model.RidgeClassifier` on the materialized table. All
    columns share one gram and, with one alpha, one factorization.

    Parameters
    ----------
    alpha : float or array-like of shape (n_outputs,), default=1.0
        Strength of the L2 penalty, non-negative (an array: one per code column).
    fit_intercept : bool, default=True
        Whether to fit an intercept (implicit centering).
    max_iter : int, default=None
        Most iterations of the iterative solvers (see :class:`FactorizedRidge`).
    tol : float, default=1e-4
        Precision of the iterative solvers (see :class:`FactorizedRidge`).
    class_weight : dict or "balanced", default=None
        Weights of the classes, multiplied into the sample weights as
        :func:`sklearn.utils.compute_sample_weight` gives them; "balanced" uses
        ``n_samples / (n_classes * np.bincount(y))``.
    solver : {"auto", "cholesky", "lsqr", "sparse_cg", "lbfgs"}, default="auto"
        As for :class:`FactorizedRidge`.
    positive : bool, default=False
        Force the coefficients to be non-negative (``solver="lbfgs"``).
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and the predictions compute (see :class:`FactorizedRidge`).
        ``classes_`` is always NumPy.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,) or list of ndarray
        Class labels (per output for multilabel targets).
    coef_ : ndarray of shape (n_features,) or (n_classes, n_features)
        Coefficients: 1-D for two classes (the decision function of
        ``classes_[1]``), one row per class otherwise.
    intercept_ : float or ndarray of shape (n_outputs,)
        Intercepts (0.0 when ``fit_intercept=False``).
    n_iter_ : ndarray of shape (n_outputs,)
        Iterations of the iterative solvers (1 for ``"cholesky"``).
    solver_ : str
        The solver that ran.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit.

    See Also
    --------
    sklearn.linear_model.RidgeClassifier : The same model on a single matrix.
    FactorizedRidge : The regression it fits.
    FactorizedLogisticRegression : A probabilistic linear classifier.

    Notes
    -----
    The factorized rewrite is :class:`FactorizedRidge`'s with the code matrix
    ``Y`` (n_samples, n_outputs) as target and the class weights folded into
    ``s``: ``(G + alpha I) W = T^T S Y - mu (s^T Y)``, where the gram ``G`` is
    formed once for all classes. The decision function is ``T W^T + b`` (one
    factorized ``matmul``); the predicted class is its argmax (its sign for two
    classes).

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedRidgeClassifier
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = np.where(base[:, 0] + dim[fk, 1] > 0, "yes", "no")
    >>> clf = FactorizedRidgeClassifier(alpha=1.0).fit(ds, y)
    >>> clf.classes_
    array(['no', 'yes'], dtype='<U3')
    >>> clf.coef_.shape
    (5,)
    >>> clf.predict(ds[:3])
    array(['yes', 'no', 'no'], dtype='<U3')
    >>> float(clf.score(ds, y)) > 0.9
    True
    """

    _parameter_constraints: dict = {
        **_RidgeFit._parameter_constraints,
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }

    def __init__(
        self,
        alpha=1.0,
        *,
        fit_intercept=True,
        max_iter=None,
        tol=1e-4,
        class_weight=None,
        solver="auto",
        positive=False,
        strategy="factorized",
        device="auto",
    ):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.max_iter = max_iter
        self.tol = tol
        self.class_weight = class_weight
        self.solver = solver
        self.positive = positive
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the ridge classifier.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Class labels (numbers or strings), or a multilabel indicator matrix.
        sample_weight : float or array-like of shape (n_samples,), default=None
            Individual weights for each sample, multiplied by the class weights.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        op, (binarizer, Y, y), sample_weight, _, lineage = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_class_codes_target,
            strategy=self.strategy,
            non_negative_weights=True,
            return_lineage=True,
        )
        if self.class_weight:
            reweighting = compute_sample_weight(self.class_weight, y)
            reweighting = asarray_on(reweighting, op.xp, op.device, np.float64)
            sample_weight = (
                reweighting if sample_weight is None else sample_weight * reweighting
            )
        # Codes are always 2-D: intercept_ of shape (n_outputs,), as scikit-learn.
        self._fit_targets(op, Y, sample_weight, y_ndim=2, lineage=lineage)
        self._label_binarizer = binarizer
        self.classes_ = binarizer.classes_
        return self

    def decision_function(self, X):
        """Confidence scores: the linear predictor ``T coef_^T + intercept_``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        scores : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            For two classes, the score of ``classes_[1]`` (positive means
            ``classes_[1]`` is predicted); otherwise one column per class (label).
        """
        scores, _, caller = _linear_decision(self, X)
        return caller.give(scores)

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            Labels from ``classes_``; an indicator matrix for multilabel targets.
        """
        check_is_fitted(self, attributes=["_label_binarizer"])
        scores, xp, caller = _linear_decision(self, X)
        if self._label_binarizer.y_type_.startswith("multilabel"):
            # Codes of -1 and 1, as the binarizer's inverse expects.
            codes = 2.0 * (to_numpy(scores) > 0) - 1.0
            return caller.give(self._label_binarizer.inverse_transform(codes))
        return _labels_from_scores(self.classes_, scores, xp, caller)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags
