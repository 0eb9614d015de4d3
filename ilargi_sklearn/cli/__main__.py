"""``python -m ilargi_sklearn.cli``: the same program as ``python -m ilargi_sklearn``."""

import sys

from ilargi_sklearn.cli import main

if __name__ == "__main__":
    sys.exit(main())
