"""From training to scoring: row origin and alignment, the schema that encodes new
frames like the training ones, match reports and their warnings, imputation over the
joined rows, and models that score datasets built with their training schema."""

from __future__ import annotations

import pickle
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from _helpers import dense
from sklearn.impute import SimpleImputer
from sklearn.model_selection import GroupKFold, cross_val_score
from sklearn.pipeline import make_pipeline

from ilargi_sklearn import (
    AutoPlan,
    FactorizedKMeans,
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedStandardScaler,
    Join,
    MultiSourceDataset,
)
from ilargi_sklearn.multisource import (
    DatasetSchema,
    JoinMatchWarning,
    UnknownCategoryWarning,
    from_frames,
)


def star(n=300, seed=0):
    """A star schema with categorical columns: sales -> stores -> regions, items."""
    rng = np.random.default_rng(seed)
    regions = pd.DataFrame(
        {"region": ["north", "south", "east", "west"], "tax": [0.1, 0.2, 0.15, 0.05]}
    )
    stores = pd.DataFrame(
        {
            "store": np.arange(30),
            "region": rng.choice(regions["region"], 30),
            "size": rng.choice(["S", "M", "L"], 30),
            "area": rng.gamma(3.0, 100.0, 30),
        }
    )
    items = pd.DataFrame(
        {
            "item": [f"i{k:03d}" for k in range(40)],
            "brand": rng.choice(["acme", "zenith", "orbit", "nova", "apex"], 40),
            "price": rng.gamma(2.0, 5.0, 40),
        }
    )
    items.loc[rng.random(40) < 0.2, "price"] = np.nan
    sales = pd.DataFrame(
        {
            "store": rng.integers(0, 30, n),
            "item": rng.choice(items["item"], n),
            "units": rng.integers(1, 10, n).astype(float),
            "channel": rng.choice(["web", "shop", "app"], n),
        }
    )
    sales["revenue"] = sales["units"] * 3 + rng.standard_normal(n)
    return {"sales": sales, "stores": stores, "regions": regions, "items": items}


def star_joins(f):
    return [
        Join(f["stores"], on="store", features=["size", "area"], name="stores"),
        Join(f["regions"], on="region", via="stores", features=["tax"], name="regions"),
        Join(
            f["items"],
            on="item",
            features=["brand", "price"],
            impute="mean",
            name="items",
            indicator=True,
        ),
    ]


def build_star(f, **kw):
    return from_frames(f["sales"], ["units", "channel"], star_joins(f), **kw)


# ----------------------------------------------------------------- row origin
def test_base_rows_after_inner_and_one_to_many_joins():
    base = pd.DataFrame({"k": [1, 2, 3, 4], "y": [10.0, 20.0, 30.0, 40.0]})
    many = pd.DataFrame({"k": [3, 1, 3], "z": [1.0, 2.0, 3.0]})
    ds, y = from_frames(
        base, joins=[Join(many, on="k", features=["z"], how="inner")], target="y"
    )
    np.testing.assert_array_equal(ds.base_rows_, [0, 2, 2])
    assert ds.n_base_rows_ == 4
    np.testing.assert_array_equal(y, [10.0, 30.0, 30.0])
    np.testing.assert_array_equal(ds.align(base["y"].to_numpy()), y)
    # Slices compose, and 2-D values take whole rows.
    np.testing.assert_array_equal(ds[[2, 0]].base_rows_, [2, 0])
    both = np.c_[base["y"], -base["y"]]
    np.testing.assert_array_equal(ds[[2]].align(both), [[30.0, -30.0]])
    # A scaled dataset (a pipeline step) keeps the rows of what it scaled.
    scaled = FactorizedStandardScaler().fit_transform(ds[[1, 2]])
    np.testing.assert_array_equal(scaled.base_rows_, [2, 2])


def test_base_rows_of_union_relationship_table_and_from_matrices():
    ratings = pd.DataFrame({"u": [0, 1, 1, 2], "m": [1, 0, 5, 1]})
    users = pd.DataFrame({"u": [0, 1, 2], "age": [20.0, 30.0, 40.0]})
    movies = pd.DataFrame({"m": [0, 1], "len": [90.0, 120.0]})
    joins = [
        Join(users, on="u", features=["age"], name="users"),
        Join(movies, on="m", features=["len"], how="inner", name="movies"),
    ]
    ds = from_frames(ratings, joins=joins)  # no base features
    np.testing.assert_array_equal(ds.base_rows_, [0, 1, 3])
    u = MultiSourceDataset.union([ds, ds[[2]]])
    np.testing.assert_array_equal(u.base_rows_, [0, 1, 3, 7])
    assert u.n_base_rows_ == 8
    y = np.arange(4.0)
    np.testing.assert_array_equal(u.align(np.r_[y, y + 10]), [0, 1, 3, 13])
    m = MultiSourceDataset.from_matrices([np.eye(3)], [None])
    np.testing.assert_array_equal(m[[2, 0]].base_rows_, [2, 0])


def test_align_checks_length_index_and_rows_without_a_base_row():
    base = pd.DataFrame({"k": [1, 2], "a": [1.0, 2.0]}, index=[10, 11])
    dim = pd.DataFrame({"k": [2, 7], "b": [5.0, 6.0]})
    ds = from_frames(
        base, ["a"], [Join(dim, on="k", features=["b"], how="outer")], min_match=0
    )
    np.testing.assert_array_equal(ds.base_rows_, [0, 1, -1])
    with pytest.raises(ValueError, match="1 dataset rows have no base row"):
        ds.align(base["a"])
    np.testing.assert_array_equal(
        ds.align(base["a"], fill_value=-1.0).to_numpy(), [1.0, 2.0, -1.0]
    )
    np.testing.assert_array_equal(ds.align([1, 2], fill_value=0), [1, 2, 0])
    kept = ds[ds.base_rows_ >= 0]
    assert kept.align(base["a"]).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="values have 3 rows.*2 base rows"):
        kept.align(pd.Series([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"shape \(3,\).*2 base rows"):
        kept.align(np.zeros(3))
    # A Series of another frame (other index) is never matched by position.
    with pytest.raises(ValueError, match="index differs from the base table's"):
        kept.align(pd.Series([1.0, 2.0]))
    assert kept.align(pd.Series([1.0, 2.0]).to_numpy()).tolist() == [1.0, 2.0]


def test_weights_and_groups_align_for_group_k_fold():
    """Weights and groups aligned through an inner join give scikit-learn's
    grouped, weighted cross-validation on the merged table."""
    from sklearn.linear_model import LinearRegression

    f = star()
    items = f["items"].iloc[:20].assign(price=lambda t: t["price"].fillna(0.0))
    joins = [Join(items, on="item", features=["price"], how="inner", name="items")]
    sales = f["sales"].assign(w=np.linspace(1, 2, len(f["sales"])))
    ds, y = from_frames(sales, ["units"], joins, target="revenue", min_match=0.3)
    merged = sales.merge(items, on="item", how="inner")
    assert len(ds) == len(merged) < len(sales)
    groups = ds.align(sales["store"])
    weights = ds.align(sales["w"])
    np.testing.assert_array_equal(groups, merged["store"])
    cv = GroupKFold(n_splits=3)
    ours = cross_val_score(
        FactorizedLinearRegression(),
        ds,
        y,
        groups=groups,
        cv=cv,
        params={"sample_weight": weights},
    )
    theirs = cross_val_score(
        LinearRegression(),
        merged[["units", "price"]],
        merged["revenue"],
        groups=merged["store"],
        cv=cv,
        params={"sample_weight": merged["w"]},
    )
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)


# ----------------------------------------------------------------- schema
def test_schema_rebuilds_the_training_dataset_and_pickles():
    f = star()
    ds = build_star(f)
    schema = ds.schema_
    assert isinstance(schema, DatasetSchema)
    assert list(schema.feature_names) == list(ds.feature_names)
    again = schema.build(f["sales"], {n: f[n] for n in ("stores", "regions", "items")})
    np.testing.assert_array_equal(dense(again), dense(ds))
    # The same through from_frames, with the training Joins or only the tables.
    for joins in (
        star_joins(f),
        {"stores": f["stores"], "regions": f["regions"], "items": f["items"]},
    ):
        got = from_frames(f["sales"], joins=joins, schema=schema)
        np.testing.assert_array_equal(dense(got), dense(ds))
    loaded = pickle.loads(pickle.dumps(schema))
    assert loaded == schema
    assert len(pickle.dumps(schema)) < 5000  # no data inside
    assert "7 features" not in repr(schema) and "DatasetSchema(" in repr(schema)


def test_schema_encodes_new_rows_with_the_training_columns():
    f = star()
    ds = build_star(f)
    new = pd.DataFrame(
        {
            "store": [3, 4],
            "item": ["i001", "i002"],
            "units": [2.0, 5.0],
            "channel": ["web", "kiosk"],
        }
    )
    tables = {"stores": f["stores"], "regions": f["regions"], "items": f["items"]}
    with pytest.warns(
        UnknownCategoryWarning, match=r"base.channel \(1 rows, e.g. \['kiosk'\]\)"
    ):
        small = ds.schema_.build(new, tables)
    assert list(small.feature_names) == list(ds.feature_names)
    M = dense(small)
    channel = [c for c in ds.feature_names if c.startswith("base__channel_")]
    cols = [list(ds.feature_names).index(c) for c in channel]
    assert M[1, cols].sum() == 0 and M[0, cols].sum() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.schema_.build(new, tables, handle_unknown="ignore")
    with pytest.raises(ValueError, match="categories the training data did not have"):
        ds.schema_.build(new, tables, handle_unknown="error")
    # Only the dimension rows the batch takes are encoded; the same values.
    full = ds.schema_.build(
        pd.concat([f["sales"], new.assign(channel="web")], ignore_index=True), tables
    )
    np.testing.assert_array_equal(
        dense(full)[-2:], dense(ds.schema_.build(new.assign(channel="web"), tables))
    )


def test_schema_imputes_with_the_training_values():
    f = star()
    ds = build_star(f)
    enc = {e.name: e for e in ds.schema_.encodings}["items"]
    price = {c.column: c for c in enc.columns}["price"]
    assert price.fill == pytest.approx(f["items"]["price"].mean())
    # New item table: all prices missing; the training mean fills them.
    items = f["items"].assign(price=np.nan)
    new = f["sales"].iloc[:5]
    got = ds.schema_.build(
        new, {"stores": f["stores"], "regions": f["regions"], "items": items}
    )
    j = list(ds.feature_names).index("items__price")
    np.testing.assert_allclose(dense(got)[:, j], price.fill)


def test_schema_refuses_other_specifications():
    f = star()
    ds = build_star(f)
    with pytest.raises(ValueError, match="base_features=.*differs from the schema"):
        from_frames(f["sales"], ["units"], star_joins(f), schema=ds.schema_)
    other = star_joins(f)
    other[0] = Join(f["stores"], on="store", features=["area"], name="stores")
    with pytest.raises(ValueError, match="join 'stores': features=.*differs"):
        from_frames(f["sales"], joins=other, schema=ds.schema_)
    with pytest.raises(ValueError, match=r"missing: \['items'\]"):
        ds.schema_.build(f["sales"], {"stores": f["stores"], "regions": f["regions"]})
    with pytest.raises(TypeError, match="schema must be a DatasetSchema"):
        from_frames(f["sales"], schema={"a": 1})
    with pytest.raises(TypeError, match="dict of tables need schema"):
        from_frames(f["sales"], ["units"], {"stores": f["stores"]})


def test_held_out_split_built_separately_scores_like_the_full_dataset():
    """A model fit on a training split scores a held-out split built from its own
    frames exactly as it scores those rows of the full dataset."""
    f = star(n=400, seed=3)
    rng = np.random.default_rng(0)
    test_rows = np.sort(rng.choice(400, 120, replace=False))
    train_rows = np.setdiff1d(np.arange(400), test_rows)
    train = f["sales"].iloc[train_rows]
    held = f["sales"].iloc[test_rows]
    tables = {"stores": f["stores"], "regions": f["regions"], "items": f["items"]}
    train_ds, y = from_frames(
        train, ["units", "channel"], star_joins(f), target="revenue"
    )
    model = make_pipeline(FactorizedStandardScaler(), FactorizedLinearRegression())
    model.fit(train_ds, y)
    schema = DatasetSchema.of(model)
    assert schema == train_ds.schema_
    held_ds = schema.build(held, tables)
    full_ds = schema.build(f["sales"], tables)
    np.testing.assert_allclose(
        model.predict(held_ds), model.predict(full_ds[test_rows]), rtol=1e-12
    )
    # A dataset built from the held-out frames alone has other columns: refused
    # with a message that says how to build it.
    fresh = from_frames(held.iloc[:10], ["units", "channel"], star_joins(f))
    assert fresh.shape[1] < train_ds.shape[1]
    with pytest.raises(ValueError, match="is expecting.*dataset_schema_.build"):
        model.predict(fresh)


def test_estimators_record_the_schema_and_predict_on_schema_datasets(tmp_path):
    f = star(n=300, seed=1)
    tables = {"stores": f["stores"], "regions": f["regions"], "items": f["items"]}
    ds, y = build_star(f, target="revenue")
    late = (y > y.median()).astype(int)
    new = f["sales"].iloc[:7]
    for est, target in (
        (FactorizedLinearRegression(), y),
        (FactorizedLogisticRegression(max_iter=500), late),
        (FactorizedKMeans(n_clusters=3, n_init=1, random_state=0), None),
        (AutoPlan(FactorizedLinearRegression()), y),
    ):
        est.fit(ds, target)
        assert DatasetSchema.of(est) == ds.schema_
        path = tmp_path / "model.pkl"
        path.write_bytes(pickle.dumps(est))
        loaded = pickle.loads(path.read_bytes())
        new_ds = DatasetSchema.of(loaded).build(new, tables)
        np.testing.assert_allclose(
            loaded.predict(new_ds), est.predict(ds[np.arange(7)])
        )


# ----------------------------------------------------------------- categories
def test_categories_are_the_sorted_values_the_dataset_rows_take():
    base = pd.DataFrame(
        {
            "k": [0, 1, 1],
            "c": pd.Categorical(["lo", "hi", "hi"], categories=["lo", "mid", "hi"]),
        }
    )
    dim = pd.DataFrame({"k": [0, 1, 2], "g": ["z", "a", "m"]})
    ds = from_frames(base, ["c"], [Join(dim, on="k", features=["g"], name="d")])
    # "mid" never occurs; "m" only on a dimension row no base row takes.
    assert list(ds.feature_names) == ["base__c_hi", "base__c_lo", "d__g_a", "d__g_z"]
    assert ds.categories_ == {"base__c": ["hi", "lo"], "d__g": ["a", "z"]}


# ----------------------------------------------------------------- imputation
def test_joined_mean_equals_simple_imputer_on_the_merge():
    f = star(n=500, seed=2)
    joins = [
        Join(
            f["items"],
            on="item",
            features=["price"],
            impute="joined_mean",
            name="items",
        )
    ]
    ds = from_frames(f["sales"], ["units"], joins)
    merged = f["sales"].merge(f["items"], on="item", how="left")
    assert merged["price"].isna().any()
    ref = SimpleImputer(strategy="mean").fit_transform(merged[["units", "price"]])
    np.testing.assert_allclose(dense(ds), ref, rtol=1e-12)
    # The table's own mean ("mean") differs: items are not sold equally often.
    own = from_frames(f["sales"], ["units"], [replace(joins[0], impute="mean")])
    fill_own = {c.column: c.fill for e in own.schema_.encodings for c in e.columns}
    assert fill_own["price"] == pytest.approx(f["items"]["price"].mean())
    assert fill_own["price"] != pytest.approx(ref[merged["price"].isna(), 1][0])


# ----------------------------------------------------------------- match rates
def test_low_match_rates_warn_and_no_match_raises():
    base = pd.DataFrame({"k": ["a", "b", "c", "d"], "x": [1.0, 2.0, 3.0, 4.0]})
    dim = pd.DataFrame({"k": ["a", " b", "C", "e"], "z": [1.0, 2.0, 3.0, 4.0]})
    join = Join(dim, on="k", features=["z"], name="dim")
    with pytest.warns(JoinMatchWarning) as record:
        ds = from_frames(base, ["x"], [join])
    (w,) = record
    msg = str(w.message)
    assert "join 'dim' (left, base.k = dim.k) matched 1 of 4 rows (25.0%)" in msg
    assert "'b' against ' b'" in msg and "'c' against 'C'" in msg
    report = ds.match_report_.loc["dim"]
    assert report["matched"] == 1 and report["fraction"] == 0.25
    assert len(report["hazards"]) == 2
    # The rate's warning is silenced per join or globally; an explicit 0 allows
    # no match at all. Key mistakes that explain unmatched keys still warn.
    plain = replace(join, table=dim.assign(k=["a", "x", "y", "e"]))
    for kw, j in (({}, replace(plain, min_match=0.2)), ({"min_match": 0.2}, plain)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            from_frames(base, ["x"], [j], **kw)
    with pytest.warns(JoinMatchWarning, match=r"'b' against ' b'.*only a warning"):
        from_frames(base, ["x"], [join], min_match=0.2)
    nothing = Join(dim.assign(k=["p", "q", "r", "s"]), on="k", features=["z"])
    with pytest.raises(ValueError, match="matched 0 of 4 rows"):
        from_frames(base, ["x"], [nothing])
    ds = from_frames(base, ["x"], [replace(nothing, min_match=0)])
    assert ds.match_report_["matched"].tolist() == [0]
    with pytest.raises(ValueError, match=r"min_match must be a fraction in \[0, 1\]"):
        from_frames(base, ["x"], [join], min_match=2)


@pytest.mark.parametrize(
    "left, right, pattern",
    [
        ([1, 2, 3], [1.5, 2.5, 3.5], "fractional numbers"),
        (["0012", "0013", "0014"], ["12", "13", "99"], "without leading zeros"),
        (['"x"', '"y"', "z"], ["x", "y", "w"], "without surrounding whitespace"),
    ],
)
def test_key_hazards_are_explained(left, right, pattern):
    base = pd.DataFrame({"k": left, "x": [1.0, 2.0, 3.0]})
    dim = pd.DataFrame({"k": right, "z": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=pattern):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])], min_match=1)


def test_numbers_stored_as_text_and_composite_key_columns_are_named():
    base = pd.DataFrame({"k": ["1", "2"], "t": ["a", "b"], "x": [1.0, 2.0]})
    dim = pd.DataFrame({"k": [1, 2], "t": ["a", "b"], "z": [1.0, 2.0]})
    with pytest.raises(TypeError, match=r"base.k holds numbers stored as text"):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])
    dim2 = dim.assign(k=["1", "2"], t=["A ", "B "])
    with pytest.raises(ValueError, match="dim.t.*this key column never matches"):
        from_frames(
            base, ["x"], [Join(dim2, on=["k", "t"], features=["z"], name="dim")]
        )


def test_row_number_joins():
    base = pd.DataFrame({"fk": [3, 1, 3, 2], "x": [1.0, 2.0, 3.0, 4.0]})
    dim = pd.DataFrame({"z": [10.0, 20.0, 30.0]})
    ds = from_frames(
        base, ["x"], [Join(dim, left_on="fk", row_number=1, features=["z"])]
    )
    np.testing.assert_array_equal(dense(ds)[:, 1], [30.0, 10.0, 30.0, 20.0])
    with pytest.warns(JoinMatchWarning, match="from 1, not from 0.*row_number=1"):
        ds0 = from_frames(
            base,
            ["x"],
            [Join(dim, left_on="fk", row_number=0, features=["z"], min_match=0)],
        )
    np.testing.assert_array_equal(dense(ds0)[:, 1], [0.0, 20.0, 0.0, 30.0])
    with pytest.raises(
        ValueError, match=r"row_number joins left_on .* \(no on or right_on\)"
    ):
        from_frames(base, ["x"], [Join(dim, on="fk", row_number=1)])


def test_describe_feature_ratio_without_base_features_is_infinite():
    ratings = pd.DataFrame({"u": [0, 1, 1], "m": [1, 0, 1]})
    users = pd.DataFrame({"u": [0, 1], "age": [20.0, 30.0]})
    ds = from_frames(ratings, joins=[Join(users, on="u", features=["age"])])
    assert np.isinf(ds.describe().sources["feature_ratio"]).all()


def test_schema_flags_only_batch_match_rates_implausible_for_training():
    f = star(n=300, seed=4)
    items = f["items"].iloc[:30]  # 75% of the items: some sales miss
    joins = [Join(items, on="item", features=["price"], impute="zero", name="items")]
    ds = from_frames(f["sales"], ["units"], joins)
    rate = ds.schema_.match_rates[0]
    assert 0.5 < rate < 1
    missing = f["sales"][~f["sales"]["item"].isin(items["item"])]
    # One or two new rows that miss: likely at the training rate, no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.schema_.build(missing.iloc[:2], {"items": items})
    # Twenty that all miss: the keys are broken.
    with pytest.raises(ValueError, match=r"matched 0 of 20 rows \(0%, against 7"):
        ds.schema_.build(missing.iloc[:20], {"items": items})
    mixed = pd.concat([missing.iloc[:30], f["sales"].iloc[:10]])
    with pytest.warns(JoinMatchWarning, match="in training"):
        ds.schema_.build(mixed, {"items": items})


def test_polars_and_pyarrow_tables_build_the_same_dataset():
    pl = pytest.importorskip("polars")
    pa = pytest.importorskip("pyarrow")
    f = star()
    ref, y_ref = build_star(f, target="revenue")
    g = {
        "sales": pl.from_pandas(f["sales"]),
        "stores": pa.Table.from_pandas(f["stores"]),
        "regions": pl.from_pandas(f["regions"]),
        "items": pa.Table.from_pandas(f["items"]),
    }
    ds, y = from_frames(
        g["sales"], ["units", "channel"], star_joins(g), target="revenue"
    )
    assert list(ds.feature_names) == list(ref.feature_names)
    np.testing.assert_array_equal(dense(ds), dense(ref))
    np.testing.assert_array_equal(y, y_ref)
    # The schema builds polars batches too.
    new = ref.schema_.build(
        g["sales"].head(5), {n: g[n] for n in ("stores", "regions", "items")}
    )
    np.testing.assert_array_equal(dense(new), dense(ref)[:5])
    with pytest.raises(TypeError, match="got numpy.ndarray"):
        from_frames(f["sales"].to_numpy(), ["units"])


def test_unknown_categories_name_a_changed_column_dtype():
    base = pd.DataFrame({"c": [1, 2, 1], "x": [1.0, 2.0, 3.0]})
    ds = from_frames(base, ["c", "x"], base_categorical=["c"])
    new = pd.DataFrame({"c": ["1"], "x": [1.0]})  # read back as text
    with pytest.warns(UnknownCategoryWarning, match="was int64 in training and is"):
        got = ds.schema_.build(new)
    assert dense(got).tolist() == [[0.0, 0.0, 1.0]]
