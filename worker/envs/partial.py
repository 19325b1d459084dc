"""Partially observed envs: CartPole and Pendulum without their velocities, and a cue to remember.

``CartPoleNoVel-v1`` observes the cart's position and the pole's angle (CartPole-v1's
observation without the two velocities) and ``PendulumNoVel-v1`` the cosine and sine of
the angle (Pendulum-v1's without the angular velocity), as RL Zoo names them. One
observation no longer says where the system is going: a policy has to remember the
observations before it, so these are the jobs that tell a policy with memory from one
without. Everything else (dynamics, rewards, time limits, rendering) is the full env's.

``CueMemory-v0`` is memory and nothing else: a cue shown at an episode's first step is to
be named ``delay`` steps later, when nothing shows it any more; a policy without memory
scores 0 on average, one that remembers 1.

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
CUE_MEMORY = "CueMemory-v0"


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


class CueMemory(gym.Env[npt.NDArray[np.float32], np.int64]):
    """Name the cue shown ``delay`` steps ago: +1 if the answer is right, -1 if wrong, and the episode ends.

    Observations are ``[cue, question]``: at the first step ``cue`` is -1 or +1 (drawn at
    reset) and ``question`` 0; then ``delay - 1`` steps of ``[0, 0]``; then ``[0, 1]``,
    where action 0 names -1 and action 1 names +1. Actions before the question do nothing.
    An episode is ``delay + 1`` steps; the question looks the same whatever the cue was.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 4}
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay: int = 4, render_mode: str | None = None) -> None:
        if not 1 <= int(delay) <= 1000:
            raise ValueError(f"delay must be 1 to 1000 steps, got {delay!r}")
        self.delay = int(delay)
        self.render_mode = render_mode
        self.cue = 1
        self.t = 0

    def render(self) -> npt.NDArray[np.uint8] | None:
        """A 64x128 frame: the cue's half lit at the first step, both halves grey at the question, dark between."""
        frame = np.zeros((64, 128, 3), dtype=np.uint8)
        if self.t == 0:
            frame[:, slice(0, 64) if self.cue < 0 else slice(64, 128)] = 255
        elif self.t == self.delay:
            frame[:] = (128, 128, 128)
        return frame

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.cue = 1 if self.np_random.random() < 0.5 else -1
        self.t = 0
        return np.array([self.cue, 0.0], dtype=np.float32), {}

    def step(self, action: np.int64) -> tuple[npt.NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.t <= self.delay:
            question = 1.0 if self.t == self.delay else 0.0
            return np.array([0.0, question], dtype=np.float32), 0.0, False, False, {}
        named = 1 if int(action) == 1 else -1
        return np.zeros(2, dtype=np.float32), 1.0 if named == self.cue else -1.0, True, False, {}


def register_partial_envs() -> None:
    """Register the ids with gymnasium (once; again is a no-op)."""
    if CARTPOLE_NO_VELOCITY not in gym.registry:
        # The full env's threshold: the same task, harder to see.
        gym.register(CARTPOLE_NO_VELOCITY, entry_point=cartpole_no_velocity, reward_threshold=475.0)
    if PENDULUM_NO_VELOCITY not in gym.registry:
        gym.register(PENDULUM_NO_VELOCITY, entry_point=pendulum_no_velocity)
    if CUE_MEMORY not in gym.registry:
        gym.register(CUE_MEMORY, entry_point="worker.envs.partial:CueMemory", reward_threshold=0.9)
