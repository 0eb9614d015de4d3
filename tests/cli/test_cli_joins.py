"""Joins in specs: scoring a Python-trained model with a spec, and the hints a spec
user can follow (``strip``, ``row_number``, ``validate``), and ``ilargi predict``
saying when it writes more rows than the base table had."""

from __future__ import annotations

import warnings
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest
from _cli_data import SPEC, run, variant, write_star

from ilargi_sklearn import Join, MultiSourceDataset
from ilargi_sklearn.cli import load_spec
from ilargi_sklearn.linear_model import FactorizedLinearRegression
from ilargi_sklearn.multisource import DatasetSchema


@pytest.fixture
def star(tmp_path):
    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC)
    return spec


def frames_of(folder: Path) -> dict[str, pd.DataFrame]:
    return {
        name: pd.read_csv(folder / f"{name}.csv")
        for name in ("sales", "products", "brands", "customers")
    }


def python_joins(f, **products):
    """The star spec's joins, written as a Python user would."""
    return [
        Join(
            f["products"],
            on="product_id",
            features=["price", "category"],  # category left implicit (text)
            name="products",
            **products,
        ),
        Join(
            f["brands"],
            via="products",
            on=["brand_id"],
            features=["rating"],
            name="brands",
        ),
        Join(
            f["customers"],
            on="customer_id",
            features=["age"],
            indicator=True,
            name="customers",
        ),
    ]


# ------------------------------------------------------------ scoring
def test_predict_scores_a_model_trained_in_python_with_the_spec(star, tmp_path, capsys):
    """on="k" against on=["k"] and left_on/right_on, a text column implicit
    against listed as categorical: the spec's joins are the training ones."""
    f = frames_of(star.parent / "data")
    sales = f["sales"].dropna(subset=["y"]).reset_index(drop=True)
    ds, y = MultiSourceDataset.from_frames(
        sales, ["quantity"], python_joins(f), base_name="sales", target="y"
    )
    model = FactorizedLinearRegression().fit(ds, y)
    joblib.dump(model, tmp_path / "py.joblib")
    new = f["sales"].drop(columns="y").iloc[:30]
    new.to_csv(tmp_path / "new.csv", index=False)
    dest = tmp_path / "scores.csv"
    code, out, err = run(
        [
            "predict",
            tmp_path / "py.joblib",
            "--spec",
            star,
            "--table",
            f"sales={tmp_path / 'new.csv'}",
            "--out",
            dest,
        ],
        capsys,
    )
    assert code == 0, err
    assert "scored 30 rows" in out and "predictions for" not in err
    expected = model.predict(ds.schema_.build(new, python_joins(f)))
    np.testing.assert_allclose(pd.read_csv(dest)["prediction"], expected, rtol=1e-12)


def test_schema_accepts_equivalent_joins_and_names_real_differences(star):
    f = frames_of(star.parent / "data")
    sales = f["sales"].dropna(subset=["y"]).reset_index(drop=True)
    ds = MultiSourceDataset.from_frames(
        sales, ["quantity"], python_joins(f), base_name="sales"
    )
    schema = ds.schema_
    expected = ds.materialize().toarray()
    j = python_joins(f)
    variants = {
        "on as a list": [
            j[0].__class__(**{**j[0].__dict__, "on": ["product_id"]}),
            *j[1:],
        ],
        "left_on and right_on": [
            Join(
                f["products"],
                left_on="product_id",
                right_on=["product_id"],
                features=["category", "price"],
                categorical=["category"],
                name="products",
                min_match=0.1,  # a check, not a definition: may differ
            ),
            *j[1:],
        ],
    }
    for what, joins in variants.items():
        got = schema.build(sales, joins).materialize().toarray()
        np.testing.assert_array_equal(got, expected, err_msg=what)
    wrong = {
        "keys": (
            Join(
                f["products"],
                left_on="quantity",
                right_on="product_id",
                name="products",
            ),
            r"join 'products': the keys \(left_on='quantity', right_on='product_id'\) "
            r"differ from the schema's \(left \['product_id'\] = right \['product_id'\]\)",
        ),
        "features": (
            Join(f["products"], on="product_id", features=["price"], name="products"),
            r"features=\['price'\] differs",
        ),
        "categorical": (
            Join(
                f["products"],
                on="product_id",
                features=["price", "category"],
                categorical=["price", "category"],
                name="products",
            ),
            r"categorical=\['price', 'category'\] differs",
        ),
        "how": (
            Join(f["products"], on="product_id", how="inner", name="products"),
            r"how='inner' differs from the schema's how='left'",
        ),
    }
    for join, pattern in wrong.values():
        with pytest.raises(ValueError, match=pattern):
            schema.build(sales, [join, *j[1:]])


def test_a_numeric_column_forced_categorical_must_be_listed_again(star):
    f = frames_of(star.parent / "data")
    sales = f["sales"].dropna(subset=["y"]).reset_index(drop=True)
    joins = python_joins(f, categorical=["category"])
    joins[1] = Join(
        f["brands"], via="products", on="brand_id", features=["rating", "brand_id"],
        categorical=["brand_id"], name="brands",
    )  # fmt: skip
    ds = MultiSourceDataset.from_frames(sales, ["quantity"], joins, base_name="sales")
    ok = Join(
        f["brands"], via="products", on="brand_id", features=["brand_id", "rating"],
        categorical=["brand_id"], name="brands",
    )  # fmt: skip
    ds.schema_.build(sales, [joins[0], ok, joins[2]])
    numeric = Join(
        f["brands"], via="products", on="brand_id", features=["rating", "brand_id"],
        categorical=["rating"], name="brands",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"join 'brands': categorical=\['rating'\]"):
        ds.schema_.build(sales, [joins[0], numeric, joins[2]])


# ------------------------------------------------------------ hints
def padded_spec(tmp_path: Path, strip: bool = False) -> Path:
    rng = np.random.default_rng(0)
    stores = pd.DataFrame(
        {"store": [f"S{i}" for i in range(40)], "size": rng.uniform(1, 9, 40)}
    )
    stores.loc[3, "store"] = ' "S3" '
    sales = pd.DataFrame(
        {
            "store": rng.choice([f"S{i}" for i in range(40)], 600),
            "q": rng.integers(1, 5, 600),
        }
    )
    sales["y"] = 2.0 * sales["q"] + rng.normal(size=600)
    sales["rating_id"] = rng.integers(1, 31, 600)
    sales.loc[:1, "rating_id"] = [1, 30]
    ratings = pd.DataFrame({"stars": rng.uniform(0, 5, 30)})
    for name, frame in (("sales", sales), ("stores", stores), ("ratings", ratings)):
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
    spec = tmp_path / "shop.toml"
    spec.write_text(
        f"""\
base = "sales"
[tables.sales]
path = "sales.csv"
numeric = ["q"]
[tables.stores]
path = "stores.csv"
key = "store"
numeric = ["size"]
{'strip = ["store"]' if strip else ""}
[tables.ratings]
path = "ratings.csv"
numeric = ["stars"]
[[joins]]
table = "stores"
on = "store"
[[joins]]
table = "ratings"
left_on = "rating_id"
row_number = 0
[target]
column = "y"
[estimator]
name = "FactorizedLinearRegression"
plan = "factorized"
[cv]
folds = 0
"""
    )
    return spec


def test_spec_hints_for_padded_keys_and_row_numbers(tmp_path, capsys):
    spec = padded_spec(tmp_path)
    code, out, err = run(["fit", spec, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "join 'stores'" in err and "'S3' against ' \"S3\" '" in err
    assert (
        'In the spec: strip = ["store"] in [tables.sales] and strip = ["store"] in [tables.stores]'
        in err
    )
    assert "The keys of sales.rating_id span 1..30" in err
    assert "In the spec: row_number = 1 with left_on" in err
    # Following the hints: every key matches, nothing to say.
    fixed = variant(
        padded_spec(tmp_path, strip=True), "row_number = 0", "row_number = 1"
    )
    code, out, err = run(["fit", fixed, "--out", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "note: join" not in err
    assert "join stores (left): matched 600 of 600 rows (100%)" in out
    assert "join ratings (left): matched 600 of 600 rows (100%)" in out


def test_strip_takes_text_columns_that_the_file_has(tmp_path, capsys):
    spec = padded_spec(tmp_path, strip=True)
    bad = variant(spec, 'strip = ["store"]', 'strip = ["size"]')
    code, _, err = run(["fit", bad, "--out", tmp_path / "out"], capsys)
    assert code == 2
    assert "tables.stores.strip" in err and "strip applies to text columns" in err
    bad = variant(spec, 'strip = ["store"]', 'strip = ["stor"]')
    code, _, err = run(["fit", bad, "--out", tmp_path / "out"], capsys)
    assert (
        code == 2 and "column 'stor' not found" in err and "Did you mean 'store'" in err
    )


def test_left_on_without_a_right_key_suggests_row_number(star, tmp_path, capsys):
    bad = variant(star, 'left_on = "customer_id"', 'left_on = "quantity"')
    bad = variant(bad, 'key = "customer_id"\n', "")
    code, _, err = run(["fit", bad, "--out", tmp_path / "out"], capsys)
    assert code == 2
    assert "or row_number = 1 to this join if 'quantity' numbers the rows" in err


# ------------------------------------------------------------ fan-out
def fanned_out(star: Path) -> Path:
    """The star data with one customer listed twice."""
    d = star.parent / "data"
    customers = pd.read_csv(d / "customers.csv")
    pd.concat([customers, customers.iloc[[5]]]).to_csv(d / "customers.csv", index=False)
    return star


def test_fit_reports_and_explains_repeated_rows(star, tmp_path, capsys):
    spec = fanned_out(star)
    code, out, err = run(["fit", spec, "--out", tmp_path / "out", "--cv", "0"], capsys)
    assert code == 0, err
    assert "join 'customers'" in err and "repeats rows" in err and "'C5'" in err
    assert 'In the spec: validate = "many_to_many"' in err
    assert "join customers (left): matched" in out and "repeats rows" in out
    declared = variant(spec, "indicator = true", 'indicator = true\nvalidate = "m:m"')
    code, out, err = run(
        ["fit", declared, "--out", tmp_path / "o2", "--cv", "0"], capsys
    )
    assert code == 0 and "repeats rows: 1 key" not in err
    strict = variant(
        spec, "indicator = true", 'indicator = true\nvalidate = "many_to_one"'
    )
    code, _, err = run(["fit", strict, "--out", tmp_path / "o3"], capsys)
    assert code == 2 and "joins[3]" in err and "'C5'" in err
    bad = variant(spec, "indicator = true", 'indicator = true\nvalidate = "1:n"')
    code, _, err = run(["fit", bad, "--out", tmp_path / "o4"], capsys)
    assert code == 2 and "joins[3].validate: validate must be one of" in err


def test_predict_says_when_it_writes_more_rows_than_the_base_had(
    star, tmp_path, capsys
):
    out_dir = tmp_path / "out"
    code, _, err = run(["fit", star, "--out", out_dir, "--cv", "0"], capsys)
    assert code == 0, err
    fanned_out(star)
    dest = tmp_path / "p.csv"
    code, out, err = run(["predict", out_dir / "star.joblib", "--out", dest], capsys)
    assert code == 0, err
    base = pd.read_csv(star.parent / "data" / "sales.csv")
    n_rows = len(pd.read_csv(dest))
    n_c5 = int((base["customer_id"] == "C5").sum())
    assert n_rows == len(base) + n_c5
    assert f"note: writing {n_rows:,} predictions for {len(base):,} base rows" in err
    assert "join customers repeats base rows" in err and "'C5'" in err


def test_predict_leaves_keys_of_rows_without_a_base_row_missing(star, tmp_path, capsys):
    """Rows an outer join adds have no base row: their keys were read from the
    last base row (index -1)."""
    d = star.parent / "data"
    customers = pd.read_csv(d / "customers.csv")
    extra = pd.DataFrame({"customer_id": ["NOBODY"], "age": [40]})
    pd.concat([customers, extra]).to_csv(d / "customers.csv", index=False)
    spec = variant(
        star, 'how = "left"\nindicator', 'how = "outer"\nindicator', "outer.toml"
    )
    out_dir = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, _, err = run(["fit", spec, "--out", out_dir, "--cv", "0"], capsys)
    assert code == 0, err
    dest = tmp_path / "p.csv"
    code, _, err = run(
        ["predict", out_dir / "outer.joblib", "--spec", spec, "--out", dest], capsys
    )
    assert code == 0, err
    got = pd.read_csv(dest)
    orphans = got["base_row"] < 0
    assert orphans.any()
    assert got.loc[orphans, "customer_id"].isna().all()
    assert got.loc[~orphans, "customer_id"].notna().all()
    schema = DatasetSchema.of(joblib.load(out_dir / "outer.joblib"))
    assert schema is not None and load_spec(spec).joins[2]["how"] == "outer"
