"""``python -m ckpred``: see :mod:`ckpred.cli`."""

import sys

from ckpred.cli import main

if __name__ == "__main__":
    sys.exit(main())
