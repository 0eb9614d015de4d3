"""Hardware features of the cost model: cores, measured GEMM rate and bandwidth.

The rates are measured once per machine (a fraction of a second) and cached in
``hardware.json`` in the user cache directory (``$ILARGI_CACHE_DIR``, else
``$XDG_CACHE_HOME/ilargi_sklearn``, else ``~/.cache/ilargi_sklearn``), keyed by a
machine identifier, so that a calibration and later fits see the same numbers. GPU
figures are added only when the probe says a GPU is usable. A cached figure that is
missing, or not a finite positive number (a damaged or hand-edited file), is
measured again and the file rewritten: the cost model divides by these rates.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from ilargi_sklearn._backend._gpu import probe_gpu

__all__ = ["cache_dir", "cpu_count", "gpu_info", "hardware_info", "machine_id"]

logger = logging.getLogger(__name__)

_HARDWARE_FILE = "hardware.json"
# Version of the measurement procedure: a change invalidates cached figures.
_VERSION = 1


def cache_dir() -> Path:
    """The user cache directory of ilargi_sklearn (not created here).

    ``$ILARGI_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/ilargi_sklearn``, else
    ``~/.cache/ilargi_sklearn``.
    """
    env = os.environ.get("ILARGI_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "ilargi_sklearn"


def cpu_count() -> int:
    """CPU cores this process may run on (the affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - non-Linux
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def machine_id() -> str:
    """A string that identifies this machine's hardware for the cache."""
    # The host name only as a short hash: records may be shared.
    host = hashlib.sha1(platform.node().encode()).hexdigest()[:10]
    return f"{host}|{platform.machine()}|{_cpu_model()}|{cpu_count()}"


def _best_time(func, repeat: int) -> float:
    func()  # warm-up: page faults, BLAS thread start
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def _measure_cpu() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    n = 384
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    gemm = 2.0 * n**3 / _best_time(lambda: a @ b, 5) / 1e9
    # A copy larger than the last-level cache: read + write bytes over time.
    src = rng.standard_normal(4_000_000)
    dst = np.empty_like(src)
    bw = 2.0 * src.nbytes / _best_time(lambda: np.copyto(dst, src), 5) / 1e9
    # Random row gather (the factorized plans' access pattern), in GB/s of output.
    Z = rng.standard_normal((50_000, 4))
    idx = rng.integers(0, Z.shape[0], 1_000_000)
    gather = (
        idx.shape[0] * Z.shape[1] * 8 / _best_time(lambda: np.take(Z, idx, axis=0), 3)
    )
    return {
        "cpu_cores": cpu_count(),
        "cpu_model": _cpu_model(),
        "gemm_gflops": float(gemm),
        "mem_bandwidth_gbs": float(bw),
        "gather_gbs": float(gather / 1e9),
    }


def _measure_gpu() -> dict[str, Any]:
    """GPU name, memory and measured rates; empty when no GPU is usable."""
    usable, reason = probe_gpu()
    if not usable:
        return {}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)

        def sync_time(func, repeat=5):
            func()
            cupy.cuda.Device().synchronize()
            best = np.inf
            for _ in range(repeat):
                t0 = time.perf_counter()
                func()
                cupy.cuda.Device().synchronize()
                best = min(best, time.perf_counter() - t0)
            return max(best, 1e-9)

        n = 2048
        a = cupy.random.standard_normal((n, n))
        gemm = 2.0 * n**3 / sync_time(lambda: a @ a) / 1e9
        src = cupy.random.standard_normal(32_000_000)
        dst = cupy.empty_like(src)
        bw = 2.0 * src.nbytes / sync_time(lambda: cupy.copyto(dst, src)) / 1e9
        return {
            "gpu_name": name,
            "gpu_memory_bytes": int(props["totalGlobalMem"]),
            "gpu_gemm_gflops": float(gemm),
            "gpu_bandwidth_gbs": float(bw),
        }
    except Exception as exc:  # noqa: BLE001 - a failed measurement is no GPU
        logger.info("GPU rates could not be measured: %s: %s", type(exc).__name__, exc)
        return {}


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        with open(path) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


#: The figures the cost model divides by (rates) or multiplies with: a cached
#: entry holds each as a finite, positive number, or is measured again.
_RATES = ("cpu_cores", "gemm_gflops", "mem_bandwidth_gbs", "gather_gbs")
_GPU_RATES = ("gpu_memory_bytes", "gpu_gemm_gflops", "gpu_bandwidth_gbs")


def _bad_figures(entry: dict[str, Any]) -> list[str]:
    """The figures of a cached entry that are missing, or not finite and positive
    numbers (a hand-edited or damaged file; ``json`` reads NaN and Infinity)."""
    names = list(_RATES)
    if any(k.startswith("gpu_") for k in entry):
        names += _GPU_RATES
    bad = []
    for name in names:
        v = entry.get(name)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not (ok and math.isfinite(v) and v > 0):
            bad.append(f"{name}={v!r}")
    return bad


@functools.lru_cache(maxsize=4)
def _hardware_info_cached(cache_path: str, key: str) -> dict[str, Any]:
    path = Path(cache_path)
    data = _read_cache(path)
    entry = data.get(key)
    if isinstance(entry, dict) and entry.get("version") == _VERSION:
        bad = _bad_figures(entry)
        if not bad:
            return entry
        logger.warning(
            "hardware figures cached in %s are not finite and positive (%s): "
            "measuring them again.",
            path,
            ", ".join(bad),
        )
    t0 = time.perf_counter()
    entry = {"version": _VERSION, "machine": key, **_measure_cpu(), **_measure_gpu()}
    logger.info(
        "measured hardware in %.2f s: %.1f GFLOP/s GEMM, %.1f GB/s copy, %d cores",
        time.perf_counter() - t0,
        entry["gemm_gflops"],
        entry["mem_bandwidth_gbs"],
        entry["cpu_cores"],
    )
    data[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        logger.info("hardware figures not cached in %s: %s", path, exc)
    return entry


def hardware_info() -> dict[str, Any]:
    """Hardware features of this machine, measured once and cached.

    Returns
    -------
    info : dict
        ``cpu_cores``, ``cpu_model``, ``gemm_gflops`` (float64 GEMM, GFLOP/s),
        ``mem_bandwidth_gbs`` (copy, GB/s), ``gather_gbs`` (random row gather, GB/s
        of output) and, when a GPU is usable, ``gpu_name``, ``gpu_memory_bytes``,
        ``gpu_gemm_gflops`` and ``gpu_bandwidth_gbs``.
    """
    return dict(_hardware_info_cached(str(cache_dir() / _HARDWARE_FILE), machine_id()))


def gpu_info() -> dict[str, Any]:
    """The GPU part of :func:`hardware_info` (empty when no GPU is usable)."""
    return {k: v for k, v in hardware_info().items() if k.startswith("gpu_")}
