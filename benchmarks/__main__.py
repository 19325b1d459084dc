"""Entry point of ``python -m benchmarks``."""

from __future__ import annotations

import sys

from benchmarks.runner import main

sys.exit(main())
