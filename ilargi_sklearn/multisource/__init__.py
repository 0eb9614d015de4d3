"""MultiSourceDataset, its builders and the operator protocol."""

from ilargi_sklearn.multisource._builder import (
    DEFAULT_MIN_MATCH,
    Join,
    JoinFanOutWarning,
    JoinMatchWarning,
)
from ilargi_sklearn.multisource._describe import DatasetDescription
from ilargi_sklearn.multisource._encoding import UnknownCategoryWarning
from ilargi_sklearn.multisource._frames import from_frames
from ilargi_sklearn.multisource._interactions import InteractionOperator
from ilargi_sklearn.multisource._multi_source import MultiSourceDataset, as_operator
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)
from ilargi_sklearn.multisource._schema import DatasetSchema
from ilargi_sklearn.multisource._stats_cache import (
    clear_statistics_cache,
    set_statistics_cache,
)

__all__ = [
    "DEFAULT_MIN_MATCH",
    "AffineOperator",
    "DatasetDescription",
    "DatasetSchema",
    "FactorizedMatrix",
    "InteractionOperator",
    "Join",
    "JoinFanOutWarning",
    "JoinMatchWarning",
    "MatrixOperator",
    "MultiSourceDataset",
    "Operator",
    "UnknownCategoryWarning",
    "as_operator",
    "clear_statistics_cache",
    "from_frames",
    "set_statistics_cache",
]
