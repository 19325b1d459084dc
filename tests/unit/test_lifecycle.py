"""Process set-up shared by the roles (worker/lifecycle.py)."""

from __future__ import annotations

import torch

from worker.lifecycle import limit_torch_threads


def test_limit_torch_threads_sets_the_pool_size() -> None:
    before = torch.get_num_threads()
    try:
        limit_torch_threads(1)
        assert torch.get_num_threads() == 1
        limit_torch_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
