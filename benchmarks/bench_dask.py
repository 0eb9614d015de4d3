"""Factorized fit on a Dask LocalCluster vs the in-memory factorized fit.

A synthetic star schema: ``--rows`` target rows, 10 base features and 200 dimension
features in ``--dims`` dimension tables of ``--dim-rows`` rows. The fact table and the
foreign keys are generated on the cluster (they never exist on the client); the
dimension tables are NumPy arrays broadcast to the workers.

Recorded per size: the wall time of ``FactorizedLinearRegression`` (normal-equation
solver) on the Dask dataset and on the in-memory dataset (the same data computed to
the client), the peak RSS of every worker process during the Dask fit (``VmHWM``,
reset before the fit), and the bytes moved per iteration of the fused gradient step
``T^T (T w - y)``: the bytes of the results received by the client and the bytes
workers sent each other (``Worker.transfer_outgoing_bytes_total``).

The target ``y`` is pinned next to the fact-table chunks (``align_rows``) and work
stealing is off, so that no task moves a row chunk to another worker; one warm-up
step (the workers' first reads of the dimension tables) precedes the traffic count.

Usage::

    python benchmarks/bench_dask.py --rows 2000000 --out results/dask.jsonl
    python benchmarks/bench_dask.py --rows 20000000 --chunk-rows 2500000 \
        --memory-limit 9GB --iters 3

The issue's full size (``--rows 20000000``, materialized 33.6 GB) holds 2.26 GB of
fact table and keys on the cluster and runs in about two minutes on a 2-core machine
(data generation, both fits and the traffic steps).
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

logger = logging.getLogger("bench_dask")


def _worker_reset_peak() -> int:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _worker_status("VmRSS")


def _worker_status(field: str = "VmHWM") -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def _sent_bytes(dask_worker) -> int:
    return int(dask_worker.transfer_outgoing_bytes_total)


def _build(client, args):
    import dask.array as da

    from ilargi_sklearn.distributed import dask_dataset

    rng = np.random.default_rng(args.seed)
    per_dim = args.dim_features // args.dims
    dims = [rng.standard_normal((args.dim_rows, per_dim)) for _ in range(args.dims)]
    drng = da.random.default_rng(args.seed)
    chunks = (args.chunk_rows,)
    base = drng.standard_normal((args.rows, args.base_features), chunks=chunks + (-1,))
    keys = [
        drng.integers(0, args.dim_rows, args.rows, chunks=chunks)
        for _ in range(args.dims)
    ]
    ds = dask_dataset([base, *dims], [None, *keys])
    w_true = rng.standard_normal(ds.shape[1])
    # y is pinned next to the fact-table chunks it is combined with.
    y = ds.operator.align_rows(
        ds @ w_true + drng.standard_normal(args.rows, chunks=chunks)
    )
    return ds, y


def _iteration_traffic(client, ds, y, n_iter):
    """Bytes received by the client and sent between workers per gradient step."""
    op = ds.operator
    w = np.zeros(ds.shape[1])
    op.rmatmul(op.matmul(w) - y)  # warm-up: first reads of the sources
    sent0 = sum(client.run(_sent_bytes).values())
    received = 0
    t0 = time.perf_counter()
    for _ in range(n_iter):
        g = op.rmatmul(op.matmul(w) - y)  # T^T (T w - y): one graph, one result
        received += g.nbytes
        w = w - 1e-9 * g
    seconds = (time.perf_counter() - t0) / n_iter
    sent = sum(client.run(_sent_bytes).values()) - sent0
    return received / n_iter, sent / n_iter, seconds


def run(args) -> dict:
    import dask
    from dask.distributed import Client, LocalCluster

    from ilargi_sklearn import MultiSourceDataset
    from ilargi_sklearn.linear_model import FactorizedLinearRegression

    # Work stealing moves a ready task (and its row chunk) to an idle worker; the
    # operator pins every row chunk next to its partners, so keep tasks there.
    dask.config.set({"distributed.scheduler.work-stealing": False})
    cluster = LocalCluster(
        n_workers=args.workers,
        threads_per_worker=1,
        memory_limit=args.memory_limit,
        dashboard_address=None,
    )
    client = Client(cluster)
    try:
        ds, y = _build(client, args)
        n, m = ds.shape
        rec = {
            "rows": n,
            "features": m,
            "chunks": ds.operator.n_chunks,
            "workers": args.workers,
            "bytes_materialized": n * m * 8,
            "bytes_factorized": ds.nbytes,
        }
        received, sent, it_s = _iteration_traffic(client, ds, y, args.iters)
        rec.update(
            iter_client_bytes=received, iter_worker_bytes=sent, iter_seconds=it_s
        )

        client.run(_worker_reset_peak)
        t0 = time.perf_counter()
        reg = FactorizedLinearRegression().fit(ds, y)
        rec["dask_fit_seconds"] = time.perf_counter() - t0
        rec["worker_peak_rss"] = list(client.run(_worker_status).values())

        if not args.skip_in_memory:
            fm = ds.operator.to_in_memory()
            mem = MultiSourceDataset(fm, ds.feature_names, ds.source_names)
            y_host = y.compute()
            t0 = time.perf_counter()
            ref = FactorizedLinearRegression().fit(mem, y_host)
            rec["memory_fit_seconds"] = time.perf_counter() - t0
            rec["ratio_dask_over_memory"] = (
                rec["dask_fit_seconds"] / rec["memory_fit_seconds"]
            )
            rec["max_coef_diff"] = float(
                np.max(np.abs(np.asarray(reg.coef_) - ref.coef_))
            )
        return rec
    finally:
        client.close()
        cluster.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--chunk-rows", type=int, default=250_000)
    p.add_argument("--base-features", type=int, default=10)
    p.add_argument("--dim-features", type=int, default=200)
    p.add_argument("--dims", type=int, default=4)
    p.add_argument("--dim-rows", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-limit", default="6GB")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-in-memory", action="store_true")
    p.add_argument("--out", default=None, help="JSON-lines file to append to")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("distributed").setLevel(logging.WARNING)
    rec = run(args)
    for k, v in rec.items():
        logger.info("%-24s %s", k, v)
    if args.out:
        from _common import write_records

        write_records(args.out, [rec])


if __name__ == "__main__":
    main()
