"""The default env plug-in: any id in gymnasium's registry (classic control, Box2D, MuJoCo, ALE...).

Only registered ids are accepted: ``gym.make("module:Env")`` would import a module named
by whoever wrote the task. Packages that register ids of their own (``ale_py``) are
imported at process start (``WARREN_ENV_PACKAGES``), never because a task asked.

Where an id registers a native vectorised implementation (``vector_entry_point``,
``CartPole-v1``) it is used: one numpy step for all copies instead of a Python loop over
envs, about ten times cheaper per step. Other ids run in gymnasium's ``SyncVectorEnv``.
Both autoreset in ``NEXT_STEP`` mode, as the contract wants.

Importing this plug-in registers warren's own partially observed ids,
``CartPoleNoVel-v1``, ``PendulumNoVel-v1`` and ``CueMemory-v0`` (:mod:`worker.envs.partial`).

ALE ids (``ALE/Pong-v5``, registered by ``ale_py``) have one: ale-py's C++
``AtariVectorEnv``, which does the usual Atari preprocessing itself (84x84 grey, frame
skip 4 with max-pooling, a stack of 4 frames as a ``(4, 84, 84)`` uint8 observation,
up to 30 no-op actions at reset, FIRE at reset, rewards clipped to -1, 0, 1; episodic
life off) and steps its envs on a pool of threads. A vector entry point that takes
``num_threads`` gets the worker's thread budget (:attr:`EnvContext.threads`) unless the
job's ``[env.kwargs]`` sets it.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from worker.envs.partial import register_partial_envs
from worker.plugins.contract import EnvContext, EnvPlugin
from worker.protocol import Refusal

register_partial_envs()


class GymnasiumEnvs(EnvPlugin):
    """gymnasium's registry as an env plug-in; ``env_id`` is the registered id, ``kwargs`` go to ``gym.make``."""

    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        """One env; kwargs only the id's vector entry point takes (ale-py's ``stack_num``) are the vector env's."""
        check_registered(ctx.env_id)
        spec = gym.spec(ctx.env_id)
        vector_only = _vector_only(spec, set(ctx.kwargs))
        try:
            return gym.make(ctx.env_id, **{k: v for k, v in ctx.kwargs.items() if k not in vector_only})
        except (gym.error.Error, TypeError) as exc:
            raise Refusal.UNKNOWN_ENV.error(f"cannot create env {ctx.env_id!r}: {exc}") from exc

    def reward_threshold(self, env_id: str) -> float | None:
        if env_id not in gym.registry:
            return None
        threshold = gym.spec(env_id).reward_threshold
        return None if threshold is None else float(threshold)

    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        check_registered(ctx.env_id)
        spec = gym.spec(ctx.env_id)
        mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
        kwargs = dict(ctx.kwargs)
        if spec.vector_entry_point is not None and "num_threads" not in kwargs and _takes_threads(spec):
            kwargs["num_threads"] = ctx.threads
        # A sync vector env copies its observations for the caller by default; VecEnvBatch
        # copies each step's into an array of its own anyway, so the first copy is skipped.
        vector_kwargs = {"copy": False} if mode == "sync" else {}
        try:
            return gym.make_vec(
                ctx.env_id, num_envs=ctx.num_envs, vectorization_mode=mode, vector_kwargs=vector_kwargs, **kwargs
            )
        except (gym.error.Error, TypeError) as exc:
            raise Refusal.UNKNOWN_ENV.error(f"cannot create env {ctx.env_id!r}: {exc}") from exc


def check_registered(env_id: str) -> None:
    """Raises: TaskError: ``unknown env``, the id is not in gymnasium's registry."""
    if env_id not in gym.registry:
        raise Refusal.UNKNOWN_ENV.error(
            f"unknown env id {env_id!r}: not in the gymnasium registry "
            "(a module that registers it is imported where WARREN_ENV_PACKAGES names it)"
        )


def _parameters(entry: Any) -> dict[str, inspect.Parameter] | None:
    """The named parameters of an entry point (``None``: unknown, or it takes ``**kwargs``)."""
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        parameters = dict(inspect.signature(creator).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return parameters


def _vector_only(spec: gym.envs.registration.EnvSpec, keys: set[str]) -> set[str]:
    """Of ``keys``, those the id's vector entry point takes and its single env's entry point does not."""
    if spec.vector_entry_point is None or not keys:
        return set()
    single, vector = _parameters(spec.entry_point), _parameters(spec.vector_entry_point)
    if single is None or vector is None:
        return set()
    return {key for key in keys if key in vector and key not in single and key not in (spec.kwargs or {})}


def _takes_threads(spec: gym.envs.registration.EnvSpec) -> bool:
    """The id's vector entry point has a ``num_threads`` parameter (ale-py's ``AtariVectorEnv`` does)."""
    entry = spec.vector_entry_point
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
        return "num_threads" in inspect.signature(creator).parameters  # type: ignore[arg-type]
    except (ImportError, AttributeError, TypeError, ValueError):
        return False
