"""``python -m benchmarks.study``: the strategy study (run from the repository root; see the package docstring)."""

import sys

from benchmarks.study.cli import main

sys.exit(main())
