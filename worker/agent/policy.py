"""A trained policy, loaded from its file and ready to act: :func:`load_policy` and :class:`Policy`.

The actor is the one a collector runs: the algorithm plug-in the file's header names,
built by :func:`~worker.plugins.binding.build_algorithm` from the job in the header (its
settings, its model, its spaces), given the file's weights in the format it takes. So a
policy acts here exactly as it acted in the run's evals; where that actor is numpy (the
built-in MLP actors), loading and acting import no torch. No broker is involved: the file
is read without the learner's lock (a publish is an atomic rename).

:meth:`Policy.act` takes raw env observations, one or a batch, converted to the space's
dtype as a collector's env batch converts them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.agent.header import BEST_SUFFIX, JOB_FILE, PolicyHeader
from worker.errors import ConfigurationError, CorruptFile, MissingFile, PolicyMismatch, StorageError, TaskError
from worker.plugins.binding import build_algorithm
from worker.plugins.contract import Actor, Algorithm, Obs
from worker.plugins.registry import MissingPlugin, PluginKind, PluginRegistry, installed
from worker.plugins.spaces import Spaces, describe_space, leaf_layout
from worker.storage.policy_format import read_policy_file, read_policy_header

logger = logging.getLogger(__name__)

#: The policy file of a run directory or policy directory when its job names none.
DEFAULT_POLICY_NAME = "policy_main"
#: Which policy of a run :func:`load_policy` takes: the best its evals saw, or the learner's latest.
WHICH = ("best", "latest")


@dataclass(frozen=True)
class PolicyPath:
    """Where a policy file is, and what was asked for (a run's best, its latest, or that file)."""

    path: Path
    asked: str
    """``best``, ``latest`` or ``file``."""
    fallback: bool = False
    """The best was asked for, the run has none (no eval of a trained policy yet): this is its latest."""


def find_policy(path_or_run_dir: str | os.PathLike[str], which: str = "best") -> PolicyPath:
    """The policy file a path names: the file itself, or a run directory's (or policy directory's) best or latest.

    A run directory holds ``job.json`` and ``policy/``; its policy is ``policy/<policy_name>``
    (``policy_name`` from ``job.json``, ``policy_main`` by default), its best ``<policy_name>.best``.

    Raises:
        ConfigurationError: ``which`` is not ``best`` or ``latest``.
        MissingFile: nothing there, or a directory without a policy file.
    """
    if which not in WHICH:
        raise ConfigurationError(f"which policy: {which!r}; one of {list(WHICH)}")
    path = Path(path_or_run_dir)
    if path.is_file():
        return PolicyPath(path, "file")
    if not path.is_dir():
        raise MissingFile(f"no policy file or run directory at {str(path)!r}")
    policy_dir, name = _policy_dir(path)
    latest = policy_dir / name
    best = policy_dir / (name + BEST_SUFFIX)
    if which == "best" and best.is_file():
        return PolicyPath(best, "best")
    if latest.is_file():
        return PolicyPath(latest, which, fallback=which == "best")
    raise MissingFile(
        f"{str(path)!r} holds no policy file ({name} in {str(policy_dir)!r}): not a run directory whose learner "
        "wrote a policy, nor a policy file"
    )


def _policy_dir(path: Path) -> tuple[Path, str]:
    """The policy directory and policy name of a run directory (``job.json``, ``policy/``) or a policy directory."""
    name = DEFAULT_POLICY_NAME
    job_file = path / JOB_FILE
    if job_file.is_file():
        try:
            job = json.loads(job_file.read_text())
            name = str(job.get("coordinator", {}).get("policy_name") or name)
        except (OSError, ValueError, AttributeError):
            pass
    return (path / "policy", name) if (path / "policy").is_dir() else (path, name)


class Policy:
    """A trained policy: the collectors' actor with the file's weights, for raw env observations.

    Made by :func:`load_policy`. ``act`` is greedy by default (the evals' choice);
    ``deterministic=False`` acts as a collect task does at the end of the run's exploration
    schedule (DQN: its last epsilon; PPO and SAC: sampled).
    """

    def __init__(self, header: PolicyHeader, algorithm: Algorithm, actor: Actor, *, asked: str = "file") -> None:
        self.header = header
        self.algorithm = algorithm
        self.actor = actor
        self.asked = asked
        """``best`` or ``latest`` of a run, or ``file``: what :func:`load_policy` was asked for."""
        steps = header.env_steps
        if steps is None:
            steps = int(header.section("coordinator").get("max_env_steps") or 0)
        self._memory = algorithm.memory_columns()
        self.explore_settings: Mapping[str, float] = algorithm.collect_settings(steps)
        """What ``deterministic=False`` gives the actor: the job's collect settings at the best eval's env steps
        (else at the end of the run's budget)."""

    @property
    def spaces(self) -> Spaces:
        return self.algorithm.spaces

    @property
    def version(self) -> int:
        """The policy version (learner updates) of the weights."""
        return self.header.version

    @property
    def path(self) -> Path:
        return self.header.path

    @property
    def eval_return(self) -> float | None:
        """The mean return of the eval that made this the run's best policy (``None``: not a best policy)."""
        return self.header.eval_return

    @property
    def has_memory(self) -> bool:
        """A recurrent policy (model ``lstm``): each act continues the episodes of the previous one."""
        return bool(self._memory)

    def reset(self, envs: int = 1) -> None:
        """Begin new episodes in ``envs`` envs: a policy with memory forgets what it saw (no-op without memory).

        A policy with memory treats consecutive :meth:`act` calls as consecutive steps of
        the same episodes, one per row of the batch; call this when they begin.
        """
        zeros = {name: np.zeros((envs, *c.shape), dtype=c.dtype) for name, c in self._memory.items()}
        if zeros:
            self.actor.set_memory(zeros)

    def episodes_begin(self, envs: npt.NDArray[np.bool_]) -> None:
        """The envs marked ``True`` begin new episodes at the next act (a policy with memory forgets them)."""
        if self.has_memory and bool(np.any(envs)):
            self.actor.forget(np.asarray(envs, dtype=bool))

    def act(self, obs: Any, deterministic: bool = True) -> Any:
        """The action for one observation, or a batch of actions for a batch ``[B, ...]`` of them.

        A policy with memory (:attr:`has_memory`) remembers what it acted on: call
        :meth:`reset` when episodes begin.

        Observations are converted to the space's dtype (a float64 observation of a float32
        space is fine). One observation gives one action of the action space (a numpy
        scalar for ``Discrete``, an array for ``Box``...).

        Raises:
            PolicyMismatch: the observation has neither the space's shape nor a batch of it.
        """
        batch, single = self._as_batch(obs)
        actions = self.act_batch(batch, deterministic)
        return actions[0] if single else actions

    def act_batch(self, obs: Obs, deterministic: bool = True) -> npt.NDArray[Any]:
        """Actions for a batch of observations already in the space's layout (``[B, ...]``, its dtype)."""
        explore = not deterministic
        actions, _ = self.actor.act(obs, explore=explore, settings=self.explore_settings if explore else {})
        return np.asarray(actions)

    def check_spaces(self, spaces: Spaces, what: str) -> None:
        """Raise :class:`~worker.errors.PolicyMismatch` unless ``spaces`` (of ``what``: an env) are the policy's."""
        mine = self.spaces
        if spaces.digest != mine.digest:
            raise PolicyMismatch(
                f"policy {self.path.name} was trained on {mine.describe()} (spaces {mine.digest}); {what} has "
                f"{spaces.describe()} (spaces {spaces.digest})"
            )

    def check_env(self, env: Any) -> None:
        """:meth:`check_spaces` for a gymnasium env or vector env (its single env's spaces)."""
        observation = getattr(env, "single_observation_space", None) or env.observation_space
        action = getattr(env, "single_action_space", None) or env.action_space
        try:
            spaces = Spaces(observation, action)
        except TaskError as exc:
            raise PolicyMismatch(f"the env's spaces are not ones warren carries: {exc.message}") from None
        self.check_spaces(spaces, f"env {getattr(getattr(env, 'spec', None), 'id', None) or type(env).__name__}")

    def describe(self) -> str:
        return self.header.describe()

    def _as_batch(self, obs: Any) -> tuple[Obs, bool]:
        space = self.spaces.observation
        if not isinstance(space, gym.spaces.Dict):
            return _leaf_batch(obs, space, "observation")
        keys = list(space.spaces)
        if not isinstance(obs, Mapping) or set(obs) != set(keys):
            raise PolicyMismatch(f"the policy takes a dict of {sorted(keys)}; got {type(obs).__name__}")
        parts = {key: _leaf_batch(obs[key], space.spaces[key], f"observation {key!r}") for key in keys}
        singles = {single for _, single in parts.values()}
        if len(singles) != 1:
            raise PolicyMismatch("the observation's keys are a mix of single observations and batches")
        return {key: batch for key, (batch, _) in parts.items()}, singles.pop()


def _leaf_batch(obs: Any, space: Any, what: str) -> tuple[npt.NDArray[Any], bool]:
    shape, dtype = leaf_layout(space)
    array = np.asarray(obs)
    if array.shape == shape:
        return np.array(array[None], dtype=dtype), True
    if array.ndim == len(shape) + 1 and array.shape[1:] == shape:
        return np.array(array, dtype=dtype), False
    raise PolicyMismatch(
        f"{what} of shape {list(array.shape)}: the policy's space is {describe_space(space)}, so one observation "
        f"is {list(shape)} and a batch [B, {', '.join(map(str, shape))}]"
    )


def load_policy(
    path_or_run_dir: str | os.PathLike[str],
    *,
    env: Any = None,
    which: str = "best",
    seed: int | None = 0,
    registry: PluginRegistry | None = None,
) -> Policy:
    """Load a trained policy: a policy file, or a run directory's best policy (its latest when it has none).

    Args:
        path_or_run_dir: a policy file (``runs/<id>/policy/policy_main.best``), or a run directory.
        env: a gymnasium env (or vector env) the policy will act in: its spaces must be the
            policy's (else :class:`~worker.errors.PolicyMismatch`).
        which: of a run directory, ``best`` (the best eval's policy) or ``latest`` (the learner's newest).
        seed: seeds the actor's draws (``act(..., deterministic=False)``).
        registry: the plug-ins to build with (default: every installed one).

    Raises:
        MissingFile: no policy file there.
        CorruptFile: the file is not a warren policy, or its header does not say enough.
        MissingPlugin: a plug-in the file names is not installed (the message names it and its version).
        PolicyMismatch: ``env``'s spaces are not the policy's.
        WarrenError: the algorithm refuses the job's settings, or the weights do not fit its actor.
    """
    found = find_policy(path_or_run_dir, which)
    path = found.path
    version, meta = read_policy_header(path)
    header = PolicyHeader.read(path, meta, version)
    where = f"policy file {str(path)!r}"
    if header.job is None:
        raise ConfigurationError(
            f"{where} does not say which job trained it (written before policy files carried their job) and no "
            f"{JOB_FILE} is in its run directory: load it from its run directory (runs/<id>)"
        )
    spaces = _spaces_of(header, where)
    registry = registry or installed()
    algorithm = _build(header, spaces, registry, where)
    actor = algorithm.make_actor(seed)
    snapshot = read_policy_file(path, numpy=algorithm.weights_format == "numpy")
    try:
        actor.load_weights(snapshot.state_dict)
    except ValueError as exc:
        raise StorageError(f"{where}: its weights do not fit the {header.algorithm} actor: {exc}") from None
    policy = Policy(header, algorithm, actor, asked=found.asked)
    if found.fallback:
        logger.info("%s has no best policy yet (no eval of a trained policy): its latest, %s", path_or_run_dir, path)
    if env is not None:
        policy.check_env(env)
    return policy


def _spaces_of(header: PolicyHeader, where: str) -> Spaces:
    try:
        spaces = Spaces.from_wire(header.section("spaces") or None)
    except TaskError as exc:
        raise CorruptFile(f"{where}: the spaces of its job are not readable: {exc.message}") from None
    if header.spaces_digest is not None and spaces.digest != header.spaces_digest:
        raise CorruptFile(
            f"{where}: its job's spaces (digest {spaces.digest}) are not the ones its weights were trained on "
            f"({header.spaces_digest})"
        )
    return spaces


def _build(header: PolicyHeader, spaces: Spaces, registry: PluginRegistry, where: str) -> Algorithm:
    """The algorithm the header names, on its model, configured as its job was."""
    algorithm_section = header.section("algorithm")
    model_section = header.section("model")
    config = {k: v for k, v in algorithm_section.items() if k not in ("name", "version")}
    model_config = {k: v for k, v in model_section.items() if k not in ("name", "version")}
    model = header.model or model_section.get("name")
    algorithm_version = _version(registry, PluginKind.ALGORITHM, header.algorithm, header.algorithm_version, where)
    try:
        return build_algorithm(
            registry,
            spaces,
            algorithm=header.algorithm,
            algorithm_version=algorithm_version,
            config=config,
            model=model,
            model_version=_version(registry, PluginKind.MODEL, model, header.model_version, where) if model else None,
            model_config=model_config,
        )
    except MissingPlugin:
        raise
    except TaskError as exc:
        raise ConfigurationError(f"{where}: its job does not build here: {exc.message}") from None


def _version(registry: PluginRegistry, kind: PluginKind, name: str, version: str | None, where: str) -> str | None:
    """The version to build plug-in ``name`` at: the file's, or (with a warning) the one installed.

    A policy outlives the release that trained it: a built-in algorithm one release on
    still loads its weights (they are checked against its actor all the same).

    Raises:
        MissingPlugin: no plug-in of that name here; the message names it and the version the file wants.
    """
    have = registry.plugins[kind]
    plugin = have.get(name)
    wanted = f" {version}" if version else ""
    if plugin is None:
        raise MissingPlugin(
            f"{where} needs {kind} plug-in {name!r}{wanted}, which is not installed here (installed {kind} "
            f"plug-ins: {', '.join(sorted(have)) or 'none'}): install the package that provides it",
            {"plugin": {"kind": kind.value, "name": name, "version": version}, "have": None},
        )
    if version and version != plugin.version:
        logger.warning(
            "%s was written by %s plug-in %r %s; loading it with %s, the version installed here",
            where,
            kind,
            name,
            version,
            plugin.version,
        )
    return plugin.version
