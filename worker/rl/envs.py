"""A batch of gymnasium envs stepped together, with explicit episode bookkeeping.

A plain list of envs is used instead of ``gymnasium.vector``: gymnasium 1.x vector envs
autoreset on the *next* step, which makes it easy to mix the final observation of one
episode with the first of the next. Here each env is reset right after its episode
ends, and the step result carries both the true final observation (needed to bootstrap
truncated episodes) and the observation the policy should see next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.protocol import Refusal

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class EnvStep:
    """What one env did in one step."""

    env_id: int
    next_obs: FloatArray
    """Observation after the action: the real final observation if the episode ended."""
    reward: float
    terminated: bool
    """The MDP reached a terminal state: do not bootstrap from ``next_obs``."""
    truncated: bool
    """The episode was cut (time limit); ``next_obs`` is still a valid bootstrap state."""
    episode_return: float | None
    """Sum of the episode's rewards when it ended in this step, else ``None``."""

    @property
    def episode_end(self) -> bool:
        return self.terminated or self.truncated


def make_env(env_id: str) -> gym.Env[Any, Any]:
    """Create one registered gymnasium env.

    Only ids in gymnasium's registry are accepted: ``gym.make("module:Env")`` would
    import an arbitrary module named by an untrusted task message.

    Raises:
        TaskError: the id is not registered, or its env is not a flat ``Box``
            observation / ``Discrete`` action env that a Q-network can drive.
    """
    if env_id not in gym.registry:
        raise Refusal.UNKNOWN_ENV.error(f"unknown env id {env_id!r}: not in the gymnasium registry")
    try:
        env = gym.make(env_id)
    except gym.error.Error as exc:
        raise Refusal.UNKNOWN_ENV.error(f"cannot create env {env_id!r}: {exc}") from exc
    obs_space, act_space = env.observation_space, env.action_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        env.close()
        raise Refusal.UNSUPPORTED_ENV.error(f"env {env_id!r} has observation space {obs_space}; a flat Box is required")
    if not isinstance(act_space, gym.spaces.Discrete):
        env.close()
        raise Refusal.UNSUPPORTED_ENV.error(f"env {env_id!r} has action space {act_space}; Discrete is required")
    return env


class EnvBatch:
    """``env_num`` copies of one env, stepped in lock step by the collector.

    Args:
        env_id: registered gymnasium id.
        env_num: number of copies.
        seed: env ``i`` is first reset with ``seed + i``; later resets continue its RNG.

    Raises:
        TaskError: see :func:`make_env`.
    """

    def __init__(self, env_id: str, env_num: int, seed: int | None = None) -> None:
        self.env_id = env_id
        self._envs: list[gym.Env[Any, Any]] = []
        try:
            for _ in range(env_num):
                self._envs.append(make_env(env_id))
        except BaseException:
            self.close()
            raise
        first = self._envs[0]
        # make_env checked both spaces.
        self.observation_space = cast(gym.spaces.Box, first.observation_space)
        self.action_space = cast(gym.spaces.Discrete, first.action_space)
        self.obs_dim = int(self.observation_space.shape[0])
        self.n_actions = int(self.action_space.n)
        self._seed = seed
        self._was_reset = False
        self._seed_seq = np.random.SeedSequence(seed)
        self._obs = np.zeros((env_num, self.obs_dim), dtype=np.float32)
        self._returns = np.zeros(env_num, dtype=np.float64)

    def __len__(self) -> int:
        return len(self._envs)

    @property
    def obs(self) -> FloatArray:
        """Current observation of every env, ``[env_num, obs_dim]`` float32 (read-only view)."""
        view = self._obs.view()
        view.flags.writeable = False
        return view

    def spawn_seed(self) -> int:
        """A new seed for the exploration RNG of the next task run on this batch.

        Tasks that share a long-lived batch must not replay the same exploration
        draws; deriving the seeds from the batch seed keeps seeded runs reproducible.
        """
        return int(self._seed_seq.spawn(1)[0].generate_state(1)[0])

    @property
    def needs_reset(self) -> bool:
        """True until the first :meth:`reset`; after it, episodes continue across tasks."""
        return not self._was_reset

    def reset(self) -> FloatArray:
        """Start a fresh episode in every env and return the observations.

        Only the first reset seeds the envs: reseeding later would replay the same
        initial states again and again.
        """
        for i, env in enumerate(self._envs):
            seed = None if self._seed is None or self._was_reset else self._seed + i
            obs, _ = env.reset(seed=seed)
            self._obs[i] = obs
        self._returns[:] = 0.0
        self._was_reset = True
        return self.obs

    def step(self, env_ids: Sequence[int] | npt.NDArray[np.int64], actions: npt.NDArray[np.int64]) -> list[EnvStep]:
        """Step the envs ``env_ids`` with ``actions`` (same order); other envs stand still.

        An env whose episode ends is reset at once, so :attr:`obs` always holds the
        observations the policy should act on next.
        """
        results = []
        for env_id, action in zip(env_ids, actions, strict=True):
            i = int(env_id)
            next_obs, reward, terminated, truncated, _ = self._envs[i].step(int(action))
            next_obs = np.asarray(next_obs, dtype=np.float32)
            self._returns[i] += float(reward)
            episode_return = None
            if terminated or truncated:
                episode_return = float(self._returns[i])
                self._returns[i] = 0.0
                self._obs[i], _ = self._envs[i].reset()
            else:
                self._obs[i] = next_obs
            results.append(EnvStep(i, next_obs, float(reward), bool(terminated), bool(truncated), episode_return))
        return results

    def close(self) -> None:
        """Close every env; safe to call more than once."""
        envs, self._envs = self._envs, []
        for env in envs:
            env.close()
