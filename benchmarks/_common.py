"""Shared helpers of the benchmark scripts: timing, peak memory, records, hardware.

Timing follows DESIGN.md 8: ``time.perf_counter``, one discarded warm-up call, the
median of the repeats. Plans that are compared are timed *interleaved* (A, B, A, B,
...) so that a busy neighbour on a shared machine slows both alike.

Peak memory is measured two ways, and every record says which (``peak_method``):

* ``tracemalloc``: the peak of the bytes allocated through Python's and NumPy's
  allocators during one call, above what was allocated before it (NumPy, SciPy and
  pandas' hash tables report to tracemalloc; Arrow buffers and BLAS scratch space do
  not). Used for the operators, whose temporaries are NumPy arrays.
* ``rss``: the growth of the peak resident set size (``VmHWM`` in
  ``/proc/self/status``, reset through ``/proc/self/clear_refs``) of a fresh child
  process during one call, with glibc's malloc told to return large blocks to the OS
  at once (``MALLOC_MMAP_THRESHOLD_``) and Arrow told to use malloc. Used where
  allocations bypass tracemalloc (pandas on Arrow-backed strings). Linux only.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ilargi_sklearn.planner._hardware import _cpu_model

__all__ = [
    "RSS_CHILD_ENV",
    "format_bytes",
    "hardware_info",
    "peak_rss_call",
    "peak_rss_child",
    "peak_tracemalloc",
    "print_table",
    "run_json_child",
    "time_calls",
    "write_records",
]

#: Environment of the child processes that measure peak RSS.
RSS_CHILD_ENV = {
    # Fixed mmap threshold: freed large blocks go back to the OS instead of staying
    # in the heap, where a later allocation would reuse them without raising RSS.
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "65536",
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}


def time_calls(
    funcs: dict[str, Callable[[], Any]],
    repeat: int = 5,
    warmup: int = 1,
    budget: float | None = None,
) -> dict[str, dict[str, Any]]:
    """Time several callables interleaved; return per-name timing statistics.

    Parameters
    ----------
    funcs : dict of str to callable
        The calls to compare (each is called ``warmup + repeat`` times).
    repeat : int
        Timed calls per callable.
    warmup : int
        Discarded calls per callable, before any timed call.
    budget : float, optional
        Seconds the timed calls may take together, estimated from the warm-up:
        ``repeat`` is lowered to fit it, but never below 3.

    Returns
    -------
    dict of str to dict
        ``seconds`` (median), ``seconds_min``, ``seconds_max`` and ``repeat``.
    """
    one_round = 0.0
    for f in funcs.values():
        for _ in range(warmup):
            start = time.perf_counter()
            f()
            one_round += (time.perf_counter() - start) / warmup
    if budget is not None and warmup and one_round * repeat > budget:
        repeat = max(3, int(budget / one_round))
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for _ in range(repeat):
        for name, f in funcs.items():
            gc.collect()
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {
        name: {
            "seconds": statistics.median(ts),
            "seconds_min": min(ts),
            "seconds_max": max(ts),
            "repeat": repeat,
        }
        for name, ts in times.items()
    }


def peak_tracemalloc(func: Callable[[], Any]) -> int:
    """Peak bytes allocated (tracemalloc) during one call, above the start level."""
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        result = func()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return int(peak - base)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_rss_call(func: Callable[[], Any]) -> int:
    """Growth of the peak RSS of this process during one call (Linux).

    Meaningful in a fresh process started with :data:`RSS_CHILD_ENV` (see
    :func:`peak_rss_child`); in a long-lived process freed heap pages are reused
    without showing up.
    """
    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    before = _status_kib("VmRSS")
    result = func()
    peak = _status_kib("VmHWM")
    del result
    return int(max(peak - before, 0) * 1024)


def run_json_child(
    argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 300.0
) -> dict[str, Any]:
    """Run ``python argv...`` in a fresh process (``env`` added to this one's
    environment) and parse the JSON object it prints as its last line."""
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"child {argv} failed with code {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_rss_child(argv: Sequence[str], timeout: float = 300.0) -> dict[str, Any]:
    """:func:`run_json_child` with :data:`RSS_CHILD_ENV`, for a child that calls
    :func:`peak_rss_call` and prints one JSON object as its last line."""
    return run_json_child(argv, RSS_CHILD_ENV, timeout)


def _blas_info() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        return []
    keep = ("user_api", "internal_api", "version", "num_threads", "architecture")
    return [{k: _scalar(d.get(k)) for k in keep} for d in threadpool_info()]


def _scalar(value: Any) -> Any:
    """A JSON scalar of a library's figure: SciPy's fast_matrix_market reports
    its ``version`` to threadpoolctl as a function (once ``scipy.io`` has loaded
    it), which made every record of that process fail to write."""
    if callable(value):
        try:
            value = value()
        except Exception:  # noqa: BLE001 - a figure of the environment only
            value = repr(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def hardware_info() -> dict[str, Any]:
    """CPU, memory and library versions of this machine (one dict per run)."""
    import pandas as pd
    import scipy

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count()
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        mem = None
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "memory_bytes": mem,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pandas": pd.__version__,
        "blas": _blas_info(),
        "platform": platform.platform(),
    }


def write_records(path: str | None, records: Iterable[dict[str, Any]]) -> None:
    """Append records to a JSON-lines file (nothing when ``path`` is None)."""
    if path is None:
        return
    with open(path, "a") as fh:
        for r in records:
            fh.write(json.dumps(r, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def format_bytes(n: float | None) -> str:
    """``1.5 MB`` style (powers of 1000)."""
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` as a fixed-width text table with the given columns."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)
    ]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
