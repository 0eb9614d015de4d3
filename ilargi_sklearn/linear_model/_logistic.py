"""Factorized logistic regression: L-BFGS on scikit-learn's objective, and the
paper's gradient descent."""

from __future__ import annotations

import logging
import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import LabelEncoder
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import _check_y

from ilargi_sklearn._backend._cuml import fit_cuml, use_cuml
from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn.linear_model._base import (
    _check_n_rows,
    _labels_from_scores,
    _linear_decision,
    _set_linear_fitted,
)
from ilargi_sklearn.linear_model._loss import (
    _class_probabilities,
    _objective,
    _split_coef,
)
from ilargi_sklearn.linear_model._optimize import (
    _gradient_descent,
    _lipschitz_constant,
    _minimize_lbfgs,
)
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceMixin,
    host_array,
    on_operator_device,
    validate_fit_inputs,
)

__all__ = ["FactorizedLogisticRegression"]

logger = logging.getLogger(__name__)


def _encode_labels(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)`` of host labels, as ``LabelEncoder().fit_transform``.

    Integer labels over a range not much wider than their count are encoded by one
    ``bincount`` (O(n)); ``LabelEncoder`` sorts (0.5 s for 1e7 labels).
    """
    y = np.asarray(y)
    if y.ndim == 1 and y.size and y.dtype.kind in "iu":
        low, high = int(y.min()), int(y.max())
        if high - low <= 4 * y.size + 1024:
            shifted = y - low if low else y
            present = np.bincount(shifted, minlength=high - low + 1) > 0
            lookup = np.cumsum(present, dtype=np.intp) - 1
            classes = (np.flatnonzero(present) + low).astype(y.dtype)
            return classes, lookup[shifted]
    encoder = LabelEncoder()
    codes = encoder.fit_transform(y)
    return encoder.classes_, codes


def _encode_device_labels(y: Any, op: Any) -> tuple[np.ndarray, Any] | None:
    """``(classes, codes)`` of numeric 1-D labels on ``op``'s (non-NumPy) device.

    ``classes`` comes back as NumPy, ``codes`` stays on the device. None when ``y``
    is not such an array (the caller encodes on the host). The checks are
    scikit-learn's: finite values, no continuous (non-integral float) labels.
    """
    if not on_operator_device(y, op):
        return None
    xp = op.xp
    if y.ndim != 1 or numpy_dtype(y.dtype).kind not in "biuf":
        return None
    if numpy_dtype(y.dtype).kind == "f":
        if not bool(xp.all(xp.isfinite(y))):
            raise ValueError("Input y contains NaN or infinity.")
        if bool(xp.any(y != xp.round(y))):
            raise ValueError(
                "Unknown label type: continuous. Maybe you are trying to fit a "
                "classifier, which expects discrete classes on a regression target "
                "with continuous values."
            )
    classes, codes = xp.unique_inverse(y)
    return to_numpy(classes), codes


def _classification_target(estimator, y, op):
    """``(classes, codes)``: the class labels (NumPy) and each sample's class index
    where ``op`` lives.

    Numeric labels already next to the data are encoded there; any others on the
    host (one copy when they came from another device), their codes then moved
    next to the data.
    """
    encoded = _encode_device_labels(y, op)
    if encoded is not None:
        _check_n_rows(op, encoded[1])
        return encoded
    y = _check_y(host_array(y), estimator=estimator)
    _check_n_rows(op, y)
    if not (y.ndim == 1 and y.dtype.kind in "iu"):
        # 1-D integer labels are always binary or multiclass targets; the
        # check's np.unique costs 3 ms per 2e5 labels.
        check_classification_targets(y)
    classes, codes = _encode_labels(y)
    return classes, asarray_on(codes, op.xp, op.device)


def _check_two_classes(classes):
    if classes.shape[0] < 2:
        label = classes[0].item() if hasattr(classes[0], "item") else classes[0]
        raise ValueError(
            "This solver needs samples of at least 2 classes in the data, but the "
            f"data contains only one class: {label!r}."
        )


def _loss_target(y_codes, n_classes, xp):
    """``(loss, n_outputs, target)``: the pointwise loss of ``n_classes`` classes
    and the class codes ``y_codes`` in its encoding (where ``y_codes`` lives)."""
    if n_classes == 2:
        return "binomial", 1, xp.astype(y_codes == 1, xp.float64)
    k = xp.arange(n_classes, dtype=y_codes.dtype, device=device_of(y_codes))
    return (
        "multinomial",
        n_classes,
        xp.astype(y_codes[:, None] == k[None, :], xp.float64),
    )


def _set_logistic_fitted(estimator, op, w, n_outputs, fit_intercept):
    """``coef_`` (n_outputs, n_features) and ``intercept_`` (n_outputs,; zeros
    without an intercept, as scikit-learn's) of flat parameters ``w``."""
    coef, intercept = _split_coef(w, op.n_cols, n_outputs, fit_intercept)
    if intercept is None:
        intercept = np.zeros(n_outputs)
    _set_linear_fitted(estimator, op, coef, intercept, y_ndim=2, ravel_single=False)


def _logistic_regression_path(
    op,
    target,
    sample_weight,
    sw_sum,
    Cs,
    *,
    fit_intercept,
    loss,
    w0,
    max_iter,
    tol,
):
    """Fit the L2-penalized logistic model for each C of ``Cs`` in turn, each fit
    started from the previous solution (a warm start), as scikit-learn's
    ``_logistic_regression_path`` with ``solver="lbfgs"``.

    Parameters
    ----------
    op : Operator
        The design matrix ``T`` of shape (n_samples, n_features).
    target : array
        The labels in the encoding of ``loss`` (see :func:`_loss_target`), where
        ``op`` lives.
    sample_weight : array of shape (n_samples,) or None
        Sample weights where ``op`` lives (class weights included); None for unit
        weights.
    sw_sum : float
        ``sum(sample_weight)`` (``n_samples`` for unit weights).
    Cs : sequence of float
        Inverse penalty strengths, fitted in this order; ``np.inf`` fits without
        penalty.
    fit_intercept : bool
    loss : {"binomial", "multinomial"}
    w0 : ndarray of shape (n_outputs * (n_features + fit_intercept),)
        Initial parameters of the first C (the layout of :func:`_loss_and_grad`).
    max_iter : int
        Most L-BFGS iterations per C.
    tol : float
        L-BFGS-B's ``gtol``: stop when the largest absolute gradient entry is at
        most ``tol``.

    Returns
    -------
    coefs : ndarray of shape (n_cs, n_outputs * (n_features + fit_intercept))
        The solution of each C, float64 on the host.
    n_iter : ndarray of shape (n_cs,), int32
        Iterations run for each C.
    """
    n_outputs = 1 if loss == "binomial" else int(target.shape[1])
    coefs = np.empty((len(Cs), np.size(w0)))
    n_iter = np.zeros(len(Cs), dtype=np.int32)
    w = np.array(w0, dtype=np.float64, copy=True)
    # One objective (and compiled plan) for every C of the path.
    objective = _objective(op, loss)
    # BLAS on one thread: the solver's operations on the parameter vector gain
    # nothing from BLAS's threads; the objective's threads come from the
    # compiled kernels' pool.
    with one_blas_thread():
        for i, C in enumerate(Cs):
            args = (
                target,
                sample_weight,
                sw_sum,
                1.0 / (C * sw_sum),
                fit_intercept,
                n_outputs,
            )
            w, n_iter[i] = _minimize_lbfgs(
                objective,
                w,
                args,
                max_iter,
                tol,
                # path <- fit <- _fit_context <- the caller
                stacklevel=3,
                context=f" for C={C:.4g}",
            )
            coefs[i] = w
    return coefs, n_iter


def _logistic_regression_gd(
    op,
    target,
    *,
    sample_weight,
    sw_sum,
    loss,
    w0,
    l2_reg_strength,
    fit_intercept,
    learning_rate,
    max_iter,
    tol,
):
    """Fixed-step gradient descent on the logistic objective (the papers'
    solver), ``w <- w - learning_rate * grad(w)`` from ``w0``.

    Parameters as :func:`_logistic_regression_path`'s; ``l2_reg_strength`` is
    the penalty on the objective scaled by ``1 / s_sum`` (``1 / (C s_sum)``, 0
    without), ``learning_rate`` None takes ``1 / L``
    (:func:`~ilargi_sklearn.linear_model._optimize._lipschitz_constant`) and
    ``tol`` 0 runs exactly ``max_iter`` steps.

    Returns
    -------
    w : ndarray of shape (n_outputs * (n_features + fit_intercept),)
    n_iter : int
    """
    n_outputs = 1 if loss == "binomial" else int(target.shape[1])
    args = (target, sample_weight, sw_sum, l2_reg_strength, fit_intercept, n_outputs)
    # BLAS on one thread, as in _logistic_regression_path.
    with one_blas_thread():
        if learning_rate is None:
            L = _lipschitz_constant(
                op, sample_weight, sw_sum, l2_reg_strength, fit_intercept, loss
            )
            learning_rate = 1.0 / L if L > 0 else 1.0
            logger.info("gradient descent step size 1/L = %.3g", learning_rate)
        # tol=0 is the papers' fixed-iteration mode: no gradient test.
        gd_tol = tol if tol > 0 else None
        w, n_iter, converged = _gradient_descent(
            _objective(op, loss), w0, args, learning_rate, max_iter, gd_tol
        )
    if gd_tol is not None and not converged:
        warnings.warn(
            f"Gradient descent did not reach tol={tol} in "
            f"max_iter={max_iter} iterations; increase max_iter.",
            ConvergenceWarning,
            stacklevel=4,
        )
    return w, n_iter


class FactorizedLogisticRegression(DeviceMixin, ClassifierMixin, BaseEstimator):
    """Logistic regression on joined data sources, without building the join.

    Binary (logistic) and multinomial (softmax, for more than two classes)
    regression with an optional L2 penalty, trained on the joined matrix ``T`` of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse matrix).
    The default solver minimizes the same objective as
    :class:`sklearn.linear_model.LogisticRegression` with L-BFGS, so both reach the
    same optimum; the ``"gd"`` solver is the fixed-step gradient descent of the
    factorized-learning papers.

    Parameters
    ----------
    penalty : {"l2", None}, default="l2"
        ``"l2"`` adds ``||coef||^2 / (2 C)`` to the summed log-loss; None fits
        without penalty (``C`` is then ignored). The intercept is never penalized.
    C : float, default=1.0
        Inverse of the regularization strength; smaller values regularize more.
    fit_intercept : bool, default=True
        Whether to fit an intercept (one per class for multinomial models).
    solver : {"lbfgs", "gd"}, default="lbfgs"
        * ``"lbfgs"``: ``scipy.optimize.minimize(method="L-BFGS-B")`` with the loss
          and its gradient computed through the operator, with scikit-learn's
          options (``gtol=tol``, ``maxls=50``).
        * ``"gd"``: fixed-step gradient descent on the same objective,
          ``w <- w - learning_rate * (T^T (s * (sigmoid(T w + b) - y)) / sum(s)
          + coef / (C sum(s)))`` (softmax for multinomial): the true log-loss
          gradient, not the update published with Morpheus.
    max_iter : int, default=100
        Most L-BFGS iterations, or the number of gradient-descent steps.
    tol : float, default=1e-4
        Stop when the largest absolute entry of the gradient is at most ``tol``
        (L-BFGS-B's ``gtol``, as in scikit-learn; the same test for ``"gd"``,
        where ``tol=0`` runs exactly ``max_iter`` steps without a convergence
        test, the papers' fixed-iteration mode).
    warm_start : bool, default=False
        When True, ``fit`` starts from the previous fit's ``coef_`` and
        ``intercept_`` (of the same shape) instead of zeros, as scikit-learn's
        ``warm_start``: refitting after a small change of ``C`` or of the data then
        takes few iterations. Both solvers stop on the same test as a cold fit, so
        the result is the same optimum to the solver's ``tol``.
    learning_rate : float, default=None
        Step size of ``solver="gd"``. None uses ``1 / L`` with ``L`` the Lipschitz
        constant of the gradient: ``c lambda_max([T, 1]^T diag(s) [T, 1]) / sum(s)``
        plus the penalty strength, with ``c = 1/4`` (binary) or ``1/2``
        (multinomial) and ``lambda_max`` estimated by power iteration.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``: through
        its factorized operator, or materialized once into a plain matrix. Both give
        the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and the predictions compute: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). On a device the n-length arrays (raw predictions, pointwise
        gradients, targets, weights) stay there; L-BFGS (scipy) runs on the host
        over the flat parameters, which cross once per evaluation. ``coef_`` and
        ``intercept_`` stay where the fit ran (``classes_`` is always NumPy);
        predictions come back in the caller's array type (labels that are not
        numbers as NumPy); pickles hold NumPy arrays. "gpu" without a usable GPU
        raises a ``RuntimeError`` with the probe's reason. A materialized dense
        plan on the GPU with ``solver="lbfgs"`` is fitted by cuML's L-BFGS
        (``solver="qn"``) when cuML is installed, except under a warm start (cuML
        takes no initial point).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Coefficients: one row for binary problems (the decision function of
        ``classes_[1]``), one per class otherwise. Dtype of the training data.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Intercepts (zeros when ``fit_intercept=False``).
    n_iter_ : ndarray of shape (1,)
        Iterations run by the solver.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.LogisticRegression : The same model on a single matrix.
    FactorizedLogisticRegressionCV : ``C`` chosen by cross-validation, along a
        warm-started path of Cs.
    FactorizedLinearRegression : Factorized least squares.

    Notes
    -----
    The objective is scikit-learn's ``LinearModelLoss``: with sample weights ``s``
    and ``s_sum = sum(s)``,

        sum_i s_i logloss(y_i, T_i W^T + b) / s_sum + ||W||^2 / (2 C s_sum),

    which has the same minimizer as ``C sum_i s_i logloss_i + ||W||^2 / 2``. Its
    gradient with respect to ``W`` is ``T^T G / s_sum + W / (C s_sum)`` with
    ``G = s * (p - Y)`` the pointwise gradients (``p`` the predicted probabilities,
    ``Y`` the one-hot labels). The factorized rewrite needs one ``T W^T`` (gather of
    per-source products ``S_k W_k^T``) and one ``T^T G`` (scatter-add of ``G`` into
    each source's rows, then ``S_k^T``) per evaluation; no joined row is formed.

    Without penalty the multinomial parametrization has one redundant direction
    (adding a vector to every class' coefficients); starting from zero, L-BFGS stays
    in the subspace where the coefficients sum to zero over classes, as scikit-learn
    does, so both return the same coefficients. On separable data no unpenalized
    optimum exists.

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
    >>> from ilargi_sklearn.linear_model import FactorizedLogisticRegression
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> fk = rng.integers(0, 20, 200)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = np.where(base[:, 0] + dim[fk, 1] > 0, "yes", "no")
    >>> clf = FactorizedLogisticRegression(C=10.0).fit(ds, y)
    >>> clf.classes_
    array(['no', 'yes'], dtype='<U3')
    >>> clf.coef_.shape
    (1, 5)
    >>> y[:3]
    array(['yes', 'no', 'no'], dtype='<U3')
    >>> clf.predict(ds[:3])
    array(['yes', 'no', 'no'], dtype='<U3')
    >>> float(clf.score(ds, y)) > 0.9
    True
    """

    _parameter_constraints: dict = {
        "penalty": [StrOptions({"l2"}), None],
        "C": [Interval(Real, 0, None, closed="right")],
        "fit_intercept": ["boolean"],
        "solver": [StrOptions({"lbfgs", "gd"})],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        penalty="l2",
        C=1.0,
        fit_intercept=True,
        solver="lbfgs",
        max_iter=100,
        tol=1e-4,
        warm_start=False,
        learning_rate=None,
        strategy="factorized",
        device="auto",
    ):
        self.penalty = penalty
        self.C = C
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.warm_start = warm_start
        self.learning_rate = learning_rate
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings), at least two distinct ones.
        sample_weight : array-like of shape (n_samples,), default=None
            Individual weights for each sample.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        op, (classes, y_codes), sample_weight, sw_sum = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_classification_target,
            strategy=self.strategy,
        )
        _check_two_classes(classes)
        w0 = self._warm_start_coef(classes.shape[0], op.n_cols)
        if self.solver == "lbfgs" and w0 is None and use_cuml(op, self.strategy):
            # A materialized dense plan on the GPU is fitted by cuML's L-BFGS (qn,
            # _backend._cuml): another library's solver, not a kernel of this
            # package, so it stays a branch of its own. It takes no initial point:
            # a warm start runs the package's L-BFGS instead.
            fitted = fit_cuml(
                "logistic",
                op,
                y_codes,
                sample_weight,
                penalty=self.penalty,
                C=self.C,
                fit_intercept=self.fit_intercept,
                max_iter=self.max_iter,
                tol=self.tol,
            )
            self.classes_ = classes
            _set_linear_fitted(
                self,
                op,
                fitted["coef_"],
                fitted["intercept_"],
                y_ndim=2,
                ravel_single=False,
                n_iter=fitted["n_iter_"],
            )
            return self

        n_features = op.n_cols
        loss, n_outputs, target = _loss_target(y_codes, classes.shape[0], op.xp)
        if w0 is None:
            w0 = np.zeros(n_outputs * (n_features + int(self.fit_intercept)))
        if self.solver == "lbfgs":
            # The path of one C: scikit-learn's LogisticRegression.fit is the same.
            C = np.inf if self.penalty is None else self.C
            coefs, n_iter = _logistic_regression_path(
                op,
                target,
                sample_weight,
                sw_sum,
                [C],
                fit_intercept=self.fit_intercept,
                loss=loss,
                w0=w0,
                max_iter=self.max_iter,
                tol=self.tol,
            )
            w, n_iter = coefs[0], int(n_iter[0])
        else:
            w, n_iter = _logistic_regression_gd(
                op,
                target,
                sample_weight=sample_weight,
                sw_sum=sw_sum,
                loss=loss,
                w0=w0,
                l2_reg_strength=(
                    0.0 if self.penalty is None else 1.0 / (self.C * sw_sum)
                ),
                fit_intercept=self.fit_intercept,
                learning_rate=self.learning_rate,
                max_iter=self.max_iter,
                tol=self.tol,
            )
        self.classes_ = classes
        _set_logistic_fitted(self, op, w, n_outputs, self.fit_intercept)
        self.n_iter_ = np.asarray([n_iter], dtype=np.int32)
        return self

    def _warm_start_coef(self, n_classes, n_features):
        """The flat initial parameters of a warm start (the previous ``coef_`` and
        ``intercept_``), or None for a cold start from zeros."""
        if not self.warm_start or not hasattr(self, "coef_"):
            return None
        n_outputs = 1 if n_classes == 2 else n_classes
        coef = np.asarray(to_numpy(self.coef_), dtype=np.float64)
        if coef.shape != (n_outputs, n_features):
            raise ValueError(
                f"warm_start=True needs the previous coef_ of shape "
                f"{(n_outputs, n_features)} (one row per output, for {n_classes} "
                f"classes and {n_features} features), got {coef.shape}; fit with "
                "warm_start=False to start afresh."
            )
        if not self.fit_intercept:
            return coef.ravel()
        intercept = np.asarray(to_numpy(self.intercept_), dtype=np.float64)
        return np.hstack([coef, intercept.reshape(n_outputs, 1)]).ravel()

    def decision_function(self, X):
        """Confidence scores: the linear predictor ``T coef^T + intercept``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        scores : ndarray of shape (n_samples,) or (n_samples, n_classes)
            For binary problems, the score of ``classes_[1]`` (positive means
            ``classes_[1]`` is predicted); otherwise one column per class.
        """
        scores, _, caller = self._scores(X)
        return caller.give(scores)

    def _scores(self, X):
        """Scores, the namespace where they were computed, and the caller."""
        scores, xp, caller = _linear_decision(self, X)
        return (scores[:, 0] if scores.shape[1] == 1 else scores), xp, caller

    def predict(self, X):
        """Predict class labels.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
            Predicted labels, taken from ``classes_``.
        """
        scores, xp, caller = self._scores(X)
        return _labels_from_scores(self.classes_, scores, xp, caller)

    def predict_proba(self, X):
        """Class probabilities (sigmoid for binary, softmax for multinomial).

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
            Probability of each class, in the order of ``classes_``.
        """
        scores, xp, caller = self._scores(X)
        return caller.give(_class_probabilities(scores, xp))

    def predict_log_proba(self, X):
        """Logarithm of the class probabilities, computed stably.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples.

        Returns
        -------
        log_proba : ndarray of shape (n_samples, n_classes)
            Log-probability of each class, in the order of ``classes_``.
        """
        scores, xp, caller = self._scores(X)
        return caller.give(_class_probabilities(scores, xp, log=True))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
