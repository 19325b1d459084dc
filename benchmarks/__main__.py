"""Entry point of ``python -m benchmarks``."""

from __future__ import annotations

import sys

from worker.lifecycle import single_threaded_math

single_threaded_math()  # as every warren process does, before numpy loads

from benchmarks.runner import main  # noqa: E402

sys.exit(main())
