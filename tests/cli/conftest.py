"""Fixtures of the command line's tests: the tiny star schema on disk with its
spec, and one BLAS thread."""

from __future__ import annotations

import pytest
from _cli_data import SPEC, write_star


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    # On a shared machine, spinning BLAS threads make the tiny fits of these tests
    # 10x slower; one thread changes no result.
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


@pytest.fixture
def star(tmp_path):
    """The star schema of :func:`_cli_data.write_star` under ``tmp_path / "data"``
    and its spec, ``tmp_path / "star.toml"``."""
    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC)
    return spec
