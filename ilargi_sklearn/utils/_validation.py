"""Input validation shared by every estimator: one entry point for datasets and arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.validation import validate_data

from ilargi_sklearn.dataset import MatrixOperator, MultiSourceDataset, Operator

__all__ = ["check_strategy", "validate_X"]

STRATEGIES = ("factorized", "materialized")


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
    return strategy


def validate_X(
    estimator: Any,
    X: Any,
    *,
    reset: bool,
    strategy: str = "factorized",
    accept_sparse: bool = True,
    ensure_non_negative: bool = False,
) -> Operator:
    """Validate ``X`` once at the estimator boundary and return its operator.

    A :class:`MultiSourceDataset` gives its (factorized) operator, or the materialized
    one when ``strategy="materialized"``; arrays go through scikit-learn's
    ``validate_data`` and give a :class:`MatrixOperator`. ``n_features_in_`` and
    ``feature_names_in_`` are set when ``reset`` and checked otherwise.
    """
    check_strategy(strategy)
    if isinstance(X, MultiSourceDataset):
        n_rows, n_features = X.shape
        name = type(estimator).__name__
        if n_rows == 0:
            raise ValueError(
                f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
                f"is required by {name}."
            )
        names = np.asarray(X.feature_names, dtype=object)
        if reset:
            estimator.n_features_in_ = n_features
            estimator.feature_names_in_ = names
        else:
            expected = getattr(estimator, "n_features_in_", None)
            if expected is not None and n_features != expected:
                raise ValueError(
                    f"X has {n_features} features, but {name} is expecting {expected} "
                    "features as input."
                )
            fitted_names = getattr(estimator, "feature_names_in_", None)
            if fitted_names is not None and not np.array_equal(fitted_names, names):
                diff = [a for a, b in zip(names, fitted_names) if a != b][:5]
                raise ValueError(
                    "The feature names of X differ from those seen during fit "
                    f"(first differences: {diff}); X must have the same schema."
                )
        op = X.operator
        if ensure_non_negative:
            _check_non_negative_operator(op, name)
        if strategy == "materialized":
            op = op.materialized()
        return op
    X = validate_data(
        estimator,
        X,
        reset=reset,
        accept_sparse="csr" if accept_sparse else False,
        dtype=[np.float64, np.float32],
        ensure_non_negative=ensure_non_negative,
    )
    return MatrixOperator(X)


def _check_non_negative_operator(op: Operator, name: str) -> None:
    from ilargi_sklearn.dataset import AffineOperator, FactorizedMatrix

    # A centered dataset (non-zero offset) is treated as possibly negative: its
    # range is not known without column minima, and centering makes some cells < 0.
    while isinstance(op, AffineOperator):
        if np.any(op.offset != 0) or np.any(op.scale < 0):
            raise ValueError(
                f"Negative values in data passed to {name} (the dataset is centered "
                "or negatively scaled)."
            )
        op = op.base
    if isinstance(op, FactorizedMatrix):
        for t in op.terms:
            S = t.S
            vals = S if isinstance(S, np.ndarray) else S.data
            if vals.size and vals.min() < 0:
                raise ValueError(f"Negative values in data passed to {name}.")
