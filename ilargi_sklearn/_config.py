"""Process-wide settings of the package: cache budgets, downdating, compiled kernels.

scikit-learn keeps its process-wide knobs in one place (``sklearn.set_config``,
``sklearn.config_context``, ``sklearn.get_config``); so does this package. Every
cache and switch reads its setting here when it is used, so a change takes effect
at the next fit. Two deliberate differences with scikit-learn:

* :func:`set_config` changes the setting for the whole process, not for the
  calling thread alone: the caches are shared by all threads (a threaded grid
  search's workers share one statistics cache), so their budgets are too, and a
  worker thread sees what the main thread set;
* :func:`config_context` overrides settings for the calling thread only, for the
  duration of the block (as scikit-learn's does), and restores them on exit,
  whatever the block raised.

Nothing here imports the rest of the package: every layer (``_backend``
included) may read it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["config_context", "get_config", "set_config"]

# Defaults. Byte budgets "auto" mean "a share of the machine's memory"
# (``cache_budget``); 0 turns a cache off.
_DEFAULTS: dict[str, Any] = {
    # Sufficient statistics of gram-based fits (grams and target products are
    # parameter-sized, 8 d^2 bytes: a sixteenth of the memory holds thousands).
    "statistics_cache_bytes": "auto",
    # Joined matrices of materialized fits (data-sized: a quarter of the memory,
    # and at most this many root datasets times devices).
    "materialization_cache_bytes": "auto",
    "materialization_cache_entries": 4,
    # Gathered rows of the index arrays a search slices with again and again.
    "slice_memo_bytes": "auto",
    "slice_memo_entries": 32,
    # A training fold's gram as its root's minus the test rows' inside a search
    # that does not know its folds (GridSearchCV): about two passes over the data
    # instead of K, but the bits of a fit then depend on which folds were fitted
    # before in the process (agreeing to rounding, guarded). Off by default, so
    # that a fit gives the same bits whatever ran before it; the cross-validated
    # estimators downdate explicitly (their folds are known) either way.
    "statistics_downdating": False,
    # AutoPlan's measured plan times: work keys kept (least recently used first).
    "plan_history_size": 256,
    # The numba kernels (the NumPy ones when off; the results agree to rounding).
    "compiled_kernels": True,
}

# Shares of the machine's memory that the "auto" byte budgets stand for.
_MEMORY_SHARE = {
    "statistics_cache_bytes": 16,
    "materialization_cache_bytes": 4,
    "slice_memo_bytes": 16,
}

_global_config: dict[str, Any] = dict(_DEFAULTS)
_global_lock = threading.Lock()
# Per thread: a stack of override dicts (config_context blocks, innermost last).
_local = threading.local()


def _overrides() -> list[dict[str, Any]]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def get_config() -> dict[str, Any]:
    """The current values of the package's settings (see :func:`set_config`).

    Returns
    -------
    config : dict
        Keys are the parameter names of :func:`set_config`: the process-wide
        values, overridden by the calling thread's :func:`config_context` blocks.
        A copy: changing it changes nothing.

    See Also
    --------
    sklearn.get_config : scikit-learn's settings.

    Examples
    --------
    >>> from ilargi_sklearn import get_config
    >>> get_config()["statistics_downdating"]
    False
    """
    with _global_lock:
        out = dict(_global_config)
    for layer in _overrides():
        out.update(layer)
    return out


def _check(name: str, value: Any) -> Any:
    if name in ("statistics_downdating", "compiled_kernels"):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}.")
        return value
    if name in _MEMORY_SHARE and value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"{name} must be a non-negative int"
            + (' or "auto" (a share of the memory)' if name in _MEMORY_SHARE else "")
            + f", got {value!r}."
        )
    return int(value)


def _validated(settings: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(k for k in settings if k not in _DEFAULTS)
    if unknown:
        raise TypeError(
            f"unknown setting(s) {unknown}; the settings are {sorted(_DEFAULTS)}."
        )
    return {k: _check(k, v) for k, v in settings.items()}


def set_config(
    statistics_cache_bytes: int | str | None = None,
    materialization_cache_bytes: int | str | None = None,
    materialization_cache_entries: int | None = None,
    slice_memo_bytes: int | str | None = None,
    slice_memo_entries: int | None = None,
    statistics_downdating: bool | None = None,
    plan_history_size: int | None = None,
    compiled_kernels: bool | None = None,
) -> None:
    """Change the package's settings for the whole process.

    A parameter left at None keeps its value (as in scikit-learn). The caches read their budgets when they
    store an entry, so a smaller budget evicts at the next store (``0`` drops
    nothing already held: :func:`~ilargi_sklearn.clear_caches` does). No setting
    changes a result beyond rounding; ``statistics_downdating`` is the one that
    changes bits (see below).

    Parameters
    ----------
    statistics_cache_bytes : int or "auto", default=None
        Most bytes of sufficient statistics (grams, target products) that
        gram-based fits (least squares, ridge, the elastic net, PCA) keep per
        root dataset, row subset, weights and target, so that the candidates of
        a search compute each fold's statistics once. ``"auto"`` (the process's
        default): a sixteenth of the machine's memory; 0: off (every fit
        computes its own).
    materialization_cache_bytes : int or "auto", default=None
        Most bytes of joined matrices kept for ``strategy="materialized"`` fits
        (the join of a root dataset is built once for its slices). ``"auto"``
        (default): a quarter of the machine's memory; 0: off.
    materialization_cache_entries : int, default=None
        Most joined matrices kept (root datasets times devices); 4 by default.
    slice_memo_bytes : int or "auto", default=None
        Most bytes of gathered rows kept for the integer index arrays a search
        slices a dataset with again and again (``ds[train]`` per candidate).
        ``"auto"`` (default): a sixteenth of the machine's memory; 0: off.
        ``ds[idx]`` is a new dataset every time either way.
    slice_memo_entries : int, default=None
        Most slices kept; 32 by default.
    statistics_downdating : bool, default=None
        Whether a gram-based fit on a row slice of at least half its root (a
        fold of ``GridSearchCV``) may form its gram as the root's minus the other
        rows' (about two passes over the data for a whole K-fold search instead
        of K). It agrees with the direct gram to rounding (guarded), but the bits
        of a fit then depend on which slices were fitted before it in the
        process. Off: a fit's bits never depend on what ran before. The
        cross-validated estimators (``FactorizedRidgeCV``, ...) downdate their
        folds either way: they know the folds, and their result depends on
        nothing else. False by default.
    plan_history_size : int, default=None
        Kinds of work (root dataset, estimator, work features) whose measured
        plan times :class:`~ilargi_sklearn.AutoPlan` keeps; 0: none (every fit
        chooses by prediction). 256 by default.
    compiled_kernels : bool, default=None
        Whether the numba kernels are used where numba is installed (off: the
        NumPy kernels, which agree to rounding; as the environment variable
        ``ILARGI_SKLEARN_NO_NUMBA=1``). True by default.

    See Also
    --------
    config_context : Change settings for a block of code.
    get_config : The current settings.
    sklearn.set_config : scikit-learn's settings.

    Examples
    --------
    >>> from ilargi_sklearn import get_config, set_config
    >>> set_config(statistics_cache_bytes=0)  # every fit computes its statistics
    >>> get_config()["statistics_cache_bytes"]
    0
    >>> set_config(statistics_cache_bytes="auto")  # back to the default
    """
    settings = {k: v for k, v in locals().items() if v is not None}
    settings = _validated(settings)
    with _global_lock:
        _global_config.update(settings)


@contextmanager
def config_context(**settings: Any) -> Iterator[None]:
    """Change the package's settings in the calling thread for a block of code.

    Takes the parameters of :func:`set_config`. The previous settings are back
    when the block exits, also on an error; other threads keep theirs.

    Parameters
    ----------
    **settings
        Parameters of :func:`set_config`.

    Yields
    ------
    None

    See Also
    --------
    set_config : Change settings for the process.
    sklearn.config_context : scikit-learn's.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset, config_context
    >>> from ilargi_sklearn.linear_model import FactorizedRidge
    >>> rng = np.random.default_rng(0)
    >>> ds = MultiSourceDataset.from_matrices(
    ...     [rng.normal(size=(8, 2)), rng.normal(size=(3, 2))],
    ...     [None, np.arange(8) % 3],
    ... )
    >>> with config_context(statistics_cache_bytes=0):
    ...     _ = FactorizedRidge().fit(ds, rng.normal(size=8))
    >>> ds.cache_info()["statistics"]["entries"]
    0
    """
    layer = _validated(settings)
    stack = _overrides()
    stack.append(layer)
    try:
        yield
    finally:
        # Remove this block's layer (by identity: a nested block that exited
        # abnormally may have left the stack in any order).
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is layer:
                del stack[i]
                break


def total_memory() -> int:
    """Bytes of memory of the machine (8 GiB where it cannot be known)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


def cache_budget(name: str) -> int:
    """The byte budget ``name`` (a ``*_bytes`` setting) in bytes now."""
    value = get_config()[name]
    if value == "auto":
        return total_memory() // _MEMORY_SHARE[name]
    return int(value)


def _reset() -> None:
    """Every setting back to its default in the process, and this thread's
    overrides dropped (the test suite's per-test reset)."""
    with _global_lock:
        _global_config.clear()
        _global_config.update(_DEFAULTS)
    _overrides().clear()
