"""``python -m benchmarks``: run the benchmark sweep (see ``benchmarks/run.py``)."""

import sys

from benchmarks.run import main

if __name__ == "__main__":
    sys.exit(main())
