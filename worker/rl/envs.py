"""A batch of envs stepped as one vector env, with explicit episode bookkeeping.

The vector env comes from an env plug-in (gymnasium's registry by default, see
:mod:`worker.envs.gymnasium`). Every one autoresets in gymnasium's ``NEXT_STEP`` mode:
the step that ends an episode returns its true final observation, and the env's *next*
step is a reset step whose action is ignored and which is not a transition.
:class:`VecStep.valid` marks the real ones.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.errors import TaskError
from worker.plugins.contract import EnvContext, EnvPlugin, Obs
from worker.plugins.spaces import Spaces, UnsupportedSpace, leaf_layout
from worker.protocol import Refusal

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class VecStep:
    """What every env of the batch did in one step (arrays of length ``num_envs``)."""

    next_obs: Obs
    """Observation after the action: the true final observation where an episode ended."""
    reward: npt.NDArray[np.float32]
    terminated: BoolArray
    """The MDP reached a terminal state: do not bootstrap from ``next_obs``."""
    truncated: BoolArray
    """The episode was cut (time limit); ``next_obs`` is still a valid bootstrap state."""
    valid: BoolArray
    """A real transition; False for the reset step that follows an episode end."""
    ended: BoolArray
    """An episode ended in this step (valid and terminated or truncated)."""
    episode_returns: npt.NDArray[np.float64]
    """Sum of each ended episode's rewards (meaningful where ``ended``)."""


def env_spaces(envs: gym.vector.VectorEnv[Any, Any, Any], env_id: str) -> Spaces:
    """The spaces of one env of the batch, checked to be ones warren carries.

    Raises:
        TaskError: ``unsupported env``, naming the space.
    """
    try:
        return Spaces(envs.single_observation_space, envs.single_action_space)
    except UnsupportedSpace as exc:
        raise Refusal.UNSUPPORTED_ENV.error(f"env {env_id!r}: {exc.message}") from None


class VecEnvBatch:
    """``ctx.num_envs`` copies of one env stepped together; see the module docstring.

    Args:
        plugin: the env plug-in that makes the vector env.
        ctx: which env, how many, seed, threads.

    Raises:
        TaskError: ``unknown env`` (the plug-in could not make it) or ``unsupported env``
            (spaces warren cannot carry, or a vector env that does not autoreset in
            ``NEXT_STEP`` mode).
    """

    def __init__(self, plugin: EnvPlugin, ctx: EnvContext) -> None:
        try:
            envs = plugin.make_vector_env(ctx)
        except TaskError:
            raise
        except Exception as exc:  # plug-in code can raise anything; the task fails, the worker lives
            raise Refusal.UNKNOWN_ENV.error(f"cannot create env {ctx.env_id!r}: {type(exc).__name__}: {exc}") from exc
        self._envs = envs
        self.plugin = plugin
        try:
            self._check_autoreset(ctx.env_id)
            self.spaces = env_spaces(envs, ctx.env_id)
        except BaseException:
            envs.close()
            raise
        if envs.num_envs != ctx.num_envs:
            envs.close()
            raise Refusal.UNSUPPORTED_ENV.error(f"env {ctx.env_id!r} made {envs.num_envs} envs, {ctx.num_envs} asked")
        self.env_id = ctx.env_id
        self.ctx = ctx
        observation = self.spaces.observation
        self._obs_layouts = (
            {key: (sub, *leaf_layout(sub)) for key, sub in observation.spaces.items()}
            if isinstance(observation, gym.spaces.Dict)
            else None
        )
        self._obs_layout = None if self._obs_layouts is not None else leaf_layout(observation)
        action = self.spaces.action
        self._box_bounds = (action.low, action.high) if isinstance(action, gym.spaces.Box) else None
        self.backend = type(envs).__name__
        self.num_envs = ctx.num_envs
        self._seed = ctx.seed
        self._seed_seq = np.random.SeedSequence(ctx.seed)
        self._obs: Obs = np.zeros(0)
        self._returns = np.zeros(ctx.num_envs, dtype=np.float64)
        self._after_end = np.zeros(ctx.num_envs, dtype=bool)
        self._was_reset = False
        self._closed = False
        self.memory: dict[str, npt.NDArray[Any]] | None = None
        """The state an actor with memory had after these envs' last step (what the next task's actor starts
        from, as episodes continue across tasks); ``None`` after a reset."""

    def _check_autoreset(self, env_id: str) -> None:
        mode = self._envs.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
        if str(getattr(mode, "value", mode)) != gym.vector.AutoresetMode.NEXT_STEP.value:
            raise Refusal.UNSUPPORTED_ENV.error(
                f"env {env_id!r}: its vector env autoresets in {mode} mode; warren needs NEXT_STEP"
            )

    def __len__(self) -> int:
        return self.num_envs

    @property
    def vector_env(self) -> gym.vector.VectorEnv[Any, Any, Any]:
        """The plug-in's vector env itself, to render it or read its metadata; step it only through this batch."""
        return self._envs

    @property
    def obs(self) -> Obs:
        """Current observation of every env, ``[num_envs, ...]``: a fresh array per step, never written to."""
        return self._obs

    @property
    def needs_reset(self) -> bool:
        """True until the first :meth:`reset`; after it, episodes continue across tasks."""
        return not self._was_reset

    def spawn_seed(self) -> int:
        """A new seed for the exploration RNG of the next task run on this batch.

        Tasks that share a long-lived batch must not replay the same exploration
        draws; deriving the seeds from the batch seed keeps seeded runs reproducible.
        """
        return int(self._seed_seq.spawn(1)[0].generate_state(1)[0])

    def reset(self, seed: int | None = None) -> Obs:
        """Start a fresh episode in every env; only the first reset uses the seed, unless ``seed`` is given.

        ``seed``: this reset's own (env ``i`` gets ``seed + i``), to play a given episode again
        (``warren eval`` films an eval's episodes one at a time in a one-env batch).
        """
        if seed is None:
            seed = None if self._seed is None or self._was_reset else self._seed
        obs, _ = self._envs.reset(seed=seed)
        self._obs = self._fresh(obs)
        self._returns[:] = 0.0
        self._after_end[:] = False
        self._was_reset = True
        self.memory = None
        return self._obs

    def step(self, actions: npt.NDArray[Any]) -> VecStep:
        """Step every env with its action (ignored by envs taking their reset step).

        ``Box`` actions are clipped into the box first (a Gaussian policy's samples are not
        bounded); the caller keeps the actions it chose, so their log-probabilities hold.
        """
        if self._box_bounds is not None:
            actions = np.clip(actions, *self._box_bounds)
        next_obs, reward, terminated, truncated, _ = self._envs.step(actions)
        # A fresh array each step, never written to again: views of earlier observations
        # (a caller's ``obs``, a step's ``next_obs``) stay what they were.
        next_obs = self._fresh(next_obs)
        reward = np.asarray(reward, dtype=np.float32)
        valid = ~self._after_end
        terminated = np.logical_and(terminated, valid)
        truncated = np.logical_and(truncated, valid)
        ended = terminated | truncated
        self._returns += np.where(valid, reward, 0.0)
        returns = self._returns.copy()
        if ended.any():
            self._returns[ended] = 0.0
        self._after_end = ended
        self._obs = next_obs
        return VecStep(next_obs, reward, terminated, truncated, valid, ended, returns)

    def _fresh(self, obs: Any) -> Obs:
        if self._obs_layouts is not None:
            return {
                key: _copy_as(obs[key], shape, dtype, self.num_envs, f"observation {key!r}")
                for key, (_, shape, dtype) in self._obs_layouts.items()
            }
        assert self._obs_layout is not None
        shape, dtype = self._obs_layout
        return _copy_as(obs, shape, dtype, self.num_envs, "observation")

    def close(self) -> None:
        """Close the envs; safe to call more than once."""
        if not self._closed:
            self._closed = True
            self._envs.close()


def _copy_as(values: Any, shape: tuple[int, ...], dtype: Any, num_envs: int, what: str) -> npt.NDArray[Any]:
    """A batch of observations in the space's chunk dtype (``leaf_layout``), checked to have its shape.

    Here, at the env's ``reset`` or ``step``, a plug-in's vector env that returns the wrong
    shape fails the task naming the env, rather than the actor, the chunks or the learner
    much later. (The dtype is converted, not checked.)
    """
    array = np.array(values, dtype=dtype)
    if array.shape != (num_envs, *shape):
        raise ValueError(
            f"{what} of {num_envs} envs has shape {array.shape}, the observation space wants {(num_envs, *shape)}"
        )
    return array


def worker_seed(seed: int, worker_id: str) -> int:
    """The seed of one collector's envs and exploration: the job's seed mixed with the worker's id.

    Every collector gets the same seed in its tasks. Used as it is, two collectors would
    reset the same episodes and draw the same exploration noise, so with the same weights
    they would ship the same data twice: half of what the learner gets would teach it
    nothing. Mixing in the worker id keeps each collector's streams seeded (same seed and
    id, same episode starts and exploration draws) while every collector steps episodes of
    its own. The data itself still depends on the policy version each step acts with,
    which depends on timing: a run is not repeatable as a whole.
    """
    mixed = np.random.SeedSequence([seed, zlib.crc32(worker_id.encode())])
    return int(mixed.generate_state(1)[0] >> 1)  # 31 bits, within every env's seed range
