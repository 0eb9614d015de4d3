"""Histogram gradient boosting over joins: parity with scikit-learn's
``HistGradientBoosting*`` on the joined table (NaN for unmatched rows, categorical
columns ordinal-encoded), binning per source, the per-source histograms, and the
estimators' API over datasets."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
)
from sklearn.ensemble._hist_gradient_boosting.binning import _BinMapper
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OrdinalEncoder

from ilargi_sklearn import (
    FactorizedHistGradientBoostingClassifier,
    FactorizedHistGradientBoostingRegressor,
    FactorizedStandardScaler,
    Join,
    MultiSourceDataset,
)
from ilargi_sklearn.ensemble import _gradient_boosting
from ilargi_sklearn.ensemble._binning import find_thresholds
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

Reg = FactorizedHistGradientBoostingRegressor
Clf = FactorizedHistGradientBoostingClassifier

NO_ES = dict(early_stopping=False, random_state=0)


# ------------------------------------------------------------------- helpers
def nan_table(ds):
    """The joined table with NaN where a source did not match (independently of
    the estimators: each term's index vector gathers its source)."""
    n, m = ds.shape
    out = np.full((n, m), np.nan)
    for t in ds.operator.terms:
        S = t.S.toarray() if sp.issparse(t.S) else np.asarray(t.S, dtype=np.float64)
        idx = np.arange(n) if t.rows.is_identity else np.asarray(t.rows.idx)
        hit = idx >= 0
        out[np.ix_(np.flatnonzero(hit), np.asarray(t.cols))] = S[idx[hit]]
    return out


def compare_trees(ours, theirs, rtol=1e-10):
    """Node by node: the same trees, or a first difference at a tie.

    Where two candidate splits of a node have the same gain (a pure node, two
    features that split the node's source rows alike), scikit-learn's choice
    depends on the rounding of its sums, which differ in another summation
    order: there the gains must agree to 1e-9, and later trees are not compared
    (they continue from other raw predictions). Returns the number of trees
    that are identical.
    """
    same = 0
    for it, (a_iter, b_iter) in enumerate(zip(ours._predictors, theirs._predictors)):
        for a, b in zip(a_iter, b_iter):
            na, nb = a.nodes, b.nodes
            m = min(na.shape[0], nb.shape[0])
            fields = (
                "feature_idx",
                "bin_threshold",
                "missing_go_to_left",
                "is_leaf",
                "left",
                "right",
                "count",
                "is_categorical",
            )
            diff = np.zeros(m, dtype=bool)
            for f in fields:
                diff |= na[f][:m] != nb[f][:m]
            if na.shape[0] != nb.shape[0] and not diff.any():
                diff[-1] = True
            if diff.any():
                k = int(np.argmax(diff))
                # The node whose split differs (or its parent when a child
                # became a leaf on one side only).
                node = k if not na["is_leaf"][k] and not nb["is_leaf"][k] else k - 1
                np.testing.assert_allclose(
                    na["gain"][node],
                    nb["gain"][node],
                    rtol=1e-9,
                    atol=1e-9 * max(abs(nb["gain"][0]), 1.0),
                    err_msg=f"iteration {it}: trees differ at node {k} without a tie",
                )
                return same
            finite = np.isfinite(nb["num_threshold"])
            np.testing.assert_array_equal(
                na["num_threshold"][finite], nb["num_threshold"][finite]
            )
            np.testing.assert_allclose(
                na["value"],
                nb["value"],
                rtol=rtol,
                atol=rtol * np.abs(nb["value"]).max(),
            )
            np.testing.assert_array_equal(
                a.binned_left_cat_bitsets, b.binned_left_cat_bitsets
            )
            same += 1
    return same


def star_frames(seed, n=1500, how="left", snowflake=True, categorical=True):
    """A base table with two joins (one of them a snowflake hop) and the
    pandas.merge of them, in the dataset's row order."""
    rng = np.random.default_rng(seed)
    r1, r2 = 400, 60
    base = pd.DataFrame(
        {
            "a": rng.normal(size=n),
            "b": rng.normal(size=n) * 10,
            "k1": rng.integers(0, int(r1 * 1.15), n),
        }
    )
    dim1 = pd.DataFrame(
        {
            "k1": np.arange(r1),
            "c": rng.normal(size=r1),
            "d": rng.gamma(2.0, size=r1),
            "k2": rng.integers(0, r2, r1),
        }
    )
    if categorical:
        dim1["colour"] = rng.choice(["red", "green", "blue", "grey"], r1)
    dim2 = pd.DataFrame({"k2": np.arange(r2), "e": rng.normal(size=r2)})
    f1 = ["c", "d"] + (["colour"] if categorical else [])
    joins = [Join(dim1, on="k1", features=f1, how=how, name="dim1", min_match=0)]
    if snowflake:
        joins.append(
            Join(dim2, on="k2", features=["e"], how="left", name="dim2", via="dim1")
        )
    ds = MultiSourceDataset.from_frames(base, ["a", "b"], joins, min_match=0)
    frame = base.merge(dim1, on="k1", how=how)
    if snowflake:
        frame = frame.merge(dim2, on="k2", how="left")
    cols = ["a", "b", "c", "d"] + (["colour"] if categorical else [])
    cols += ["e"] if snowflake else []
    joined = frame[cols].copy()
    signal = (
        np.sin(joined["a"].to_numpy())
        + np.nan_to_num(joined["c"].to_numpy())
        + 0.3 * np.nan_to_num(joined.get("e", pd.Series(0.0, index=joined.index)))
    )
    if categorical:
        signal = signal + (joined["colour"] == "red").to_numpy() * 1.5
    y = signal + 0.2 * rng.normal(size=len(joined))
    return ds, joined, y


def new_star_frames(colour):
    """New rows for :func:`star_frames`' schema: 30 base rows, each matching one
    row of each dimension table, half of them of ``colour`` and half red."""
    rng = np.random.default_rng(0)
    base = pd.DataFrame(
        {"a": rng.normal(size=30), "b": rng.normal(size=30), "k1": np.arange(30)}
    )
    dim1 = pd.DataFrame(
        {
            "k1": np.arange(30),
            "c": rng.normal(size=30),
            "d": rng.gamma(2.0, size=30),
            "k2": np.arange(30),
            "colour": [colour] * 15 + ["red"] * 15,
        }
    )
    dim2 = pd.DataFrame({"k2": np.arange(30), "e": rng.normal(size=30)})
    return base, dim1, dim2


def encoded(joined):
    """scikit-learn's input: categorical columns ordinal-encoded (NaN: missing)."""
    X = joined.copy()
    cat = [c for c in X.columns if not pd.api.types.is_numeric_dtype(X[c])]
    if cat:
        enc = OrdinalEncoder(encoded_missing_value=np.nan)
        codes = enc.fit_transform(X[cat].astype(object))
        X = X.drop(columns=cat).assign(**{c: codes[:, i] for i, c in enumerate(cat)})
        X = X[list(joined.columns)]
    return X.to_numpy(dtype=np.float64), np.asarray(
        [c in cat for c in X.columns], dtype=bool
    )


# -------------------------------------------------------------------- parity
@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("seed", [0, 1])
def test_parity_with_sklearn_on_the_join(how, seed):
    ds, joined, y = star_frames(seed, how=how)
    X, is_cat = encoded(joined)
    params = dict(max_iter=15, max_leaf_nodes=15, **NO_ES)
    ours = Reg(**params).fit(ds, y)
    ref = HistGradientBoostingRegressor(categorical_features=is_cat, **params).fit(X, y)
    # The same bin thresholds, feature by feature (categorical features first,
    # as scikit-learn's preprocessor orders them; a category's bins are its
    # known categories, scikit-learn's their ordinal codes).
    np.testing.assert_array_equal(
        ours._bin_mapper.n_bins_non_missing_, ref._bin_mapper.n_bins_non_missing_
    )
    for f in np.flatnonzero(~ours._layout.is_categorical):
        np.testing.assert_array_equal(
            ours._bin_mapper.bin_thresholds_[f], ref._bin_mapper.bin_thresholds_[f]
        )
    assert ours.tree_feature_names_.tolist() == [
        "base__a",
        "base__b",
        "dim1__c",
        "dim1__d",
        "dim1__colour",
        "dim2__e",
    ]
    same = compare_trees(ours, ref)
    assert same >= 5, same
    if same == ours.n_iter_:
        np.testing.assert_allclose(ours.predict(ds), ref.predict(X), rtol=1e-9)


def test_unmatched_rows_are_missing_not_zero():
    """A left join's unmatched rows take the missing bin: a model that has to
    tell them from real zeros does so, and matches scikit-learn on NaN."""
    rng = np.random.default_rng(3)
    n, r = 2000, 80
    base = rng.normal(size=(n, 1))
    dim = rng.normal(size=(r, 1))
    dim[:10] = 0.0
    idx = rng.integers(0, r, n)
    idx[rng.random(n) < 0.3] = -1
    ds = MultiSourceDataset.from_matrices([base, dim], [None, idx])
    y = np.where(idx < 0, 5.0, 0.0) + rng.normal(size=n) * 0.1
    X = nan_table(ds)
    ours = Reg(max_iter=5, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(max_iter=5, **NO_ES).fit(X, y)
    assert compare_trees(ours, ref) == 5
    pred = ours.predict(ds)
    assert abs(pred[idx < 0].mean() - pred[idx >= 0].mean()) > 1.5
    # The zeros of materialize() would merge the two: the model does not.
    np.testing.assert_allclose(pred, ref.predict(X), rtol=1e-9)


LOSSES = ["squared_error", "poisson", "gamma", "absolute_error", "quantile"]


@settings(max_examples=15)
@given(
    scenario=st.sampled_from(SCENARIOS),
    loss=st.sampled_from(LOSSES),
    seed=st.integers(0, 2**16),
)
def test_parity_random_schemas(scenario, loss, seed):
    ds = random_dataset(seed, n_rows=400, n_sources=3, scenario=scenario)
    X = nan_table(ds)
    rng = np.random.default_rng(seed)
    eta = np.nan_to_num(X) @ rng.normal(size=X.shape[1])
    eta = eta / max(float(np.std(eta)), 1e-12)
    y = eta + 0.3 * rng.normal(size=len(ds))
    if loss in ("poisson", "gamma"):
        y = np.exp(0.5 * y)
    kw = dict(quantile=0.4) if loss == "quantile" else {}
    params = dict(loss=loss, max_iter=5, min_samples_leaf=10, **kw, **NO_ES)
    ours = Reg(**params).fit(ds, y)
    ref = HistGradientBoostingRegressor(**params).fit(X.astype(np.float64), y)
    for a, b in zip(ours._bin_mapper.bin_thresholds_, ref._bin_mapper.bin_thresholds_):
        np.testing.assert_array_equal(a, b)
    if loss in ("absolute_error", "quantile"):
        # Gradients are signs: many candidate splits tie exactly, and the leaf
        # values are medians and quantiles; the baseline is the same.
        np.testing.assert_allclose(
            ours._baseline_prediction, ref._baseline_prediction, rtol=1e-12
        )
        return
    same = compare_trees(ours, ref)
    if same == ours.n_iter_:
        np.testing.assert_allclose(ours.predict(ds), ref.predict(X), rtol=1e-8)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_parity(n_classes):
    ds, joined, y = star_frames(4, n=1200)
    X, is_cat = encoded(joined)
    edges = np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1])
    labels = np.asarray(["lo", "mid", "hi"])[np.digitize(y, edges)]
    # Label noise: no node is pure (a pure node's gains are rounding noise).
    flip = np.random.default_rng(0).random(len(labels)) < 0.15
    labels[flip] = labels[np.roll(np.flatnonzero(flip), 1)]
    params = dict(max_iter=6, max_leaf_nodes=8, min_samples_leaf=30, **NO_ES)
    ours = Clf(**params).fit(ds, labels)
    ref = HistGradientBoostingClassifier(categorical_features=is_cat, **params).fit(
        X, labels
    )
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    same = compare_trees(ours, ref)
    assert same >= 2
    if same == ours.n_iter_ * ours.n_trees_per_iteration_:
        np.testing.assert_allclose(
            ours.predict_proba(ds), ref.predict_proba(X), rtol=1e-8, atol=1e-12
        )
        np.testing.assert_array_equal(ours.predict(ds), ref.predict(X))


def test_class_weight_and_sample_weight_parity():
    ds, joined, y = star_frames(5, n=1000, categorical=False)
    X, _ = encoded(joined)
    rng = np.random.default_rng(1)
    # Label noise: no node is pure (a pure node's gains are rounding noise).
    labels = ((y > np.quantile(y, 0.7)) ^ (rng.random(len(y)) < 0.2)).astype(int)
    w = rng.integers(1, 4, len(labels)).astype(float)
    params = dict(
        max_iter=4, class_weight="balanced", min_samples_leaf=40, max_leaf_nodes=8
    )
    params.update(NO_ES)
    ours = Clf(**params).fit(ds, labels, sample_weight=w)
    ref = HistGradientBoostingClassifier(**params).fit(X, labels, sample_weight=w)
    for a, b in zip(ours._bin_mapper.bin_thresholds_, ref._bin_mapper.bin_thresholds_):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    assert compare_trees(ours, ref) >= 2


def test_early_stopping_same_validation_rows():
    """ "auto" turns early stopping on above 10,000 rows; the validation rows,
    and so the scores, are scikit-learn's for the same random_state."""
    ds, joined, y = star_frames(6, n=11_000, categorical=False)
    X, _ = encoded(joined)
    params = dict(max_iter=60, max_leaf_nodes=8, random_state=3, n_iter_no_change=3)
    ours = Reg(**params).fit(ds, y)
    ref = HistGradientBoostingRegressor(**params).fit(X, y)
    assert ours.do_early_stopping_ and ref.do_early_stopping_
    assert abs(ours.n_iter_ - ref.n_iter_) <= 3
    k = min(ours.n_iter_, ref.n_iter_) + 1
    np.testing.assert_allclose(
        ours.validation_score_[:k], ref.validation_score_[:k], rtol=1e-6
    )
    np.testing.assert_allclose(ours.train_score_[0], ref.train_score_[0], rtol=1e-12)
    # A predefined scorer reads the raw predictions the fit keeps.
    ours = Reg(scoring="r2", **params).fit(ds, y)
    ref = HistGradientBoostingRegressor(scoring="r2", **params).fit(X, y)
    np.testing.assert_allclose(
        ours.validation_score_[:3], ref.validation_score_[:3], rtol=1e-6
    )


def test_given_validation_rows_as_sklearn():
    """X_val and y_val: a dataset's rows (or an array's) instead of a split."""
    ds, joined, y = star_frames(17, n=1500, categorical=False)
    X, _ = encoded(joined)
    tr, va = np.arange(1000), np.arange(1000, 1500)
    params = dict(max_iter=40, early_stopping=True, random_state=0, n_iter_no_change=3)
    ours = Reg(**params).fit(ds[tr], y[tr], X_val=ds[va], y_val=y[va])
    ref = HistGradientBoostingRegressor(**params).fit(
        X[tr], y[tr], X_val=X[va], y_val=y[va]
    )
    assert abs(ours.n_iter_ - ref.n_iter_) <= 2
    k = min(ours.n_iter_, ref.n_iter_) + 1
    np.testing.assert_allclose(
        ours.validation_score_[:k], ref.validation_score_[:k], rtol=1e-6
    )
    scored = Reg(scoring="neg_mean_absolute_error", **params).fit(
        ds[tr], y[tr], X_val=ds[va], y_val=y[va]
    )
    assert scored.validation_score_.shape[0] == scored.n_iter_ + 1
    with pytest.raises(ValueError, match="early_stopping is False"):
        Reg(early_stopping=False).fit(ds[tr], y[tr], X_val=ds[va], y_val=y[va])
    with pytest.raises(ValueError, match="y_val was not provided"):
        Reg().fit(ds[tr], y[tr], X_val=ds[va])


def test_binning_subsample_draws_as_sklearn(monkeypatch):
    """Above the subsample size the thresholds come from scikit-learn's draw of
    target rows, counted per source row (a small subsample stands in for
    200,000)."""
    monkeypatch.setattr(_gradient_boosting, "BINNING_SUBSAMPLE", 300)
    rng = np.random.default_rng(7)
    n, r = 2000, 700
    base = rng.normal(size=(n, 1))
    dim = rng.normal(size=(r, 2))
    idx = rng.integers(0, r, n)
    idx[:50] = -1
    ds = MultiSourceDataset.from_matrices([base, dim], [None, idx])
    X = nan_table(ds)
    for sw in (None, rng.integers(1, 5, n).astype(float)):
        ours = Reg(max_iter=1, **NO_ES).fit(ds, X[:, 0], sample_weight=sw)
        seed = ours._random_seed
        mapper = _BinMapper(n_bins=256, subsample=300, random_state=seed)
        mapper.fit(X, sample_weight=sw)
        for a, b in zip(ours._bin_mapper.bin_thresholds_, mapper.bin_thresholds_):
            np.testing.assert_array_equal(a, b)


def test_find_thresholds_weighted_distinct_values():
    """Thresholds from (value, count) pairs equal those of the expanded column,
    with more distinct values than bins (quantiles) and fewer (midpoints)."""
    rng = np.random.default_rng(0)
    for m in (40, 600):
        values = rng.normal(size=m)
        counts = rng.integers(0, 6, m).astype(float)
        expanded = np.repeat(values, counts.astype(int))
        ref = _BinMapper(n_bins=256).fit(expanded[:, None]).bin_thresholds_[0]
        np.testing.assert_array_equal(find_thresholds(values, counts, 255, False), ref)
        weights = rng.integers(1, 4, expanded.shape[0]).astype(float)
        ref_w = _BinMapper(n_bins=256).fit(expanded[:, None], sample_weight=weights)
        agg = np.bincount(np.repeat(np.arange(m), counts.astype(int)), weights, m)
        np.testing.assert_allclose(
            find_thresholds(values, agg, 255, True), ref_w.bin_thresholds_[0]
        )


@pytest.mark.parametrize("compiled", [True, False])
def test_binning_a_column_as_sklearn(monkeypatch, compiled):
    """The bins of a column (compiled binary search or NumPy's searchsorted),
    strided as a source's column is: those of scikit-learn's _BinMapper, with
    values on the thresholds, infinities and NaN (the missing bin)."""
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.ensemble._binning import BinMapper

    launched = []
    launch = _launcher.launch
    monkeypatch.setattr(
        _launcher,
        "launch",
        lambda name, *a: (launched.append(name), launch(name, *a))[1],
    )
    if not compiled:
        monkeypatch.setenv("ILARGI_SKLEARN_NO_NUMBA", "1")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300_000, 2))
    X[::7, 0] = np.round(X[::7, 0], 1)
    X[::11, 0] = np.nan
    X[100, 0], X[101, 0] = np.inf, -np.inf
    ref = _BinMapper(n_bins=256, random_state=0).fit(X[:, :1])
    t = ref.bin_thresholds_[0]
    X[:50, 0] = t[:50]
    mapper = BinMapper(256)
    mapper.bin_thresholds_ = [t]
    mapper.is_categorical_ = np.zeros(1, dtype=np.uint8)
    out = np.zeros((X.shape[0], 2), dtype=np.uint8)
    mapper._bin_column(X[:, 0], 0, out[:, 1])
    np.testing.assert_array_equal(out[:, 1], ref.transform(X[:, :1])[:, 0])
    assert out[0, 1] == 0 and out[55, 1] == 255 and out[100, 1] == t.shape[0]
    assert out[101, 1] == 0
    assert not out[:, 0].any()
    # A column of few distinct values (few thresholds, midpoints).
    few = rng.integers(0, 10, X.shape[0]).astype(np.float64)
    ref_few = _BinMapper(n_bins=256, random_state=0).fit(few[:, None])
    mapper.bin_thresholds_ = ref_few.bin_thresholds_
    mapper._bin_column(few, 0, out[:, 0])
    np.testing.assert_array_equal(out[:, 0], ref_few.transform(few[:, None])[:, 0])
    assert out[:, 0].max() == 9
    assert launched == (["tree_bin"] * 2 if compiled else [])


@pytest.mark.parametrize("compiled", [True, False])
def test_leaf_values_added_at_their_rows(monkeypatch, compiled):
    """The raw predictions of a fit move by each leaf's value at the leaf's
    rows (read off the partition): the tree's prediction of its rows."""
    from ilargi_sklearn.ensemble._grower import TreeGrower
    from ilargi_sklearn.ensemble._histogram import HistogramBuilder

    if not compiled:
        monkeypatch.setenv("ILARGI_SKLEARN_NO_NUMBA", "1")
    ds, joined, y = star_frames(15, n=2000)
    model = Reg(max_iter=1, **NO_ES)
    groups, n = model._check_X(ds, reset=True)
    model._random_seed = 0
    mapper = model._fit_bin_mapper(groups, np.arange(n), None, n)
    model._bin_mapper = mapper
    data = model._bin(groups, n)
    g = (np.mean(y) - y).astype(np.float32)
    builder = HistogramBuilder(data, 256)
    grower = TreeGrower(
        data,
        g,
        np.ones(1, dtype=np.float32),
        builder,
        max_leaf_nodes=8,
        n_bins_non_missing=mapper.n_bins_non_missing_,
        has_missing_values=model._has_missing(data, 255),
        shrinkage=0.5,
    )
    grower.grow()
    assert len(grower.finalized_leaves) == 8
    raw = np.full(n, 2.0)
    grower.add_leaf_values(raw)
    builder.end_tree()
    expected = np.full(n, 2.0)
    grower.make_predictor(mapper.bin_thresholds_).predict_binned(data, 255, expected)
    np.testing.assert_allclose(raw, expected, rtol=1e-15)
    assert np.unique(raw).shape[0] == 8


# --------------------------------------------------------- categorical columns
def test_categorical_columns_split_natively():
    ds, joined, y = star_frames(8, n=1500)
    X, is_cat = encoded(joined)
    model = Reg(max_iter=10, **NO_ES).fit(ds, y)
    assert model.is_categorical_.tolist() == [False] * 4 + [True, False]
    nodes = np.concatenate([p[0].nodes for p in model._predictors])
    assert nodes["is_categorical"].any()
    # None: the one-hot columns are numbers, as on the one-hot encoded join.
    onehot = Reg(max_iter=3, categorical_features=None, **NO_ES).fit(ds, y)
    assert onehot.is_categorical_ is None
    assert onehot.tree_feature_names_.shape[0] == ds.shape[1]
    ref = HistGradientBoostingRegressor(max_iter=3, **NO_ES).fit(nan_table(ds), y)
    assert compare_trees(onehot, ref) >= 1
    # By name: the schema's column.
    named = Reg(max_iter=3, categorical_features=["dim1__colour"], **NO_ES).fit(ds, y)
    assert named.is_categorical_.sum() == 1
    with pytest.raises(ValueError, match="neither a categorical column"):
        Reg(categorical_features=["nope"]).fit(ds, y)
    with pytest.raises(ValueError, match="one-hot columns"):
        Reg(categorical_features=["dim1__colour", "dim1__colour_red"]).fit(ds, y)


def test_new_data_through_the_schema_unknown_categories_are_missing():
    ds, joined, y = star_frames(9, n=1200)
    model = Reg(max_iter=8, **NO_ES).fit(ds, y)
    base, dim1, dim2 = new_star_frames("purple")
    with pytest.warns(UserWarning, match="purple"):
        new = model.dataset_schema_.build(base, {"dim1": dim1, "dim2": dim2})
    pred = model.predict(new)
    # The same rows as a table with NaN for the unknown category.
    frame = base.merge(dim1, on="k1").merge(dim2, on="k2")
    X = frame[["a", "b", "c", "d"]].to_numpy()
    colour = np.where(frame["colour"] == "red", 3.0, np.nan)  # blue green grey red
    ref_model = HistGradientBoostingRegressor(
        max_iter=8, categorical_features=[False] * 4 + [True, False], **NO_ES
    )
    Xtr, _ = encoded(joined)
    ref_model.fit(Xtr, y)
    Xnew = np.column_stack([X, colour, frame["e"].to_numpy()])
    if compare_trees(model, ref_model) == model.n_iter_:
        np.testing.assert_allclose(pred, ref_model.predict(Xnew), rtol=1e-9)


def test_too_many_categories_and_monotonic_errors():
    rng = np.random.default_rng(0)
    base = pd.DataFrame({"x": rng.normal(size=300), "k": rng.integers(0, 10, 300)})
    dim = pd.DataFrame({"k": np.arange(10), "g": [f"v{i}" for i in range(10)]})
    ds = MultiSourceDataset.from_frames(
        base, ["x"], [Join(dim, on="k", features=["g"], name="dim")]
    )
    y = rng.normal(size=300)
    with pytest.raises(ValueError, match="cardinality <= 5"):
        Reg(max_bins=5).fit(ds, y)
    with pytest.raises(ValueError, match="Categorical features cannot have monotonic"):
        Reg(monotonic_cst={"dim__g": 1}).fit(ds, y)
    with pytest.raises(ValueError, match="unexpected feature names"):
        Reg(monotonic_cst={"nope": 1}).fit(ds, y)


def test_monotonic_constraints_match_sklearn():
    """Constraints clip the children's values: where both children of a node
    clip to the same bound, every split's gain is rounding noise (a tie), so the
    trees agree up to such nodes; the constraints hold."""
    ds, joined, y = star_frames(10, n=1200, categorical=False)
    X, _ = encoded(joined)
    cst = [1, 0, 1, -1, 0]
    ours = Reg(max_iter=6, monotonic_cst=cst, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(max_iter=6, monotonic_cst=cst, **NO_ES)
    ref.fit(X, y)
    compare_trees(ours, ref)
    by_name = Reg(
        max_iter=6, monotonic_cst={"base__a": 1, "dim1__c": 1, "dim1__d": -1}, **NO_ES
    ).fit(ds, y)
    np.testing.assert_allclose(by_name.predict(ds), ours.predict(ds))
    # Moving base__a up (an array with the model's columns) never lowers a
    # prediction, moving dim1__d up never raises one.
    arr = Reg(max_iter=6, monotonic_cst=cst, **NO_ES).fit(X, y)
    grid = np.repeat(np.nanmean(X, axis=0)[None], 50, axis=0)
    for col, sign in ((0, 1), (3, -1)):
        g = grid.copy()
        g[:, col] = np.linspace(np.nanmin(X[:, col]), np.nanmax(X[:, col]), 50)
        assert np.all(sign * np.diff(arr.predict(g)) >= -1e-12)


def test_max_features_and_l2_match_sklearn():
    ds, joined, y = star_frames(11, n=1200, categorical=False)
    X, _ = encoded(joined)
    params = dict(max_iter=5, max_features=0.5, l2_regularization=2.0, max_depth=3)
    ours = Reg(**params, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(**params, **NO_ES).fit(X, y)
    assert compare_trees(ours, ref) >= 3


@pytest.mark.parametrize("cst", [[[0, 2], [1, 3, 4]], "pairwise", "no_interactions"])
def test_interaction_constraints_match_sklearn(cst):
    ds, joined, y = star_frames(11, n=1200, categorical=False)
    X, _ = encoded(joined)
    params = dict(max_iter=5, interaction_cst=cst, max_features=0.7)
    ours = Reg(**params, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(**params, **NO_ES).fit(X, y)
    assert compare_trees(ours, ref) >= 3
    if cst == "no_interactions":
        for p in ours._predictors:
            nodes = p[0].nodes
            inner = nodes[~nodes["is_leaf"].astype(bool)]
            assert np.unique(inner["feature_idx"]).shape[0] <= 1
    with pytest.raises(ValueError, match="invalid indices: \\[7\\]"):
        Reg(interaction_cst=[[0, 7]]).fit(ds, y)


# ------------------------------------------------------------ kernels
def test_compiled_and_numpy_kernels_agree(monkeypatch):
    ds, joined, y = star_frames(12, n=2000)
    fast = Reg(max_iter=5, **NO_ES).fit(ds, y)
    monkeypatch.setenv("ILARGI_SKLEARN_NO_NUMBA", "1")
    slow = Reg(max_iter=5, **NO_ES).fit(ds, y)
    assert compare_trees(fast, slow) >= 3
    np.testing.assert_allclose(slow.predict(ds), fast.predict(ds), rtol=1e-9)


@pytest.mark.parametrize("loss", ["squared_error", "poisson"])
def test_threads_do_not_change_the_trees(monkeypatch, loss):
    """Histograms by feature tasks and partitions by array ranges on several
    threads give bitwise the trees of one thread: each feature's histogram is
    summed by one task in row order, and the moves are exact. The thresholds
    that keep small nodes on one thread are lowered so that this small star
    takes every parallel path (several tasks, chunks of sides and moves)."""
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.ensemble import _histogram

    if not _launcher.numba_available():
        pytest.skip("numba is not installed")
    ds, joined, y = star_frames(15, n=3000)
    y = np.abs(y) + 0.1
    one = Reg(loss=loss, max_iter=5, max_leaf_nodes=15, **NO_ES)
    one.fit(ds, y)
    monkeypatch.setattr(_histogram, "PARALLEL_WORK", 0)
    monkeypatch.setattr(_histogram, "PARALLEL_MOVES", 0)
    monkeypatch.setitem(_launcher.MIN_CHUNK_ROWS, "tree_sides", 64)
    monkeypatch.setattr(_launcher, "n_threads", lambda: 3)
    calls = []
    run = _launcher.run_kernel_tasks
    monkeypatch.setattr(
        _launcher,
        "run_kernel_tasks",
        lambda task, n, threads: (calls.append((n, threads)), run(task, n, threads)),
    )
    many = Reg(loss=loss, max_iter=5, max_leaf_nodes=15, **NO_ES).fit(ds, y)
    assert any(n > 1 and threads == 3 for n, threads in calls)
    for a_iter, b_iter in zip(one._predictors, many._predictors, strict=True):
        for a, b in zip(a_iter, b_iter, strict=True):
            np.testing.assert_array_equal(a.nodes, b.nodes)
    np.testing.assert_array_equal(one.predict(ds), many.predict(ds))


@pytest.mark.parametrize("const_h", [True, False])
def test_compiled_categorical_scan_matches_the_reference(const_h):
    """The compiled scan of categorical features gives bitwise the reference's
    gain (it is compiled without FMAs), left sums and bitset, feature by
    feature: categories of little support, missing values, ties in the sort
    order, and features with no valid split."""
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.ensemble._splitting import MIN_CAT_SUPPORT, scan_categorical

    if not _launcher.numba_available():
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(5)
    F, n_bins = 40, 256
    hist = np.zeros((F, n_bins, 3))
    nbnm = rng.integers(1, 60, F)
    has_missing = rng.integers(0, 2, F)
    for f in range(F):
        counts = rng.integers(0, 40, nbnm[f] + 1).astype(float)
        counts[rng.random(nbnm[f] + 1) < 0.2] = 0.0
        bins = np.r_[np.arange(nbnm[f]), n_bins - 1]
        hist[f, bins, 2] = counts
        # Rounded gradients: equal ratios, so the stable sort's ties matter.
        hist[f, bins, 0] = np.round(rng.normal(size=bins.shape[0]), 1) * counts
        hist[f, bins, 1] = counts * (1.0 if const_h else rng.uniform(0.2, 1.0))
        if not has_missing[f]:
            hist[f, n_bins - 1] = 0.0
    n = float(hist[0, :, 2].sum())
    sg, sh = float(hist[0, :, 0].sum()), float(hist[0, :, 2 if const_h else 1].sum())
    args = (n, sg, sh, -sg / sh, -np.inf, np.inf, 0.5, 1e-3, 5.0, 0.0, const_h)
    feats = np.arange(F, dtype=np.int64)
    res = np.empty((F, 4))
    bitsets = np.empty((F, 8), dtype=np.uint32)
    _launcher.call(
        "tree_scan_categorical",
        hist,
        feats,
        nbnm.astype(np.int64),
        has_missing.astype(np.int64),
        n_bins - 1,
        *args,
        MIN_CAT_SUPPORT,
        res,
        bitsets,
    )
    found = 0
    for f in range(F):
        gain, bitset, sgl, shl, nl = scan_categorical(
            hist[f], nbnm[f], bool(has_missing[f]), n_bins - 1, *args
        )
        assert res[f, 0] == gain
        if bitset is None:
            assert not bitsets[f].any()
            continue
        found += 1
        np.testing.assert_array_equal(bitsets[f], bitset)
        assert (res[f, 1], res[f, 2], int(res[f, 3])) == (sgl, shl, nl)
    assert 5 < found < F


def test_grouped_and_rowwise_histograms_agree():
    from ilargi_sklearn.ensemble._histogram import (
        HistogramBuilder,
        build_histograms,
    )
    from ilargi_sklearn.ensemble._trees_numba import GROUPED, ROWWISE

    ds, joined, y = star_frames(13, n=3000)
    model = Reg(max_iter=1, **NO_ES)
    groups, n = model._check_X(ds, reset=True)
    model._random_seed = 0
    model._bin_mapper = model._fit_bin_mapper(groups, np.arange(n), None, n)
    data = model._bin(groups, n)
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(n, 1000, replace=False))
    g = rng.normal(size=n).astype(np.float32)
    h = rng.random(n).astype(np.float32)
    dims = [k for k in range(data.n_groups) if data.idx[k].shape[0]]
    row = np.full(data.n_groups, ROWWISE)
    grouped = row.copy()
    grouped[dims] = GROUPED
    src = [data.rows_of(k, rows) for k in range(data.n_groups)]
    a = build_histograms(data, src, g[rows], h[rows], row, 256)
    b = build_histograms(data, src, g[rows], h[rows], grouped, 256)
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)
    # A direct count over the joined binned column.
    f = int(np.flatnonzero(data.feature_group == dims[0])[0])
    col = data.column(f, rows)
    np.testing.assert_array_equal(a[f, :, 2], np.bincount(col, minlength=256))
    builder = HistogramBuilder(data, 256)
    builder.start_tree(g.copy(), h.copy())
    np.testing.assert_allclose(
        builder.build(0, n),
        build_histograms(
            data, [data.rows_of(k) for k in range(data.n_groups)], g, h, row, 256
        ),
        rtol=1e-10,
        atol=1e-10,
    )
    # The cost model sends a repeated dimension to a grouped build and keeps
    # the base table row-wise.
    modes = builder.modes(3000)
    assert modes[dims[0]] != ROWWISE
    assert all(modes[k] == ROWWISE for k in range(data.n_groups) if k not in dims)


@pytest.mark.parametrize("constant_hessians", [True, False])
def test_rowwise_histograms_of_every_group_width(constant_hessians):
    """The compiled row-wise build (two features a pass, an odd last feature
    paired with itself at weight 0) gives the reference's sums for groups of 1
    to 5 features, the base table's and a dimension's, with and without
    hessians, on a node in the middle of the partition."""
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.ensemble._binning import BinnedData
    from ilargi_sklearn.ensemble._histogram import (
        HistogramBuilder,
        build_histograms,
    )
    from ilargi_sklearn.ensemble._trees_numba import ROWWISE

    if not _launcher.numba_available():
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(3)
    n, r = 3000, 40
    widths = [1, 2, 3, 4, 5]
    bins, idx, fg, fc = [], [], [], []
    for g, c in enumerate(widths):
        rows = n if g % 2 == 0 else r
        bins.append(rng.integers(0, 256, (rows + 1, c)).astype(np.uint8))
        idx.append(
            np.zeros(0, np.int32)
            if g % 2 == 0
            else rng.integers(0, r + 1, n).astype(np.int32)
        )
        fg += [g] * c
        fc += list(range(c))
    # Tree features of a group not in its column order (the fmaps).
    order = rng.permutation(len(fg))
    data = BinnedData(
        tuple(bins),
        tuple(idx),
        np.asarray(fg)[order],
        np.asarray(fc)[order],
        n,
    )
    g = rng.normal(size=n).astype(np.float32)
    h = None if constant_hessians else rng.random(n).astype(np.float32)
    builder = HistogramBuilder(data, 256)
    builder.start_tree(g.copy(), None if h is None else h.copy())
    builder.modes = lambda n_node: np.full(data.n_groups, ROWWISE)
    start, stop = 700, 2900
    assert builder.compiled
    got = builder.build(start, stop)
    rows = builder.partition[start:stop]
    ref = build_histograms(
        data,
        [data.rows_of(k, rows) for k in range(data.n_groups)],
        g[rows],
        None if h is None else h[rows],
        np.full(data.n_groups, ROWWISE),
        256,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    assert np.all(got[:, :, 2].sum(axis=1) == stop - start)


@pytest.mark.parametrize("compiled", [True, False])
def test_split_moves_the_rows_and_their_gradients(compiled):
    """A split partitions the node's positions stably (left rows first, each
    side in order), and every array kept in that order moves with its row:
    the source rows of each dimension, the gradients and hessians. Each
    histogram mode of the compiled kernel then gives the reference's sums on
    the child's rows."""
    from ilargi_sklearn.ensemble._histogram import (
        HistogramBuilder,
        build_histograms,
    )
    from ilargi_sklearn.ensemble._trees_numba import GROUPED, GROUPED_DENSE, ROWWISE

    ds, joined, y = star_frames(14, n=3000)
    model = Reg(max_iter=1, **NO_ES)
    groups, n = model._check_X(ds, reset=True)
    model._random_seed = 0
    model._bin_mapper = model._fit_bin_mapper(groups, np.arange(n), None, n)
    data = model._bin(groups, n)
    rng = np.random.default_rng(1)
    g = rng.normal(size=n).astype(np.float32)
    h = rng.random(n).astype(np.float32)
    idx = [ix.copy() for ix in data.idx]
    builder = HistogramBuilder(data, 256)
    builder.start_tree(g.copy(), h.copy())
    builder.compiled = compiled
    missing_bin = 255
    dims = [k for k in range(data.n_groups) if data.idx[k].shape[0]]
    f_dim = int(np.flatnonzero(data.feature_group == dims[0])[0])
    f_base = int(np.flatnonzero(data.feature_group != dims[0])[0])
    # Split all rows on a dimension's column, then the left child on another.
    nl = builder.split(0, n, f_dim, 100, True, missing_bin, None)
    b = data.column(f_dim)
    left = (b <= 100) | (b == missing_bin)
    expected = np.concatenate([np.flatnonzero(left), np.flatnonzero(~left)])
    assert nl == int(left.sum())
    np.testing.assert_array_equal(builder.partition, expected)
    rows = builder.partition[:nl]
    nl2 = builder.split(0, nl, f_base, 50, False, missing_bin, None)
    b2 = data.column(f_base, rows)
    left2 = b2 <= 50
    expected2 = np.concatenate([rows[left2], rows[~left2]])
    assert nl2 == int(left2.sum())
    np.testing.assert_array_equal(builder.partition[:nl], expected2)
    p = builder.partition
    np.testing.assert_array_equal(builder.gradients, g[p])
    np.testing.assert_array_equal(builder.hessians, h[p])
    for k in range(data.n_groups):
        key = builder.keys[builder.key_of[k]]
        np.testing.assert_array_equal(key, p if idx[k].shape[0] == 0 else idx[k][p])
    # The histograms of the right child of the second split, per mode.
    child = p[nl2:nl]
    ref = build_histograms(
        data,
        [child if ix.shape[0] == 0 else ix[child] for ix in idx],
        g[child],
        h[child],
        np.full(data.n_groups, ROWWISE),
        256,
    )
    assert ref[:, :, 2].sum() == child.shape[0] * data.feature_group.shape[0]
    for mode in (ROWWISE, GROUPED, GROUPED_DENSE):
        builder.modes = lambda n_node, mode=mode: np.where(
            np.isin(np.arange(data.n_groups), dims), mode, ROWWISE
        )
        np.testing.assert_allclose(builder.build(nl2, nl), ref, rtol=1e-10, atol=1e-10)
    # After the tree, the index vectors are back in target-row order.
    builder.end_tree()
    for k in range(data.n_groups):
        np.testing.assert_array_equal(data.idx[k], idx[k])


def test_nan_inside_a_source_is_missing():
    """NaN kept in a source (allow_nan=True) is a missing value for the trees."""
    rng = np.random.default_rng(0)
    n, r = 1500, 500
    base = rng.normal(size=(n, 1))
    dim = rng.normal(size=(r, 2))
    dim[:60, 0] = np.nan
    idx = rng.integers(0, r, n)
    with pytest.raises(ValueError, match="NaN or infinite"):
        MultiSourceDataset.from_matrices([base, dim], [None, idx])
    ds = MultiSourceDataset.from_matrices([base, dim], [None, idx], allow_nan=True)
    assert ds.allows_nan and ds.nan_source() == "s1"
    assert ds[np.arange(10)].allows_nan
    X = nan_table(ds)
    assert np.isnan(X[:, 1]).sum() == np.isin(idx, np.arange(60)).sum()
    y = np.where(np.isnan(X[:, 1]), 3.0, X[:, 1]) + 0.1 * rng.normal(size=n)
    ours = Reg(max_iter=5, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(max_iter=5, **NO_ES).fit(X, y)
    assert ours._has_missing(ours._bin(*ours._check_X(ds, reset=False)), 255)[1]
    assert compare_trees(ours, ref) >= 3
    # Estimators that take no missing values refuse the dataset by name.
    from ilargi_sklearn import FactorizedRidge

    with pytest.raises(ValueError, match="missing values \\(NaN\\) in source 's1'"):
        FactorizedRidge().fit(ds, y)
    dim[0, 1] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        MultiSourceDataset.from_matrices([base, dim], [None, idx], allow_nan=True)


def test_impute_missing_keeps_nan_from_frames():
    """Join(impute="missing"): NaN of a table stay missing values, as in the
    pandas.merge the trees are compared with."""
    rng = np.random.default_rng(1)
    n, r = 1500, 400
    base = pd.DataFrame({"a": rng.normal(size=n), "k": rng.integers(0, r + 50, n)})
    dim = pd.DataFrame({"k": np.arange(r), "b": rng.normal(size=r)})
    dim.loc[rng.random(r) < 0.2, "b"] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        MultiSourceDataset.from_frames(base, ["a"], [Join(dim, on="k", features=["b"])])
    ds = MultiSourceDataset.from_frames(
        base, ["a"], [Join(dim, on="k", features=["b"], impute="missing", name="d")]
    )
    assert ds.allows_nan
    joined = base.merge(dim, on="k", how="left")[["a", "b"]]
    X = joined.to_numpy()
    y = np.where(np.isnan(X[:, 1]), 2.0, X[:, 1]) + X[:, 0] + rng.normal(size=n) * 0.1
    ours = Reg(max_iter=5, **NO_ES).fit(ds, y)
    ref = HistGradientBoostingRegressor(max_iter=5, **NO_ES).fit(X, y)
    assert compare_trees(ours, ref) >= 3
    # New rows through the schema keep their NaN too.
    new = ours.dataset_schema_.build(base.iloc[:50], {"d": dim})
    np.testing.assert_allclose(ours.predict(new), ours.predict(ds)[:50])


# ------------------------------------------------------------------- the API
def test_staged_warm_start_and_pickle():
    ds, joined, y = star_frames(14, n=800)
    model = Reg(max_iter=6, **NO_ES).fit(ds, y)
    staged = list(model.staged_predict(ds))
    assert len(staged) == 6
    np.testing.assert_allclose(staged[-1], model.predict(ds))
    warm = Reg(max_iter=3, warm_start=True, **NO_ES).fit(ds, y)
    warm.set_params(max_iter=6).fit(ds, y)
    assert warm.n_iter_ == 6
    np.testing.assert_allclose(warm.predict(ds), model.predict(ds), rtol=1e-10)
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(ds), model.predict(ds))
    labels = (y > np.median(y)).astype(int)
    clf = Clf(max_iter=4, **NO_ES).fit(ds, labels)
    for staged_proba, staged_dec in zip(
        clf.staged_predict_proba(ds), clf.staged_decision_function(ds)
    ):
        assert staged_proba.shape == (len(ds), 2) and staged_dec.shape == (len(ds),)
    np.testing.assert_allclose(staged_proba, clf.predict_proba(ds))
    np.testing.assert_array_equal(list(clf.staged_predict(ds))[-1], clf.predict(ds))


def test_pipeline_grid_search_and_cross_validation():
    ds, joined, y = star_frames(15, n=600, categorical=False)
    pipe = Pipeline([("hgb", Reg(max_iter=5, **NO_ES))])
    scores = cross_val_score(pipe, ds, y, cv=3)
    X, _ = encoded(joined)
    ref = cross_val_score(
        HistGradientBoostingRegressor(max_iter=5, **NO_ES), X, y, cv=3
    )
    np.testing.assert_allclose(scores, ref, rtol=1e-6)
    search = GridSearchCV(
        Reg(**NO_ES), {"max_iter": [2, 5], "max_leaf_nodes": [4, 8]}, cv=3
    )
    search.fit(ds, y)
    assert search.best_params_["max_iter"] == 5


def test_input_errors():
    ds, joined, y = star_frames(16, n=300, categorical=False)
    with pytest.raises(TypeError, match="no scaling"):
        Reg(max_iter=2).fit(FactorizedStandardScaler().fit_transform(ds), y)
    model = Reg(max_iter=2, **NO_ES).fit(ds, y)
    with pytest.raises(TypeError, match="fitted on a MultiSourceDataset"):
        model.predict(ds.materialize())
    with pytest.raises(ValueError, match="one target value per row"):
        Reg(max_iter=2).fit(ds, y[:-1])
    arr = Reg(max_iter=2, **NO_ES).fit(np.nan_to_num(nan_table(ds)), y)
    with pytest.raises(TypeError, match="fitted on an array"):
        arr.predict(ds)
