"""The learned cost model: CatBoost over plan features, with a roofline fallback.

The model predicts, for one plan, ``log10(measured seconds / roofline seconds)``:
the roofline estimate of :func:`plan_costs` carries the scaling with data size
(trees cannot extrapolate beyond their training range), the trees learn how far
each kind of operation is from its roofline on this machine. The predicted time of
a plan is the roofline time times ``10 ** prediction``.

CatBoost is an optional dependency (``pip install 'ilargi-sklearn[planner]'``),
imported only when a model is loaded or trained. A missing or unreadable model, or
a missing CatBoost, gives one warning per model path and the roofline estimates
alone: a fit never fails because of the cost model.

Every model file is saved with a checksum file next to it (``cost_model.cbm`` and
``cost_model.cbm.sha256``, in the format of ``sha256sum``), and is loaded only when
the two agree: CatBoost's loader trusts the bytes it reads, and a file with one
byte flipped either loads as a silently different model or crashes the process
(a segmentation fault inside the native loader, which no ``except`` catches). A
file that fails the check, or has no checksum, is not read at all: the user's
calibrated model falls back to the shipped one, the shipped one (or a model named
by its path) to the roofline estimates, each with one warning.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ilargi_sklearn.planner._features import (
    COMPONENTS,
    model_inputs,
    plan_costs,
    split_plan,
    unit_costs,
    with_iterations,
)
from ilargi_sklearn.planner._hardware import cache_dir

__all__ = [
    "CostModel",
    "checksum_path",
    "default_model_path",
    "fit_cost_model",
    "fit_efficiency",
    "load_cost_model",
    "read_records",
    "save_cost_model",
    "shipped_model_path",
    "shipped_records_path",
    "train_cost_model",
    "training_table",
]

logger = logging.getLogger(__name__)

#: What the model predicts; a model with another target is not used.
TARGET = "log10_seconds_over_calibrated_roofline_v2"
_MODEL_FILE = "cost_model.cbm"
# Compressed: 6 MB of JSON lines, a tenth of it in the package.
_RECORDS_FILE = "calibration.jsonl.gz"
_CHECKSUM_SUFFIX = ".sha256"

_lock = threading.Lock()
_loaded: dict[tuple[str, int, int], CostModel] = {}
# Versions of a model file and its checksum file that failed to load (checked,
# warned about): not read again.
_failed: set[tuple[str, int, int, int | None]] = set()
_warned: set[str] = set()


def shipped_model_path() -> Path:
    """The default model shipped with the package (trained by its developers)."""
    return Path(str(resources.files("ilargi_sklearn.planner") / "data" / _MODEL_FILE))


def shipped_records_path() -> Path:
    """The timing records the shipped model was trained on."""
    return shipped_model_path().with_name(_RECORDS_FILE)


def default_model_path() -> Path:
    """The model ``cost_model="default"`` uses.

    The model of the user's own calibration (``cost_model.cbm`` in the cache
    directory, see :func:`~ilargi_sklearn.planner.calibrate`) when there is one,
    else the shipped model.
    """
    user = cache_dir() / _MODEL_FILE
    return user if user.is_file() else shipped_model_path()


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


class CostModel:
    """Predicts each plan's fit time.

    Parameters
    ----------
    booster : catboost.CatBoostRegressor or None
        The trained model; None predicts with the roofline model alone.
    source : str
        Where the model came from (a path, or ``"analytical"``).
    gpu_trained : bool
        Whether the training data held GPU timings (else GPU plans use the roofline).
    efficiency : dict of str to float, optional
        Per cost component, the measured slow-down against the hardware rates
        (CPU plans; see :func:`fit_efficiency`).
    records_until : float, optional
        Time stamp (``time.time()``) of the newest calibration record the model was
        trained on; records after it are new to the model. None when unknown.
    """

    def __init__(
        self,
        booster: Any = None,
        source: str = "analytical",
        gpu_trained: bool = False,
        efficiency: dict[str, float] | None = None,
        records_until: float | None = None,
    ) -> None:
        self.booster = booster
        self.source = source
        self.gpu_trained = gpu_trained
        self.efficiency = dict(efficiency or {})
        self.records_until = records_until

    @property
    def is_learned(self) -> bool:
        return self.booster is not None

    def predict(
        self,
        features: dict[str, Any],
        plans: Sequence[str],
        cached: dict[str, bool] | None = None,
        stats_cached: dict[str, bool | str | None] | None = None,
    ) -> dict[str, float]:
        """Predicted seconds of each plan.

        Parameters
        ----------
        features : dict
            Output of :func:`plan_features`.
        plans : list of str
            Plans to predict.
        cached : dict of str to bool, optional
            Whether each (materialized) plan's joined matrix is cached.
        stats_cached : dict of str to {bool, "fold", "root", None}, optional
            Whether each plan's sufficient statistics are cached (gram-based
            fits; see :func:`plan_costs`).

        Returns
        -------
        seconds : dict of str to float

        Notes
        -----
        No calibration record times a fit with cached statistics, so the trees
        know nothing about one: a plan with cached statistics gets the learned
        correction of its full fit (how far this workload is from its roofline on
        this machine) applied to the roofline time of the work that is left.
        """
        cached = cached or {}
        stats_cached = stats_cached or {}
        out: dict[str, float] = {}
        rows, learned = [], []
        for plan in plans:
            c = bool(cached.get(plan, False))
            _, device = split_plan(plan)
            learn = self.booster is not None and (device == "cpu" or self.gpu_trained)
            eff = self.efficiency if learn else None
            out[plan] = float(
                plan_costs(
                    features,
                    plan,
                    cached=c,
                    efficiency=eff,
                    stats_cached=stats_cached.get(plan),
                )["seconds"]
            )
            if learn:
                rows.append(model_inputs(features, plan, cached=c, efficiency=eff))
                learned.append(plan)
        if rows:
            names = list(self.booster.feature_names_)
            X = np.array([[r.get(n, np.nan) for n in names] for r in rows], dtype=float)
            try:
                residual = np.asarray(self.booster.predict(X, thread_count=1), float)
            except Exception as exc:  # noqa: BLE001 - never fail a fit
                _warn_once(
                    f"predict:{self.source}",
                    f"cost model {self.source!r} could not predict "
                    f"({type(exc).__name__}: {exc}); using the roofline estimates.",
                )
                return out
            for plan, r in zip(learned, residual):
                out[plan] = out[plan] * 10.0 ** float(np.clip(r, -6, 6))
        return out


def _resolve(cost_model: Any) -> Path | None:
    if isinstance(cost_model, CostModel):
        raise TypeError("pass a model path or name, not a CostModel object.")
    if isinstance(cost_model, str) and cost_model == "default":
        return default_model_path()
    if isinstance(cost_model, str) and cost_model in ("analytical", "roofline"):
        return None
    if isinstance(cost_model, (str, os.PathLike)):
        return Path(cost_model).expanduser()
    raise TypeError(
        "cost_model must be 'default', 'analytical' or a path to a model file, got "
        f"{type(cost_model).__name__}."
    )


def checksum_path(model_path: Any) -> Path:
    """The checksum file of a model file: its name with ``.sha256`` appended.

    It holds the SHA-256 of the model file in the format of ``sha256sum``
    (``HEX  NAME``); :func:`save_cost_model` writes it, and a model file is loaded
    only when it matches (see the module's notes).
    """
    path = Path(model_path)
    return path.with_name(path.name + _CHECKSUM_SUFFIX)


def _write_checksum(path: Path, data: bytes) -> None:
    """Write the checksum file of ``path`` (holding ``data``), atomically."""
    side = checksum_path(path)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n", "ascii")
    os.replace(tmp, side)


class _ModelFileError(Exception):
    """A model file that must not be handed to CatBoost's loader (the reason)."""


def _verified_bytes(path: Path) -> bytes:
    """The bytes of a model file whose checksum file agrees with them.

    Raises
    ------
    _ModelFileError
        No checksum file, or a checksum that does not match.
    OSError
        The model file cannot be read.
    """
    side = checksum_path(path)
    for attempt in range(2):
        data = path.read_bytes()
        try:
            text = side.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            raise _ModelFileError(
                f"it has no readable checksum file {side.name!r} (a model saved by "
                "an older version, or copied without it)"
            ) from None
        expected = text.split()[0].lower() if text.split() else ""
        if hashlib.sha256(data).hexdigest() == expected:
            return data
        if attempt == 0:
            # A model being replaced (calibration writes the model, then its
            # checksum): look once more before calling the file damaged.
            time.sleep(0.05)
    raise _ModelFileError(
        f"its SHA-256 does not match {side.name!r}: the file is damaged (truncated, "
        "or changed on disk)"
    )


def load_cost_model(cost_model: Any = "default") -> CostModel:
    """Load (once per process and file version) the cost model named ``cost_model``.

    Parameters
    ----------
    cost_model : str or path-like, default="default"
        ``"default"`` (see :func:`default_model_path`), ``"analytical"`` (the
        roofline model alone), or the path of a model trained by
        :func:`train_cost_model`.

    Returns
    -------
    CostModel
        Falls back, with one warning per path, when the file is missing, fails
        its checksum (:func:`checksum_path`: damaged, or saved without one) or
        cannot be read, or CatBoost is not installed: ``"default"`` from the
        user's calibrated model to the shipped one, and from there (or from a
        model named by its path) to the roofline model.
    """
    path = _resolve(cost_model)
    if path is None:
        return CostModel()
    shipped = shipped_model_path()
    if isinstance(cost_model, str) and cost_model == "default" and path != shipped:
        model = _load_file(path, "the shipped model is used instead")
        if model is not None:
            return model
        path = shipped
    model = _load_file(
        path, "plans are chosen with the analytical (roofline) model", path == shipped
    )
    return CostModel() if model is None else model


def _load_file(path: Path, fallback: str, shipped: bool = False) -> CostModel | None:
    """The model of one file, or None (after one warning per path) when it
    cannot be used; ``fallback`` says what is used instead."""
    fix = (
        "Reinstall ilargi-sklearn to restore the shipped model."
        if shipped
        else "Run 'ilargi calibrate' (ilargi_sklearn.planner.calibrate()) to write "
        "a new one."
    )
    key = str(path.resolve()) if path.exists() else str(path)
    try:
        st = path.stat()
    except OSError:
        _warn_once(
            key,
            f"cost model file {str(path)!r} does not exist; {fallback}. {fix}",
        )
        return None
    cache_key = (key, st.st_mtime_ns, st.st_size)
    try:
        failed_key = cache_key + (checksum_path(path).stat().st_mtime_ns,)
    except OSError:
        failed_key = cache_key + (None,)
    with _lock:
        model = _loaded.get(cache_key)
        if failed_key in _failed:
            return None
    if model is not None:
        return model
    try:
        from catboost import CatBoostRegressor
    except ImportError:
        _warn_once(
            "catboost",
            "CatBoost is not installed (pip install 'ilargi-sklearn[planner]'); plans "
            "are chosen with the analytical (roofline) model.",
        )
        return None
    try:
        data = _verified_bytes(path)
    except (_ModelFileError, OSError) as exc:
        with _lock:
            _failed.add(failed_key)
        _warn_once(
            key, f"cost model file {str(path)!r} is not used: {exc}; {fallback}. {fix}"
        )
        return None
    try:
        booster = CatBoostRegressor()
        booster.load_model(blob=data)
        meta = dict(booster.get_metadata())
        if meta.get("ilargi_target") != TARGET:
            raise ValueError(
                f"model target {meta.get('ilargi_target')!r}, expected {TARGET!r}"
            )
        gpu_trained = int(meta.get("ilargi_gpu_records", "0")) > 0
        efficiency = {
            k: float(v)
            for k, v in json.loads(meta.get("ilargi_efficiency", "{}")).items()
        }
        until = meta.get("ilargi_records_until")
        records_until = None if until is None else float(until)
    except Exception as exc:  # noqa: BLE001 - any unreadable file falls back
        with _lock:
            _failed.add(failed_key)
        _warn_once(
            key,
            f"cost model file {str(path)!r} could not be loaded ({type(exc).__name__}: "
            f"{exc}); {fallback}. {fix}",
        )
        return None
    model = CostModel(booster, str(path), gpu_trained, efficiency, records_until)
    with _lock:
        _loaded[cache_key] = model
    logger.info("loaded cost model %s", path)
    return model


# ------------------------------------------------------------------- training
def read_records(paths: Any) -> list[dict[str, Any]]:
    """Read timing records from JSON-lines files, skipping unreadable lines.

    Parameters
    ----------
    paths : path-like or list of path-like
        Files written by :func:`~ilargi_sklearn.planner.calibrate` or by the GPU
        check script (one JSON object per line); gzip-compressed when the name
        ends in ``.gz`` (the shipped records).

    Returns
    -------
    records : list of dict
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            continue
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by an interruption
                if isinstance(rec, dict) and "features" in rec and "plan" in rec:
                    records.append(rec)
    return records


def _usable(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        seconds = float(rec.get("seconds", float("nan")))
        if seconds > 0 and math.isfinite(seconds):
            out.append(rec)
    return out


def fit_efficiency(
    records: Iterable[dict[str, Any]], *, prior: float = 1.0
) -> dict[str, float]:
    """Fit each cost component's slow-down against its hardware rate.

    Least squares on relative errors, ``sum_i (sum_j e_j a_ij / t_i - 1)^2`` with
    ``a_ij`` the roofline seconds of component ``j`` in record ``i`` and ``t_i`` the
    measured seconds, plus ``prior * sum_j (e_j - 1)^2`` so that a component the
    records hardly exercise keeps its roofline rate; ``e_j`` bounded to
    [0.02, 100]. CPU records only.

    Parameters
    ----------
    records : iterable of dict
        Timing records.
    prior : float, default=1.0

    Returns
    -------
    efficiency : dict of str to float
    """
    from scipy.optimize import lsq_linear

    rows, t = [], []
    for rec in _usable(records):
        rep, device = split_plan(rec["plan"])
        if device != "cpu":
            continue
        f = with_iterations(rec["features"], rec.get("n_iter"))
        costs = plan_costs(f, rec["plan"], cached=bool(rec.get("cached", False)))
        unit = unit_costs(f, device)
        rows.append([costs[k] * unit[k] for k in COMPONENTS])
        t.append(float(rec["seconds"]))
    if not rows:
        return dict.fromkeys(COMPONENTS, 1.0)
    A = np.asarray(rows) / np.asarray(t)[:, None]
    k = len(COMPONENTS)
    A = np.vstack([A, math.sqrt(prior) * np.eye(k)])
    b = np.concatenate([np.ones(len(t)), math.sqrt(prior) * np.ones(k)])
    res = lsq_linear(A, b, bounds=(0.02, 100.0))
    return {name: float(v) for name, v in zip(COMPONENTS, res.x)}


def training_table(
    records: Iterable[dict[str, Any]], efficiency: dict[str, float] | None = None
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Model inputs and targets of timing records.

    Parameters
    ----------
    records : iterable of dict
    efficiency : dict, optional
        Component slow-downs of CPU plans (see :func:`fit_efficiency`).

    Returns
    -------
    names : list of str
        Input names.
    X : ndarray of shape (n_records, n_inputs)
    y : ndarray of shape (n_records,)
        ``log10(seconds / calibrated roofline seconds)``.
    """
    names: list[str] | None = None
    X, y = [], []
    for rec in _usable(records):
        features = with_iterations(rec["features"], rec.get("n_iter"))
        cached = bool(rec.get("cached", False))
        eff = efficiency if split_plan(rec["plan"])[1] == "cpu" else None
        x = model_inputs(features, rec["plan"], cached=cached, efficiency=eff)
        if names is None:
            names = list(x)
        X.append([x[n] for n in names])
        roof = plan_costs(features, rec["plan"], cached=cached, efficiency=eff)
        y.append(math.log10(float(rec["seconds"])) - math.log10(roof["seconds"]))
    if names is None:
        raise ValueError("no usable timing records (seconds > 0) to train on.")
    return names, np.asarray(X, dtype=float), np.asarray(y, dtype=float)


def fit_cost_model(
    records: Iterable[dict[str, Any]],
    *,
    iterations: int = 300,
    depth: int = 6,
    learning_rate: float = 0.08,
    random_state: int = 0,
    thread_count: int = -1,
    records_until: float | None = None,
) -> CostModel:
    """Train the cost model on timing records, in memory.

    Parameters
    ----------
    records : iterable of dict
        Timing records (see :func:`read_records`).
    iterations, depth, learning_rate : CatBoost parameters
    random_state : int, default=0
    thread_count : int, default=-1
    records_until : float, optional
        Time stamp of the newest record the model counts as seen (stored with the
        model as ``CostModel.records_until``); default the newest ``time`` of
        ``records``.

    Returns
    -------
    CostModel
        With ``source="trained"``; :func:`train_cost_model` also saves it.
    """
    from catboost import CatBoostRegressor, Pool

    records = _usable(records)
    efficiency = fit_efficiency(records)
    names, X, y = training_table(records, efficiency)
    booster = CatBoostRegressor(
        iterations=iterations,
        depth=depth,
        learning_rate=learning_rate,
        loss_function="RMSE",
        random_seed=random_state,
        thread_count=thread_count,
        verbose=0,
        allow_writing_files=False,
    )
    booster.fit(Pool(X, y, feature_names=names))
    if records_until is None:
        records_until = max((float(r.get("time", 0.0)) for r in records), default=0.0)
    n_gpu = sum(1 for r in records if str(r.get("plan", "")).endswith("-gpu"))
    meta = booster.get_metadata()
    meta["ilargi_target"] = TARGET
    meta["ilargi_records"] = str(len(y))
    meta["ilargi_efficiency"] = json.dumps(efficiency, sort_keys=True)
    meta["ilargi_gpu_records"] = str(n_gpu)
    meta["ilargi_records_until"] = repr(float(records_until))
    residual = booster.predict(X) - y
    logger.info(
        "trained cost model on %d records (train RMSE %.3f in log10 seconds)",
        len(y),
        float(np.sqrt(np.mean(residual**2))),
    )
    return CostModel(booster, "trained", n_gpu > 0, efficiency, float(records_until))


def save_cost_model(model: CostModel, model_path: Any = None) -> Path:
    """Save a trained model and its checksum file (atomically: a reader never
    sees half a file).

    Parameters
    ----------
    model : CostModel
        A learned model (from :func:`fit_cost_model`).
    model_path : path-like, optional
        Default ``cost_model.cbm`` in the user cache directory (which
        ``cost_model="default"`` then uses).

    Returns
    -------
    path : pathlib.Path
        The model file; its checksum file is :func:`checksum_path` of it, which
        must travel with it (a model without one is not loaded).
    """
    if model.booster is None:
        raise ValueError("the analytical model has nothing to save.")
    path = Path(model_path) if model_path is not None else cache_dir() / _MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    model.booster.save_model(str(tmp))
    data = tmp.read_bytes()
    os.replace(tmp, path)
    _write_checksum(path, data)
    logger.info("saved cost model -> %s", path)
    return path


def train_cost_model(
    records_paths: Any,
    model_path: Any = None,
    *,
    records: Iterable[dict[str, Any]] | None = None,
    iterations: int = 300,
    depth: int = 6,
    learning_rate: float = 0.08,
    random_state: int = 0,
    thread_count: int = -1,
) -> Path:
    """Train the cost model on timing records and save it.

    Parameters
    ----------
    records_paths : path-like or list of path-like
        JSON-lines files of timing records (calibration runs, ``gpu_check.py``).
    model_path : path-like, optional
        Where to save the model; default ``cost_model.cbm`` in the user cache
        directory (which ``cost_model="default"`` then uses).
    records : iterable of dict, optional
        Records to use instead of reading ``records_paths`` (for example a subset
        that leaves a dataset out).
    iterations, depth, learning_rate : CatBoost parameters
    random_state : int, default=0
    thread_count : int, default=-1

    Returns
    -------
    path : pathlib.Path
        The saved model.
    """
    if records is None:
        records = read_records(records_paths)
    model = fit_cost_model(
        records,
        iterations=iterations,
        depth=depth,
        learning_rate=learning_rate,
        random_state=random_state,
        thread_count=thread_count,
    )
    return save_cost_model(model, model_path)
