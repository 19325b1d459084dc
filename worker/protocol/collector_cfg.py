"""``collector_cfg``: what a collect or eval task asks a collector to run, typed and validated.

It arrives in a msgpack task message, so it is untrusted: every field is type- and
range-checked once, here, and any problem becomes a :class:`~worker.errors.TaskError`
whose message names the offending key. Validation lives in ``__post_init__`` so specs
built in code (the coordinator's job config, tests) obey the same rules as specs parsed
from the wire.

A task names its env, algorithm and model by plug-in name (and version), with their
settings as plain data; never a module to import. Whether the worker has those plug-ins,
and whether they accept the settings, is the worker's to check (``missing plugin``,
``bad collector_cfg``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from worker.errors import TaskError
from worker.plugins.spaces import Spaces
from worker.protocol.checks import (
    MAX_COUNT,
    check_bool,
    check_float,
    check_int,
    check_plain,
    check_settings,
    check_str,
    mapping,
    required,
)

#: More envs than this in one task would starve the other processes on a worker host.
MAX_ENV_NUM: Final = 256
_MAX_SEED: Final = 2**32 - 1
_MAX_NAME: Final = 100


def _optional_str(value: Any, key: str) -> str | None:
    return None if value is None else check_str(value, key, max_len=_MAX_NAME)


@dataclass(frozen=True)
class EnvSpec:
    """Which env to run and how many copies to step together."""

    id: str
    """The env: a gymnasium id (``CartPole-v1``), or, with ``plugin``, an id that plug-in knows."""
    env_num: int
    """Number of envs stepped together with one batched policy forward pass."""
    seed: int | None = None
    """Env ``i`` is reset with ``seed + i`` on its first episode; ``None`` for fresh entropy.

    The exploration RNG is seeded from it too (see ``VecEnvBatch.spawn_seed``). A collect
    task's collector mixes its worker id into it first (``worker.rl.envs.worker_seed``), so
    that two collectors never ship the same episodes."""
    plugin: str | None = None
    """The env plug-in that makes it; ``None``: gymnasium's registry."""
    plugin_version: str | None = None
    """The env plug-in's version; a worker that has another refuses the task."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env (plain data), e.g. ``{"continuous": true}``."""

    def __post_init__(self) -> None:
        p = "collector_cfg.env"
        check_str(self.id, f"{p}.id", max_len=200)
        object.__setattr__(self, "env_num", check_int(self.env_num, f"{p}.env_num", 1, MAX_ENV_NUM))
        if self.seed is not None:
            object.__setattr__(self, "seed", check_int(self.seed, f"{p}.seed", 0, _MAX_SEED))
        _optional_str(self.plugin, f"{p}.plugin")
        _optional_str(self.plugin_version, f"{p}.plugin_version")
        object.__setattr__(self, "kwargs", check_plain(mapping(self.kwargs, f"{p}.kwargs"), f"{p}.kwargs"))

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"id": self.id, "env_num": self.env_num}
        for key in ("seed", "plugin", "plugin_version"):
            if getattr(self, key) is not None:
                wire[key] = getattr(self, key)
        if self.kwargs:
            wire["kwargs"] = dict(self.kwargs)
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> EnvSpec:
        p = "collector_cfg.env"
        cfg = mapping(wire, p)
        return cls(
            id=required(cfg, "id", p),
            env_num=required(cfg, "env_num", p),
            seed=cfg.get("seed"),
            plugin=cfg.get("plugin"),
            plugin_version=cfg.get("plugin_version"),
            kwargs=cfg.get("kwargs", {}),
        )


@dataclass(frozen=True)
class PolicySpec:
    """Which algorithm acts (its actor), on which model, with which settings."""

    type: str
    """The algorithm plug-in: ``dqn``, ``ppo``, ``sac``, ``random``, or an installed one."""
    version: str | None = None
    """Its version; a worker that has another refuses the task."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """The algorithm's settings (plain data; the job's ``[algorithm]`` table)."""
    model: str | None = None
    """The model plug-in; ``None``: the algorithm's default (``mlp``)."""
    model_version: str | None = None
    model_config: Mapping[str, Any] = field(default_factory=dict)
    """The model's settings (the job's ``[model]`` table), e.g. ``{"hidden_sizes": [128, 128]}``."""

    def __post_init__(self) -> None:
        p = "collector_cfg.policy"
        check_str(self.type, f"{p}.type", max_len=_MAX_NAME)
        _optional_str(self.version, f"{p}.version")
        _optional_str(self.model, f"{p}.model")
        _optional_str(self.model_version, f"{p}.model_version")
        object.__setattr__(self, "config", check_plain(mapping(self.config, f"{p}.config"), f"{p}.config"))
        model_config = check_plain(mapping(self.model_config, f"{p}.model_config"), f"{p}.model_config")
        object.__setattr__(self, "model_config", model_config)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"type": self.type}
        for key in ("version", "model", "model_version"):
            if getattr(self, key) is not None:
                wire[key] = getattr(self, key)
        if self.config:
            wire["config"] = dict(self.config)
        if self.model_config:
            wire["model_config"] = dict(self.model_config)
        return wire

    @classmethod
    def from_wire(cls, wire: Any) -> PolicySpec:
        p = "collector_cfg.policy"
        cfg = mapping(wire, p)
        return cls(
            type=required(cfg, "type", p),
            version=cfg.get("version"),
            config=cfg.get("config", {}),
            model=cfg.get("model"),
            model_version=cfg.get("model_version"),
            model_config=cfg.get("model_config", {}),
        )


@dataclass(frozen=True)
class CollectorSpec:
    """One collect or eval task: DI-engine's ``collector_cfg``, validated.

    Exactly one of ``n_sample`` and ``n_episode`` is set. Build it from a task message
    with :meth:`from_wire`; :meth:`to_wire` gives back an equivalent wire dict.
    """

    env: EnvSpec
    policy: PolicySpec
    spaces: Spaces | None = None
    """The job's spaces: the actor is built from them, and the worker's env must have the
    same (digest). ``None``: taken from the worker's env."""
    n_sample: int | None = None
    """Collect tasks: done once this many train samples (transitions) were produced in total."""
    n_episode: int | None = None
    """Done once every env finished this many episodes (DI-engine's ``env_manager.done``)."""
    traj_len: int = 64
    """Steps per chunk (``T``): one step file and one metadata message per ``traj_len`` steps of all envs."""
    collect_setting: Mapping[str, float] = field(default_factory=dict)
    """What the algorithm tells its actors for this task (DQN: ``eps``); eval tasks act greedily."""
    policy_update_path: str | None = None
    """Relative name of the policy file; path safety is checked by whoever opens it."""
    update_policy_second: float = 3.0
    """Collect tasks re-read the policy file this often, in seconds."""
    eval_flag: bool = False
    """Eval tasks act greedily, write no samples and report episode returns."""
    max_env_steps: int = 1_000_000
    """Safety cap on env steps in one task; reaching it finishes the task."""

    def __post_init__(self) -> None:
        p = "collector_cfg"
        if not isinstance(self.env, EnvSpec) or not isinstance(self.policy, PolicySpec):
            raise TaskError(f"{p}.env and {p}.policy must be EnvSpec and PolicySpec")
        if self.spaces is not None and not isinstance(self.spaces, Spaces):
            raise TaskError(f"{p}.spaces must be Spaces")
        if (self.n_sample is None) == (self.n_episode is None):
            raise TaskError(f"exactly one of {p}.n_sample and {p}.n_episode must be given")
        flag = check_bool(self.eval_flag, f"{p}.eval_flag")
        object.__setattr__(self, "eval_flag", flag)
        if self.n_sample is not None:
            if flag:
                raise TaskError(f"{p}.n_sample cannot be used by eval tasks (they produce no samples); use n_episode")
            object.__setattr__(self, "n_sample", check_int(self.n_sample, f"{p}.n_sample", 1, MAX_COUNT))
        if self.n_episode is not None:
            object.__setattr__(self, "n_episode", check_int(self.n_episode, f"{p}.n_episode", 1, 10**6))
        object.__setattr__(self, "traj_len", check_int(self.traj_len, f"{p}.traj_len", 1, 4096))
        object.__setattr__(self, "collect_setting", check_settings(self.collect_setting, f"{p}.collect_setting"))
        if self.policy_update_path is not None:
            check_str(self.policy_update_path, f"{p}.policy_update_path")
        ups = check_float(self.update_policy_second, f"{p}.update_policy_second", 0.0, 3600.0, lo_open=True)
        object.__setattr__(self, "update_policy_second", ups)
        steps = check_int(self.max_env_steps, f"{p}.max_env_steps", 1, MAX_COUNT)
        object.__setattr__(self, "max_env_steps", steps)

    @classmethod
    def from_wire(cls, cfg: Any) -> CollectorSpec:
        """Validate a ``collector_cfg`` dict from a task message.

        Unknown keys are ignored so that coordinators may send DI-engine extras
        (``type``, ``import_names``, ``exp_name``...): a worker never imports anything a
        task names.

        Raises:
            TaskError: a key is missing, has the wrong type or is out of range; the
                message names the key.
        """
        p = "collector_cfg"
        cfg = mapping(cfg, p)
        eval_flag = cfg.get("eval_flag", False)
        spaces = cfg.get("spaces")
        return cls(
            env=EnvSpec.from_wire(required(cfg, "env", p)),
            policy=PolicySpec.from_wire(required(cfg, "policy", p)),
            spaces=None if spaces is None else Spaces.from_wire(spaces),
            n_sample=cfg.get("n_sample"),
            n_episode=cfg.get("n_episode"),
            traj_len=cfg.get("traj_len", 64),
            collect_setting={} if eval_flag is True else cfg.get("collect_setting", {}),
            policy_update_path=cfg.get("policy_update_path"),
            update_policy_second=cfg.get("update_policy_second", 3.0),
            eval_flag=eval_flag,
            max_env_steps=cfg.get("max_env_steps", 1_000_000),
        )

    def to_wire(self) -> dict[str, Any]:
        """The wire dict of this spec; ``from_wire(spec.to_wire()) == spec``."""
        wire: dict[str, Any] = {
            "env": self.env.to_wire(),
            "policy": self.policy.to_wire(),
            "traj_len": self.traj_len,
            "update_policy_second": self.update_policy_second,
            "eval_flag": self.eval_flag,
            "max_env_steps": self.max_env_steps,
        }
        if self.spaces is not None:
            wire["spaces"] = self.spaces.to_wire()
        if self.n_sample is not None:
            wire["n_sample"] = self.n_sample
        if self.n_episode is not None:
            wire["n_episode"] = self.n_episode
        if self.collect_setting and not self.eval_flag:
            wire["collect_setting"] = dict(self.collect_setting)
        if self.policy_update_path is not None:
            wire["policy_update_path"] = self.policy_update_path
        return wire
