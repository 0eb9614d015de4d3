"""AutoPlan: a meta-estimator that predicts each plan's time and fits the fastest."""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, MetaEstimatorMixin, _fit_context, clone
from sklearn.utils import get_tags
from sklearn.utils._param_validation import HasMethods, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from ilargi_sklearn._backend._gpu import probe_gpu
from ilargi_sklearn._backend._plan import (
    DeviceUnavailableError,
    UnsupportedOnDeviceError,
)
from ilargi_sklearn._config import get_config
from ilargi_sklearn.multisource import MultiSourceDataset
from ilargi_sklearn.multisource._bounded import BoundedCache
from ilargi_sklearn.multisource._cache import (
    clear_materialization_cache,
    is_materialization_cached,
    is_table_cached,
    materialization_seconds,
    materialized_dataset,
    set_materialization_cache,
)
from ilargi_sklearn.multisource._stats_cache import statistics_cached
from ilargi_sklearn.planner._cost_model import load_cost_model
from ilargi_sklearn.planner._features import (
    DEVICES,
    PLANS,
    STRATEGIES,
    plan_features,
    split_plan,
)

__all__ = [
    "AutoPlan",
    "clear_plan_history",
    "clear_materialization_cache",
    "materialized_dataset",
    "set_materialization_cache",
]

logger = logging.getLogger(__name__)


# -------------------------------------------------------------------- helpers
def _estimator_has(attr: str):
    def check(self):
        if hasattr(self, "estimator_"):
            return hasattr(self.estimator_, attr)
        return hasattr(self.estimator, attr)

    return check


_GPU_MODULES = ("cupy", "cupyx", "cupy_backends", "cuml", "rmm")


def _resource_failure(exc: BaseException, device: str) -> str | None:
    """Why ``exc`` is a resource failure (a reason to try another plan), or None.

    Out of memory on any device; on a GPU plan also an unusable GPU
    (:class:`DeviceUnavailableError`, or an error raised by the GPU libraries
    themselves) and a configuration the GPU kernels do not implement
    (:class:`UnsupportedOnDeviceError`).
    """
    if isinstance(exc, MemoryError):
        return "out of memory"
    if "OutOfMemory" in type(exc).__name__:
        return "GPU out of memory"
    if device != "gpu":
        return None
    if isinstance(exc, DeviceUnavailableError):
        return "GPU unusable"
    if isinstance(exc, UnsupportedOnDeviceError):
        return "not supported on the GPU"
    if type(exc).__module__.split(".")[0] in _GPU_MODULES:
        return "GPU unusable"
    return None


def _on_host(X: Any) -> bool:
    """Whether ``X`` lives in host memory (NumPy/SciPy)."""
    if isinstance(X, MultiSourceDataset):
        return str(getattr(X, "device", "cpu")) == "cpu"
    return not type(X).__module__.split(".")[0].startswith("cupy")


# ------------------------------------------------------- measured plan history
#: Algorithm features that identify the work of a fit: two configurations with
#: the same values (a grid search's ridge ``alpha``, logistic ``C``) do the same
#: operator work, so their measured times stand for each other.
_WORK_FEATURES = (
    "estimator",
    "solver",
    "m",
    "iterations",
    "passes",
    "matmuls",
    "matmul_m",
    "grams",
    "row_norms",
)
#: An unmeasured plan estimated within this factor of the measured time of the
#: other is fitted once (the model's relative error between two plans is about
#: that: the held-out median error is a factor of about 1.26), then the
#: measurements decide.
_EXPLORE_FACTOR = 1.25


class _PlanHistory:
    """Measured seconds of AutoPlan fits, per work key, plan and cache state.

    A work key is the root dataset's token, the estimator's class, the dataset's
    width and dtype and the work features (``_WORK_FEATURES``): the folds and the
    candidates of a search over one dataset share it, clones included (they share
    nothing else). A measurement is kept per cache state of the plan (the join
    cached or not, the statistics cached or not), because a state's time says
    little about another's (the first materialized fit builds the join; its time
    less the join's build time is recorded for the cached state too), and
    stored per row: the slices of one root (folds, the refit) differ in size, and
    the plans' work scales with the rows. Bounded by the ``plan_history_size``
    setting (:func:`~ilargi_sklearn.set_config`, work keys, least recently used
    dropped first); a root dataset's keys go with its operator.
    """

    def __init__(self) -> None:
        self._cache = BoundedCache(
            "plan history", max_entries=lambda: get_config()["plan_history_size"]
        )

    def get(self, key: tuple) -> dict[tuple, float]:
        entry = self._cache.get(key, count=False)
        return {} if entry is None else dict(entry)

    def record(
        self,
        key: tuple,
        state: tuple,
        seconds_per_row: float,
        replace: bool = True,
        root: Any = None,
    ) -> None:
        def add(entry: dict | None) -> dict:
            entry = {} if entry is None else dict(entry)
            # The latest measurement (the machine's load changes, and a state
            # seen again is the current one), unless asked to keep a measured one.
            if replace or state not in entry:
                entry[state] = seconds_per_row
            return entry

        self._cache.update(key, add)
        if root is not None:
            self._cache.watch(root, group=key[0])

    def clear(self) -> None:
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._cache)


_HISTORY = _PlanHistory()


def clear_plan_history() -> None:
    """Forget the measured times of earlier AutoPlan fits.

    AutoPlan keeps, per root dataset and kind of work, the measured time of every
    plan it fitted, so that the later fits of a grid search (its folds and
    candidates) choose by measurement rather than by prediction. Clear it to
    start a comparison afresh (a benchmark that times the choice itself).
    """
    _HISTORY.clear()


def _work_key(X: Any, estimator: Any, features: dict[str, Any]) -> tuple | None:
    token = getattr(X, "_root_token", None)
    if token is None:
        return None
    return (
        token,
        type(estimator).__qualname__,
        int(features["n_features"]),
        int(features["itemsize"]),
        tuple(features.get(k) for k in _WORK_FEATURES),
    )


def _own_table_key(estimator: Any, X: Any) -> tuple | None:
    """The join cache's key of the table an estimator's materialized plan builds
    itself (the trees' joined table of tree features), or None."""
    probe = getattr(estimator, "_materialized_table_key", None)
    return None if probe is None else probe(X)


def _plan_cached(X: Any, plan: str, table_key: tuple | None) -> bool:
    """Whether a materialized plan finds what it builds in the join cache: the
    joined matrix, or with ``table_key`` the estimator's own table (on the host:
    the trees' tables are host arrays)."""
    rep, device = split_plan(plan)
    if rep != "materialized" or not isinstance(X, MultiSourceDataset):
        return False
    if table_key is not None:
        return device == "cpu" and is_table_cached(X, table_key, device)
    return is_materialization_cached(X, device)


def _choose(
    order: list[str],
    predicted: dict[str, float],
    measured: dict[str, float],
) -> tuple[list[str], str]:
    """The plans in the order to try them, and why the first one.

    ``order`` is by prediction; ``measured`` holds the measured seconds (scaled to
    this fit's rows) of the plans measured in their current cache state. Without
    measurements the prediction decides. A measured plan counts its measured
    time; an unmeasured one its prediction times the ratio of measured to
    predicted time of the measured plans (geometric mean): a machine that runs
    every plan slower than the model says (another process on the cores) slows
    the unmeasured plan too, so one measurement alone never overturns the
    prediction's order. An unmeasured plan whose estimate is within
    ``_EXPLORE_FACTOR`` of the best measured time is fitted once, to measure it;
    otherwise the estimates rank the plans. Deterministic: ties go to the
    prediction's order.
    """
    if not measured:
        return order, "predicted"
    ratio = math.exp(
        sum(math.log(measured[p] / max(predicted[p], 1e-9)) for p in measured)
        / len(measured)
    )
    estimate = {p: measured.get(p, predicted[p] * ratio) for p in order}
    best_measured = min(measured, key=lambda p: (measured[p], order.index(p)))
    for p in order:
        if (
            p not in measured
            and estimate[p] <= _EXPLORE_FACTOR * measured[best_measured]
        ):
            reason = (
                f"explore: {p} estimated {estimate[p]:.3g} s (predicted "
                f"{predicted[p]:.3g} s x measured/predicted {ratio:.3g}), within "
                f"{_EXPLORE_FACTOR:g}x of {best_measured} measured "
                f"{measured[best_measured]:.3g} s"
            )
            return [p] + [q for q in order if q != p], reason
    ranked = sorted(order, key=lambda p: (estimate[p], order.index(p)))
    shown = ", ".join(
        f"{p} {estimate[p]:.3g} s ({'measured' if p in measured else 'estimated'})"
        for p in ranked
    )
    return ranked, f"measured: {shown}; {ranked[0]}"


class AutoPlan(MetaEstimatorMixin, BaseEstimator):
    """Fit an estimator with the plan that a cost model predicts to be fastest.

    A plan is a representation (train on the sources, ``"factorized"``, or on the
    joined matrix built once, ``"materialized"``) and a device (``"cpu"`` or
    ``"gpu"``). At ``fit``, AutoPlan computes cheap features of the data (shapes,
    non-zeros, tuple and feature ratios, join types), of the estimator's parameters
    (iterations, clusters, rank, classes) and of the hardware, predicts every
    available plan's time, fits a clone of the estimator with the fastest plan (its
    ``strategy`` set accordingly) and records what it predicted and chose. All plans
    give the same model within solver tolerance.

    Parameters
    ----------
    estimator : estimator object
        An ilargi_sklearn estimator with a ``strategy`` parameter
        (:class:`~ilargi_sklearn.FactorizedLinearRegression`,
        :class:`~ilargi_sklearn.FactorizedLogisticRegression`,
        :class:`~ilargi_sklearn.FactorizedKMeans`,
        :class:`~ilargi_sklearn.FactorizedGNMF`). It is cloned, never fitted.
    plans : "auto" or list of str, default="auto"
        Candidate plans: "auto" for all, or names such as ``"factorized"`` (on every
        allowed device), ``"materialized-cpu"``.
    cost_model : str or path-like, default="default"
        ``"default"``: the model of the user's own calibration when there is one
        (see :func:`~ilargi_sklearn.planner.calibrate`), else the model shipped with
        the package; ``"analytical"``: the roofline estimates alone; or the path of a
        model file. Loaded lazily and cached per process, so cloning copies a name.
    devices : {"auto", "cpu", "gpu"} or list of str, default="auto"
        Allowed devices. GPU plans are candidates only where the GPU probe says a
        GPU is usable and the estimator has a ``device`` parameter.

    Attributes
    ----------
    estimator_ : estimator
        The fitted clone.
    plan_ : str
        The plan that was fitted, ``"{representation}-{device}"``.
    predicted_seconds_ : dict of str to float
        Predicted fit time of every candidate plan.
    features_ : dict
        The plan features the prediction was made from.
    fallback_reason_ : str or None
        Why the fitted plan differs from the predicted fastest one (a plan that
        failed for lack of memory, an unusable GPU), else None.
    fit_seconds_ : float
        Measured time of the fit of ``plan_`` (materialization included).
    materialization_cached_ : bool
        Whether a materialized plan reused a cached joined matrix (for the
        gradient-boosted trees: their cached joined table of tree features).
    statistics_cached_ : {"fold", "root"} or None
        Whether the fitted plan found its gram in the statistics cache when the
        choice was made: the fold's own (``"fold"``), its root's to downdate from
        (``"root"``), or not (None; also for fits without a gram).
    choice_reason_ : str
        Why ``plan_`` was tried first: ``"predicted"`` (the cost model alone),
        ``"explore: ..."`` (an unmeasured plan predicted close to the measured
        time of another) or ``"measured: ..."`` (earlier fits of the same work
        measured; the estimates it ranked by).
    measured_seconds_ : dict of str to float
        Measured seconds of earlier fits of the same work on the same root in the
        plans' current cache states, scaled to this fit's rows (empty when none).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of the features seen during fit (datasets).

    See Also
    --------
    sklearn.model_selection.GridSearchCV : Works with AutoPlan; a grid search over
        one dataset builds its join at most once.
    ilargi_sklearn.planner.calibrate : Train the cost model on this machine.

    Notes
    -----
    Materialized plans build the joined matrix of the *root* dataset once and keep
    it in a per-process LRU cache keyed by the root and device; a cross-validation
    fold takes its rows of it, and the cost model knows whether the join is already
    cached. After a materialized plan, ``predict``, ``transform``, ``score`` and
    the other delegated methods read a dataset whose root's join is cached (a
    test fold) from that cache too, instead of joining it again. Decisions are
    logged at INFO on the ``ilargi_sklearn.planner`` logger.

    The cost model is told what the caches hold: whether the root's join is
    cached (materialized plans) and, for the fits that form a gram (least
    squares and ridge by the normal equations, the elastic net, PCA), whether
    the statistics cache holds the fold's gram or its root's (then only the
    dense solve, or the downdate's pass over the other rows, is left). Both are
    looked up without computing anything.

    Within a search, measurements replace predictions. Every fit records its
    plan's measured seconds (per row) under a key of the root dataset, the
    estimator's class and the work its parameters imply (the algorithm features:
    a ridge ``alpha`` or a logistic ``C`` does not change it, ``max_iter`` or
    ``n_clusters`` does), and the plan's cache state; the folds and candidates of
    a grid search share the key (clones share nothing else). The next fit of the
    same work ranks each plan by its measured time where there is one in the
    current cache state, else by its prediction rescaled by how much slower
    than predicted the measured plans ran (so that a loaded machine does not
    make the unmeasured plan look cheap), except that a plan not yet measured
    and so estimated within a factor 1.25 of the best measured time is fitted
    once to measure it. The rule is deterministic; ``choice_reason_`` says
    which one applied, and the decision is logged at INFO.
    :func:`clear_plan_history` forgets the measurements (at most
    ``plan_history_size`` keys are kept, 256 by default, least recently used
    dropped first: :func:`~ilargi_sklearn.set_config`; a root dataset's go with
    it). The history is per process: the
    worker processes of a parallel search (``n_jobs``) each learn their own.

    If the chosen plan fails for a resource reason (``MemoryError``, GPU out of
    memory, GPU unusable), the next fastest plan is fitted and the reason recorded
    in ``fallback_reason_``; any other error is raised. Only ``strategy`` (and
    ``device``) differ between plans, so a fallback never changes the model.

    Plain arrays and sparse matrices are already materialized: they are fitted as
    they are (``plan_="materialized-cpu"``), without a prediction.

    Examples
    --------
    >>> from ilargi_sklearn.datasets import make_multi_source
    >>> from ilargi_sklearn.linear_model import FactorizedLinearRegression
    >>> from ilargi_sklearn.planner import AutoPlan
    >>> data = make_multi_source(2000, tuple_ratio=20, random_state=0)
    >>> auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    >>> auto = auto.fit(data.dataset, data.target)
    >>> auto.plan_ in auto.predicted_seconds_
    True
    >>> auto.estimator_.strategy == auto.plan_.split("-")[0]
    True
    >>> bool(auto.score(data.dataset, data.target) > 0.9)
    True
    """

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit"])],
        "plans": [StrOptions({"auto"}), list, tuple],
        "cost_model": [str, os.PathLike],
        "devices": [StrOptions({"auto", "cpu", "gpu"}), list, tuple],
    }

    def __init__(
        self, estimator, *, plans="auto", cost_model="default", devices="auto"
    ):
        self.estimator = estimator
        self.plans = plans
        self.cost_model = cost_model
        self.devices = devices

    # --------------------------------------------------------------- plans
    def _requested(self) -> list[str]:
        devices = self.devices
        if isinstance(devices, str):
            devices = DEVICES if devices == "auto" else (devices,)
        devices = list(devices)
        bad = [d for d in devices if d not in DEVICES]
        if bad or not devices:
            raise ValueError(
                f"devices must be 'auto' or a non-empty list of {list(DEVICES)}, got "
                f"{self.devices!r}."
            )
        names = STRATEGIES if self.plans == "auto" else self.plans
        if isinstance(names, str):
            names = [names]
        out: list[str] = []
        for name in names:
            if name in STRATEGIES:
                out += [f"{name}-{d}" for d in devices]
            elif name in PLANS:
                out.append(name)
            else:
                raise ValueError(
                    f"unknown plan {name!r}; use 'auto', {list(STRATEGIES)} or "
                    f"{list(PLANS)}."
                )
        return list(dict.fromkeys(out))

    def _available(self, requested: list[str]) -> tuple[list[str], str | None]:
        """The requested plans that can run here, and why GPU plans were dropped."""
        gpu = [p for p in requested if split_plan(p)[1] == "gpu"]
        if not gpu:
            return requested, None
        usable, reason = probe_gpu()
        if usable and "device" not in self.estimator.get_params(deep=False):
            usable = False
            reason = f"{type(self.estimator).__name__} has no GPU implementation"
        if usable:
            return requested, None
        cpu = [p for p in requested if split_plan(p)[1] == "cpu"]
        why = None
        if not cpu:
            # Only GPU plans were asked for: run their CPU counterparts, recorded.
            cpu = list(dict.fromkeys(p.replace("-gpu", "-cpu") for p in gpu))
            why = f"GPU unusable ({reason}): fitted on the CPU instead"
        logger.info("GPU plans unavailable: %s", reason)
        return cpu, why

    # ------------------------------------------------------------------ fit
    def _statistics_cached(
        self, X, plans, features, fit_params
    ) -> dict[str, str | None]:
        """Per plan, whether its fit's gram would come from the statistics cache
        (``"fold"``, ``"root"``) or not (None); looked up, never computed.

        Only for fits that form a gram (``grams`` in the features: the normal
        equations of least squares and ridge, the elastic net, PCA), on the
        device the data live on (another device's copy has its own token).
        """
        if not features.get("grams"):
            return dict.fromkeys(plans)
        here = "cpu" if _on_host(X) else "gpu"
        weight = fit_params.get("sample_weight")
        out = {}
        for p in plans:
            rep, device = split_plan(p)
            out[p] = statistics_cached(X, rep, weight) if device == here else None
        return out

    def _fit_plan(self, plan, X, y, method, fit_params):
        rep, device = split_plan(plan)
        params = {"strategy": rep}
        current = self.estimator.get_params(deep=False).get("device")
        if current is not None:
            # "auto" computes where the data lives: kept when that is the plan's
            # device, so that only what the plan needs differs from the user's.
            if device == "gpu":
                params["device"] = "gpu"
            elif current == "gpu" or (current == "auto" and not _on_host(X)):
                params["device"] = "cpu"
        est = clone(self.estimator).set_params(**params)
        # The estimator's strategy decides what it computes with
        # (MultiSourceDataset.operator_for: the join is built once per root and
        # cached); only whether it was cached already is recorded here.
        hit = _plan_cached(X, plan, _own_table_key(self.estimator, X))
        t0 = time.perf_counter()
        result = getattr(est, method)(X, y, **fit_params)
        return est, result, time.perf_counter() - t0, hit

    def _fit(self, X, y, method, fit_params):
        if "strategy" not in self.estimator.get_params(deep=False):
            raise TypeError(
                f"AutoPlan needs an estimator with a 'strategy' parameter (an "
                f"ilargi_sklearn estimator), got {type(self.estimator).__name__}."
            )
        name = type(self.estimator).__name__
        fallback = []
        if isinstance(X, MultiSourceDataset):
            plans, why = self._available(self._requested())
            if why:
                fallback.append(why)
            features = plan_features(X, self.estimator, y)
            # An estimator that builds its own table (the trees) reads no join,
            # but may find that table in the join cache (a search's later fits).
            joins = bool(features.get("joins", True))
            table_key = None if joins else _own_table_key(self.estimator, X)
            cached = {
                p: (joins or table_key is not None) and _plan_cached(X, p, table_key)
                for p in plans
            }
            stats = self._statistics_cached(X, plans, features, fit_params)
            model = load_cost_model(self.cost_model)
            predicted = model.predict(features, plans, cached, stats)
            order = sorted(plans, key=lambda p: (predicted[p], PLANS.index(p)))
            work = _work_key(X, self.estimator, features)
            # A plan's cache state: what changes its work (the join only matters
            # to the materialized plans).
            states = {
                p: (p, cached[p] and split_plan(p)[0] == "materialized", stats[p])
                for p in plans
            }
            history = _HISTORY.get(work) if work is not None else {}
            n_rows = float(features["n_rows"])
            measured = {
                p: history[states[p]] * n_rows for p in plans if states[p] in history
            }
            shown = ", ".join(f"{p} {predicted[p]:.3g} s" for p in order)
            order, reason = _choose(order, predicted, measured)
            logger.info(
                "AutoPlan(%s): predicted %s (%s model%s); %s; trying %s",
                name,
                shown,
                "learned" if model.is_learned else "roofline",
                "".join(
                    f", {p} statistics cached ({stats[p]})" for p in plans if stats[p]
                ),
                reason,
                order[0],
            )
        else:
            # An array is already the joined matrix: nothing to choose.
            order, predicted, features = ["materialized-cpu"], {}, {}
            table_key = None
            work, states, measured, stats = None, {}, {}, {}
            reason = "an array: fitted as it is"
        last_exc = None
        for plan in order:
            try:
                est, result, seconds, hit = self._fit_plan(
                    plan, X, y, method, fit_params
                )
            except Exception as exc:
                reason = _resource_failure(exc, split_plan(plan)[1])
                if reason is None:
                    raise
                last_exc = exc
                fallback.append(
                    f"{plan} failed ({reason}: {type(exc).__name__}: {exc})"
                )
                logger.info(
                    "AutoPlan(%s): %s; trying the next plan", name, fallback[-1]
                )
                continue
            break
        else:
            raise last_exc
        self.estimator_ = est
        self.plan_ = plan
        self.predicted_seconds_ = predicted
        self.features_ = features
        self.fallback_reason_ = "; ".join(fallback) if fallback else None
        self.fit_seconds_ = seconds
        self.materialization_cached_ = bool(hit) and (
            bool(features.get("joins", True)) or table_key is not None
        )
        self.statistics_cached_ = stats.get(plan)
        self.choice_reason_ = reason
        self.measured_seconds_ = measured
        if work is not None:
            rows = max(n_rows, 1.0)
            root = getattr(X, "_root_operator", None)
            _HISTORY.record(work, states[plan], seconds / rows, root=root)
            rep, device = split_plan(plan)
            join = None
            if rep == "materialized" and features.get("joins", True):
                join = materialization_seconds(X, device)
            elif rep == "materialized" and table_key is not None:
                join = materialization_seconds(X, device, key=table_key)
            if not hit and join is not None:
                # This fit built the join: without that build it measured the
                # plan with the join cached, the state of the fits to come (else
                # the next fit would explore that state anew, at a fit's cost).
                cached_state = (plan, True, states[plan][2])
                _HISTORY.record(
                    work,
                    cached_state,
                    max(seconds - join, 0.0) / rows,
                    replace=False,
                    root=root,
                )
        if hasattr(est, "n_features_in_"):
            self.n_features_in_ = est.n_features_in_
        if isinstance(X, MultiSourceDataset):
            self.feature_names_in_ = np.asarray(X.feature_names, dtype=object)
            if X.schema_ is not None:
                self.dataset_schema_ = X.schema_
        elif hasattr(est, "feature_names_in_"):
            self.feature_names_in_ = est.feature_names_in_
        logger.info(
            "AutoPlan(%s): fitted %s in %.3g s%s",
            name,
            plan,
            seconds,
            " (cached join)" if hit else "",
        )
        return result

    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, **fit_params):
        """Choose a plan, then fit a clone of the estimator with it.

        Parameters
        ----------
        X : {MultiSourceDataset, array-like, sparse matrix} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,), default=None
            Target, when the estimator takes one.
        **fit_params : dict
            Passed to the estimator's ``fit`` (for example ``sample_weight``).

        Returns
        -------
        self : AutoPlan
        """
        self._fit(X, y, "fit", fit_params)
        return self

    @available_if(_estimator_has("fit_transform"))
    @_fit_context(prefer_skip_nested_validation=False)
    def fit_transform(self, X, y=None, **fit_params):
        """Choose a plan, fit with it and return the estimator's ``fit_transform``.

        Parameters
        ----------
        X : {MultiSourceDataset, array-like, sparse matrix}
        y : array-like, default=None
        **fit_params : dict

        Returns
        -------
        X_new : ndarray
        """
        return self._fit(X, y, "fit_transform", fit_params)

    @available_if(_estimator_has("fit_predict"))
    @_fit_context(prefer_skip_nested_validation=False)
    def fit_predict(self, X, y=None, **fit_params):
        """Choose a plan, fit with it and return the estimator's ``fit_predict``.

        Parameters
        ----------
        X : {MultiSourceDataset, array-like, sparse matrix}
        y : array-like, default=None
        **fit_params : dict

        Returns
        -------
        labels : ndarray
        """
        return self._fit(X, y, "fit_predict", fit_params)

    # ------------------------------------------------------------ delegation
    @available_if(_estimator_has("predict"))
    def predict(self, X, **params):
        """The fitted estimator's ``predict``."""
        check_is_fitted(self)
        return self.estimator_.predict(X, **params)

    @available_if(_estimator_has("predict_proba"))
    def predict_proba(self, X, **params):
        """The fitted estimator's ``predict_proba``."""
        check_is_fitted(self)
        return self.estimator_.predict_proba(X, **params)

    @available_if(_estimator_has("predict_log_proba"))
    def predict_log_proba(self, X, **params):
        """The fitted estimator's ``predict_log_proba``."""
        check_is_fitted(self)
        return self.estimator_.predict_log_proba(X, **params)

    @available_if(_estimator_has("decision_function"))
    def decision_function(self, X, **params):
        """The fitted estimator's ``decision_function``."""
        check_is_fitted(self)
        return self.estimator_.decision_function(X, **params)

    @available_if(_estimator_has("transform"))
    def transform(self, X, **params):
        """The fitted estimator's ``transform``."""
        check_is_fitted(self)
        return self.estimator_.transform(X, **params)

    @available_if(_estimator_has("inverse_transform"))
    def inverse_transform(self, X, **params):
        """The fitted estimator's ``inverse_transform``."""
        check_is_fitted(self)
        return self.estimator_.inverse_transform(X, **params)

    @available_if(_estimator_has("score"))
    def score(self, X, y=None, **params):
        """The fitted estimator's ``score``."""
        check_is_fitted(self)
        return self.estimator_.score(X, y, **params)

    @property
    def classes_(self):
        """Class labels of the fitted classifier."""
        return self.estimator_.classes_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        sub = get_tags(self.estimator)
        tags.estimator_type = sub.estimator_type
        tags.classifier_tags = sub.classifier_tags
        tags.regressor_tags = sub.regressor_tags
        tags.transformer_tags = sub.transformer_tags
        tags.target_tags = sub.target_tags
        tags.input_tags = sub.input_tags
        return tags
