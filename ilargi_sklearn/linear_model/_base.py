"""What the factorized linear models share: their targets, the device check, the
fitted coefficients, the decision function and ``predict``, and the candidates
and folds of the cross-validated searches.

The anatomy of scikit-learn's ``linear_model/_base.py``: estimators of the family
take these instead of copies, and solvers stay in their own modules
(:mod:`._least_squares`, :mod:`._loss`, :mod:`._optimize`), called with explicit
arguments.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
import scipy.sparse as sp
from sklearn.model_selection import check_cv
from sklearn.utils import check_scalar
from sklearn.utils.validation import _check_y, check_is_fitted

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    is_numpy_namespace,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
from ilargi_sklearn.utils._validation import (
    Caller,
    device_regression_target,
    host_array,
    validate_X,
)

__all__ = ["LinearPredictorMixin"]


# ------------------------------------------------------------------ targets
def _check_n_rows(op, y, name="y"):
    n_rows, n_y = op.n_rows, y.shape[0]
    if n_rows != n_y:
        raise ValueError(
            f"X has {n_rows} samples but {name} has {n_y}; they must have the same "
            "number of rows."
        )


def _regression_target(estimator, y, op):
    """``(Y, y_ndim)``: the target as float64 of shape (n_samples, n_targets) where
    ``op`` lives, and the number of dimensions ``y`` came with.

    A target already next to the data is checked there; any other is validated on
    the host (one copy when it came from another device) and moved next to the
    data once, for the whole fit. ``estimator`` names the model in scikit-learn's
    messages (the ``target`` callback of ``validate_fit_inputs``).
    """
    Y = device_regression_target(estimator, y, op)
    if Y is not None:
        _check_n_rows(op, Y)
        return Y, y.ndim
    y = _check_y(host_array(y), multi_output=True, y_numeric=True, estimator=estimator)
    if sp.issparse(y):
        y = y.toarray()
    _check_n_rows(op, y)
    Y = np.asarray(y, dtype=np.float64).reshape(op.n_rows, -1)
    return asarray_on(Y, op.xp, op.device), y.ndim


def _check_device_support(op, name="FactorizedLinearRegression"):
    """Sparse operators outside NumPy have no solver: LSQR and the sparse gram
    products are SciPy kernels. ``name``: the estimator the message names."""
    if op.is_sparse and not is_numpy_namespace(op.xp):
        raise UnsupportedOnDeviceError(
            f"on a device, {name} supports dense data only (got "
            f"a sparse {type(op).__name__} in {op.xp.__name__}); use device='cpu'."
        )


# ------------------------------------------------------- fitted coefficients
def _set_linear_fitted(
    estimator, op, coef, intercept, *, y_ndim, ravel_single, n_iter=None
):
    """Set ``coef_`` and ``intercept_`` (and ``n_iter_``) of a fitted linear
    model, with scikit-learn's shapes, in the training data's dtype and where the
    fit ran (``op``'s namespace and device).

    Every linear model of the family sets its coefficients here, its solvers'
    (``fit``) and cuML's alike, so that the shapes follow one rule.

    Parameters
    ----------
    estimator : estimator
        The model being fitted.
    op : Operator
        The training data.
    coef : array of shape (n_outputs, n_features)
        On the host (float64) or where ``op`` lives; any shape with
        ``n_outputs * n_features`` entries in that order (cuML's 1-D ``coef_``).
    intercept : array of shape (n_outputs,) or None
        None without an intercept: ``intercept_ = 0.0``, scikit-learn's
        regressors' convention (a classifier passes its zeros).
    y_ndim : {1, 2}
        Dimensions of the target: 1 gives a scalar ``intercept_`` (for one
        output), 2 an array of shape (n_outputs,).
    ravel_single : bool
        Whether one output gives a 1-D ``coef_`` whatever ``y``'s shape, as
        scikit-learn's ``Ridge``, ``ElasticNet`` and GLMs; otherwise only a 1-D
        ``y`` does (``LinearRegression``; a classifier passes ``y_ndim=2``).
    n_iter : int or array, default=None
        ``n_iter_`` (not set when None).
    """
    xp, device = op.xp, op.device
    dtype = numpy_dtype(op.dtype)
    coef = xp.reshape(asarray_on(coef, xp, device, dtype), (-1, op.n_cols))
    single = coef.shape[0] == 1
    estimator.coef_ = coef[0, :] if single and (ravel_single or y_ndim == 1) else coef
    if intercept is None:
        estimator.intercept_ = 0.0
    else:
        intercept = xp.reshape(asarray_on(intercept, xp, device, dtype), (-1,))
        estimator.intercept_ = intercept[0] if y_ndim == 1 else intercept
    if n_iter is not None:
        estimator.n_iter_ = n_iter


# --------------------------------------------------------- decision function
def _predict64(op, coef):
    """``T @ coef`` as float64 where ``op`` lives (``coef`` on the host)."""
    P = op.matmul(asarray_on(coef, op.xp, op.device, op.dtype))
    return op.xp.astype(P, op.xp.float64, copy=False)


def _linear_decision(estimator, X):
    """``(T coef_^T + intercept_, xp, caller)`` of a fitted linear model.

    ``coef_`` is (n_features,) or (n_outputs, n_features) and ``intercept_`` a
    float or (n_outputs,); the values are computed where ``X`` is placed (the
    estimator's ``device``), ``caller`` hands them back to where ``X`` came from.
    """
    check_is_fitted(estimator)
    caller = Caller(X)
    op = validate_X(estimator, X, reset=False, device=estimator.device)
    xp = op.xp
    # Parameters go to where the data is (they are small).
    coef = asarray_on(estimator.coef_, xp, op.device)
    coef = coef if coef.ndim == 1 else xp.matrix_transpose(coef)
    b = estimator.intercept_
    b = asarray_on(b, xp, op.device) if hasattr(b, "shape") else b
    return op.matmul(coef) + b, xp, caller


def _labels_from_scores(classes, scores, xp, caller):
    """The predicted labels of a linear classifier's decision values ``scores``
    (1-D: ``classes[1]`` where positive; 2-D: the argmax), in the caller's
    namespace."""
    if scores.ndim == 1:
        indices = xp.astype(scores > 0, xp.int64)
    else:
        indices = xp.argmax(scores, axis=1)
    if classes.dtype.kind not in "biuf":
        # Labels that are not numbers have no device array type.
        return classes[to_numpy(indices)]
    # device_of, not scores.device: Dask arrays have no .device attribute.
    labels = xp.take(asarray_on(classes, xp, device_of(scores)), indices)
    return caller.give(labels)


class LinearPredictorMixin:
    """``predict`` of a fitted linear model: ``T coef_^T + intercept_`` through the
    operator's ``matmul``, on the data's device, returned in the caller's array
    type. ``coef_`` is (n_features,) or (n_targets, n_features); ``intercept_`` a
    scalar or (n_targets,)."""

    def predict(self, X):
        """Predict with the linear model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples; a dataset is used through its factorized operator.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_targets)
            Predicted values.
        """
        values, _, caller = _linear_decision(self, X)
        return caller.give(values)


# ------------------------------------------------- cross-validated searches
def _predict_path(op, coef, intercept):
    """``T w_k + b_k`` for every candidate ``k`` of a search: one ``matmul`` with
    ``n_candidates * n_targets`` columns, ``coef`` (n_candidates, n_features,
    n_targets) and ``intercept`` (n_candidates, n_targets) on the host. Returns
    ``(n_rows, n_candidates, n_targets)`` where ``op`` lives."""
    n_alphas, d, n_targets = coef.shape
    xp = op.xp
    M = np.transpose(coef, (1, 0, 2)).reshape(d, n_alphas * n_targets)
    P = xp.reshape(_predict64(op, M), (op.n_rows, n_alphas, n_targets))
    return P + asarray_on(intercept, xp, op.device)[None, :, :]


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
