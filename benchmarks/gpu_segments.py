"""Scatter-adds on the GPU: ``cupy.add.at`` against the sorted segment sums.

Times ``I^T Y`` (a factorized ``rmatmul``'s scatter) and the gram's cross term
``I_a^T I_b Z`` both ways on a star-schema index vector, and the one-off sort that
the segment sums need (cached per row map). Run on a machine with a GPU::

    python benchmarks/gpu_segments.py --rows 1e7

Prints one line per case (median of 5 synchronized runs after a warm-up) and
``no GPU: <reason>`` (exit 0) where no usable GPU exists.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e7)
    parser.add_argument("--ratios", default="1000,100,20", help="tuple ratios n / m")
    parser.add_argument("--cols", default="1,4,8")
    args = parser.parse_args(argv)

    from ilargi_sklearn._backend._gpu import probe_gpu

    usable, reason = probe_gpu()
    if not usable:
        print(f"no GPU: {reason}")
        return 0
    import cupy
    from gpu_check import _timed

    from ilargi_sklearn._backend import _cuda

    def sync() -> None:
        cupy.cuda.Device().synchronize()

    n = int(args.rows)
    rng = np.random.default_rng(0)
    print(f"{'case':<34}{'tuple ratio':>12}{'k':>4}{'add.at ms':>11}{'sorted ms':>11}")
    for ratio in (int(r) for r in args.ratios.split(",")):
        m = max(1, n // ratio)
        idx = cupy.asarray(rng.integers(0, m, n).astype(np.int32))
        rows = _cuda.sorted_rows(idx, m)
        sort_ms = 1e3 * _timed(lambda idx=idx, m=m: _cuda.sorted_rows(idx, m), sync, 5)
        print(
            f"{'sort (once per row map)':<34}{ratio:>12}{'':>4}{'':>11}{sort_ms:>11.3f}"
        )
        for k in (int(c) for c in args.cols.split(",")):
            Y = cupy.asarray(rng.standard_normal((n, k)))

            def atomic(Y=Y, idx=idx, m=m, k=k):
                out = cupy.zeros((m, k))
                cupy.add.at(out, idx, Y)
                return out

            def sorted_(Y=Y, rows=rows):
                return _cuda.segment_sum(rows, Y)

            diff = float(cupy.max(cupy.abs(atomic() - sorted_())))
            a, s = _timed(atomic, sync, 5), _timed(sorted_, sync, 5)
            print(
                f"{'I^T Y':<34}{ratio:>12}{k:>4}{1e3 * a:>11.3f}{1e3 * s:>11.3f}"
                f"   max diff {diff:.1e}"
            )
            mb = 10_000
            g = cupy.asarray(rng.integers(0, mb, n).astype(np.int32))
            Z = cupy.asarray(rng.standard_normal((mb, k)))

            def atomic_cross(Z=Z, g=g, idx=idx, m=m, k=k):
                out = cupy.zeros((m, k))
                cupy.add.at(out, idx, cupy.take(Z, g, axis=0))
                return out

            def sorted_cross(Z=Z, g=g, rows=rows):
                return _cuda.segment_sum(rows, Z, gather=g)

            diff = float(cupy.max(cupy.abs(atomic_cross() - sorted_cross())))
            a, s = _timed(atomic_cross, sync, 5), _timed(sorted_cross, sync, 5)
            print(
                f"{'I_a^T I_b Z (10,000 rows of Z)':<34}{ratio:>12}{k:>4}"
                f"{1e3 * a:>11.3f}{1e3 * s:>11.3f}   max diff {diff:.1e}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
