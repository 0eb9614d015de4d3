"""The project's own estimator checks, on MultiSourceDataset input.

scikit-learn's ``check_estimator`` feeds only arrays and sparse matrices; these checks
cover what it cannot: cross-validation over a dataset, cloning and pickling a model
fitted on one, inputs left untouched, and factorized == materialized.

Use :func:`dataset_checks` to iterate over them::

    for check in dataset_checks():
        check(estimator, ds, y)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.base import clone, is_classifier
from sklearn.model_selection import cross_val_score

__all__ = [
    "check_clone_and_pickle",
    "check_cross_validation",
    "check_factorized_equals_materialized",
    "check_inputs_unchanged",
    "dataset_checks",
]


def _outputs(est: Any, X: Any) -> dict[str, np.ndarray]:
    out = {}
    for method in ("predict", "predict_proba", "decision_function", "transform"):
        if hasattr(est, method):
            out[method] = np.asarray(getattr(est, method)(X))
    return out


def _fit(est: Any, X: Any, y: Any) -> Any:
    return est.fit(X) if y is None else est.fit(X, y)


def _assert_outputs_close(
    a: dict, b: dict, rtol: float, atol: float, what: str
) -> None:
    assert a.keys() == b.keys(), what
    for k in a:
        np.testing.assert_allclose(
            a[k], b[k], rtol=rtol, atol=atol, err_msg=f"{what}: {k}"
        )


def _tol(X: Any) -> tuple[float, float]:
    return (1e-3, 1e-4) if X.dtype == np.float32 else (1e-6, 1e-8)


def check_factorized_equals_materialized(estimator: Any, X: Any, y: Any = None) -> None:
    """``strategy="factorized"`` and ``"materialized"`` fit the same model."""
    rtol, atol = _tol(X)
    fact = _fit(clone(estimator).set_params(strategy="factorized"), X, y)
    mat = _fit(clone(estimator).set_params(strategy="materialized"), X, y)
    _assert_outputs_close(
        _outputs(fact, X), _outputs(mat, X), rtol, atol, "factorized vs materialized"
    )


def check_cross_validation(estimator: Any, X: Any, y: Any = None) -> None:
    """``cross_val_score`` on a dataset equals the same on its materialized array."""
    rtol, atol = _tol(X)
    scoring = None
    if not hasattr(estimator, "score"):
        # Transformers without a score (NMF-like): score a deterministic function of
        # the fitted model on the held-out fold instead.
        def scoring(est, X_test, y_test=None):
            return float(np.mean(est.transform(X_test)))

    scores_ds = cross_val_score(clone(estimator), X, y, cv=3, scoring=scoring)
    scores_arr = cross_val_score(
        clone(estimator), X.materialize(), y, cv=3, scoring=scoring
    )
    assert np.all(np.isfinite(scores_ds))
    np.testing.assert_allclose(
        scores_ds, scores_arr, rtol=max(rtol, 1e-5), atol=max(atol, 1e-6)
    )


def check_clone_and_pickle(estimator: Any, X: Any, y: Any = None) -> None:
    """A fitted model survives pickling; a clone is unfitted with equal parameters."""
    est = _fit(clone(estimator), X, y)
    restored = pickle.loads(pickle.dumps(est))
    rtol, atol = _tol(X)
    _assert_outputs_close(_outputs(est, X), _outputs(restored, X), rtol, atol, "pickle")
    # A dataset survives pickling too (n_jobs > 1 ships it to workers).
    X2 = pickle.loads(pickle.dumps(X))
    _assert_outputs_close(
        _outputs(est, X), _outputs(est, X2), rtol, atol, "pickled dataset"
    )
    fresh = clone(est)
    assert _same_params(fresh.get_params(deep=False), est.get_params(deep=False))
    assert not any(k.endswith("_") and not k.startswith("_") for k in vars(fresh))


def _same_params(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal parameters, a nested estimator (a meta-estimator's) compared by type
    and its own parameters (a clone holds another object)."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if hasattr(v, "get_params") and not isinstance(v, type):
            if type(v) is not type(w) or not _same_params(
                v.get_params(deep=False), w.get_params(deep=False)
            ):
                return False
        elif v is not w and v != w:
            return False
    return True


def _snapshot(X: Any) -> list[np.ndarray]:
    arrays = []
    for t in X.operator.terms if hasattr(X.operator, "terms") else []:
        arrays.append(t.S.toarray() if sp.issparse(t.S) else np.array(t.S, copy=True))
        arrays.append(np.array(t.rows.idx, copy=True))
    return arrays


def check_inputs_unchanged(estimator: Any, X: Any, y: Any = None) -> None:
    """Fitting and predicting leave the dataset's sources, index vectors and y intact."""
    before = _snapshot(X)
    y_before = None if y is None else np.array(y, copy=True)
    est = _fit(clone(estimator), X, y)
    _outputs(est, X)
    after = _snapshot(X)
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    if y is not None:
        np.testing.assert_array_equal(np.asarray(y), y_before)


def dataset_checks() -> Iterator[Callable[..., None]]:
    """Yield the dataset checks, each called as ``check(estimator, X, y)``."""
    yield check_factorized_equals_materialized
    yield check_cross_validation
    yield check_clone_and_pickle
    yield check_inputs_unchanged


def needs_y(estimator: Any) -> bool:
    """Whether ``fit`` takes a target (regressors and classifiers)."""
    return (
        is_classifier(estimator)
        or getattr(estimator, "_estimator_type", None) == "regressor"
        or (estimator.__sklearn_tags__().target_tags.required)
    )
