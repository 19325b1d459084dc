"""``python -m worker.cli``: the ``warren`` command (how ``warren run`` starts its children)."""

from __future__ import annotations

import sys

from worker.cli.main import main

sys.exit(main())
