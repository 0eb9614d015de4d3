"""MultiSourceDataset.from_frames against pandas.merge, and operators on the result.

Random schemas (hypothesis): 1-4 sources, star and snowflake (``via``) joins, inner,
left and outer joins, one-to-many joins, relationship tables without base features,
joins that match nothing, composite and string keys, numeric, boolean and one-hot
features, imputation, matched indicators, coalesced columns with priorities, float32
and float64, dense and sparse storage. The reference is the chain of
``pandas.merge`` calls on the same frames, encoded by hand.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from _helpers import assert_close
from hypothesis import event, given
from hypothesis import strategies as st

from ilargi_sklearn.multisource import Join, MultiSourceDataset, from_frames

K = 6  # size of the key domain: small, so that joins match often
FEATURES = ["x0", "x1", "n", "flag", "c", "cat", "y", "cn", "w"]
NEEDS_IMPUTE = {"y", "cn"}


def make_table(rng, n_rows, *, prefix="", unique=False, composite=False, offset=0):
    """A table with key columns ``{prefix}ka`` (int) and ``{prefix}kb`` (str) and one
    column of every feature kind."""
    if unique:
        if composite:
            pairs = rng.permutation(2 * K)[:n_rows]
            ka, kb = pairs // 2, np.array(["u", "v"])[pairs % 2]
        else:
            ka, kb = rng.permutation(K)[:n_rows], rng.choice(["u", "v"], n_rows)
    else:
        ka, kb = rng.integers(0, K, n_rows), rng.choice(["u", "v"], n_rows)
    y = rng.standard_normal(n_rows)
    y[rng.random(n_rows) < 0.3] = np.nan
    cn = rng.choice(["s", "t"], n_rows).astype(object)
    cn[rng.random(n_rows) < 0.3] = None
    return pd.DataFrame(
        {
            f"{prefix}ka": ka + offset,
            f"{prefix}kb": list(kb),
            "x0": rng.standard_normal(n_rows) * 10,
            "x1": rng.standard_normal(n_rows),
            "n": rng.integers(-2, 3, n_rows),
            "flag": rng.random(n_rows) < 0.5,
            "c": list(rng.choice(["p", "q", "r"], n_rows)),
            "cat": pd.Categorical(
                rng.choice(["lo", "hi"], n_rows), categories=["lo", "mid", "hi"]
            ),
            "y": y,
            "cn": list(cn),
            "w": rng.standard_normal(n_rows),
        }
    )


@st.composite
def feature_lists(draw, allow_empty=True):
    feats = draw(st.permutations(FEATURES))
    k = draw(st.integers(0 if allow_empty else 1, 4))
    return list(feats[:k])


@st.composite
def frame_schemas(draw):
    n_joins = draw(st.integers(0, 3))
    spec = {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "n_base": draw(st.integers(1, 12)),
        "base_features": []
        if n_joins and draw(st.booleans())  # a relationship table of keys only
        else draw(feature_lists(allow_empty=False)),
        "dtype": draw(st.sampled_from([np.float64, np.float32])),
        "sparse": draw(st.booleans()),
        "joins": [],
    }
    for i in range(n_joins):
        unique = draw(st.booleans())
        composite = draw(st.booleans())
        spec["joins"].append(
            {
                "name": f"t{i}",
                "how": draw(st.sampled_from(["inner", "left", "outer"])),
                "via": draw(st.sampled_from([None] + [f"t{h}" for h in range(i)])),
                "unique": unique,
                "composite": composite,
                "style": draw(st.sampled_from(["on", "left_on"])),
                "nomatch": draw(st.integers(0, 5)) == 5,
                "n_rows": draw(st.integers(1, 2 * K if composite else K))
                if unique
                else draw(st.integers(1, 8)),
                "features": draw(feature_lists()),
                "indicator": draw(st.booleans()),
            }
        )
    names = ["base"] + [j["name"] for j in spec["joins"]]
    feats = _features(spec)
    spec["categorical"] = {
        n: ["n"] if "n" in feats[n] and draw(st.booleans()) else [] for n in names
    }
    spec["impute"] = {
        n: draw(st.sampled_from(["zero", "mean", "median", 1.5])) for n in names
    }
    spec["coalesce"] = draw(st.booleans())
    if spec["coalesce"]:
        # "w" in at least two sources (a join may still leave a source unmatched).
        holders = [j["features"] for j in spec["joins"]]
        if spec["base_features"]:
            holders.append(spec["base_features"])
        for feats in draw(st.permutations(holders))[:2]:
            if "w" not in feats:
                feats.insert(draw(st.integers(0, len(feats))), "w")
    spec["priority"] = (
        list(draw(st.permutations(names))) if draw(st.booleans()) else None
    )
    if not spec["base_features"] and not any(j["features"] for j in spec["joins"]):
        spec["joins"][-1]["features"].append("x0")
    return spec


def build_inputs(spec):
    rng = np.random.default_rng(spec["seed"])
    # Base keys overshoot the domain a little: some rows match nothing.
    base = make_table(rng, spec["n_base"])
    base["ka"] = rng.integers(0, K + 1, spec["n_base"])
    tables = {"base": base}
    joins, keys = [], {}
    prefix_of = {"base": ""}  # key columns of each table are {prefix}ka, {prefix}kb
    for j in spec["joins"]:
        prefix = "r" if j["style"] == "left_on" else ""
        prefix_of[j["name"]] = prefix
        left_prefix = prefix_of[j["via"] or "base"]
        t = make_table(
            rng,
            j["n_rows"],
            prefix=prefix,
            unique=j["unique"],
            composite=j["composite"],
            offset=100 if j["nomatch"] else 0,
        )
        names = ["ka", "kb"] if j["composite"] else ["ka"]
        lnames = [left_prefix + k for k in names]
        rnames = [prefix + k for k in names]
        keys[j["name"]] = (lnames, rnames)
        if lnames == rnames and j["style"] == "on":
            kw = {"on": lnames[0] if len(lnames) == 1 else lnames}
        else:
            kw = {"left_on": lnames, "right_on": rnames}
        joins.append(
            Join(
                t,
                features=j["features"],
                how=j["how"],
                name=j["name"],
                via=j["via"],
                categorical=spec["categorical"][j["name"]],
                impute=spec["impute"][j["name"]],
                indicator=j["indicator"],
                **kw,
            )
        )
        tables[j["name"]] = t
    kwargs = {
        "base_name": "base",
        "base_categorical": spec["categorical"]["base"],
        "base_impute": spec["impute"]["base"],
        "sparse": spec["sparse"],
        "coalesce": ["w"] if spec["coalesce"] else [],
        "priority": spec["priority"],
        "dtype": spec["dtype"],
        # Joins that match nothing are part of the generated schemas.
        "min_match": 0,
    }
    return tables, joins, keys, kwargs


def _fill_value(s, impute):
    if impute == "zero":
        return 0.0
    if impute == "mean":
        return float(s.mean()) if s.notna().any() else 0.0
    if impute == "median":
        return float(s.median()) if s.notna().any() else 0.0
    return float(impute)


def _events(spec):
    """Label the scenario (shown by ``pytest --hypothesis-show-statistics``)."""
    joins = spec["joins"]
    depth = {"base": 0}
    for j in joins:
        depth[j["name"]] = depth[j["via"] or "base"] + 1
    event(f"sources with features: {sum(bool(f) for f in _features(spec).values())}")
    event(f"snowflake depth: {max(depth.values())}")
    for j in joins:
        event(f"join: {j['how']}, {'unique' if j['unique'] else 'one-to-many'}")
    if any(j["nomatch"] for j in joins):
        event("a join matching nothing")
    if any(j["composite"] for j in joins):
        event("composite key")
    if not spec["base_features"]:
        event("no base features (relationship table)")
    if spec["coalesce"] and sum("w" in f for f in _features(spec).values()) > 1:
        event("coalesced column from several sources")


def _features(spec):
    return {"base": spec["base_features"]} | {
        j["name"]: j["features"] for j in spec["joins"]
    }


def pandas_reference(spec, tables, keys):
    """Joined matrix, feature names and whether row order is comparable, from pandas.

    Also returns whether any feature was one-hot encoded. When ``from_frames`` must
    raise instead, the matrix is None and the names are the expected message.
    """
    feats = _features(spec)
    indicator = {"base": False} | {j["name"]: j["indicator"] for j in spec["joins"]}
    pref = {}
    for name, t in tables.items():
        t = t.copy()
        if "y" in t:
            t["y"] = t["y"].fillna(_fill_value(t["y"], spec["impute"][name]))
        t = t.add_prefix(f"{name}__")
        t[f"{name}__@m"] = 1.0
        pref[name] = t
    cur = _merge_chain(spec, pref, keys)
    ordered = all(j["how"] != "outer" for j in spec["joins"])  # pandas sorts them
    if len(cur) == 0:
        return None, "the joins leave no target rows: inner join", ordered, False

    order = list(tables)
    prio = (spec["priority"] or []) + [
        n for n in order if n not in (spec["priority"] or [])
    ]
    w_sources = [n for n in prio if "w" in feats[n]]
    columns, names, placed_w, one_hot = [], [], False, False
    for name in order:
        # A source with a categorical column is one-hot encoded (sparse when
        # asked), unless it adds no column at all (every categorical value
        # missing from the joined rows, no other feature): then it is dropped.
        before, categorical = len(columns), False
        for col in feats[name]:
            s = cur[f"{name}__{col}"]
            if col == "w" and spec["coalesce"]:
                if placed_w:
                    continue
                placed_w = True
                value = np.zeros(len(cur))
                done = np.zeros(len(cur), dtype=bool)
                for src in w_sources:
                    hit = cur[f"{src}__@m"].notna().to_numpy() & ~done
                    value[hit] = cur[f"{src}__w"].to_numpy(dtype=np.float64)[hit]
                    done |= hit
                columns.append(value)
                names.append(f"{w_sources[0]}__w")
            elif col in ("c", "cat", "cn") or col in spec["categorical"][name]:
                # The values that occur in the joined rows, sorted (OneHotEncoder's
                # categories on the merged table).
                present = set(s.dropna().tolist())
                cats = sorted(
                    v for v in tables[name][col].dropna().unique() if v in present
                )
                categorical = True
                for c in cats:
                    columns.append((s == c).fillna(False).to_numpy(dtype=np.float64))
                    names.append(f"{name}__{col}_{c}")
            else:
                columns.append(s.astype("float64").fillna(0.0).to_numpy())
                names.append(f"{name}__{col}")
        if indicator[name]:
            columns.append(cur[f"{name}__@m"].notna().to_numpy(dtype=np.float64))
            names.append(f"{name}__matched")
        one_hot = one_hot or (categorical and len(columns) > before)
    if not columns:  # e.g. a categorical column with only missing values
        return None, "no features selected", ordered, one_hot
    T = np.column_stack(columns).astype(spec["dtype"])
    return T, names, ordered, one_hot


def _sorted_rows(A):
    keys = np.round(A.astype(np.float64), 4)
    return A[np.lexsort(keys.T[::-1])] if A.shape[1] else A


def _assert_frames_unchanged(tables, copies):
    for name, t in tables.items():
        pd.testing.assert_frame_equal(t, copies[name], check_exact=True)


@given(spec=frame_schemas())
def test_from_frames_equals_pandas_merge(spec, check_operators):
    tables, joins, keys, kwargs = build_inputs(spec)
    copies = {n: t.copy(deep=True) for n, t in tables.items()}
    T, names, ordered, one_hot = pandas_reference(spec, tables, keys)
    _events(spec)
    if T is None:
        event(f"error: {names}")
        with pytest.raises(ValueError, match=names):
            from_frames(tables["base"], spec["base_features"], joins, **kwargs)
        _assert_frames_unchanged(tables, copies)
        return
    ds = from_frames(tables["base"], spec["base_features"], joins, **kwargs)
    _assert_frames_unchanged(tables, copies)
    assert isinstance(ds, MultiSourceDataset)
    assert ds.dtype == spec["dtype"]
    assert list(ds.feature_names) == names
    assert ds.shape == T.shape
    M = check_operators(ds, spec["seed"] % 1000)
    if not ordered:
        M, T = _sorted_rows(M), _sorted_rows(T)
    assert_close(M, T, bound=T, dtype=ds.dtype, err_msg="materialize() vs pandas.merge")
    # Sources with one-hot columns are CSR when sparse=True; all dense otherwise.
    assert ds.operator.is_sparse == (spec["sparse"] and one_hot)


@given(spec=frame_schemas(), split=st.integers(1, 11))
def test_union_of_frames_equals_concatenated_merges(spec, split, check_operators):
    # Union of the datasets built on two row ranges of the base with the same joins.
    # Inner/outer joins change the row sets per part, so compare left joins only.
    # A mean or median imputation of the base would be computed per part.
    for j in spec["joins"]:
        j["how"] = "left"
    spec["impute"]["base"] = "zero"
    tables, joins, keys, kwargs = build_inputs(spec)
    base = tables["base"]
    split = min(split, len(base) - 1)
    if split < 1:
        return
    parts = [
        base.iloc[:split].reset_index(drop=True),
        base.iloc[split:].reset_index(drop=True),
    ]
    try:
        dss = [from_frames(p, spec["base_features"], joins, **kwargs) for p in parts]
    except ValueError as exc:
        # A part whose only features are categorical columns with all values
        # missing encodes to no columns: there is no dataset to unite.
        if "no features selected" not in str(exc):
            raise
        event("a part without features")
        return
    if list(dss[0].feature_names) != list(dss[1].feature_names):
        with pytest.raises(ValueError, match="same feature names"):
            MultiSourceDataset.union(dss)
        return
    u = MultiSourceDataset.union(dss)
    whole = from_frames(base, spec["base_features"], joins, **kwargs)
    expected = np.vstack([d.materialize("dense") for d in dss])
    M = check_operators(u, split, slices=False)
    assert_close(
        M, expected, bound=expected, dtype=u.dtype, err_msg="union vs stacked parts"
    )
    if list(whole.feature_names) == list(u.feature_names):
        W = whole.materialize("dense")
        assert_close(M, W, bound=W, dtype=u.dtype, err_msg="union vs whole")


# -------------------------------------------------------------- worked examples
@pytest.fixture
def shop():
    orders = pd.DataFrame(
        {
            "oid": [1, 2, 3, 4, 5],
            "cid": [10, 11, 10, 12, 99],
            "amount": [5.0, 7.5, 1.0, 2.0, 3.0],
            "channel": ["web", "app", "web", "app", "web"],
        }
    )
    customers = pd.DataFrame(
        {"cid": [10, 11, 12, 13], "age": [30.0, 40.0, 50.0, 60.0], "rid": [1, 2, 1, 3]}
    )
    regions = pd.DataFrame({"rid": [1, 2, 3], "income": [1.5, 2.5, 3.5]})
    items = pd.DataFrame({"oid": [1, 1, 2, 4, 7], "qty": [1.0, 2.0, 3.0, 4.0, 5.0]})
    return orders, customers, regions, items


def test_star_snowflake_order_and_names(shop, check_operators):
    orders, customers, regions, items = shop
    ds = from_frames(
        orders,
        ["amount", "channel"],
        [
            Join(customers, on="cid", features=["age"], name="cust", indicator=True),
            Join(regions, on="rid", features=["income"], name="region", via="cust"),
        ],
        sparse=False,
    )
    assert list(ds.feature_names) == [
        "base__amount",
        "base__channel_app",
        "base__channel_web",
        "cust__age",
        "cust__matched",
        "region__income",
    ]
    expected = np.array(
        [
            [5.0, 0, 1, 30.0, 1, 1.5],
            [7.5, 1, 0, 40.0, 1, 2.5],
            [1.0, 0, 1, 30.0, 1, 1.5],
            [2.0, 1, 0, 50.0, 1, 1.5],
            [3.0, 0, 1, 0.0, 0, 0.0],  # customer 99 is unknown: zeros, matched 0
        ]
    )
    np.testing.assert_allclose(check_operators(ds), expected)
    assert ds.categories_ == {"base__channel": ["app", "web"]}


@pytest.mark.parametrize(
    ("how", "rows"),
    [
        ("inner", [[5.0, 1.0], [5.0, 2.0], [7.5, 3.0], [2.0, 4.0]]),
        (
            "left",
            [[5.0, 1.0], [5.0, 2.0], [7.5, 3.0], [1.0, 0.0], [2.0, 4.0], [3.0, 0.0]],
        ),
        (
            "outer",
            [
                [5.0, 1.0],
                [5.0, 2.0],
                [7.5, 3.0],
                [1.0, 0.0],
                [2.0, 4.0],
                [3.0, 0.0],
                [0.0, 5.0],
            ],
        ),
    ],
)
def test_one_to_many_row_order(shop, how, rows, check_operators):
    orders, _, _, items = shop
    ds = from_frames(
        orders, ["amount"], [Join(items, on="oid", features=["qty"], how=how)]
    )
    # Target rows keep the base order, matches in the joined table's order; outer
    # joins append the joined table's unmatched rows at the end.
    np.testing.assert_allclose(check_operators(ds), rows)


def test_many_to_many_relationship_table(check_operators):
    ratings = pd.DataFrame(
        {"user": [0, 0, 1, 2, 2, 2], "movie": ["a", "b", "a", "c", "b", "a"]}
    )
    users = pd.DataFrame({"user": [2, 1, 0], "age": [20.0, 30.0, 40.0]})
    movies = pd.DataFrame({"movie": ["c", "b", "a"], "genre": ["x", "y", "x"]})
    ds = from_frames(
        ratings,
        (),
        [
            Join(users, on="user", features=["age"], name="users"),
            Join(movies, on="movie", features=["genre"], name="movies"),
        ],
    )
    assert ds.source_names == ["users", "movies"]
    assert ds.operator.is_sparse
    ref = ratings.merge(users, on="user", how="left").merge(
        movies, on="movie", how="left"
    )
    expected = np.column_stack(
        [ref["age"], ref["genre"] == "x", ref["genre"] == "y"]
    ).astype(float)
    np.testing.assert_allclose(check_operators(ds), expected)
    assert ds.describe().sources["tuple_ratio"].tolist() == [2.0, 2.0]


def test_coalesce_with_priority(check_operators):
    patients = pd.DataFrame({"pid": [1, 2, 3, 4], "weight": [70.0, 80.0, 90.0, 60.0]})
    visits = pd.DataFrame({"pid": [2, 4], "weight": [81.0, 61.0], "bp": [120.0, 130.0]})
    # Default priority: the base owns "weight" on every row it has.
    ds = from_frames(
        patients,
        ["weight"],
        [Join(visits, on="pid", features=["weight", "bp"], name="visit")],
        coalesce=["weight"],
    )
    assert list(ds.feature_names) == ["base__weight", "visit__bp"]
    np.testing.assert_allclose(check_operators(ds)[:, 0], [70.0, 80.0, 90.0, 60.0])
    # The visit first: it owns the rows it matched, the base fills in the others.
    ds = from_frames(
        patients,
        ["weight"],
        [Join(visits, on="pid", features=["weight", "bp"], name="visit")],
        coalesce=["weight"],
        priority=["visit", "base"],
    )
    assert list(ds.feature_names) == ["visit__weight", "visit__bp"]
    np.testing.assert_allclose(check_operators(ds)[:, 0], [70.0, 81.0, 90.0, 61.0])
    # Without coalescing, both columns are kept side by side.
    ds = from_frames(
        patients,
        ["weight"],
        [Join(visits, on="pid", features=["weight"], name="visit")],
    )
    assert list(ds.feature_names) == ["base__weight", "visit__weight"]


def test_composite_keys_and_left_on_right_on(check_operators):
    flights = pd.DataFrame(
        {
            "origin": ["EWR", "JFK", "EWR", "LGA"],
            "hour": [1, 1, 2, 2],
            "dest": ["JFK", "EWR", "LGA", "XXX"],
            "dist": [1.0, 2.0, 3.0, 4.0],
        }
    )
    weather = pd.DataFrame(
        {
            "origin": ["EWR", "EWR", "JFK", "LGA"],
            "hour": [1, 2, 1, 1],
            "temp": [10.0, 11.0, 12.0, 13.0],
        }
    )
    airports = pd.DataFrame({"faa": ["EWR", "JFK", "LGA"], "alt": [18.0, 13.0, 22.0]})
    ds = from_frames(
        flights,
        ["dist"],
        [
            Join(weather, on=["origin", "hour"], features=["temp"], name="weather"),
            Join(
                airports,
                left_on="origin",
                right_on="faa",
                features=["alt"],
                name="orig",
            ),
            Join(
                airports, left_on="dest", right_on="faa", features=["alt"], name="dest"
            ),
        ],
    )
    assert list(ds.feature_names) == [
        "base__dist",
        "weather__temp",
        "orig__alt",
        "dest__alt",
    ]
    expected = [
        [1.0, 10.0, 18.0, 13.0],
        [2.0, 12.0, 13.0, 18.0],
        [3.0, 11.0, 18.0, 22.0],
        [4.0, 0.0, 22.0, 0.0],
    ]
    np.testing.assert_allclose(check_operators(ds), expected)


def test_left_join_matching_nothing_gives_zero_columns(check_operators):
    base = pd.DataFrame({"k": [1, 2, 3], "a": [1.0, 2.0, 3.0]})
    other = pd.DataFrame({"k": [7, 8], "b": [5.0, 6.0]})
    join = Join(other, on="k", features=["b"], indicator=True)
    with pytest.raises(ValueError, match="matched 0 of 3 rows.*min_match=0"):
        from_frames(base, ["a"], [join])
    ds = from_frames(base, ["a"], [join], min_match=0)
    M = check_operators(ds)
    np.testing.assert_allclose(M, [[1.0, 0, 0], [2.0, 0, 0], [3.0, 0, 0]])
    assert ds.describe().sources.loc["join0", "matched"] == 0.0


def test_imputation_and_categorical_missing_values(check_operators):
    t = pd.DataFrame(
        {
            "k": [0, 1, 2, 3],
            "v": [1.0, np.nan, 3.0, np.nan],
            "g": ["a", None, "b", "a"],
        }
    )
    base = pd.DataFrame({"k": [3, 2, 1, 0, 5]})
    for impute, fill in (("zero", 0.0), ("mean", 2.0), ("median", 2.0), (-1.0, -1.0)):
        ds = from_frames(
            base, (), [Join(t, on="k", features=["v", "g"], impute=impute, name="t")]
        )
        expected = [
            [fill, 1, 0],
            [3.0, 0, 1],
            [fill, 0, 0],  # a missing category is an all-zero one-hot row
            [1.0, 1, 0],
            [0.0, 0, 0],  # unmatched: zeros, not the imputed value
        ]
        np.testing.assert_allclose(check_operators(ds), expected)
        assert ds.categories_ == {"t__g": ["a", "b"]}


def test_forced_categorical_and_boolean_features(check_operators):
    base = pd.DataFrame({"n": [3, 1, 3, 2], "b": [True, False, True, True]})
    ds = from_frames(base, ["n", "b"], base_categorical=["n"], dtype=np.float32)
    assert list(ds.feature_names) == ["base__n_1", "base__n_2", "base__n_3", "base__b"]
    assert ds.dtype == np.float32
    np.testing.assert_allclose(
        check_operators(ds), [[0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]]
    )


def test_classmethod_matches_function(shop):
    orders, customers, _, _ = shop
    joins = [Join(customers, on="cid", features=["age"])]
    a = MultiSourceDataset.from_frames(orders, ["amount"], joins, dtype=np.float32)
    b = from_frames(orders, ["amount"], joins, dtype=np.float32)
    np.testing.assert_array_equal(a.materialize(), b.materialize())
    assert list(a.feature_names) == list(b.feature_names)


def test_a_string_names_one_column(shop):
    orders, customers, _, _ = shop
    ds = from_frames(
        orders,
        "amount",
        [Join(customers, on="cid", features="age", name="cust")],
        coalesce="amount",  # supplied by one table only: kept as is
    )
    assert list(ds.feature_names) == ["base__amount", "cust__age"]
    np.testing.assert_allclose(ds.materialize()[:, 0], orders["amount"])


@pytest.mark.parametrize(
    "keys",
    [
        [-3, 0, 5, 2],  # small range: integer keys are their own codes
        [10**12, -(10**12), 7, 2**40],  # wide range: hashed
        np.array([3, 9, 0, 2**63 + 5], dtype=np.uint64),  # unsigned, wide
    ],
    ids=["small-range", "wide-range", "uint64"],
)
def test_integer_keys_of_any_range(keys, check_operators):
    keys = np.asarray(keys)
    dim = pd.DataFrame({"k": keys, "b": [1.0, 2.0, 3.0, 4.0]})
    fact = pd.DataFrame(
        {"k": keys[[3, 0, 0, 2, 1, 3]].astype(keys.dtype), "a": np.arange(6.0)}
    )
    fact.loc[5, "k"] = keys[0] + 1 if keys[0] + 1 not in keys else keys[0] + 2
    ds = from_frames(fact, ["a"], [Join(dim, on="k", features=["b"])])
    expected = fact.merge(dim, on="k", how="left").fillna(0.0)[["a", "b"]]
    np.testing.assert_allclose(check_operators(ds), expected.to_numpy())


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_float_block_copy_equals_column_by_column(monkeypatch, dtype):
    """Large all-float tables are copied as one block: same dataset as the
    column-by-column path, no memory shared with the frame, and NaN or non-float
    columns still go through the per-column checks."""
    from ilargi_sklearn.multisource import _encoding

    rng = np.random.default_rng(0)
    base = pd.DataFrame(
        {
            "k": rng.integers(0, 4, 40),
            "a": rng.standard_normal(40),
            "b": rng.standard_normal(40).astype(np.float32),
            "c": rng.standard_normal(40),
        }
    )
    dim = pd.DataFrame({"k": range(4), "d": rng.standard_normal(4), "n": [1, 2, 3, 4]})
    joins = [Join(dim, on="k", features=["d", "n"], name="dim")]
    ref = from_frames(base, ["a", "b", "c"], joins, dtype=dtype)
    monkeypatch.setattr(_encoding, "_BLOCK_COPY_MIN", 0)
    got = from_frames(base, ["a", "b", "c"], joins, dtype=dtype)
    assert list(got.feature_names) == list(ref.feature_names)
    assert got.dtype == ref.dtype == dtype
    before = got.materialize()
    np.testing.assert_array_equal(before, ref.materialize())
    base.loc[0, "a"] = 1e6  # the dataset keeps its own copy
    np.testing.assert_array_equal(got.materialize(), before)

    base.loc[1, "c"] = np.nan
    with pytest.raises(ValueError, match=r"column 'c' has 1 NaN"):
        from_frames(base, ["a", "b", "c"], joins, dtype=dtype)
    imputed = from_frames(base, ["a", "b", "c"], joins, base_impute="zero")
    assert imputed.materialize()[1, 2] == 0.0
    base.loc[2, "b"] = np.inf
    with pytest.raises(ValueError, match=r"column 'b' contains infinite"):
        from_frames(base, ["a", "b", "c"], joins, base_impute="zero")


def test_huge_finite_values_are_not_taken_for_infinite():
    # The all-finite test of a column is its sum; a sum that overflows only
    # sends the column through the element-wise checks, which accept it.
    base = pd.DataFrame({"a": [1e308, 1e308, -1.0], "b": [np.nan, 2.0, 3.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no overflow warning
        ds = from_frames(base, ["a", "b"], [], base_impute="zero")
    np.testing.assert_array_equal(
        ds.materialize(), [[1e308, 0.0], [1e308, 2.0], [-1.0, 3.0]]
    )
    base.loc[2, "a"] = -np.inf
    with pytest.raises(ValueError, match=r"column 'a' contains infinite"):
        from_frames(base, ["a", "b"], [], base_impute="zero")


def _merge_chain(spec, pref, keys):
    """The chain of ``pandas.merge`` calls over tables with prefixed columns."""
    cur = pref["base"]
    for j in spec["joins"]:
        left = j["via"] or "base"
        lk, rk = keys[j["name"]]
        cur = cur.merge(
            pref[j["name"]],
            left_on=[f"{left}__{k}" for k in lk],
            right_on=[f"{j['name']}__{k}" for k in rk],
            how=j["how"],
        )
    return cur


def _merged_target(spec, tables, keys, target):
    """The base column ``target`` after the chain of ``pandas.merge`` calls."""
    pref = {name: t.add_prefix(f"{name}__") for name, t in tables.items()}
    pref["base"] = pref["base"].assign(**{f"base__{target}": target_values(tables)})
    cur = _merge_chain(spec, pref, keys)
    return cur[f"base__{target}"].to_numpy(dtype=np.float64)


def target_values(tables):
    return np.arange(len(tables["base"]), dtype=np.float64) * 10 + 0.5


@given(spec=frame_schemas())
def test_aligned_target_equals_the_merged_target_column(spec):
    """ds.align(y) is the merged frame's target column, row for row (as a multiset
    where pandas sorts outer-join keys); a slice and the target= option agree."""
    tables, joins, keys, kwargs = build_inputs(spec)
    expected = _merged_target(spec, tables, keys, "target")
    if len(expected) == 0:
        return  # the joins leave no rows: from_frames raises (tested above)
    y = pd.Series(target_values(tables), index=tables["base"].index)
    try:
        ds, got = from_frames(
            tables["base"].assign(target=y),
            spec["base_features"],
            joins,
            target="target",
            **kwargs,
        )
    except ValueError as exc:
        # Only categorical columns whose values all are missing: no columns, a
        # clear error (tested with the matrices above), no dataset to align.
        if "no features selected" not in str(exc):
            raise
        event("no features")
        return
    assert ds.n_base_rows_ == len(tables["base"])
    rows = ds.base_rows_
    assert ((rows >= -1) & (rows < ds.n_base_rows_)).all()
    aligned = ds.align(y, fill_value=np.nan).to_numpy()
    np.testing.assert_array_equal(got.fillna(np.nan).to_numpy(), aligned)
    if any(j["how"] == "outer" for j in spec["joins"]):
        np.testing.assert_array_equal(np.sort(aligned), np.sort(expected))
    else:
        np.testing.assert_array_equal(aligned, expected)
    # A slice (what cross-validation does) takes its rows' targets.
    pick = np.arange(len(ds))[::2]
    np.testing.assert_array_equal(
        ds[pick].align(y.to_numpy(), fill_value=np.nan), aligned[pick]
    )
