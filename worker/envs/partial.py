"""Partially observed classic control: CartPole and Pendulum without their velocities.

``CartPoleNoVel-v1`` observes the cart's position and the pole's angle (CartPole-v1's
observation without the two velocities) and ``PendulumNoVel-v1`` the cosine and sine of
the angle (Pendulum-v1's without the angular velocity), as RL Zoo names them. One
observation no longer says where the system is going: a policy has to remember the
observations before it, so these are the jobs that tell a policy with memory from one
without. Everything else (dynamics, rewards, time limits, rendering) is the full env's.

Registered in gymnasium's registry when warren's gymnasium env plug-in is imported, so
every warren process and any script that loads the plug-in can make them by id.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

CARTPOLE_NO_VELOCITY = "CartPoleNoVel-v1"
PENDULUM_NO_VELOCITY = "PendulumNoVel-v1"


class DropVelocities(gym.ObservationWrapper[npt.NDArray[np.float32], Any, npt.NDArray[np.float32]]):
    """Keeps the entries ``keep`` of a flat Box observation (and of its bounds)."""

    def __init__(self, env: gym.Env[npt.NDArray[np.float32], Any], keep: tuple[int, ...]) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, gym.spaces.Box) and len(box.shape) == 1
        self.keep = np.asarray(keep, dtype=np.intp)
        self.observation_space = gym.spaces.Box(box.low[self.keep], box.high[self.keep], dtype=box.dtype)

    def observation(self, observation: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        return observation[self.keep]


def cartpole_no_velocity(**kwargs: Any) -> gym.Env[Any, Any]:
    """CartPole-v1 observing ``[x, theta]`` (its time limit of 500 steps included)."""
    return DropVelocities(gym.make("CartPole-v1", **kwargs), (0, 2))


def pendulum_no_velocity(**kwargs: Any) -> gym.Env[Any, Any]:
    """Pendulum-v1 observing ``[cos(theta), sin(theta)]`` (its time limit of 200 steps included)."""
    return DropVelocities(gym.make("Pendulum-v1", **kwargs), (0, 1))


def register_partial_envs() -> None:
    """Register both ids with gymnasium (once; again is a no-op)."""
    if CARTPOLE_NO_VELOCITY not in gym.registry:
        # The full env's threshold: the same task, harder to see.
        gym.register(CARTPOLE_NO_VELOCITY, entry_point=cartpole_no_velocity, reward_threshold=475.0)
    if PENDULUM_NO_VELOCITY not in gym.registry:
        gym.register(PENDULUM_NO_VELOCITY, entry_point=pendulum_no_velocity)
