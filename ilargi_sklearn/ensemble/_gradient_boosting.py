"""Histogram gradient boosting over joins: scikit-learn's ``HistGradientBoosting*``
trained on the sources of a :class:`~ilargi_sklearn.MultiSourceDataset`.

The estimators take scikit-learn's parameters with their meaning and fit the same
trees: the same bin thresholds (binned per source, :mod:`._binning`), the same
gradients (scikit-learn's loss objects, :mod:`._loss`), the same split decisions
(:mod:`._splitting`, :mod:`._grower`); only the histograms are built per source
(:mod:`._histogram`) and rows are routed through the index vectors.

``strategy="materialized"`` is the other plan: scikit-learn's own estimator fitted
on the joined table of tree features (NaN where a join did not match, categorical
columns as codes), the table built once per root dataset and kept in the join
cache (:func:`~ilargi_sklearn.multisource._cache.cached_table`).
"""

from __future__ import annotations

import itertools
import logging
import math
from contextlib import contextmanager, nullcontext
from numbers import Integral, Real

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    RegressorMixin,
    _fit_context,
    is_classifier,
)
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
)
from sklearn.metrics import check_scoring
from sklearn.metrics._scorer import _SCORERS
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import LabelEncoder
from sklearn.utils import check_random_state, compute_sample_weight, resample
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    _check_y,
    check_is_fitted,
    validate_data,
)

from ilargi_sklearn._backend._namespace import to_numpy
from ilargi_sklearn.ensemble._binning import (
    ROW_DTYPE,
    BinMapper,
    RawGroup,
    TreeLayout,
    group_weights,
    raw_groups,
)
from ilargi_sklearn.ensemble._grower import TreeGrower
from ilargi_sklearn.ensemble._histogram import HistogramBuilder
from ilargi_sklearn.ensemble._loss import make_loss
from ilargi_sklearn.multisource import FactorizedMatrix, MultiSourceDataset
from ilargi_sklearn.multisource._cache import cached_table, is_table_cached
from ilargi_sklearn.utils._validation import Caller, host_array, validate_X

__all__ = [
    "FactorizedHistGradientBoostingClassifier",
    "FactorizedHistGradientBoostingRegressor",
]

logger = logging.getLogger(__name__)

#: Rows of scikit-learn's subsample for the bin thresholds.
BINNING_SUBSAMPLE = 200_000


# ------------------------------------------------------------------ layouts
def _dataset_layout(ds: MultiSourceDataset, categorical_features) -> TreeLayout:
    """Tree features of a dataset: its columns, one-hot groups of the schema
    folded into categorical features (``"from_dtype"``), or as asked."""
    names = [str(n) for n in ds.feature_names]
    pos = {n: i for i, n in enumerate(names)}
    groups: dict[str, list[int]] = {}
    for key, cats in ds.categories_.items():
        cols = [pos.get(f"{key}_{v}") for v in cats]
        if cats and all(c is not None for c in cols):
            groups[key] = cols
    chosen: set[str] = set()
    numeric_cat: set[int] = set()
    if isinstance(categorical_features, str) and categorical_features == "from_dtype":
        chosen = set(groups)
    elif categorical_features is not None:
        spec = np.asarray(categorical_features)
        if spec.dtype.kind == "b":
            if spec.shape != (len(names),):
                raise ValueError(
                    f"categorical_features as a boolean mask must have shape "
                    f"({len(names)},) (one entry per dataset column), got {spec.shape}."
                )
            numeric_cat = set(np.flatnonzero(spec).tolist())
        elif spec.dtype.kind in "iu":
            bad = [int(i) for i in spec if not 0 <= i < len(names)]
            if bad:
                raise ValueError(
                    f"categorical_features has indices {bad} outside [0, {len(names)})."
                )
            numeric_cat = set(spec.tolist())
        else:
            for name in spec.tolist():
                if name in groups:
                    chosen.add(name)
                elif name in pos:
                    numeric_cat.add(pos[name])
                else:
                    raise ValueError(
                        f"categorical_features names {name!r}, which is neither a "
                        f"categorical column of the dataset's schema "
                        f"({sorted(groups)}) nor one of its features."
                    )
    in_group = {c: key for key in chosen for c in groups[key]}
    bad = sorted(names[c] for c in numeric_cat if c in in_group)
    if bad:
        raise ValueError(
            f"categorical_features lists one-hot columns {bad}; name their "
            f"categorical column instead ({sorted({in_group[pos[b]] for b in bad})})."
        )
    f_names, f_cols, f_cat, f_onehot = [], [], [], []
    for c, name in enumerate(names):
        key = in_group.get(c)
        if key is not None:
            if groups[key][0] == c:
                f_names.append(key)
                f_cols.append(np.asarray(groups[key]))
                f_cat.append(True)
                f_onehot.append(True)
            continue
        f_names.append(name)
        f_cols.append(np.asarray([c]))
        f_cat.append(c in numeric_cat)
        f_onehot.append(False)
    return TreeLayout.build(f_names, f_cols, f_cat, f_onehot)


def _array_layout(estimator, n_features: int, categorical_features) -> TreeLayout:
    names = getattr(estimator, "feature_names_in_", None)
    names = (
        [str(n) for n in names]
        if names is not None
        else [f"x{i}" for i in range(n_features)]
    )
    mask = np.zeros(n_features, dtype=bool)
    spec = categorical_features
    if spec is not None and not (isinstance(spec, str) and spec == "from_dtype"):
        spec = np.asarray(spec)
        if spec.dtype.kind == "b":
            if spec.shape != (n_features,):
                raise ValueError(
                    "categorical_features set as a boolean mask must have shape "
                    f"(n_features,), got: {spec.shape}"
                )
            mask = spec.copy()
        elif spec.dtype.kind in "iu":
            if np.any(spec < 0) or np.any(spec >= n_features):
                raise ValueError(
                    "categorical_features set as integer indices must be in "
                    f"[0, n_features - 1] = [0, {n_features - 1}], got {spec.tolist()}."
                )
            mask[spec] = True
        elif spec.size:
            fn = getattr(estimator, "feature_names_in_", None)
            if fn is None:
                raise ValueError(
                    "categorical_features should be passed as an array of integers "
                    "or as a boolean mask when the model is fitted on data without "
                    "feature names."
                )
            where = {n: i for i, n in enumerate(fn)}
            missing = [n for n in spec.tolist() if n not in where]
            if missing:
                raise ValueError(
                    f"categorical_features has an item value {missing[0]!r} which is "
                    "not a valid feature name of the training data."
                )
            mask[[where[n] for n in spec.tolist()]] = True
    cols = [np.asarray([i]) for i in range(n_features)]
    return TreeLayout.build(names, cols, mask, np.zeros(n_features, dtype=bool))


def _natural_table(groups: list[RawGroup], n_rows: int, layout: TreeLayout):
    """The joined table of tree values (NaN where a join did not match), its
    columns the features in input order (:attr:`tree_feature_names_`): what
    scikit-learn's estimator takes in the materialized plan. Each row is computed
    from that row alone (a row slice's table is its rows of the whole one)."""
    F = layout.n_features
    position = np.empty(F, dtype=np.int64)
    position[layout.natural] = np.arange(F)
    out = np.full((n_rows, F), np.nan)
    for grp in groups:
        cols = position[grp.features]
        if grp.idx is None:
            out[:, cols] = grp.values
        else:
            hit = grp.idx >= 0
            out[np.ix_(np.flatnonzero(hit), cols)] = grp.values[grp.idx[hit]]
    return out


def _table_key(layout: TreeLayout) -> tuple:
    """What a dataset's tree table depends on besides its data (the join
    cache's key of :func:`cached_table`)."""
    return (
        "trees",
        tuple(layout.names),
        tuple(tuple(int(c) for c in cols) for cols in layout.columns),
        tuple(bool(b) for b in layout.is_categorical),
        tuple(bool(b) for b in layout.onehot),
    )


def joined_tree_table(ds, categorical_features="from_dtype"):
    """The join as scikit-learn's ``HistGradientBoosting*`` takes it: NaN where a
    join did not match, each categorical column of the schema ordinal-encoded.

    Built row by row from the sources (it is the join): for comparisons and for
    the materialized plan. The columns are the model's features in input order.

    Returns
    -------
    X : ndarray of float64 of shape (n_rows, n_tree_features)
    is_categorical : ndarray of bool
    names : list of str
    """
    layout = _dataset_layout(ds, categorical_features)
    table = _natural_table(raw_groups(ds.operator, layout), len(ds), layout)
    names = [layout.names[f] for f in layout.natural]
    return table, layout.is_categorical[layout.natural], names


def _source_shapes(X, categorical_features):
    """``(rows, tree features, distinct rows referenced, identity)`` per source
    term of ``X``, for the planner: what :func:`raw_groups` would build, counted
    without building it (a column several terms own counts as an identity
    feature, as it is gathered into one)."""
    if not isinstance(X, MultiSourceDataset) or not isinstance(
        X.operator, FactorizedMatrix
    ):
        n, d = (0, 0) if X is None else (int(X.shape[0]), int(X.shape[1]))
        return [(n, d, n, True)]
    op = X.operator
    layout = _dataset_layout(X, categorical_features)
    owners: dict[int, set[int]] = {}
    for t_idx, t in enumerate(op.terms):
        for c in np.asarray(t.cols):
            owners.setdefault(int(c), set()).add(t_idx)
    per_term = np.zeros(len(op.terms), dtype=np.int64)
    derived = 0
    for f in range(layout.n_features):
        terms = set().union(*(owners.get(int(c), set()) for c in layout.columns[f]))
        single = all(len(owners.get(int(c), ())) == 1 for c in layout.columns[f])
        if len(terms) == 1 and single:
            per_term[terms.pop()] += 1
        else:
            derived += 1
    n = op.n_rows
    out = []
    for t, c in zip(op.terms, per_term):
        if not c:
            continue
        r = int(t.S.shape[0])
        if t.rows.is_identity:
            out.append((n, int(c), n, True))
            continue
        idx = np.asarray(to_numpy(t.rows.idx))
        hit = idx[idx >= 0]
        u = int(np.count_nonzero(np.bincount(hit, minlength=r))) if hit.size else 0
        out.append((r, int(c), u, False))
    if derived:
        out.append((n, derived, n, True))
    return out


def _is_default(value, default) -> bool:
    """Whether a parameter's value is its default (arrays and lists never are,
    unless the default is the same object)."""
    if value is default:
        return True
    scalar = (str, bool, Integral, Real, type(None))
    return (
        isinstance(value, scalar) and isinstance(default, scalar) and value == default
    )


@contextmanager
def _patch_raw_predict(estimator, raw_predictions):
    """``_raw_predict`` returns ``raw_predictions`` inside the block (scorers of
    early stopping on the rows whose raw predictions the fit already has)."""
    estimator._raw_predict = lambda *args, **kwargs: raw_predictions
    try:
        yield estimator
    finally:
        del estimator._raw_predict


# ---------------------------------------------------------------- estimators
class _BaseFactorizedHGB(BaseEstimator):
    """The shared machinery of the two estimators."""

    _parameter_constraints: dict = {
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "max_leaf_nodes": [Interval(Integral, 2, None, closed="left"), None],
        "max_depth": [Interval(Integral, 1, None, closed="left"), None],
        "min_samples_leaf": [Interval(Integral, 1, None, closed="left")],
        "l2_regularization": [Interval(Real, 0, None, closed="left")],
        "max_features": [Interval(RealNotInt, 0, 1, closed="right")],
        "monotonic_cst": ["array-like", dict, None],
        "interaction_cst": [
            list,
            tuple,
            StrOptions({"pairwise", "no_interactions"}),
            None,
        ],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "validation_fraction": [
            Interval(RealNotInt, 0, 1, closed="neither"),
            Interval(Integral, 1, None, closed="left"),
            None,
        ],
        "tol": [Interval(Real, 0, None, closed="left")],
        "max_bins": [Interval(Integral, 2, 255, closed="both")],
        "categorical_features": ["array-like", StrOptions({"from_dtype"}), None],
        "warm_start": ["boolean"],
        "early_stopping": [StrOptions({"auto"}), "boolean"],
        "scoring": [str, callable, None],
        "verbose": ["verbose"],
        "random_state": ["random_state"],
        "strategy": [StrOptions({"factorized", "materialized"})],
    }

    def __init__(
        self,
        loss,
        *,
        learning_rate,
        max_iter,
        max_leaf_nodes,
        max_depth,
        min_samples_leaf,
        l2_regularization,
        max_features,
        max_bins,
        categorical_features,
        monotonic_cst,
        interaction_cst,
        warm_start,
        early_stopping,
        scoring,
        validation_fraction,
        n_iter_no_change,
        tol,
        verbose,
        random_state,
        strategy,
    ):
        self.loss = loss
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.max_leaf_nodes = max_leaf_nodes
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.max_features = max_features
        self.max_bins = max_bins
        self.categorical_features = categorical_features
        self.monotonic_cst = monotonic_cst
        self.interaction_cst = interaction_cst
        self.warm_start = warm_start
        self.early_stopping = early_stopping
        self.scoring = scoring
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.verbose = verbose
        self.random_state = random_state
        self.strategy = strategy

    # -------------------------------------------------------------- the data
    def _check_X(self, X, *, reset):
        """``(raw groups, n_rows)`` of ``X`` in the trees' features; sets the
        layout and the input attributes when ``reset``."""
        src, n = self._check_input(X, reset=reset)
        return raw_groups(src, self._layout), n

    def _table(self, X, *, reset):
        """The joined tree table of ``X`` (columns :attr:`tree_feature_names_`),
        what scikit-learn's estimator takes in the materialized plan; for a
        dataset built once per root dataset and kept in the join cache."""
        src, n = self._check_input(X, reset=reset)
        if not isinstance(X, MultiSourceDataset):
            return src.A  # an array's columns are the tree features, in order
        layout = self._layout

        def build(op):
            return _natural_table(raw_groups(op, layout), op.n_rows, layout)

        return cached_table(X, _table_key(layout), build)[0]

    def _check_input(self, X, *, reset):
        """``(operator or array, n_rows)`` of ``X``, validated; sets the layout
        and the input attributes when ``reset``."""
        if isinstance(X, MultiSourceDataset):
            op = validate_X(self, X, reset=reset, device="auto")
            if not isinstance(op, FactorizedMatrix):
                raise TypeError(
                    f"{type(self).__name__} takes a dataset of joined sources; this "
                    f"one is {type(op).__name__} (scaled, centered or expanded). "
                    "Trees need no scaling: pass the dataset before "
                    "FactorizedStandardScaler or FactorizedPolynomialFeatures."
                )
            if reset:
                self._layout = _dataset_layout(X, self.categorical_features)
            src, n = op, op.n_rows
        else:
            if not reset and getattr(self, "_layout_is_dataset", False):
                raise TypeError(
                    f"{type(self).__name__} was fitted on a MultiSourceDataset: "
                    "predict on a dataset built with its schema "
                    "(model.dataset_schema_.build(base, tables))."
                )
            A = validate_data(
                self,
                host_array(X),
                reset=reset,
                dtype=np.float64,
                ensure_all_finite=False,
            )
            if reset:
                self._layout = _array_layout(
                    self, A.shape[1], self.categorical_features
                )
            src, n = _Dense(A), A.shape[0]
        if reset:
            self._layout_is_dataset = isinstance(X, MultiSourceDataset)
        elif isinstance(X, MultiSourceDataset) and not getattr(
            self, "_layout_is_dataset", False
        ):
            raise TypeError(
                f"{type(self).__name__} was fitted on an array: predict on an array "
                "of the same columns, or refit on the dataset."
            )
        return src, n

    def _bin(self, groups, n):
        return self._bin_mapper.transform(groups, n, self._layout.n_features)

    # ------------------------------------------------------------- fitting
    def _monotonic(self, check_multiclass=True):
        layout = self._layout
        F = layout.n_features
        cst = np.zeros(F, dtype=np.int8)
        if self.monotonic_cst is None:
            return cst
        natural_names = [None] * F
        for nat, f in enumerate(layout.natural):
            natural_names[nat] = layout.names[f]
        if isinstance(self.monotonic_cst, dict):
            unknown = sorted(set(self.monotonic_cst) - set(layout.names))
            if unknown:
                raise ValueError(
                    f"monotonic_cst contains {len(unknown)} unexpected feature "
                    f"names: {unknown}; the model's features are {natural_names}."
                )
            values = [self.monotonic_cst.get(n, 0) for n in natural_names]
        else:
            values = np.asarray(self.monotonic_cst)
            if values.shape != (F,):
                raise ValueError(
                    f"monotonic_cst has shape {values.shape} but the model has {F} "
                    f"features ({natural_names})."
                )
        values = np.asarray(values, dtype=np.int64)
        bad = np.setdiff1d(np.unique(values), [-1, 0, 1])
        if bad.size:
            raise ValueError(
                "monotonic_cst must be an array-like of -1, 0 or 1. Observed values: "
                f"{bad.tolist()}."
            )
        cst[layout.natural] = values
        if np.any(cst[layout.is_categorical] != 0):
            raise ValueError("Categorical features cannot have monotonic constraints.")
        if check_multiclass and cst.any() and self.n_trees_per_iteration_ != 1:
            raise ValueError(
                "monotonic constraints are not supported for multiclass classification."
            )
        return cst

    def _interactions(self):
        """The interaction constraints as sets of tree features (the trees'
        order), the features no set lists forming one more set."""
        if self.interaction_cst is None:
            return None
        F = self._layout.n_features
        if self.interaction_cst == "no_interactions":
            groups = [[i] for i in range(F)]
        elif self.interaction_cst == "pairwise":
            groups = itertools.combinations(range(F), 2)
        else:
            groups = self.interaction_cst
        try:
            groups = [set(g) for g in groups]
        except TypeError:
            raise ValueError(
                "Interaction constraints must be a sequence of tuples or lists, got:"
                f" {self.interaction_cst!r}."
            ) from None
        for g in groups:
            bad = [x for x in g if not (isinstance(x, Integral) and 0 <= x < F)]
            if bad:
                raise ValueError(
                    "Interaction constraints must consist of integer indices in "
                    f"[0, n_features - 1] = [0, {F - 1}] (the positions of "
                    f"tree_feature_names_), got invalid indices: {sorted(bad)}."
                )
        # Positions of tree_feature_names_ to the trees' order (categories first).
        natural = self._layout.natural
        out = [{int(natural[x]) for x in g} for g in groups]
        rest = set(range(F)) - set().union(*out)
        if rest:
            out.append(rest)
        return out

    def _fit_bin_mapper(self, groups, train_idx, sw_train, n_rows):
        """Thresholds as ``_BinMapper(random_state=self._random_seed)`` computes
        them on the training rows of the joined table."""
        n_train = train_idx.shape[0]
        weighted = False
        weights = None
        # All rows in order: counted from the index vectors themselves.
        rows = None if n_train == n_rows else train_idx
        if n_train > BINNING_SUBSAMPLE:
            rng = check_random_state(self._random_seed)
            p = None if sw_train is None else sw_train / np.sum(sw_train)
            subset = rng.choice(n_train, BINNING_SUBSAMPLE, p=p, replace=True)
            rows = train_idx[subset]
        elif sw_train is not None:
            weighted, weights = True, sw_train
        counts = [group_weights(g, rows, weights) for g in groups]
        # Categories are those of every row of X (scikit-learn's OrdinalEncoder
        # runs before the validation split); only categorical features need them.
        is_cat = self._layout.is_categorical
        known = [
            group_weights(g, None) if is_cat[g.features].any() else None for g in groups
        ]
        mapper = BinMapper(self.max_bins + 1)
        return mapper.fit(groups, self._layout, counts, weighted, known)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(
        self,
        X,
        y,
        sample_weight=None,
        *,
        X_val=None,
        y_val=None,
        sample_weight_val=None,
    ):
        """Fit the gradient boosting model.

        Parameters
        ----------
        X : {array-like, MultiSourceDataset} of shape (n_samples, n_features)
            The input samples: a dataset of joined sources (trained on the
            sources), or an array (NaN for missing values).
        y : array-like of shape (n_samples,)
            Target values, one per row of ``X`` (a dataset's rows: see
            :meth:`~ilargi_sklearn.MultiSourceDataset.align`).
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the rows.
        X_val : {array-like, MultiSourceDataset}, default=None
            Validation rows for early stopping instead of a split of ``X`` (a
            dataset built with the training schema, or an array like ``X``).
        y_val : array-like, default=None
            Their targets.
        sample_weight_val : array-like, default=None
            Their weights.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        fitted = getattr(self, "_fit_strategy", None)
        if self.warm_start and self._is_fitted() and fitted != self.strategy:
            raise ValueError(
                f"warm_start=True adds trees to the previous fit, which ran "
                f"strategy={fitted!r}, but strategy={self.strategy!r} now: the two "
                "plans keep different trees. Set strategy back to "
                f"{fitted!r} to continue that fit, or warm_start=False to fit anew."
            )
        if self.strategy == "materialized":
            return self._fit_materialized(
                X, y, sample_weight, X_val, y_val, sample_weight_val
            )
        for attr in ("_hgb", "classes_"):
            # What a materialized fit of this estimator left (the factorized fit
            # sets the classes again).
            if hasattr(self, attr):
                delattr(self, attr)
        self._fit_strategy = "factorized"
        groups, n_samples = self._check_X(X, reset=True)
        y = self._encode_y(_check_y(host_array(y), estimator=self))
        if y.shape[0] != n_samples:
            raise ValueError(
                f"X has {n_samples} rows but y has {y.shape[0]}; give one target "
                "value per row of X (ds.align(base[target]) takes a base table's "
                "column into dataset order)."
            )
        if sample_weight is not None:
            sample_weight = _check_sample_weight(
                host_array(sample_weight), np.empty((n_samples, 0)), dtype=np.float64
            )
        sample_weight = self._finalize_sample_weight(sample_weight, y)
        provided = X_val is not None or y_val is not None
        groups_val = None
        if provided:
            if y_val is None:
                raise ValueError("X_val is provided, but y_val was not provided.")
            if X_val is None:
                raise ValueError("y_val is provided, but X_val was not provided.")
            if self.early_stopping is False:
                raise ValueError(
                    "X_val and y_val are passed to fit while at the same time "
                    "early_stopping is False. When passing X_val and y_val to fit, "
                    "early_stopping should be set to either 'auto' or True."
                )
            groups_val, n_val = self._check_X(X_val, reset=False)
            y_val = self._encode_y_val(_check_y(host_array(y_val), estimator=self))
            if y_val.shape[0] != n_val:
                raise ValueError(
                    f"X_val has {n_val} rows but y_val has {y_val.shape[0]}."
                )
            if sample_weight_val is not None:
                sample_weight_val = _check_sample_weight(
                    host_array(sample_weight_val),
                    np.empty((n_val, 0)),
                    dtype=np.float64,
                )

        rng = check_random_state(self.random_state)
        if not self.warm_start or not self._is_fitted():
            self._random_seed = rng.randint(np.iinfo(np.uint32).max, dtype="u8")
            feature_subsample_seed = rng.randint(np.iinfo(np.uint32).max, dtype="u8")
            self._feature_subsample_rng = np.random.default_rng(feature_subsample_seed)
        monotonic_cst = self._monotonic()
        interaction_cst = self._interactions()
        self._loss = self._get_loss(sample_weight)
        if self.early_stopping == "auto":
            self.do_early_stopping_ = n_samples > 10_000
        else:
            self.do_early_stopping_ = self.early_stopping
        self._use_validation_data = self.validation_fraction is not None or provided
        if n_samples >= np.iinfo(ROW_DTYPE).max:
            raise ValueError(
                f"{type(self).__name__} takes fewer than 2**31 rows, got {n_samples}."
            )
        all_idx = np.arange(n_samples, dtype=ROW_DTYPE)
        if self.do_early_stopping_ and self._use_validation_data and not provided:
            stratify = y if hasattr(self._loss, "predict_proba") else None
            train_idx, val_idx = train_test_split(
                all_idx,
                test_size=self.validation_fraction,
                stratify=stratify,
                random_state=self._random_seed,
            )
        else:
            train_idx, val_idx = all_idx, None
        if val_idx is None:
            y_train, sw_train = y, sample_weight
        else:
            y_train = y[train_idx]
            sw_train = None if sample_weight is None else sample_weight[train_idx]
        if provided:
            sw_val = sample_weight_val
        else:
            y_val = None if val_idx is None else y[val_idx]
            sw_val = None
            if val_idx is not None and sample_weight is not None:
                sw_val = sample_weight[val_idx]

        self._bin_mapper = self._fit_bin_mapper(groups, train_idx, sw_train, n_samples)
        data = self._bin(groups, n_samples)
        del groups
        data_train = data if val_idx is None else data.take(train_idx)
        data_val = None if val_idx is None else data.take(val_idx)
        if provided:
            data_val = self._bin(groups_val, n_val)
            del groups_val
        del data
        missing_bin = self._bin_mapper.missing_values_bin_idx_
        has_missing = self._has_missing(data_train, missing_bin)
        n_train = train_idx.shape[0]
        n_bins = self.max_bins + 1
        if not self.do_early_stopping_:
            # Only the scorer of early stopping reads the training rows' ids
            # again: 4 bytes a row less for the rest of the fit.
            del all_idx, train_idx

        scoring_is_predefined_string = self.scoring in _SCORERS
        need_raw_val = data_val is not None and (
            scoring_is_predefined_string or self.scoring == "loss"
        )
        K = self.n_trees_per_iteration_
        small = None
        if self.do_early_stopping_ and self.scoring != "loss":
            # The scorer's training rows: at most 10,000, drawn once per fit.
            small = self._small_trainset(y_train, sw_train)
        if not (self._is_fitted() and self.warm_start):
            self._clear_state()
            self._baseline_prediction = self._loss.fit_intercept_only(
                y_true=y_train, sample_weight=sw_train
            ).reshape((1, -1))
            raw = np.zeros((n_train, K), dtype=np.float64, order="F")
            raw += self._baseline_prediction
            self._predictors = predictors = []
            self._scorer = None
            raw_val = None
            self.train_score_ = []
            self.validation_score_ = []
            if self.do_early_stopping_:
                if need_raw_val:
                    raw_val = np.zeros((data_val.n_rows, K), order="F")
                    raw_val += self._baseline_prediction
                if self.scoring == "loss":
                    self._check_early_stopping_loss(
                        raw, y_train, sw_train, raw_val, y_val, sw_val
                    )
                else:
                    self._scorer = check_scoring(self, self.scoring)
                    self._check_early_stopping_scorer(
                        X,
                        X_val,
                        train_idx,
                        val_idx,
                        small,
                        y_train,
                        sw_train,
                        y_val,
                        sw_val,
                        raw if scoring_is_predefined_string else None,
                        raw_val,
                    )
            begin_at_stage = 0
        else:
            if self.max_iter < self.n_iter_:
                raise ValueError(
                    f"max_iter={self.max_iter} must be larger than or equal to "
                    f"n_iter_={self.n_iter_} when warm_start==True"
                )
            self.train_score_ = self.train_score_.tolist()
            self.validation_score_ = self.validation_score_.tolist()
            raw = self._raw_predict_binned(data_train)
            raw_val = None
            if self.do_early_stopping_ and need_raw_val:
                raw_val = self._raw_predict_binned(data_val)
            predictors = self._predictors
            begin_at_stage = self.n_iter_

        gradient, hessian = self._loss.init_gradient_and_hessian(
            n_samples=n_train, dtype=np.float32, order="F"
        )
        builder = HistogramBuilder(data_train, n_bins)
        for iteration in range(begin_at_stage, self.max_iter):
            if self._loss.constant_hessian:
                self._loss.gradient(
                    y_true=y_train,
                    raw_prediction=raw,
                    sample_weight=sw_train,
                    gradient_out=gradient,
                )
            else:
                self._loss.gradient_hessian(
                    y_true=y_train,
                    raw_prediction=raw,
                    sample_weight=sw_train,
                    gradient_out=gradient,
                    hessian_out=hessian,
                )
            predictors.append([])
            if gradient.ndim == 1:
                g_view, h_view = gradient.reshape((-1, 1)), hessian.reshape((-1, 1))
            else:
                g_view, h_view = gradient, hessian
            for k in range(K):
                grower = TreeGrower(
                    data_train,
                    np.ascontiguousarray(g_view[:, k]),
                    np.ascontiguousarray(h_view[:, k]),
                    builder,
                    max_leaf_nodes=self.max_leaf_nodes,
                    max_depth=self.max_depth,
                    min_samples_leaf=self.min_samples_leaf,
                    n_bins=n_bins,
                    n_bins_non_missing=self._bin_mapper.n_bins_non_missing_,
                    has_missing_values=has_missing,
                    is_categorical=self._layout.is_categorical,
                    monotonic_cst=monotonic_cst,
                    interaction_cst=interaction_cst,
                    l2_regularization=self.l2_regularization,
                    feature_fraction_per_split=self.max_features,
                    rng=self._feature_subsample_rng,
                    shrinkage=self.learning_rate,
                )
                grower.grow()
                if not self._loss.differentiable:
                    self._update_leaves_values(grower, y_train, raw[:, k], sw_train)
                predictors[-1].append(
                    grower.make_predictor(self._bin_mapper.bin_thresholds_)
                )
                grower.add_leaf_values(raw[:, k])
                builder.end_tree()
            should_stop = False
            if self.do_early_stopping_:
                if need_raw_val:
                    for k, pred in enumerate(predictors[-1]):
                        pred.predict_binned(data_val, missing_bin, raw_val[:, k])
                if self.scoring == "loss":
                    should_stop = self._check_early_stopping_loss(
                        raw, y_train, sw_train, raw_val, y_val, sw_val
                    )
                else:
                    should_stop = self._check_early_stopping_scorer(
                        X,
                        X_val,
                        train_idx,
                        val_idx,
                        small,
                        y_train,
                        sw_train,
                        y_val,
                        sw_val,
                        raw if scoring_is_predefined_string else None,
                        raw_val,
                    )
            if self.verbose >= 2:
                logger.info(
                    "[%d/%d] %d trees, %d leaves",
                    iteration + 1,
                    self.max_iter,
                    K,
                    sum(p.get_n_leaf_nodes() for p in predictors[-1]),
                )
            if should_stop:
                break
        self.train_score_ = np.asarray(self.train_score_)
        self.validation_score_ = np.asarray(self.validation_score_)
        return self

    # ------------------------------------------------- the materialized plan
    def _sklearn_estimator_params(self):
        """scikit-learn's parameters of this fit, one to one, on the tree table
        (columns :attr:`tree_feature_names_`); only those the installed
        scikit-learn has (a set one it lacks is an error)."""
        layout = self._layout
        natural = layout.natural
        mask = layout.is_categorical[natural]
        interaction_cst = self.interaction_cst
        if interaction_cst is not None and not isinstance(interaction_cst, str):
            # scikit-learn reads the positions after moving the categorical
            # features first (the trees' order); ours are of the input order.
            interaction_cst = [sorted(g) for g in self._interactions()]
        monotonic_cst = None
        if self.monotonic_cst is not None:
            # In input order; scikit-learn reorders it itself.
            monotonic_cst = self._monotonic(check_multiclass=False)[natural]
        params = {
            name: getattr(self, name)
            for name in self.get_params(deep=False)
            if name not in ("strategy",)
        }
        params.update(
            categorical_features=mask if mask.any() else None,
            monotonic_cst=monotonic_cst,
            interaction_cst=interaction_cst,
        )
        cls = (
            HistGradientBoostingClassifier
            if self._is_classifier
            else HistGradientBoostingRegressor
        )
        known = cls().get_params(deep=False)
        defaults = type(self)().get_params(deep=False)
        lacking = sorted(
            k
            for k in set(params) - set(known)
            if not _is_default(params[k], defaults[k])
        )
        if lacking:
            import sklearn

            raise ValueError(
                f"strategy='materialized' fits scikit-learn {sklearn.__version__}'s "
                f"{cls.__name__}, which has no parameter {lacking}: leave "
                "it at its default, use strategy='factorized', or upgrade "
                "scikit-learn."
            )
        return cls, {k: v for k, v in params.items() if k in known}

    def _fit_materialized(self, X, y, sample_weight, X_val, y_val, sample_weight_val):
        """scikit-learn's estimator on the joined tree table (the table of a
        dataset from the join cache); its fitted attributes copied."""
        table = self._table(X, reset=True)
        y = _check_y(host_array(y), estimator=self)
        if y.shape[0] != table.shape[0]:
            raise ValueError(
                f"X has {table.shape[0]} rows but y has {y.shape[0]}; give one "
                "target value per row of X (ds.align(base[target]) takes a base "
                "table's column into dataset order)."
            )
        cls, params = self._sklearn_estimator_params()
        fit_params = {}
        if sample_weight is not None:
            fit_params["sample_weight"] = host_array(sample_weight)
        if X_val is not None or y_val is not None:
            fit_params["X_val"] = (
                None if X_val is None else self._table(X_val, reset=False)
            )
            fit_params["y_val"] = None if y_val is None else host_array(y_val)
            if sample_weight_val is not None:
                fit_params["sample_weight_val"] = host_array(sample_weight_val)
        if self.warm_start and self._is_fitted():
            est = self._hgb.set_params(**params)
        else:
            est = cls(**params)
        for attr in ("_predictors", "_bin_mapper", "_loss", "_baseline_prediction"):
            # A factorized fit's trees (this one replaces them).
            if hasattr(self, attr):
                delattr(self, attr)
        est.fit(table, y, **fit_params)
        self._hgb = est
        self._fit_strategy = "materialized"
        self.do_early_stopping_ = est.do_early_stopping_
        self.n_trees_per_iteration_ = est.n_trees_per_iteration_
        self.train_score_ = est.train_score_
        self.validation_score_ = est.validation_score_
        if self._is_classifier:
            self.classes_ = est.classes_
        return self

    def _materialized_output(self, method, X):
        """scikit-learn's ``method`` on the tree table of ``X`` (the training
        schema's), or None when the fit was factorized."""
        if getattr(self, "_fit_strategy", None) != "materialized":
            return None
        check_is_fitted(self)
        return getattr(self._hgb, method)(self._table(X, reset=False))

    def _materialized_table_key(self, X):
        """The join cache's key of the table the materialized plan fits on
        (:func:`cached_table`) for the dataset ``X``; None for other data. The
        planner looks the table up with it (AutoPlan's cache state of the plan),
        never builds it."""
        if not isinstance(X, MultiSourceDataset) or not isinstance(
            X.operator, FactorizedMatrix
        ):
            return None
        return _table_key(_dataset_layout(X, self.categorical_features))

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`).

        Histograms, not operator products: per tree, the root's histogram and the
        smaller child's of every split (the larger by subtraction), over a
        balanced tree of ``max_leaf_nodes`` leaves. Per built node of ``r`` rows
        and per source ``k`` (``r_k`` rows, ``c_k`` tree features, ``u_k``
        distinct rows referenced), the factorized plan makes ``min(r c_k, r +
        u c_k)`` histogram updates (the grouped build or the row-wise gather,
        whichever is cheaper, as the kernels choose), with ``u`` the distinct
        source rows among the node's ``r``, and bins the sources' rows.

        The materialized plan is scikit-learn's ``HistGradientBoosting*`` on the
        joined tree table: its ``_BinMapper`` on (a subsample of) the joined
        columns and a binary search per joined value, its row-wise histograms
        over every joined column (``r c_k`` updates per node and source, one
        call per node), the split of the validation rows copying the table when
        early stopping is on. The table itself is built once per root dataset
        (the join cache): its gather counts unless the cache holds it, and then
        only a row slice's copy of its rows.
        """
        from ilargi_sklearn.planner._work import Work, n_classes

        n = int(data["n_rows"])
        early = self.early_stopping
        if early == "auto":
            early = n > 10_000
        vf = self.validation_fraction
        if early and vf is not None:
            n_train = n - (int(vf) if isinstance(vf, Integral) else int(vf * n))
        else:
            n_train = n
        n_train = max(n_train, 1)
        k = 1
        if is_classifier(self):
            classes = n_classes(y)
            k = 1 if classes <= 2 else classes
        leaves = self.max_leaf_nodes or n_train
        if self.max_depth is not None:
            leaves = min(leaves, 2**self.max_depth)
        leaves = int(max(min(leaves, n_train // max(self.min_samples_leaf, 1)), 2))
        # Rows of each built histogram: the root, then level by level the smaller
        # child of each split (half its parent's rows in a balanced tree).
        nodes = [float(n_train)]
        level, splits = 1, leaves - 1
        while splits > 0:
            width = min(2 ** (level - 1), splits)
            nodes += [n_train / 2.0**level] * width
            splits -= width
            level += 1
        shape = _source_shapes(data.dataset, self.categorical_features)
        fact = mat = 0.0
        for _, c_k, u_k, identity in shape:
            for r in nodes:
                mat += r * c_k
                if identity or u_k <= 0:
                    fact += r * c_k
                else:
                    u = u_k * -math.expm1(-r / u_k)
                    fact += min(r * c_k, r + u * c_k)
        n_features = sum(c for _, c, _, _ in shape)
        trees = float(self.max_iter * k)
        # Per histogram update: the bin byte, the gradient and hessian read, the
        # histogram entry written; a kernel call per node and source.
        update_bytes = 24.0
        bins = float(self.max_bins + 1)
        # Binning: thresholds from a sort of (a subsample of) each column, then a
        # binary search per value; on the sources' rows or on the join's.
        sample = float(min(n, BINNING_SUBSAMPLE))
        bin_fact = sum(
            8.0 * c * (min(r, sample) * math.log2(max(min(r, sample), 2.0)) + 8.0 * r)
            for r, c, _, _ in shape
        )
        bin_mat = 8.0 * n_features * (sample * math.log2(max(sample, 2.0)) + 8.0 * n)
        # The joined table of tree features: gathered from the sources (written,
        # its NaN fill and the gathered rows read), or a slice's rows of the
        # cached root table.
        table = 3.0 * 8.0 * n * n_features
        key = self._materialized_table_key(data.dataset)
        if key is not None and is_table_cached(data.dataset, key):
            sliced = getattr(data.dataset, "_root_rows", None) is not None
            table = 2.0 * 8.0 * n * n_features if sliced else 0.0
        if early and vf is not None:
            # scikit-learn's train_test_split copies the table's rows.
            table += 2.0 * 8.0 * n * n_features
        return Work(
            "trees",
            "hist",
            m=k,
            iterations=int(self.max_iter),
            passes=0.0,
            passes_per_iteration=0.0,
            scales_with_iterations=("common_bytes", "plan_work"),
            # Gradients, hessians and raw predictions per tree; split finding
            # over every bin of every feature per node: the same in both plans.
            common_bytes=trees * (64.0 * n + 32.0 * len(nodes) * n_features * bins),
            joins=False,
            plan_work={
                "factorized": {
                    "gather_bytes": trees * update_bytes * fact,
                    "calls": trees * len(nodes) * len(shape),
                    "setup_bytes": bin_fact,
                },
                "materialized": {
                    "gather_bytes": trees * update_bytes * mat,
                    "calls": trees * len(nodes),
                    "setup_bytes": bin_mat + table,
                },
            },
        )

    def _has_missing(self, data, missing_bin):
        """Per tree feature: whether a training row's value is missing."""
        out = np.zeros(self._layout.n_features, dtype=np.uint8)
        for g in range(data.n_groups):
            B = data.bins[g]
            ix = data.idx[g]
            if ix.shape[0] == 0:
                # Every row of an identity group is used (not its pad row).
                miss = np.zeros(B.shape[1], dtype=bool)
                step = 1 << 16
                for start in range(0, data.n_rows, step):
                    block = B[start : min(start + step, data.n_rows)]
                    miss |= (block == missing_bin).any(axis=0)
            else:
                used = np.zeros(B.shape[0], dtype=bool)
                used[ix] = True
                miss = (B[used] == missing_bin).any(axis=0)
            out[data.group_features(g)] = miss
        return out

    def _update_leaves_values(self, grower, y_true, raw_prediction, sample_weight):
        """Leaf values of the losses without a useful hessian (absolute error,
        quantile): the loss's intercept of the leaf's residuals."""
        partition = grower.splitter.partition
        for leaf in grower.finalized_leaves:
            idx = partition[leaf.partition_start : leaf.partition_stop]
            sw = None if sample_weight is None else sample_weight[idx]
            update = self._loss.fit_intercept_only(
                y_true=y_true[idx] - raw_prediction[idx], sample_weight=sw
            )
            leaf.value = grower.shrinkage * update

    def _small_trainset(self, y_train, sw_train):
        """Positions (in the training rows) of the scorer's training subset."""
        n = y_train.shape[0]
        if n <= 10_000:
            return None
        stratify = y_train if self._is_classifier else None
        return resample(
            np.arange(n),
            n_samples=10_000,
            replace=False,
            random_state=self._random_seed,
            stratify=stratify,
        )

    def _check_early_stopping_loss(
        self, raw, y_train, sw_train, raw_val, y_val, sw_val
    ):
        self.train_score_.append(
            -self._loss(y_true=y_train, raw_prediction=raw, sample_weight=sw_train)
        )
        if self._use_validation_data:
            self.validation_score_.append(
                -self._loss(y_true=y_val, raw_prediction=raw_val, sample_weight=sw_val)
            )
            return self._should_stop(self.validation_score_)
        return self._should_stop(self.train_score_)

    def _rows(self, X, rows):
        if rows is None:
            return X
        return X[rows] if isinstance(X, MultiSourceDataset) else host_array(X)[rows]

    def _check_early_stopping_scorer(
        self,
        X,
        X_val,
        train_idx,
        val_idx,
        small,
        y_train,
        sw_train,
        y_val,
        sw_val,
        raw,
        raw_val,
    ):
        """Scores of the scorer on (a subset of 10,000 of) the training rows and
        on the validation rows. A predefined scorer reads the raw predictions the
        fit keeps (``_raw_predict`` patched, no rows passed); another is called on
        the rows of ``X`` themselves."""
        sub = slice(None) if small is None else small
        y_small = y_train[sub]
        sw_small = None if sw_train is None else sw_train[sub]
        if self._is_classifier:
            y_small = self.classes_[y_small.astype(int)]
        if raw is None:
            score = self._score(self._rows(X, train_idx[sub]), y_small, sw_small, None)
        else:
            score = self._score(None, y_small, sw_small, raw[sub])
        self.train_score_.append(score)
        if self._use_validation_data:
            yv = self.classes_[y_val.astype(int)] if self._is_classifier else y_val
            Xv = None
            if raw_val is None:
                Xv = X_val if X_val is not None else self._rows(X, val_idx)
            self.validation_score_.append(self._score(Xv, yv, sw_val, raw_val))
            return self._should_stop(self.validation_score_)
        return self._should_stop(self.train_score_)

    def _score(self, X, y, sample_weight, raw):
        patch = nullcontext() if raw is None else _patch_raw_predict(self, raw)
        with patch:
            if sample_weight is None:
                return self._scorer(self, X, y)
            return self._scorer(self, X, y, sample_weight=sample_weight)

    def _should_stop(self, scores):
        reference_position = self.n_iter_no_change + 1
        if len(scores) < reference_position:
            return False
        reference_score = scores[-reference_position] + self.tol
        recent = scores[-reference_position + 1 :]
        return not any(score > reference_score for score in recent)

    def _is_fitted(self):
        if getattr(self, "_fit_strategy", None) == "materialized":
            return hasattr(self, "_hgb")
        return len(getattr(self, "_predictors", [])) > 0

    def __sklearn_is_fitted__(self):
        return hasattr(self, "_predictors") or hasattr(self, "_hgb")

    def _clear_state(self):
        for var in ("train_score_", "validation_score_"):
            if hasattr(self, var):
                delattr(self, var)

    def _finalize_sample_weight(self, sample_weight, y):
        return sample_weight

    # ------------------------------------------------------------ predicting
    @property
    def _is_classifier(self):
        return isinstance(self, ClassifierMixin)

    def _raw_predict_binned(self, data, predictors=None):
        K = self.n_trees_per_iteration_
        raw = np.zeros((data.n_rows, K), dtype=np.float64, order="F")
        raw += self._baseline_prediction
        missing_bin = self._bin_mapper.missing_values_bin_idx_
        for per_iter in self._predictors if predictors is None else predictors:
            for k, pred in enumerate(per_iter):
                col = np.zeros(data.n_rows)
                pred.predict_binned(data, missing_bin, col)
                raw[:, k] += col
        return raw

    def _raw_predict(self, X):
        """The sum of the trees' values (and the baseline) of each row of ``X``."""
        check_is_fitted(self)
        groups, n = self._check_X(X, reset=False)
        return self._raw_predict_binned(self._bin(groups, n))

    def _staged_raw_predict(self, X):
        check_is_fitted(self)
        groups, n = self._check_X(X, reset=False)
        data = self._bin(groups, n)
        raw = np.zeros((n, self.n_trees_per_iteration_), order="F")
        raw += self._baseline_prediction
        missing_bin = self._bin_mapper.missing_values_bin_idx_
        for per_iter in self._predictors:
            for k, pred in enumerate(per_iter):
                col = np.zeros(n)
                pred.predict_binned(data, missing_bin, col)
                raw[:, k] += col
            yield raw.copy()

    @property
    def n_iter_(self):
        """Number of iterations of the boosting process."""
        check_is_fitted(self)
        if getattr(self, "_fit_strategy", None) == "materialized":
            return self._hgb.n_iter_
        return len(self._predictors)

    @property
    def tree_feature_names_(self):
        """Names of the features the trees split on, in input order.

        For an array, its columns. For a dataset, its columns with the one-hot
        columns of each categorical column (of the schema, with
        ``categorical_features="from_dtype"``) folded into one categorical
        feature named after the column.
        """
        check_is_fitted(self)
        layout = self._layout
        return np.asarray([layout.names[f] for f in layout.natural], dtype=object)

    @property
    def is_categorical_(self):
        """Boolean mask of the categorical features among
        :attr:`tree_feature_names_`, or None when there is none."""
        check_is_fitted(self)
        mask = self._layout.is_categorical[self._layout.natural]
        return mask.copy() if mask.any() else None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


class FactorizedHistGradientBoostingRegressor(RegressorMixin, _BaseFactorizedHGB):
    """Histogram-based gradient boosting regression trees, trained on the sources.

    scikit-learn's :class:`~sklearn.ensemble.HistGradientBoostingRegressor` with
    its parameters and meaning, fitted on a :class:`~ilargi_sklearn.MultiSourceDataset`
    without building the join: features are binned per source (thresholds of the
    joined columns), histograms are built per source (summing each node's
    gradients per source row first where the rows repeat), and rows reach their
    bins through the index vectors. On the joined table (NaN where a left or
    outer join did not match, categorical columns ordinal-encoded) it fits the
    same trees as scikit-learn.

    Parameters
    ----------
    loss : {"squared_error", "absolute_error", "gamma", "poisson", "quantile"}, \
            default="squared_error"
        The loss of the boosting process, as in scikit-learn ("gamma" and
        "poisson" use a log link).
    quantile : float, default=None
        The quantile of ``loss="quantile"``, in [0, 1].
    learning_rate : float, default=0.1
        Shrinkage of the leaf values.
    max_iter : int, default=100
        The maximum number of iterations (trees).
    max_leaf_nodes : int or None, default=31
        The maximum number of leaves of each tree.
    max_depth : int or None, default=None
        The maximum depth of each tree.
    min_samples_leaf : int, default=20
        The minimum number of rows per leaf.
    l2_regularization : float, default=0.0
        L2 regularization of the leaf values.
    max_features : float, default=1.0
        Proportion of features drawn at random for each split.
    max_bins : int, default=255
        Bins for non-missing values (one more holds the missing values).
    categorical_features : array-like of {bool, int, str}, "from_dtype" or None, \
            default="from_dtype"
        Categorical features. For a dataset built from frames, "from_dtype" makes
        each categorical column of its schema (one-hot encoded in the dataset) one
        categorical feature, split natively; None treats the one-hot columns as
        numbers; names may name such columns (``"planes__manufacturer"``) and
        numeric columns, masks and indices numeric columns. For an array, as
        scikit-learn (a mask, indices or names; "from_dtype" selects none).
    monotonic_cst : array-like of int or dict, default=None
        Monotonic constraint (-1, 0, 1) of each feature of
        :attr:`tree_feature_names_`, or a dict by name.
    interaction_cst : {"pairwise", "no_interactions"} or sequence of lists of int, \
            default=None
        Sets of features (positions in :attr:`tree_feature_names_`) that may
        interact in a branch; features no set lists form one more set. As
        scikit-learn's, except that with categorical features scikit-learn reads
        the positions after moving those features first.
    warm_start : bool, default=False
        Add trees to the previous fit's.
    early_stopping : "auto" or bool, default="auto"
        "auto": on above 10,000 rows. The validation rows are scikit-learn's
        ``train_test_split`` of the rows with the same ``random_state``.
    scoring : str, callable or None, default="loss"
        The early-stopping score; "loss" uses the loss.
    validation_fraction : int, float or None, default=0.1
        Rows set aside for early stopping (None: the training loss decides).
    n_iter_no_change : int, default=10
        Iterations without improvement before stopping.
    tol : float, default=1e-7
        Absolute tolerance of the early-stopping comparisons.
    verbose : int, default=0
        Iteration summaries at INFO on this module's logger (``verbose >= 2``);
        with ``strategy="materialized"``, scikit-learn's own printout.
    random_state : int, RandomState instance or None, default=None
        Controls the binning subsample, the validation split and feature
        subsampling, drawn as scikit-learn draws them.
    strategy : {"factorized", "materialized"}, default="factorized"
        "factorized" runs the package's kernels on the sources. "materialized"
        fits scikit-learn's :class:`~sklearn.ensemble.HistGradientBoostingRegressor`
        (the classifier's for the classifier), every parameter passed one to one,
        on the joined table of tree features (columns
        :attr:`tree_feature_names_`, NaN for unmatched rows, categorical columns
        as codes), and predicts through it: scikit-learn's results on the join,
        the reference the factorized fit equals. The table is built once per
        root dataset and kept in the join cache
        (``ds.cache_info()["materialized"]["tables"]``,
        :func:`~ilargi_sklearn.clear_caches`). A callable ``scoring`` then gets
        scikit-learn's estimator and rows of the table. ``warm_start`` cannot
        change the strategy.

    Attributes
    ----------
    do_early_stopping_ : bool
    n_iter_ : int
    n_trees_per_iteration_ : int
    train_score_ : ndarray of shape (n_iter_ + 1,)
        Scores on the training rows (empty without early stopping).
    validation_score_ : ndarray of shape (n_iter_ + 1,)
        Scores on the validation rows (empty without early stopping or
        validation rows).
    is_categorical_ : ndarray of bool or None
        Categorical features among :attr:`tree_feature_names_`.
    tree_feature_names_ : ndarray of str
        The features the trees split on (see the property).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Defined for a dataset and for inputs with string column names.
    dataset_schema_ : DatasetSchema
        The training encoding (datasets built from frames): build new data alike.

    See Also
    --------
    sklearn.ensemble.HistGradientBoostingRegressor : The same model on the join.

    Notes
    -----
    For the tree features of source ``k`` the histogram of a node is
    ``H_k[f, b] = sum_j a_j [bin_k(j, f) = b]`` with ``a_j`` the node's gradients
    summed per source row ``j``: ``n_node + u_k c_k`` work instead of
    ``n_node c_k`` (``u_k`` distinct source rows in the node). Unmatched rows of
    left and outer joins and NaN inside sources are missing values (routed by the
    learned missing direction), not zeros as in the linear models.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.ensemble import FactorizedHistGradientBoostingRegressor
    >>> rng = np.random.default_rng(0)
    >>> base, dim = rng.normal(size=(200, 2)), rng.normal(size=(10, 3))
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, rng.integers(0, 10, 200)])
    >>> y = ds.materialize()[:, 2] + 0.1 * rng.normal(size=200)
    >>> model = FactorizedHistGradientBoostingRegressor(max_iter=20).fit(ds, y)
    >>> model.predict(ds).shape
    (200,)
    """

    _parameter_constraints: dict = {
        **_BaseFactorizedHGB._parameter_constraints,
        "loss": [
            StrOptions(
                {"squared_error", "absolute_error", "poisson", "gamma", "quantile"}
            )
        ],
        "quantile": [Interval(Real, 0, 1, closed="both"), None],
    }

    def __init__(
        self,
        loss="squared_error",
        *,
        quantile=None,
        learning_rate=0.1,
        max_iter=100,
        max_leaf_nodes=31,
        max_depth=None,
        min_samples_leaf=20,
        l2_regularization=0.0,
        max_features=1.0,
        max_bins=255,
        categorical_features="from_dtype",
        monotonic_cst=None,
        interaction_cst=None,
        warm_start=False,
        early_stopping="auto",
        scoring="loss",
        validation_fraction=0.1,
        n_iter_no_change=10,
        tol=1e-7,
        verbose=0,
        random_state=None,
        strategy="factorized",
    ):
        super().__init__(
            loss=loss,
            learning_rate=learning_rate,
            max_iter=max_iter,
            max_leaf_nodes=max_leaf_nodes,
            max_depth=max_depth,
            min_samples_leaf=min_samples_leaf,
            l2_regularization=l2_regularization,
            max_features=max_features,
            max_bins=max_bins,
            categorical_features=categorical_features,
            monotonic_cst=monotonic_cst,
            interaction_cst=interaction_cst,
            warm_start=warm_start,
            early_stopping=early_stopping,
            scoring=scoring,
            validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change,
            tol=tol,
            verbose=verbose,
            random_state=random_state,
            strategy=strategy,
        )
        self.quantile = quantile

    def predict(self, X):
        """Predicted values of the rows of ``X`` (an array or a dataset built
        with the training schema).

        Returns
        -------
        ndarray of shape (n_samples,)
        """
        caller = Caller(X)
        out = self._materialized_output("predict", X)
        if out is not None:
            return caller.give(out)
        raw = self._raw_predict(X)
        return caller.give(self._loss.link.inverse(raw.ravel()))

    def staged_predict(self, X):
        """Predicted values after each iteration (a generator)."""
        caller = Caller(X)
        staged = self._materialized_output("staged_predict", X)
        if staged is not None:
            for out in staged:
                yield caller.give(out)
            return
        for raw in self._staged_raw_predict(X):
            yield caller.give(self._loss.link.inverse(raw.ravel()))

    def _encode_y(self, y):
        self.n_trees_per_iteration_ = 1
        y = np.asarray(y, dtype=np.float64)
        if self.loss == "gamma" and not np.all(y > 0):
            raise ValueError("loss='gamma' requires strictly positive y.")
        if self.loss == "poisson" and not (np.all(y >= 0) and np.sum(y) > 0):
            raise ValueError("loss='poisson' requires non-negative y and sum(y) > 0.")
        return y

    def _encode_y_val(self, y):
        return self._encode_y(y)

    def _get_loss(self, sample_weight):
        if self.loss == "quantile" and self.quantile is None:
            raise ValueError("loss='quantile' needs quantile=... in [0, 1].")
        return make_loss(self.loss, sample_weight, quantile=self.quantile)


class FactorizedHistGradientBoostingClassifier(ClassifierMixin, _BaseFactorizedHGB):
    """Histogram-based gradient boosting classification trees, trained on the
    sources.

    scikit-learn's :class:`~sklearn.ensemble.HistGradientBoostingClassifier` with
    its parameters and meaning (``loss="log_loss"``: one tree per iteration for
    two classes, one per class otherwise; ``class_weight``), fitted on a
    :class:`~ilargi_sklearn.MultiSourceDataset` without building the join. See
    :class:`FactorizedHistGradientBoostingRegressor` for the parameters they
    share; early stopping's validation split is stratified.

    Parameters
    ----------
    loss : {"log_loss"}, default="log_loss"
    class_weight : dict or "balanced", default=None
        Weights of the classes, multiplied into ``sample_weight``.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)

    See Also
    --------
    sklearn.ensemble.HistGradientBoostingClassifier : The same model on the join.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.ensemble import FactorizedHistGradientBoostingClassifier
    >>> rng = np.random.default_rng(0)
    >>> base, dim = rng.normal(size=(200, 2)), rng.normal(size=(10, 3))
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, rng.integers(0, 10, 200)])
    >>> y = ds.materialize()[:, 2] > 0
    >>> clf = FactorizedHistGradientBoostingClassifier(max_iter=10).fit(ds, y)
    >>> clf.predict_proba(ds).shape
    (200, 2)
    """

    _parameter_constraints: dict = {
        **_BaseFactorizedHGB._parameter_constraints,
        "loss": [StrOptions({"log_loss"})],
        "class_weight": [dict, StrOptions({"balanced"}), None],
    }

    def __init__(
        self,
        loss="log_loss",
        *,
        learning_rate=0.1,
        max_iter=100,
        max_leaf_nodes=31,
        max_depth=None,
        min_samples_leaf=20,
        l2_regularization=0.0,
        max_features=1.0,
        max_bins=255,
        categorical_features="from_dtype",
        monotonic_cst=None,
        interaction_cst=None,
        warm_start=False,
        early_stopping="auto",
        scoring="loss",
        validation_fraction=0.1,
        n_iter_no_change=10,
        tol=1e-7,
        verbose=0,
        random_state=None,
        class_weight=None,
        strategy="factorized",
    ):
        super().__init__(
            loss=loss,
            learning_rate=learning_rate,
            max_iter=max_iter,
            max_leaf_nodes=max_leaf_nodes,
            max_depth=max_depth,
            min_samples_leaf=min_samples_leaf,
            l2_regularization=l2_regularization,
            max_features=max_features,
            max_bins=max_bins,
            categorical_features=categorical_features,
            monotonic_cst=monotonic_cst,
            interaction_cst=interaction_cst,
            warm_start=warm_start,
            early_stopping=early_stopping,
            scoring=scoring,
            validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change,
            tol=tol,
            verbose=verbose,
            random_state=random_state,
            strategy=strategy,
        )
        self.class_weight = class_weight

    def _finalize_sample_weight(self, sample_weight, y):
        if self.class_weight is None:
            return sample_weight
        expanded = compute_sample_weight(self.class_weight, y)
        return expanded if sample_weight is None else sample_weight * expanded

    def _encode_y(self, y):
        check_classification_targets(y)
        self._label_encoder = LabelEncoder()
        encoded = self._label_encoder.fit_transform(y)
        self.classes_ = self._label_encoder.classes_
        n_classes = self.classes_.shape[0]
        self.n_trees_per_iteration_ = 1 if n_classes <= 2 else n_classes
        return encoded.astype(np.float64, copy=False)

    def _encode_y_val(self, y):
        return self._label_encoder.transform(y).astype(np.float64, copy=False)

    def _get_loss(self, sample_weight):
        return make_loss(
            "log_loss", sample_weight, n_classes=self.n_trees_per_iteration_
        )

    def _classes_of(self, raw):
        if raw.shape[1] == 1:
            # "> 0", not ">= 0": a tie goes to the first class, as np.argmax.
            encoded = (raw.ravel() > 0).astype(int)
        else:
            encoded = np.argmax(raw, axis=1)
        return self.classes_[encoded]

    def predict(self, X):
        """Predicted classes of the rows of ``X``."""
        caller = Caller(X)
        out = self._materialized_output("predict", X)
        if out is not None:
            return caller.give(out)
        return caller.give(self._classes_of(self._raw_predict(X)))

    def staged_predict(self, X):
        """Predicted classes after each iteration (a generator)."""
        caller = Caller(X)
        staged = self._materialized_output("staged_predict", X)
        if staged is not None:
            for out in staged:
                yield caller.give(out)
            return
        for raw in self._staged_raw_predict(X):
            yield caller.give(self._classes_of(raw))

    def predict_proba(self, X):
        """Class probabilities of the rows of ``X``, shape (n_samples, n_classes)."""
        caller = Caller(X)
        out = self._materialized_output("predict_proba", X)
        if out is not None:
            return caller.give(out)
        raw = self._raw_predict(X)
        return caller.give(self._loss.predict_proba(raw))

    def staged_predict_proba(self, X):
        """Class probabilities after each iteration (a generator)."""
        caller = Caller(X)
        staged = self._materialized_output("staged_predict_proba", X)
        if staged is not None:
            for out in staged:
                yield caller.give(out)
            return
        for raw in self._staged_raw_predict(X):
            yield caller.give(self._loss.predict_proba(raw))

    def decision_function(self, X):
        """The raw values (sum of the trees' leaves) of each row; shape
        (n_samples,) for two classes, else (n_samples, n_classes)."""
        caller = Caller(X)
        out = self._materialized_output("decision_function", X)
        if out is not None:
            return caller.give(out)
        raw = self._raw_predict(X)
        return caller.give(raw.ravel() if raw.shape[1] == 1 else raw)

    def staged_decision_function(self, X):
        """The raw values after each iteration (a generator)."""
        caller = Caller(X)
        staged = self._materialized_output("staged_decision_function", X)
        if staged is not None:
            for out in staged:
                yield caller.give(out)
            return
        for raw in self._staged_raw_predict(X):
            yield caller.give(raw.ravel() if raw.shape[1] == 1 else raw)


class _Dense:
    """A plain matrix as raw_groups takes it."""

    def __init__(self, A):
        self.A = A
