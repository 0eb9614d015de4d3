"""The command line's test data, shared by the CLI tests and the cross-cutting
ones (cold start, faults): a tiny star schema on disk, its TOML spec, and running
the CLI in-process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ilargi_sklearn.cli import main


def run(argv, capsys):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def write_star(folder: Path, n: int = 400, seed: int = 0) -> None:
    """A tiny star schema with a snowflake hop and a string key."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    brands = pd.DataFrame({"brand_id": np.arange(5), "rating": rng.uniform(1, 5, 5)})
    products = pd.DataFrame(
        {
            "product_id": np.arange(30),
            "brand_id": rng.integers(0, 5, 30),
            "price": rng.uniform(1, 50, 30),
            "category": rng.choice(["a", "b", "c"], 30),
        }
    )
    customers = pd.DataFrame(
        {"customer_id": [f"C{i}" for i in range(40)], "age": rng.integers(18, 80, 40)}
    )
    cust = np.array(customers["customer_id"])[rng.integers(0, 40, n)]
    cust[rng.random(n) < 0.1] = "GUEST"
    sales = pd.DataFrame(
        {
            "customer_id": cust,
            "product_id": rng.integers(0, 30, n),
            "quantity": rng.integers(1, 5, n),
        }
    )
    p = products.set_index("product_id").loc[sales["product_id"]]
    b = brands.set_index("brand_id").loc[p["brand_id"]]
    sales["y"] = (
        2.0 * sales["quantity"].to_numpy()
        + 0.5 * p["price"].to_numpy()
        + 3.0 * b["rating"].to_numpy()
        + rng.normal(0, 0.5, n)
    )
    sales.loc[3, "y"] = np.nan  # a row without a target is dropped
    for name, frame in [
        ("sales", sales),
        ("products", products),
        ("brands", brands),
        ("customers", customers),
    ]:
        frame.to_csv(folder / f"{name}.csv", index=False)


SPEC = """\
base = "sales"

[tables.sales]
path = "data/sales.csv"
numeric = ["quantity"]

[tables.products]
path = "data/products.csv"
key = "product_id"
numeric = ["price"]
categorical = ["category"]

[tables.brands]
path = "data/brands.csv"
key = "brand_id"
numeric = ["rating"]

[tables.customers]
path = "data/customers.csv"
key = "customer_id"
numeric = ["age"]

[[joins]]
table = "products"
on = "product_id"

[[joins]]
table = "brands"
via = "products"
on = "brand_id"

[[joins]]
table = "customers"
left_on = "customer_id"
how = "left"
indicator = true

[target]
column = "y"

[estimator]
name = "FactorizedLinearRegression"
plan = "factorized"

[cv]
folds = 3
scoring = "r2"
"""


def variant(spec: Path, old: str, new: str, name: str = "bad.toml") -> Path:
    text = spec.read_text()
    assert old in text, old
    out = spec.parent / name
    out.write_text(text.replace(old, new, 1))
    return out
