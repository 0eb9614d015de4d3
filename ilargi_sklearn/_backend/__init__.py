"""Backend layer: array namespaces, row maps (gather / scatter-add) and sparse shims.

Only this package knows which array library is underneath; everything above it calls
the functions exported here.
"""

from ilargi_sklearn._backend._ops import (
    RowMap,
    is_sparse,
    safe_sparse_dot,
    segment_sum,
    to_dense,
)

__all__ = ["RowMap", "is_sparse", "safe_sparse_dot", "segment_sum", "to_dense"]
