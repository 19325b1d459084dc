"""``python3 scripts/offline_kit`` (what ``scripts/offline-kit`` runs), or ``python3 -m offline_kit`` beside it."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__:
    from .cli import main
else:  # run as a folder: its package is imported from the folder it stands in (scripts/, or the kit)
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
    from offline_kit.cli import main

sys.exit(main())
