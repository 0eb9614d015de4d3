"""Identity models: the cross-validated searches score predictions they computed
for many candidates at once through scikit-learn's scorers.

A search computes the predictions (or decision values) of all its candidates on a
fold's test rows in one product; a scorer wants an estimator and its input. An
identity model is that estimator: its "input" are the precomputed values, which
its prediction methods return as they are (or turn into labels and
probabilities), so that every scorer, a name of :func:`sklearn.metrics.get_scorer`
or a callable ``scorer(estimator, X, y)``, scores them as it would a fitted model.
scikit-learn's ``RidgeCV`` scores its leave-one-out predictions the same way
(``_IdentityRegressor`` and ``_IdentityClassifier`` in its ``_ridge.py``).
"""

from __future__ import annotations

import inspect

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from ilargi_sklearn.linear_model._base import _labels_from_scores
from ilargi_sklearn.linear_model._loss import _class_probabilities
from ilargi_sklearn.utils._validation import Caller


class _IdentityRegressor(RegressorMixin, BaseEstimator):
    """A regressor whose input are its predictions (n_samples,) or (n_samples,
    n_targets)."""

    def decision_function(self, y_predict):
        return y_predict

    def predict(self, y_predict):
        return y_predict


class _IdentityClassifier(ClassifierMixin, BaseEstimator):
    """A linear classifier of classes ``classes`` whose input are its decision
    values, host arrays of shape (n_samples, n_outputs) (one output for two
    classes, the score of ``classes[1]``): its labels are their sign or argmax,
    its probabilities their sigmoid or softmax, as
    :class:`~ilargi_sklearn.linear_model.FactorizedLogisticRegression` gives them
    from the same values."""

    def __init__(self, classes):
        self.classes_ = classes

    def decision_function(self, raw):
        return raw[:, 0] if raw.shape[1] == 1 else raw

    def predict(self, raw):
        # Host results: the fold's labels are there.
        return _labels_from_scores(
            self.classes_, self.decision_function(raw), np, Caller(None)
        )

    def predict_proba(self, raw):
        return _class_probabilities(self.decision_function(raw), np)

    def predict_log_proba(self, raw):
        return _class_probabilities(self.decision_function(raw), np, log=True)


def _accepts_sample_weight(scorer):
    """Whether GridSearchCV would hand ``sample_weight`` to ``scorer`` (its rule
    without metadata routing: a scorer object's own answer, else whether the
    callable has a ``sample_weight`` parameter)."""
    accept = getattr(scorer, "_accept_sample_weight", None)
    if accept is not None:
        return bool(accept())
    return "sample_weight" in inspect.signature(scorer).parameters
