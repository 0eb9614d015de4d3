"""Factorized logistic regression with the penalty chosen by cross-validation: the
C path of each fold on the fold's rows of the joined matrix, without building it."""

from __future__ import annotations

import inspect
from numbers import Integral, Real

import numpy as np
from sklearn.base import _fit_context
from sklearn.metrics import get_scorer, get_scorer_names, make_scorer
from sklearn.model_selection import check_cv
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.class_weight import compute_class_weight

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on, to_numpy
from ilargi_sklearn.linear_model._logistic import (
    FactorizedLogisticRegression,
    _check_two_classes,
    _classification_target,
    _logistic_regression_path,
    _loss_target,
    _set_logistic_fitted,
)
from ilargi_sklearn.linear_model._loss import _raw_prediction, _split_coef
from ilargi_sklearn.linear_model._scoring import _IdentityClassifier
from ilargi_sklearn.multisource import MultiSourceDataset
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    validate_fit_inputs,
)

__all__ = ["FactorizedLogisticRegressionCV"]


class FactorizedLogisticRegressionCV(FactorizedLogisticRegression):
    """Logistic regression on joined data sources with ``C`` chosen by
    cross-validation, without building the join.

    For each fold of ``cv``, the L2-penalized model is fitted for every value of
    ``Cs`` on the fold's training rows, each fit started from the previous C's
    solution, and scored on the fold's test rows; the C of the best mean score is
    then refitted on all rows (``refit=True``). This is
    :class:`sklearn.linear_model.LogisticRegressionCV` with ``solver="lbfgs"`` and
    the L2 penalty, computed through the factorized operator of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or on a plain array or sparse
    matrix): the same folds and ``Cs`` give the same ``C_`` and, to the solver's
    tolerance, the same coefficients.

    Parameters
    ----------
    Cs : int or array-like of shape (n_cs,), default=10
        The inverse penalty strengths to try, in this order (each fit of a fold
        starts from the previous one's solution). An int ``n`` is ``n`` values on a
        logarithmic scale from 1e-4 to 1e4, as in scikit-learn. ``np.inf`` fits
        without penalty.
    fit_intercept : bool, default=True
        Whether to fit an intercept (one per class for multinomial models).
    cv : int, cross-validation generator or iterable, default=None
        The folds: None for 5-fold stratified cross-validation, an int for that
        many stratified folds, a splitter (``split(X, y)`` is called with the data
        as given) or an iterable of ``(train, test)`` index arrays.
    penalty : {"l2"}, default="l2"
        The L2 penalty ``||coef||^2 / (2 C)`` on the summed log-loss. ``"l1"`` and
        ``"elasticnet"`` raise a ``ValueError`` (no factorized solver for them);
        to fit without penalty, give ``Cs=[np.inf]``.
    scoring : str or callable, default=None
        How a fold's test rows score a model: a scorer name (``"neg_log_loss"``,
        ``"roc_auc"``, ...), a callable ``scorer(estimator, X, y)``, or None for
        the accuracy (scikit-learn's default until 1.11). Scorers that take the
        class labels get all of them, as in scikit-learn, so a fold missing a class
        still scores. A name (or None) scores the decision values of all Cs,
        computed in one product; a callable gets, as in scikit-learn, a fitted
        :class:`FactorizedLogisticRegression` of each C and the fold's test rows
        (a row slice of the dataset). Also used by :meth:`score`.
    solver : {"lbfgs"}, default="lbfgs"
        ``scipy.optimize.minimize(method="L-BFGS-B")`` with scikit-learn's options,
        the loss and its gradient computed through the operator.
    tol : float, default=1e-4
        Stop each fit when the largest absolute entry of the gradient is at most
        ``tol``.
    max_iter : int, default=100
        Most L-BFGS iterations of each fit.
    class_weight : dict or "balanced", default=None
        Weights of the classes, ``{label: weight}``, multiplying the sample
        weights in the loss (not in the scores). ``"balanced"`` uses
        ``n_samples / (n_classes * np.bincount(y))`` (weighted counts with
        ``sample_weight``), computed once on all rows.
    n_jobs : int, default=None
        Accepted for compatibility with scikit-learn; the folds run one after the
        other in this process (each fit's objective already runs on the package's
        threads).
    refit : bool, default=True
        True: refit the C of the best mean score on all rows, started from the mean
        of the folds' coefficients at that C. False: the mean of each fold's best
        coefficients, and ``C_`` the mean of the folds' best Cs.
    random_state : int, RandomState instance or None, default=None
        Accepted for compatibility with scikit-learn: L-BFGS draws no random
        numbers (and the folds of ``cv`` are not drawn from it).
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used: through its
        factorized operator (each fold a row slice of it), or its joined matrix,
        built once for the dataset's root and shared with every fit on its slices.
        Both give the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the fits compute, as in :class:`FactorizedLogisticRegression`
        (cuML is never used here: its L-BFGS takes no initial point).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    Cs_ : ndarray of shape (n_cs,)
        The Cs tried.
    C_ : float
        The chosen C (refit=False: the mean of the folds' best Cs).
    l1_ratio_ : float
        0.0 (the L2 penalty), as scikit-learn's with ``l1_ratios=(0,)``.
    l1_ratios_ : ndarray of shape (1,)
        ``[0.0]``.
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Coefficients of the final model, in the training data's dtype and where
        the fit ran.
    intercept_ : ndarray of shape (1,) or (n_classes,)
        Intercepts (zeros when ``fit_intercept=False``).
    coefs_paths_ : ndarray of shape (n_folds, 1, n_cs, n_outputs, n_dof)
        The coefficients of each fold and C, the intercept last
        (``n_dof = n_features + fit_intercept``; ``n_outputs`` is 1 for binary
        problems, ``n_classes`` otherwise).
    scores_ : ndarray of shape (n_folds, 1, n_cs)
        Each fold's test score of each C.
    n_iter_ : ndarray of shape (n_folds, 1, n_cs)
        L-BFGS iterations of each fold and C (the refit not counted).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.LogisticRegressionCV : The same search on a single matrix.
    FactorizedLogisticRegression : One C, with ``warm_start``.
    sklearn.model_selection.GridSearchCV : A search over any parameters (each
        candidate fitted from scratch).

    Notes
    -----
    A fold's training rows of a dataset are a row slice of its operator: the index
    vectors of the sources are sliced, no joined row is formed (with
    ``strategy="materialized"``, the fold takes its rows of the root's cached join).
    Along the path, the solution for ``C_j`` is the first iterate for ``C_{j+1}``,
    where L-BFGS usually needs a fraction of a cold start's iterations. The scores
    of a fold need one product ``T_test [W_1, ..., W_{n_cs}]^T`` for all Cs at once.

    The attribute shapes are scikit-learn's with ``use_legacy_attributes=False``
    (its default from 1.10): ``C_`` is a float and ``coefs_paths_``, ``scores_``
    and ``n_iter_`` are arrays with an axis for the (single) ``l1_ratio``.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedLogisticRegressionCV
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((300, 2))
    >>> dim = rng.standard_normal((30, 3))
    >>> fk = rng.integers(0, 30, 300)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = (base[:, 0] + dim[fk, 1] + rng.logistic(size=300) > 0).astype(int)
    >>> clf = FactorizedLogisticRegressionCV(Cs=5, cv=3).fit(ds, y)
    >>> clf.Cs_
    array([1.e-04, 1.e-02, 1.e+00, 1.e+02, 1.e+04])
    >>> clf.scores_.shape
    (3, 1, 5)
    >>> clf.coef_.shape
    (1, 5)
    >>> float(clf.score(ds, y)) > 0.7
    True
    """

    _parameter_constraints: dict = {
        "Cs": [Interval(Integral, 1, None, closed="left"), "array-like"],
        "fit_intercept": ["boolean"],
        "cv": ["cv_object"],
        # "l1" and "elasticnet" are known values refused in fit with a message
        # that says what to do, not by the generic parameter check.
        "penalty": [StrOptions({"l1", "l2", "elasticnet"})],
        "scoring": [StrOptions(set(get_scorer_names())), callable, None],
        "solver": [StrOptions({"lbfgs"})],
        "tol": [Interval(Real, 0, None, closed="left")],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "n_jobs": [Integral, None],
        "refit": ["boolean"],
        "random_state": ["random_state"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        Cs=10,
        fit_intercept=True,
        cv=None,
        penalty="l2",
        scoring=None,
        solver="lbfgs",
        tol=1e-4,
        max_iter=100,
        class_weight=None,
        n_jobs=None,
        refit=True,
        random_state=None,
        strategy="factorized",
        device="auto",
    ):
        self.Cs = Cs
        self.fit_intercept = fit_intercept
        self.cv = cv
        self.penalty = penalty
        self.scoring = scoring
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.class_weight = class_weight
        self.n_jobs = n_jobs
        self.refit = refit
        self.random_state = random_state
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the path of each fold, choose C and fit the final model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels (numbers or strings), at least two distinct ones.
        sample_weight : array-like of shape (n_samples,), default=None
            Individual weights for each sample, in the fits (times the class
            weights) and in the scores.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        if self.penalty != "l2":
            raise ValueError(
                f"penalty={self.penalty!r} is not supported: "
                f"{type(self).__name__} fits the L2 penalty only (penalty='l2'). For "
                "an L1 or elastic-net penalty use scikit-learn's LogisticRegressionCV "
                "(solver='saga') on the joined matrix; to fit without penalty, give "
                "Cs=[np.inf]."
            )
        Cs = _check_Cs(self.Cs)
        op, (classes, y_codes), sample_weight, _ = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_classification_target,
            strategy=self.strategy,
        )
        _check_two_classes(classes)
        xp = op.xp
        codes = to_numpy(y_codes)
        # The labels on the host, for the splitter and the scorers.
        labels = classes[codes]
        sw_scores = None if sample_weight is None else to_numpy(sample_weight)
        fit_weight = _fit_weights(
            self.class_weight, classes, codes, sw_scores, xp, op.device
        )
        loss, n_outputs, target = _loss_target(y_codes, classes.shape[0], xp)
        n_dof = op.n_cols + int(self.fit_intercept)

        folds = list(check_cv(self.cv, labels, classifier=True).split(X, labels))
        scorer = _fold_scorer(self.scoring, classes)
        # A named scorer reads the model's outputs only: it scores the decision
        # values that the path computes for all Cs in one product. A callable
        # may read the rows themselves: it gets a fitted model of each C and the
        # fold's test rows, as scikit-learn's LogisticRegressionCV gives them.
        precomputed = self.scoring is None or isinstance(self.scoring, str)
        n_folds, n_cs = len(folds), len(Cs)
        coefs_paths = np.empty((n_folds, n_cs, n_outputs * n_dof))
        scores = np.empty((n_folds, n_cs))
        n_iter = np.empty((n_folds, n_cs), dtype=np.int32)
        # BLAS on one thread for the whole search, as in the path: the scores'
        # products have as many columns as Cs (thin blocks), where BLAS's threads
        # cost more than they save (7x slower with two OpenBLAS threads on a
        # loaded two-core machine: 98 ms against 13 ms for a test fold of 4e4
        # rows and 10 Cs).
        with one_blas_thread():
            all_rows = np.arange(op.n_rows)
            for f, (train, test) in enumerate(folds):
                # Row numbers in [0, n_rows) from the splitter's indices or masks, as
                # indexing an array with them selects (negative ones count from the
                # end; out of range raises an IndexError).
                train, test = all_rows[np.asarray(train)], all_rows[np.asarray(test)]
                coefs_paths[f], n_iter[f] = _logistic_regression_path(
                    *_training_rows(op, target, fit_weight, train),
                    Cs,
                    fit_intercept=self.fit_intercept,
                    loss=loss,
                    w0=np.zeros(n_outputs * n_dof),
                    max_iter=self.max_iter,
                    tol=self.tol,
                )
                op_test = op.take_rows(test)
                sw_test = None if sw_scores is None else sw_scores[test]
                if precomputed:
                    scores[f] = _path_scores(
                        op_test,
                        coefs_paths[f],
                        classes,
                        scorer,
                        labels[test],
                        sw_test,
                        n_outputs=n_outputs,
                        fit_intercept=self.fit_intercept,
                    )
                else:
                    scores[f] = _path_model_scores(
                        X[test] if isinstance(X, MultiSourceDataset) else op_test.A,
                        op_test,
                        coefs_paths[f],
                        classes,
                        scorer,
                        labels[test],
                        sw_test,
                        n_outputs=n_outputs,
                        fit_intercept=self.fit_intercept,
                        device=self.device,
                        feature_names=getattr(self, "feature_names_in_", None),
                    )

            if self.refit:
                # The sum over folds, as scikit-learn: a mean could round two
                # different sums to a tie, and argmax takes the first of ties.
                best = int(np.argmax(scores.sum(axis=0)))
                C = float(Cs[best])
                fit_sum = op.n_rows if fit_weight is None else float(xp.sum(fit_weight))
                w, _ = _logistic_regression_path(
                    op,
                    target,
                    fit_weight,
                    fit_sum,
                    [C],
                    fit_intercept=self.fit_intercept,
                    loss=loss,
                    w0=coefs_paths[:, best].mean(axis=0),
                    max_iter=self.max_iter,
                    tol=self.tol,
                )
                w = w[0]
            else:
                best = np.argmax(scores, axis=1)
                w = coefs_paths[np.arange(n_folds), best].mean(axis=0)
                C = float(np.mean(Cs[best]))

        self.classes_ = classes
        self.Cs_ = Cs
        self.C_ = C
        self.l1_ratio_ = 0.0
        self.l1_ratios_ = np.asarray([0.0])
        self.coefs_paths_ = coefs_paths.reshape(n_folds, 1, n_cs, n_outputs, n_dof)
        self.scores_ = scores[:, None, :]
        self.n_iter_ = n_iter[:, None, :]
        _set_logistic_fitted(self, op, w, n_outputs, self.fit_intercept)
        return self

    def score(self, X, y, sample_weight=None):
        """Score of the model on ``X`` and ``y`` with the ``scoring`` option
        (accuracy when None), as in scikit-learn.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Test samples.
        y : array-like of shape (n_samples,)
            True labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Sample weights.

        Returns
        -------
        score : float
        """
        scorer = get_scorer(self.scoring or "accuracy")
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return scorer(self, X, y, **kwargs)


def _check_Cs(Cs):
    """The Cs as a float array (scikit-learn's log grid for an int)."""
    if isinstance(Cs, Integral):
        return np.logspace(-4, 4, Cs)
    Cs = np.asarray(Cs, dtype=np.float64).ravel()
    if Cs.size == 0 or not np.all(Cs > 0) or np.any(np.isnan(Cs)):
        raise ValueError(
            f"Cs must be a positive int or a non-empty list of positive numbers "
            f"(np.inf for no penalty), got {Cs.tolist()!r}."
        )
    return Cs


def _fit_weights(class_weight, classes, codes, sample_weight, xp, device):
    """The weights of the loss: the sample weights times the class weights (None
    when both are unit), computed once on all rows where the data lives.

    ``"balanced"`` weights come from all labels, not a fold's, as in scikit-learn.
    """
    if class_weight is None:
        return None if sample_weight is None else asarray_on(sample_weight, xp, device)
    if isinstance(class_weight, dict):
        unknown = set(class_weight) - set(classes.tolist())
        if unknown:
            raise ValueError(
                f"The given class_weight dict must have the class labels as keys; "
                f"classes={classes} but unknown key(s) {sorted(unknown, key=str)}."
            )
    per_class = compute_class_weight(
        class_weight, classes=classes, y=classes[codes], sample_weight=sample_weight
    )
    weights = per_class[codes]
    if sample_weight is not None:
        weights = weights * sample_weight
    return asarray_on(weights, xp, device)


def _training_rows(op, target, weight, rows):
    """``(op, target, sample_weight, sw_sum)`` of a fold's training rows ``rows``.

    A fold of at least half the rows is all of ``op`` with its rows' counts in
    ``rows`` (zero for the test rows) times ``weight`` as sample weights: the same
    objective (a row of weight zero adds zero to the loss and its gradient, and a
    repeated row counts as often as it is given), on the operator that the
    compiled objective runs fastest. A row slice of a factorized operator turns
    the identity-mapped base table into a gathered one (an evaluation 4x slower
    on a star of 2e5 rows, 10 base and 40 dimension columns), and a slice of a
    joined matrix is a copy; the zero rows cost at most as much again as the
    training rows. A smaller fold is a row slice of the operator: index vectors,
    not joined rows.
    """
    xp = op.xp
    n_rows = op.n_rows
    if 2 * rows.shape[0] >= n_rows:
        counts = np.bincount(rows, minlength=n_rows).astype(np.float64)
        counts = asarray_on(counts, xp, op.device)
        weight = counts if weight is None else weight * counts
        fold = op, target, weight, float(xp.sum(weight))
    else:
        rows_on = asarray_on(rows, xp, op.device)
        target = xp.take(target, rows_on, axis=0)
        if weight is None:
            fold = op.take_rows(rows), target, None, float(rows.shape[0])
        else:
            weight = xp.take(weight, rows_on, axis=0)
            fold = op.take_rows(rows), target, weight, float(xp.sum(weight))
    if not fold[3] > 0:
        raise ValueError(
            f"A fold's {rows.shape[0]} training rows have a total weight of "
            f"{fold[3]}: give each fold's training rows some positive sample (or "
            "class) weight, or other folds."
        )
    return fold


def _fold_scorer(scoring, classes):
    """The scorer of a fold's test rows: ``scorer(model, X, y, sample_weight)``.

    A metric that takes the labels gets all of ``classes`` (and the binary
    positive label ``classes[1]``), as scikit-learn's LogisticRegressionCV does,
    so that a test fold without some class scores as on all rows.
    """
    if scoring is None:
        return lambda model, X, y, sample_weight: model.score(
            X, y, sample_weight=sample_weight
        )
    scorer = get_scorer(scoring)
    func = getattr(scorer, "_score_func", None)
    if func is not None and "labels" in inspect.signature(func).parameters:
        params = inspect.signature(func).parameters
        extra = {"labels": classes}
        if classes.shape[0] == 2 and "pos_label" in params:
            extra["pos_label"] = classes[-1]
        scorer = make_scorer(
            func,
            greater_is_better=scorer._sign == 1,
            response_method=scorer._response_method,
            **{**getattr(scorer, "_kwargs", {}), **extra},
        )

    def score(model, X, y, sample_weight):
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        return scorer(model, X, y, **kwargs)

    return score


def _path_scores(
    op_test, coefs, classes, scorer, y_test, sw_test, *, n_outputs, fit_intercept
):
    """The test score of each C of a path: one product of the test rows with all
    the path's coefficients (flat parameters, one row per C), then the scorer on
    each C's decision values through an identity classifier."""
    n_cs = coefs.shape[0]
    n_features = op_test.n_cols
    coef, intercept = _split_coef(
        coefs.ravel(), n_features, n_cs * n_outputs, fit_intercept
    )
    raw = to_numpy(_raw_prediction(op_test, coef, intercept))
    model = _IdentityClassifier(classes)
    out = np.empty(n_cs)
    for i in range(n_cs):
        out[i] = scorer(
            model, raw[:, i * n_outputs : (i + 1) * n_outputs], y_test, sw_test
        )
    return out


def _path_model_scores(
    X_test,
    op_test,
    coefs,
    classes,
    scorer,
    y_test,
    sw_test,
    *,
    n_outputs,
    fit_intercept,
    device,
    feature_names,
):
    """The test score of each C of a path for a callable scorer: a fitted
    :class:`FactorizedLogisticRegression` of each C (its coefficients, the
    classes and the feature names), scored on the fold's test rows ``X_test`` as
    scikit-learn's LogisticRegressionCV scores its LogisticRegression."""
    out = np.empty(coefs.shape[0])
    for i, w in enumerate(coefs):
        model = FactorizedLogisticRegression(fit_intercept=fit_intercept, device=device)
        model.classes_ = classes
        _set_logistic_fitted(model, op_test, w, n_outputs, fit_intercept)
        model.n_features_in_ = op_test.n_cols
        if feature_names is not None:
            model.feature_names_in_ = feature_names
        out[i] = scorer(model, X_test, y_test, sw_test)
    return out
