"""MultiSourceDataset, its builders and the operator protocol."""

from ilargi_sklearn.dataset._builder import Join, from_frames
from ilargi_sklearn.dataset._multi_source import (
    DatasetDescription,
    MultiSourceDataset,
    as_operator,
)
from ilargi_sklearn.dataset._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)

__all__ = [
    "AffineOperator",
    "DatasetDescription",
    "FactorizedMatrix",
    "Join",
    "MatrixOperator",
    "MultiSourceDataset",
    "Operator",
    "as_operator",
    "from_frames",
]
