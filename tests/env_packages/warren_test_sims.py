"""An env package for tests, as ``WARREN_ENV_PACKAGES`` names one: importing it registers gymnasium ids.

Put ``tests/env_packages`` on ``PYTHONPATH`` and set ``WARREN_ENV_PACKAGES=warren_test_sims``:

* ``WarrenTestSim-v0``: CartPole under another name (only this module registers it);
* ``WarrenTestHang-v0``: resets, then never returns from ``step``, as an env stuck in its
  simulator would (for ``warren check``'s time limit); it first writes its process id to the
  file ``WARREN_TEST_HANG_PID_FILE`` names, if set.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

SIM_ID = "WarrenTestSim-v0"
HANG_ID = "WarrenTestHang-v0"
PID_FILE_VARIABLE = "WARREN_TEST_HANG_PID_FILE"


class HangingEnv(gym.Env[np.ndarray, np.int64]):
    """Four-float observations, two actions; ``step`` sleeps forever."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        marker = os.environ.get(PID_FILE_VARIABLE)
        if marker:  # tells a test that the hang began, and in which process
            Path(marker).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)


if SIM_ID not in gym.registry:
    gym.register(
        SIM_ID,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        max_episode_steps=500,
        reward_threshold=475.0,
    )
if HANG_ID not in gym.registry:
    gym.register(HANG_ID, entry_point=f"{__name__}:HangingEnv", max_episode_steps=100, reward_threshold=100.0)
