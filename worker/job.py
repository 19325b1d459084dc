"""The job: what one training run does (env, algorithm, model, collector, learner and coordinator).

One typed, frozen :class:`JobConfig`, read from an optional TOML file (or the JSON
``job.json`` that ``warren run`` writes into its workdir) and overridden by flags. The
defaults are the shipped CartPole-v1 DQN job. A file looks like::

    [env]
    id = "CartPole-v1"
    stop_value = 195.0

    [algorithm]
    name = "dqn"            # a built-in (dqn, random) or an installed plug-in
    lr = 0.001              # its hyperparameters, checked by the plug-in

    [model]
    name = "mlp"
    hidden_sizes = [128, 128]

    [collector]
    n_sample = 2048

Unknown sections or keys are errors, so a typo never silently falls back to a default.
The ``[algorithm]`` and ``[model]`` keys besides ``name`` and ``version`` belong to the
plug-in, which says which it knows.

Loading a job checks it the way the workers will: the plug-ins exist, the algorithm and
the model take the env's spaces, every key is known. It also records what the workers
need and could not find out alone: the env's spaces (so a learner builds its model
without making an env) and the versions of the plug-ins (every task names them, and a
worker with another version refuses). ``job.json`` carries both.

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
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker import json_text
from worker.errors import TaskError
from worker.json_text import finite
from worker.plugins import Algorithm, PluginKind, PluginRegistry, Spaces, config_to_dict, installed
from worker.plugins.binding import build_algorithm, env_plugin, make_env_context
from worker.plugins.registry import GYMNASIUM
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec

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


def default_stop_value(env_id: str, plugin: str | None = None) -> float:
    """The stop value of ``env_id`` when the job gives none: :data:`STOP_VALUES`, else its ``reward_threshold``.

    Raises:
        ConfigurationError: the env has no ``reward_threshold`` (then the job must give a stop value).
    """
    if plugin in (None, GYMNASIUM) and env_id in STOP_VALUES:
        return STOP_VALUES[env_id]
    try:
        threshold = env_plugin(installed(), plugin).reward_threshold(env_id)
    except TaskError as exc:
        raise ConfigurationError(f"the job cannot run: {exc.message}") from None
    if threshold is None:
        raise ConfigurationError(
            f"env {env_id!r} has no reward_threshold: give a stop value "
            "(--stop-value, or stop_value in [env]; inf runs until a budget ends the run)"
        )
    return float(threshold)


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
    """The env: a gymnasium id, or (with ``plugin``) an id the env plug-in knows."""
    plugin: str | None = None
    """The env plug-in that makes it; left out: gymnasium's registry."""
    plugin_version: str | None = None
    """The env plug-in's version (left out: the one installed where the job is loaded)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env (``[env.kwargs]``), plain data."""
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
class AlgorithmSection:
    """``[algorithm]``: the plug-in by name, and its hyperparameters (every other key)."""

    name: str = "dqn"
    version: str | None = None
    """Left out: the version installed where the job is loaded; every task names it."""
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: the model plug-in (left out: the algorithm's default) and its settings."""

    name: str | None = None
    version: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)


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
    checkpoint_interval_s: float = 10.0
    """Write the learner's full checkpoint (targets, optimizer) at most this often, and at exit."""
    delete_consumed: bool = True
    """Delete a step data file once its samples are in the replay buffer."""
    read_wait_s: float = 5.0
    """How long to wait for a step file named in metadata to appear."""
    torch_threads: int = 0
    """torch intra-op threads this job's learner wants (0: one). A CNN learner trains
    faster on every core; an MLP's torch step is dispatch-bound and does not, so 1 is the
    default. The learner process's own ``WARREN_TORCH_THREADS``/``--torch-threads``, when
    given, win: they describe the machine it runs on."""

    def __post_init__(self) -> None:
        if not 0 <= self.torch_threads <= 1024:
            raise ValueError(
                f"learner.torch_threads must be 0 (one, unless the learner process sets it) to 1024,"
                f" got {self.torch_threads}"
            )


#: The sections of a job file, by name; ``[algorithm]`` and ``[model]`` are read apart.
_SECTIONS: dict[str, Any] = {
    "env": EnvSection,
    "collector": CollectorSection,
    "coordinator": CoordinatorSection,
    "learner": LearnerSection,
}


@dataclass(frozen=True)
class JobConfig:
    """Everything a job needs, shared by coordinator and learner; see the module docstring.

    ``spaces`` is derived when not given (the env is made once to read them).
    """

    env: EnvSection = field(default_factory=EnvSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    model: ModelSection = field(default_factory=ModelSection)
    collector: CollectorSection = field(default_factory=CollectorSection)
    coordinator: CoordinatorSection = field(default_factory=CoordinatorSection)
    learner: LearnerSection = field(default_factory=LearnerSection)
    spaces: Spaces | None = None
    _bound: Algorithm | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        registry = installed()
        try:
            if self.spaces is None:
                object.__setattr__(self, "spaces", probe_spaces(registry, self.env))
            self._pin_versions(registry)
            object.__setattr__(self, "_bound", self._build(registry))
        except TaskError as exc:
            raise ConfigurationError(f"the job cannot run: {exc.message}") from None
        # The tasks this job will send, built once now: a value no collector would accept
        # (too many envs, a zero policy period...) is a configuration error at start-up,
        # not a refusal in the middle of a run.
        try:
            self.collect_spec(0)
            self.eval_spec()
        except TaskError as exc:
            raise ConfigurationError(f"the job's tasks would be refused: {exc.message}") from None
        if math.isnan(self.env.stop_value):
            raise ConfigurationError("env.stop_value is nan: no return reaches it (inf: run until a budget ends it)")
        if self.coordinator.max_run_ahead_samples < self.collector.n_sample:
            raise ConfigurationError(
                f"coordinator.max_run_ahead_samples ({self.coordinator.max_run_ahead_samples}) must be at least"
                f" collector.n_sample ({self.collector.n_sample}): no collect task could ever start"
            )

    def _pin_versions(self, registry: PluginRegistry) -> None:
        """Fill in the installed version of every plug-in the job leaves unversioned (tasks name them)."""
        algo = registry.get(PluginKind.ALGORITHM, self.algorithm.name, self.algorithm.version)
        model_name = self.model.name or algo.obj.default_model
        model = registry.get(PluginKind.MODEL, model_name, self.model.version)
        object.__setattr__(self, "algorithm", dataclasses.replace(self.algorithm, version=algo.version))
        object.__setattr__(self, "model", dataclasses.replace(self.model, name=model_name, version=model.version))
        if self.env.plugin not in (None, GYMNASIUM):
            env = registry.get(PluginKind.ENV, self.env.plugin, self.env.plugin_version)
            object.__setattr__(self, "env", dataclasses.replace(self.env, plugin_version=env.version))

    def _build(self, registry: PluginRegistry) -> Algorithm:
        assert self.spaces is not None
        algorithm = build_algorithm(
            registry,
            self.spaces,
            algorithm=self.algorithm.name,
            algorithm_version=self.algorithm.version,
            config=self.algorithm.config,
            model=self.model.name,
            model_version=self.model.version,
            model_config=self.model.config,
        )
        # The configs as the plug-ins complete them, so job.json and every task spell out every value.
        algorithm_config, model_config = config_to_dict(algorithm.config), config_to_dict(algorithm.model.config)
        object.__setattr__(self, "algorithm", dataclasses.replace(self.algorithm, config=algorithm_config))
        object.__setattr__(self, "model", dataclasses.replace(self.model, config=model_config))
        return algorithm

    @property
    def bound(self) -> Algorithm:
        """The job's algorithm, configured, on its model, for its spaces."""
        assert self._bound is not None
        return self._bound

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> JobConfig:
        """Defaults, then the file at ``path`` (TOML, or JSON if it ends in ``.json``), then
        ``overrides`` (``"section.key": value``).

        Raises:
            ConfigurationError: unreadable file, unknown section or key, wrong type or range,
                a plug-in that is missing or refuses the env.
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
            ConfigurationError: unknown section or key, wrong type or range, unknown env or plug-in.
        """
        known = {*_SECTIONS, "algorithm", "model", "spaces"}
        for name in data:
            if name == "learner_process":
                raise ConfigurationError(
                    "[learner_process] is now [learner] (the algorithm's settings are in [algorithm])"
                )
            if name not in known:
                raise ConfigurationError(f"unknown config section [{name}]; known: {sorted(known)}")
        env = dict(data.get("env", {}))
        no_stop_value: ConfigurationError | None = None
        if "stop_value" not in env and isinstance(env.get("id", EnvSection.id), str):
            try:
                env["stop_value"] = default_stop_value(env.get("id", EnvSection.id), env.get("plugin"))
            except ConfigurationError as exc:
                # Said only once the env is known to run: for an unknown or unusable env, that is the news.
                no_stop_value, env["stop_value"] = exc, math.inf
        sections: dict[str, Any] = {}
        for name, section_type in _SECTIONS.items():
            sections[name] = _section(name, section_type, env if name == "env" else data.get(name, {}))
        sections["algorithm"] = _plugin_section("algorithm", AlgorithmSection, data.get("algorithm", {}))
        sections["model"] = _plugin_section("model", ModelSection, data.get("model", {}))
        if "spaces" in data:
            try:
                sections["spaces"] = Spaces.from_wire(data["spaces"])
            except TaskError as exc:
                raise ConfigurationError(f"[spaces]: {exc.message}") from None
        job = cls(**sections)
        if no_stop_value is not None:
            raise no_stop_value
        return job

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

    def to_dict(self) -> dict[str, Any]:
        """The job as plain data, in the layout :meth:`from_dict` reads (``[algorithm]`` keys flat)."""
        out: dict[str, Any] = {name: finite(dataclasses.asdict(getattr(self, name))) for name in _SECTIONS}
        for name in ("algorithm", "model"):
            section = getattr(self, name)
            out[name] = {
                **({"name": section.name} if section.name is not None else {}),
                **({"version": section.version} if section.version is not None else {}),
                **finite(dict(section.config)),
            }
        if self.spaces is not None:
            out["spaces"] = finite(self.spaces.to_wire())
        return out

    def to_json(self) -> str:
        """The job as ``job.json``: :meth:`load` reads it back to an equal config.

        Strict JSON: an infinite stop value is written as ``"inf"`` (see :mod:`worker.json_text`).
        """
        return json_text.dumps(self.to_dict(), indent=2)

    # -- task bodies ----------------------------------------------------------------

    def policy_spec(self) -> PolicySpec:
        """``collector_cfg.policy`` of this job's tasks: the algorithm and model, named and versioned."""
        return PolicySpec(
            type=self.algorithm.name,
            version=self.algorithm.version,
            config=dict(self.algorithm.config),
            model=self.model.name,
            model_version=self.model.version,
            model_config=dict(self.model.config),
        )

    def env_spec(self, env_num: int, seed: int) -> EnvSpec:
        env = self.env
        return EnvSpec(env.id, env_num, seed, plugin=env.plugin, plugin_version=env.plugin_version, kwargs=env.kwargs)

    def collect_spec(self, env_steps: int) -> CollectorSpec:
        """``collector_cfg`` of a collect task started after ``env_steps`` env steps (its schedule's point)."""
        return CollectorSpec(
            env=self.env_spec(self.env.collector_env_num, self.env.seed),
            policy=self.policy_spec(),
            spaces=self.spaces,
            n_sample=self.collector.n_sample,
            traj_len=self.collector.traj_len,
            collect_setting=self.bound.collect_settings(env_steps),
            policy_update_path=self.coordinator.policy_name,
            update_policy_second=self.collector.update_policy_second,
        )

    def eval_spec(self) -> CollectorSpec:
        """``collector_cfg`` of an eval task: greedy, fresh episodes, no step data."""
        return CollectorSpec(
            env=self.env_spec(self.env.evaluator_env_num, self.env.seed + 10_000),
            policy=self.policy_spec(),
            spaces=self.spaces,
            n_episode=self.env.eval_episodes,
            policy_update_path=self.coordinator.policy_name,
            eval_flag=True,
        )


def probe_spaces(registry: PluginRegistry, env: EnvSection) -> Spaces:
    """The env's spaces, read off a one-env vector env made the way a collector makes it.

    Raises:
        TaskError: the env plug-in is missing, cannot make the env, or its spaces are not ones warren carries.
    """
    from worker.rl.envs import VecEnvBatch

    plugin = env_plugin(registry, env.plugin, env.plugin_version)
    batch = VecEnvBatch(plugin, make_env_context(env.id, 1, kwargs=env.kwargs, seed=env.seed))
    try:
        return batch.spaces
    finally:
        batch.close()


def _section(name: str, section_type: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"[{name}] must be a table")
    known = {f.name for f in fields(section_type)}
    unknown = set(raw) - known
    if unknown:
        moved = (
            " (an algorithm's settings, such as lr or learning_starts, go in [algorithm])" if name == "learner" else ""
        )
        raise ConfigurationError(f"unknown keys in [{name}]: {sorted(unknown)}; known: {sorted(known)}{moved}")
    values = _read_float_texts(section_type, raw)
    try:
        return section_type(**values)
    except (TaskError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"[{name}]: {getattr(exc, 'message', exc)}") from None


def _plugin_section(name: str, section_type: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"[{name}] must be a table")
    values = dict(raw)
    head = {key: values.pop(key) for key in ("name", "version") if key in values}
    for key, value in head.items():
        if not isinstance(value, str):
            raise ConfigurationError(f"[{name}] {key} must be a string, got {value!r}")
    return section_type(**head, config=values)
