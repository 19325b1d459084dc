"""Tests that need a CUDA GPU: every test here is marked ``gpu`` and skipped, saying why, where torch sees none.

They never touch CUDA on a machine without it (``torch.cuda.is_available()`` is the only
call, and it returns at once there). ``scripts/gpu-session`` runs them on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

NO_GPU = "needs a CUDA GPU: torch.cuda.is_available() is false here (scripts/gpu-session runs these on one)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = __file__.rsplit("/", 1)[0]
    available = torch.cuda.is_available()
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not available:
                item.add_marker(pytest.mark.skip(reason=NO_GPU))
