"""The job: what one training run does (env, policy, collector, learner and coordinator).

One typed, frozen :class:`JobConfig`, read from an optional TOML file (or the JSON
``job.json`` that ``warren run`` writes into its workdir) and overridden by flags. The
defaults are the shipped CartPole-v1 DQN job. A file looks like::

    [env]
    id = "CartPole-v1"
    stop_value = 195.0

    [collector]
    n_sample = 128

    [learner]
    lr = 0.001

Unknown sections or keys are errors, so a typo never silently falls back to a default.

The stop value, when neither the file nor a flag gives one, is the env's: 195 for
CartPole-v1 (DI-engine's value, kept so runs compare with DI-engine's), otherwise the
``reward_threshold`` of the env's gymnasium spec (Acrobot-v1: -100).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker import json_text
from worker.errors import TaskError
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.config import LearnerSpec

#: Stop values that differ from the env's gymnasium ``reward_threshold`` (see :func:`default_stop_value`).
#: CartPole-v1: DI-engine's 195 (its cartpole DQN config; gymnasium's threshold is 475), so a
#: run here compares with a DI-engine run of the same job.
STOP_VALUES = {"CartPole-v1": 195.0}

#: The returns an episode can have, for the classic-control envs a DQN drives: reward per
#: step times the time limit (gymnasium specs carry no reward range). A stop value outside
#: them is warned about (:meth:`JobConfig.warnings`).
RETURN_RANGES = {
    "CartPole-v0": (0.0, 200.0),  # +1 per step, 200 steps
    "CartPole-v1": (0.0, 500.0),  # +1 per step, 500 steps
    "Acrobot-v1": (-500.0, 0.0),  # -1 per step until the goal, 500 steps
    "MountainCar-v0": (-200.0, 0.0),  # -1 per step, 200 steps
}


def default_stop_value(env_id: str) -> float:
    """The stop value of ``env_id`` when the job gives none: :data:`STOP_VALUES`, else its ``reward_threshold``.

    Raises:
        ConfigurationError: no collector would run the env, or its spec has no
            ``reward_threshold`` (then the job must give a stop value).
    """
    if env_id in STOP_VALUES:
        return STOP_VALUES[env_id]
    spec = _usable_env_spec(env_id)
    if spec.reward_threshold is None:
        raise ConfigurationError(
            f"env {env_id!r} has no reward_threshold in its gymnasium spec: give a stop value "
            "(--stop-value, or stop_value in [env]; inf runs until a budget ends the run)"
        )
    return float(spec.reward_threshold)


def _usable_env_spec(env_id: str) -> Any:
    """The gymnasium spec of ``env_id``, once checked the way a collector checks a task's env.

    Raises:
        ConfigurationError: every collector would refuse the env (not registered, or not
            flat ``Box`` observations and ``Discrete`` actions).
    """
    import gymnasium as gym  # here, not at import: only the roles that read a job need it

    from worker.rl.envs import make_env

    try:
        make_env(env_id).close()
    except TaskError as exc:
        raise ConfigurationError(f"the job's tasks would be refused: {exc.message}") from None
    return gym.spec(env_id)


def _read_float_texts(section_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the texts ``job.json`` writes for non-finite floats (``"inf"``) read back as floats."""
    hints = typing.get_type_hints(section_type)
    return {
        key: float(value)
        if hints.get(key) is float and isinstance(value, str) and value in ("inf", "-inf", "nan")
        else value
        for key, value in values.items()
    }


@dataclass(frozen=True)
class EnvSection:
    id: str = "CartPole-v1"
    """gymnasium id (flat Box observations, Discrete actions)."""
    collector_env_num: int = 64
    """Envs per collect task, stepped as one vector env (one policy forward pass per step)."""
    evaluator_env_num: int = 5
    """Envs per eval task."""
    eval_episodes: int = 1
    """Episodes per eval env; the eval return is the mean over all of them."""
    stop_value: float = 195.0
    """The run succeeds once an eval's mean return reaches this (``inf``: never; a budget ends it).
    Left out of a config file: the env's (:func:`default_stop_value`)."""
    seed: int = 0


@dataclass(frozen=True)
class CollectorSection:
    n_sample: int = 2048
    """Train samples per collect task (a task is a unit of work a worker takes)."""
    traj_len: int = 32
    """Steps per chunk (``T``): a step data file holds ``traj_len x collector_env_num`` transitions."""
    update_policy_second: float = 1.0
    """How often collectors re-read the policy file."""


@dataclass(frozen=True)
class CoordinatorSection:
    collect_tasks: int = 0
    """Collect tasks kept running at once; 0 (auto): one per collector worker listening, so
    adding workers (``--scale collector=N``) needs no other change."""
    eval_interval_s: float = 2.0
    """Seconds between eval tasks."""
    max_env_steps: int = 400_000
    """Stop the run (unsuccessfully) after this many collected env steps."""
    max_time_s: float = 1800.0
    """Stop the run (unsuccessfully) after this long."""
    start_timeout_s: float = 30.0
    """A start task no worker took within this long is sent again."""
    task_silence_s: float = 60.0
    """A running task that sends nothing for this long is checked on, then re-run elsewhere."""
    max_run_ahead_samples: int = 4096
    """Rate limit: a collect task starts only while the samples collected but not yet taken
    in by the learner (its unread queue, plus what running collect tasks will still
    deliver) stay within this. Collection then runs at the learner's pace, never more than
    this many samples ahead of training, so the replay ratio holds over the whole run."""
    buffer_id: str = "main"
    """Replay buffer id: names the learner's data queue."""
    policy_name: str = "policy_main"
    """Policy file name under the policy directory."""

    def __post_init__(self) -> None:
        if self.collect_tasks < 0:
            raise ValueError(f"collect_tasks must be 0 (one per worker) or more, got {self.collect_tasks}")
        if self.max_env_steps < 1 or self.max_time_s <= 0:
            raise ValueError(
                f"budgets must be positive, got max_env_steps {self.max_env_steps}, max_time_s {self.max_time_s}"
            )


@dataclass(frozen=True)
class LearnerSection:
    policy_write_interval_s: float = 0.5
    """Write the policy file at most this often (it is read every ``update_policy_second``)."""
    delete_consumed: bool = True
    """Delete a step data file once its samples are in the replay buffer."""
    read_wait_s: float = 5.0
    """How long to wait for a step file named in metadata to appear."""


@dataclass(frozen=True)
class JobConfig:
    """Everything the CartPole-style DQN job needs, shared by coordinator and learner."""

    env: EnvSection = field(default_factory=EnvSection)
    collector: CollectorSection = field(default_factory=CollectorSection)
    coordinator: CoordinatorSection = field(default_factory=CoordinatorSection)
    learner_process: LearnerSection = field(default_factory=LearnerSection)
    learner: LearnerSpec = field(default_factory=LearnerSpec)

    def __post_init__(self) -> None:
        # The tasks this job will send, built once now: a value no collector would accept
        # (too many envs, a zero policy period...) is a configuration error at start-up,
        # not a refusal in the middle of a run.
        try:
            self.collect_spec(self.learner.eps_start)
            self.eval_spec()
        except TaskError as exc:
            raise ConfigurationError(f"the job's tasks would be refused: {exc.message}") from None
        _usable_env_spec(self.env.id)
        if math.isnan(self.env.stop_value):
            raise ConfigurationError("env.stop_value is nan: no return reaches it (inf: run until a budget ends it)")
        if self.coordinator.max_run_ahead_samples < self.collector.n_sample:
            raise ConfigurationError(
                f"coordinator.max_run_ahead_samples ({self.coordinator.max_run_ahead_samples}) must be at least"
                f" collector.n_sample ({self.collector.n_sample}): no collect task could ever start"
            )

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> JobConfig:
        """Defaults, then the file at ``path`` (TOML, or JSON if it ends in ``.json``), then
        ``overrides`` (``"section.key": value``).

        Raises:
            ConfigurationError: unreadable file, unknown section or key, wrong type or range.
        """
        data: dict[str, dict[str, Any]] = {}
        if path is not None:
            try:
                text = Path(path).read_text()
                raw = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
            except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
                raise ConfigurationError(f"cannot read config {path}: {exc}") from None
            if not isinstance(raw, dict):
                raise ConfigurationError(f"{path}: the top level must be a table of sections")
            for section, values in raw.items():
                if not isinstance(values, dict):
                    raise ConfigurationError(f"{path}: [{section}] must be a table")
                data[section] = dict(values)
        for dotted, value in overrides.items():
            if value is None:
                continue
            section, _, key = dotted.partition(".")
            data.setdefault(section, {})[key] = value
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, Any]]) -> JobConfig:
        """The job from ``{section: {key: value}}``; a missing ``env.stop_value`` is the env's.

        Raises:
            ConfigurationError: unknown section or key, wrong type or range, unknown env.
        """
        env = data.get("env", {})
        if isinstance(env, dict) and "stop_value" not in env and isinstance(env.get("id", EnvSection.id), str):
            data = {**data, "env": {**env, "stop_value": default_stop_value(env.get("id", EnvSection.id))}}
        sections: dict[str, Any] = {}
        types: dict[str, Any] = {
            "env": EnvSection,
            "collector": CollectorSection,
            "coordinator": CoordinatorSection,
            "learner_process": LearnerSection,
            "learner": LearnerSpec,
        }
        for name, raw_values in data.items():
            if name not in types:
                raise ConfigurationError(f"unknown config section [{name}]; known: {sorted(types)}")
            section_type = types[name]
            known = {f.name for f in fields(section_type)}
            values = dict(raw_values)
            unknown = set(values) - known
            if unknown:
                raise ConfigurationError(f"unknown keys in [{name}]: {sorted(unknown)}; known: {sorted(known)}")
            if "hidden_sizes" in values:
                values["hidden_sizes"] = tuple(values["hidden_sizes"])
            values = _read_float_texts(section_type, values)
            try:
                sections[name] = section_type(**values)
            except (TaskError, TypeError, ValueError) as exc:
                raise ConfigurationError(f"[{name}]: {getattr(exc, 'message', exc)}") from None
        return cls(**sections)

    def warnings(self) -> list[str]:
        """What in this job is legal but most likely a mistake (for the roles to log at start)."""
        low, high = RETURN_RANGES.get(self.env.id, (-math.inf, math.inf))
        stop = self.env.stop_value
        if stop == math.inf:
            return []
        if stop > high:
            return [
                f"stop value {stop:g} is above the highest return {self.env.id} can give ({high:g}): only a budget "
                f"can end this run (give --stop-value inf if that is the plan)"
            ]
        if stop <= low:
            return [
                f"stop value {stop:g} is at or below the lowest return {self.env.id} can give ({low:g}): "
                "the first eval ends the run"
            ]
        return []

    def to_json(self) -> str:
        """The job as ``job.json``: :meth:`load` reads it back to an equal config.

        Strict JSON: an infinite stop value is written as ``"inf"`` (see :mod:`worker.json_text`).
        """
        return json_text.dumps(dataclasses.asdict(self), indent=2, default=list)

    # -- task bodies ----------------------------------------------------------------

    def collect_spec(self, eps: float) -> CollectorSpec:
        """``collector_cfg`` of a collect task exploring with ``eps``."""
        return CollectorSpec(
            env=EnvSpec(self.env.id, self.env.collector_env_num, self.env.seed),
            policy=PolicySpec("dqn", self.learner.hidden_sizes),
            n_sample=self.collector.n_sample,
            traj_len=self.collector.traj_len,
            eps=eps,
            policy_update_path=self.coordinator.policy_name,
            update_policy_second=self.collector.update_policy_second,
        )

    def eval_spec(self) -> CollectorSpec:
        """``collector_cfg`` of an eval task: greedy, fresh episodes, no step data."""
        return CollectorSpec(
            env=EnvSpec(self.env.id, self.env.evaluator_env_num, self.env.seed + 10_000),
            policy=PolicySpec("dqn", self.learner.hidden_sizes),
            n_episode=self.env.eval_episodes,
            policy_update_path=self.coordinator.policy_name,
            eval_flag=True,
        )
