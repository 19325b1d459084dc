"""The job: what one training run does (env, algorithm, model, collector, learner and coordinator).

One typed, frozen :class:`JobConfig`, read from an optional job file (TOML, or the JSON
``job.json`` that ``warren run`` writes into its workdir: :mod:`worker.job_file`, which
also holds its sections) and overridden by flags. The defaults are the shipped
CartPole-v1 DQN job.

Loading a job checks it the way the workers will: the plug-ins exist, the algorithm and
the model take the env's spaces, every key is known. It also records what the workers
need and could not find out alone: the env's spaces (so a learner builds its model
without making an env) and the versions of the plug-ins (every task names them, and a
worker with another version refuses). ``job.json`` carries both.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker import json_text
from worker.errors import TaskError
from worker.job_file import (
    SECTIONS,
    AlgorithmSection,
    CollectorSection,
    CoordinatorSection,
    EnvSection,
    LearnerSection,
    ModelSection,
    read_job_file,
    read_sections,
)
from worker.json_text import finite
from worker.plugins import Algorithm, PluginKind, PluginRegistry, Spaces, config_to_dict, installed
from worker.plugins.binding import build_algorithm, env_plugin, make_env_context, task_plugins
from worker.plugins.faults import TaskPlugins
from worker.plugins.registry import GYMNASIUM
from worker.protocol import MAX_ENV_NUM, CollectorSpec, EnvSpec, PolicySpec

__all__ = [
    "RETURN_RANGES",
    "AlgorithmSection",
    "CollectorSection",
    "CoordinatorSection",
    "EnvSection",
    "JobConfig",
    "LearnerSection",
    "ModelSection",
    "job_plugins",
    "probe_spaces",
]

#: The returns an episode can have, for the classic-control envs a DQN drives: reward per
#: step times the time limit (gymnasium specs carry no reward range). A stop value outside
#: them is warned about (:meth:`JobConfig.warnings`).
RETURN_RANGES = {
    "CartPole-v0": (0.0, 200.0),  # +1 per step, 200 steps
    "CartPole-v1": (0.0, 500.0),  # +1 per step, 500 steps
    "Acrobot-v1": (-500.0, 0.0),  # -1 per step until the goal, 500 steps
    "MountainCar-v0": (-200.0, 0.0),  # -1 per step, 200 steps
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
        if not 0 <= self.env.confirm_episodes <= MAX_ENV_NUM:
            raise ConfigurationError(
                f"[env] confirm_episodes must be 0 (no confirmation) to {MAX_ENV_NUM}, got {self.env.confirm_episodes}"
            )
        # The tasks this job will send, built once now: a value no collector would accept
        # (too many envs, a zero policy period...) is a configuration error at start-up,
        # not a refusal in the middle of a run.
        try:
            self.collect_spec(0)
            self.eval_spec()
            self.confirm_spec(self.coordinator.policy_name)
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
        return cls.from_dict(read_job_file(path, overrides))

    @classmethod
    def from_dict(cls, data: dict[str, dict[str, Any]]) -> JobConfig:
        """The job from ``{section: {key: value}}``; a missing ``env.stop_value`` is the env's.

        Raises:
            ConfigurationError: unknown section or key, wrong type or range, unknown env or plug-in.
        """
        sections, no_stop_value = read_sections(data)
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
        out: dict[str, Any] = {name: finite(dataclasses.asdict(getattr(self, name))) for name in SECTIONS}
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

    def eval_spec(self, policy_file: str | None = None) -> CollectorSpec:
        """``collector_cfg`` of an eval task: greedy, fresh episodes, no step data.

        ``policy_file``: the policy file it reads (default: the learner's; the coordinator
        gives each eval a copy, see :mod:`worker.coordinator.policy_files`).
        """
        return CollectorSpec(
            env=self.env_spec(self.env.evaluator_env_num, self.env.seed + 10_000),
            policy=self.policy_spec(),
            spaces=self.spaces,
            n_episode=self.env.eval_episodes,
            policy_update_path=policy_file or self.coordinator.policy_name,
            eval_flag=True,
        )

    def confirm_spec(self, policy_file: str) -> CollectorSpec:
        """``collector_cfg`` of the confirmation of an eval that reached the stop value, reading ``policy_file``.

        ``confirm_episodes`` envs, one episode each, seeded apart from the evals' (whose
        first episodes the eval it confirms already played).
        """
        return CollectorSpec(
            env=self.env_spec(max(1, self.env.confirm_episodes), self.env.seed + 20_000),
            policy=self.policy_spec(),
            spaces=self.spaces,
            n_episode=1,
            policy_update_path=policy_file,
            eval_flag=True,
        )


def job_plugins(job: JobConfig, registry: PluginRegistry | None = None) -> TaskPlugins:
    """The job's env, algorithm and model plug-ins as this process has them: what its failures name."""
    return task_plugins(
        registry or installed(),
        env=job.env.plugin,
        env_version=job.env.plugin_version,
        env_id=job.env.id,
        algorithm=job.algorithm.name,
        algorithm_version=job.algorithm.version,
        model=job.model.name,
        model_version=job.model.version,
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
