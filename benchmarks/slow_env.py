"""``SlowCartPole-v1``: CartPole whose every step waits, like a simulator behind a network or an IPC hop.

Registered with gymnasium when imported: the collection-at-scale case names this module in
``WARREN_ENV_PACKAGES``, so warren's collectors and the bare loops it is compared with make
the same env. The wait (``step_delay_s``, 2 ms by default) is a sleep, not work: the env is
latency-bound, and what a process spends on CPU per step is the cost of everything around
the env.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "SlowCartPole-v1"
STEP_DELAY_S = 0.002


class SlowCartPole(CartPoleEnv):
    """CartPole-v1 whose ``step`` first sleeps ``step_delay_s``."""

    def __init__(self, step_delay_s: float = STEP_DELAY_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_delay_s = step_delay_s

    def step(self, action: Any) -> Any:
        if self.step_delay_s > 0:  # sleep(0) is not free: it gives up the CPU
            time.sleep(self.step_delay_s)
        return super().step(action)  # type: ignore[no-untyped-call]


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SlowCartPole, max_episode_steps=500, reward_threshold=475.0)
