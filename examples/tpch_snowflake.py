"""TPC-H as a snowflake schema: lineitem -> orders -> customer -> nation, part, supplier.

Run with ``python examples/tpch_snowflake.py`` (scale 0.01: a few seconds after a
one-off generation of 1-2 s). Set ``ILARGI_EXAMPLE_SMALL=1`` for scale 0.002.

Needs the ``tpchgen-cli`` tool (an optional extra: ``pip install
'ilargi-sklearn[tpch]'``); without it the example says so and exits. The tables are
generated once into ``$ILARGI_DATA_DIR/tpch`` (default
``~/.cache/ilargi_sklearn/tpch``) and read from there afterwards.

customer joins *via* orders and nation via customer: the index vectors compose
(lineitem row -> order row -> customer row), no feature data is touched.
"""

import os
import sys
import time

from sklearn.model_selection import KFold, cross_val_score

from ilargi_sklearn import FactorizedLinearRegression
from ilargi_sklearn.datasets import load_tpch

SMALL = os.environ.get("ILARGI_EXAMPLE_SMALL") == "1"


def main() -> int:
    scale = 0.002 if SMALL else 0.01
    t0 = time.perf_counter()
    try:
        data = load_tpch(scale)
    except ImportError as exc:
        print(f"skipped: {exc}")
        return 0
    ds = data.dataset
    print(f"TPC-H sf{scale:g} in {time.perf_counter() - t0:.2f} s: {ds!r}\n")
    print(ds.describe(), "\n")

    t0 = time.perf_counter()
    r2 = cross_val_score(
        FactorizedLinearRegression(),
        ds,
        data.target,
        cv=KFold(5, shuffle=True, random_state=0),
    )
    print(
        f"log(l_extendedprice) from the snowflake's features: R^2 {r2.mean():.3f} "
        f"+/- {r2.std():.3f} (5 folds, {time.perf_counter() - t0:.2f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
