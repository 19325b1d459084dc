"""Typed, frozen task configuration for collectors and the DQN learner.

``collector_cfg`` arrives in a msgpack task message, so it is untrusted: every field is
type- and range-checked here, once, at the edge, and any problem becomes a
:class:`~worker.errors.TaskError` whose message names the offending key (the worker
replies ``ok: false`` with it and keeps serving). Code past this module can rely on
the types the dataclasses declare.

Validation lives in ``__post_init__`` so that specs built in code (tests, scripts) are
held to the same rules as specs parsed from the wire.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, cast

import numpy as np

from worker.errors import TaskError, short_repr

PolicyType = Literal["dqn", "random"]

#: Policy types a collector can run.
POLICY_TYPES: Final[tuple[PolicyType, ...]] = ("dqn", "random")
#: Q-network hidden layer widths shared by collectors and the learner; the two must
#: agree or the learner's state_dict cannot be loaded by the collectors.
DEFAULT_HIDDEN_SIZES: Final = (128, 128)
#: More envs than this in one task would starve the other processes on a worker host.
MAX_ENV_NUM: Final = 64
_MAX_COUNT: Final = 10**9
_MAX_SEED: Final = 2**32 - 1


# -- validation helpers --------------------------------------------------------------


def _show(value: Any) -> str:
    return short_repr(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _check_int(value: Any, key: str, lo: int, hi: int) -> int:
    if not _is_int(value) or not lo <= int(value) <= hi:
        raise TaskError(f"{key} must be an integer between {lo} and {hi}, got {_show(value)}")
    return int(value)


def _check_float(value: Any, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    ok = (_is_int(value) or isinstance(value, float | np.floating)) and math.isfinite(float(value))
    if ok:
        number = float(value)
        ok = (lo < number if lo_open else lo <= number) and number <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        raise TaskError(f"{key} must be a number in {bracket}{lo}, {hi}], got {_show(value)}")
    return float(value)


def _check_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool | np.bool_):
        raise TaskError(f"{key} must be a boolean, got {_show(value)}")
    return bool(value)


def _check_str(value: Any, key: str, max_len: int = 4096) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_len:
        raise TaskError(f"{key} must be a non-empty string of at most {max_len} characters, got {_show(value)}")
    return value


def _check_sizes(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not 1 <= len(value) <= 4:
        raise TaskError(f"{key} must be a list of 1 to 4 layer widths, got {_show(value)}")
    return tuple(_check_int(width, f"{key}[{i}]", 1, 1024) for i, width in enumerate(value))


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TaskError(f"{key} must be a map, got {_show(value)}")
    return cast(Mapping[str, Any], value)


def _required(cfg: Mapping[str, Any], name: str, prefix: str) -> Any:
    if name not in cfg:
        raise TaskError(f"{prefix}.{name} is missing")
    return cfg[name]


# -- collector task config -----------------------------------------------------------


@dataclass(frozen=True)
class EnvSpec:
    """Which gymnasium env to run and how many copies to step together."""

    id: str
    """Registered gymnasium id, e.g. ``CartPole-v1``; checked against the registry by the env batch."""
    env_num: int
    """Number of envs stepped together with one batched policy forward pass."""
    seed: int | None = None
    """Env ``i`` is reset with ``seed + i`` on its first episode; ``None`` for fresh entropy.

    The exploration RNG is seeded from it too (see ``EnvBatch.spawn_seed``)."""

    def __post_init__(self) -> None:
        _check_str(self.id, "collector_cfg.env.id", max_len=200)
        object.__setattr__(self, "env_num", _check_int(self.env_num, "collector_cfg.env.env_num", 1, MAX_ENV_NUM))
        if self.seed is not None:
            object.__setattr__(self, "seed", _check_int(self.seed, "collector_cfg.env.seed", 0, _MAX_SEED))


@dataclass(frozen=True)
class PolicySpec:
    """Which policy acts in the envs."""

    type: PolicyType
    """``dqn`` (epsilon-greedy Q-network, needs a policy file) or ``random`` (uniform actions)."""
    hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
    """Q-network hidden layer widths; must match the learner's."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or self.type not in POLICY_TYPES:
            raise TaskError(f"collector_cfg.policy.type must be one of {list(POLICY_TYPES)}, got {_show(self.type)}")
        sizes = _check_sizes(self.hidden_sizes, "collector_cfg.policy.hidden_sizes")
        object.__setattr__(self, "hidden_sizes", sizes)


@dataclass(frozen=True)
class CollectorSpec:
    """One collect or eval task: DI-engine's ``collector_cfg``, validated.

    Exactly one of ``n_sample`` and ``n_episode`` is set. Build it from a task message
    with :meth:`from_wire`; :meth:`to_wire` gives back an equivalent wire dict.
    """

    env: EnvSpec
    policy: PolicySpec
    n_sample: int | None = None
    """Collect tasks: done once this many train samples (transitions) were produced in total."""
    n_episode: int | None = None
    """Done once every env finished this many episodes (DI-engine's ``env_manager.done``)."""
    traj_len: int = 32
    """Max transitions buffered per env before they are flushed as one chunk."""
    eps: float | None = None
    """``collect_setting.eps``: exploration rate of collect tasks; eval tasks act greedily."""
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
        if (self.n_sample is None) == (self.n_episode is None):
            raise TaskError(f"exactly one of {p}.n_sample and {p}.n_episode must be given")
        flag = _check_bool(self.eval_flag, f"{p}.eval_flag")
        object.__setattr__(self, "eval_flag", flag)
        if self.n_sample is not None:
            if flag:
                raise TaskError(f"{p}.n_sample cannot be used by eval tasks (they produce no samples); use n_episode")
            object.__setattr__(self, "n_sample", _check_int(self.n_sample, f"{p}.n_sample", 1, _MAX_COUNT))
        if self.n_episode is not None:
            object.__setattr__(self, "n_episode", _check_int(self.n_episode, f"{p}.n_episode", 1, 10**6))
        object.__setattr__(self, "traj_len", _check_int(self.traj_len, f"{p}.traj_len", 1, 4096))
        if self.eps is not None:
            object.__setattr__(self, "eps", _check_float(self.eps, f"{p}.collect_setting.eps", 0.0, 1.0))
        elif self.policy.type == "dqn" and not flag:
            raise TaskError(f"{p}.collect_setting.eps is missing (required by dqn collect tasks)")
        if self.policy_update_path is not None:
            _check_str(self.policy_update_path, f"{p}.policy_update_path")
        elif self.policy.type == "dqn":
            raise TaskError(f"{p}.policy_update_path is missing (required by dqn policies)")
        ups = _check_float(self.update_policy_second, f"{p}.update_policy_second", 0.0, 3600.0, lo_open=True)
        object.__setattr__(self, "update_policy_second", ups)
        steps = _check_int(self.max_env_steps, f"{p}.max_env_steps", 1, _MAX_COUNT)
        object.__setattr__(self, "max_env_steps", steps)

    @property
    def collect_setting(self) -> dict[str, Any] | None:
        """DI-engine's ``collect_setting`` dict, or ``None`` for eval tasks."""
        if self.eval_flag or self.eps is None:
            return None
        return {"eps": self.eps}

    @classmethod
    def from_wire(cls, cfg: Any) -> CollectorSpec:
        """Validate a ``collector_cfg`` dict from a task message.

        Unknown keys are ignored so that coordinators may send DI-engine extras
        (``type``, ``import_names``, ``exp_name``...).

        Raises:
            TaskError: a key is missing, has the wrong type or is out of range; the
                message names the key.
        """
        p = "collector_cfg"
        cfg = _mapping(cfg, p)
        env_cfg = _mapping(_required(cfg, "env", p), f"{p}.env")
        pol_cfg = _mapping(_required(cfg, "policy", p), f"{p}.policy")
        env = EnvSpec(
            id=_required(env_cfg, "id", f"{p}.env"),
            env_num=_required(env_cfg, "env_num", f"{p}.env"),
            seed=env_cfg.get("seed"),
        )
        policy = PolicySpec(
            type=_required(pol_cfg, "type", f"{p}.policy"),
            hidden_sizes=pol_cfg.get("hidden_sizes", DEFAULT_HIDDEN_SIZES),
        )
        eval_flag = cfg.get("eval_flag", False)
        eps = None
        if "collect_setting" in cfg and eval_flag is not True:
            eps = _required(_mapping(cfg["collect_setting"], f"{p}.collect_setting"), "eps", f"{p}.collect_setting")
        return cls(
            env=env,
            policy=policy,
            n_sample=cfg.get("n_sample"),
            n_episode=cfg.get("n_episode"),
            traj_len=cfg.get("traj_len", 32),
            eps=eps,
            policy_update_path=cfg.get("policy_update_path"),
            update_policy_second=cfg.get("update_policy_second", 3.0),
            eval_flag=eval_flag,
            max_env_steps=cfg.get("max_env_steps", 1_000_000),
        )

    def to_wire(self) -> dict[str, Any]:
        """The wire dict of this spec; ``from_wire(spec.to_wire()) == spec``."""
        env: dict[str, Any] = {"id": self.env.id, "env_num": self.env.env_num}
        if self.env.seed is not None:
            env["seed"] = self.env.seed
        wire: dict[str, Any] = {
            "env": env,
            "policy": {"type": self.policy.type, "hidden_sizes": list(self.policy.hidden_sizes)},
            "traj_len": self.traj_len,
            "update_policy_second": self.update_policy_second,
            "eval_flag": self.eval_flag,
            "max_env_steps": self.max_env_steps,
        }
        if self.n_sample is not None:
            wire["n_sample"] = self.n_sample
        if self.n_episode is not None:
            wire["n_episode"] = self.n_episode
        if self.collect_setting is not None:
            wire["collect_setting"] = self.collect_setting
        if self.policy_update_path is not None:
            wire["policy_update_path"] = self.policy_update_path
        return wire


# -- learner config ------------------------------------------------------------------


@dataclass(frozen=True)
class LearnerSpec:
    """DQN hyperparameters, with defaults tuned to solve CartPole-v1 quickly.

    The exploration schedule (``eps_*``) and the replay ratio are read by whoever
    schedules collect tasks (the coordinator); the rest by the learner.

    Tuned with ``scripts/dev_train_inprocess.py`` (greedy eval >= 195 after 3-9k env
    steps and ~600-2000 train steps on 10 of 10 seeds). Faster settings exist (lr 1e-3,
    batch 64, replay ratio 0.5 solve in ~2-3k steps) but their policies collapse again
    in most later evals; with these, 80-100% of later evals stay above 195, which
    matters when evals only run every few seconds.
    """

    batch_size: int = 128
    lr: float = 2.5e-4
    """Adam learning rate."""
    discount: float = 0.99
    replay_capacity: int = 50_000
    """Transitions kept in the replay ring buffer."""
    learning_starts: int = 500
    """No train step before the replay buffer holds this many transitions."""
    target_update_interval: int = 250
    """Train steps between target network updates."""
    tau: float = 1.0
    """Target update weight: 1.0 copies the online net, smaller values do Polyak averaging."""
    hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
    double_dqn: bool = True
    """Pick the bootstrap action with the online net, evaluate it with the target net."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip, against the occasional huge TD error."""
    train_steps_per_sample: float = 0.25
    """Replay ratio: train steps to run per collected transition."""
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int = 5_000
    """Env steps over which epsilon decays linearly from ``eps_start`` to ``eps_end``."""

    def __post_init__(self) -> None:
        p = "learner_cfg"
        for name, lo, hi in (
            ("batch_size", 1, 65_536),
            ("replay_capacity", 1, 10**8),
            ("learning_starts", 0, _MAX_COUNT),
            ("target_update_interval", 1, _MAX_COUNT),
            ("eps_decay_steps", 1, _MAX_COUNT),
        ):
            object.__setattr__(self, name, _check_int(getattr(self, name), f"{p}.{name}", lo, hi))
        for name, flo, fhi, lo_open in (
            ("lr", 0.0, 1.0, True),
            ("discount", 0.0, 1.0, False),
            ("tau", 0.0, 1.0, True),
            ("max_grad_norm", 0.0, 1e6, True),
            ("train_steps_per_sample", 0.0, 1024.0, True),
            ("eps_start", 0.0, 1.0, False),
            ("eps_end", 0.0, 1.0, False),
        ):
            value = _check_float(getattr(self, name), f"{p}.{name}", flo, fhi, lo_open=lo_open)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "hidden_sizes", _check_sizes(self.hidden_sizes, f"{p}.hidden_sizes"))
        object.__setattr__(self, "double_dqn", _check_bool(self.double_dqn, f"{p}.double_dqn"))

    def epsilon(self, env_steps: int) -> float:
        """Exploration rate for collect tasks started after ``env_steps`` env steps."""
        return epsilon_at(env_steps, self.eps_start, self.eps_end, self.eps_decay_steps)

    @classmethod
    def from_wire(cls, cfg: Any) -> LearnerSpec:
        """Validate a ``learner_cfg`` dict; missing keys take the defaults, unknown keys are refused.

        Raises:
            TaskError: a key is unknown, has the wrong type or is out of range.
        """
        cfg = _mapping(cfg, "learner_cfg")
        known = set(cls.__dataclass_fields__)
        for key in cfg:
            if key not in known:
                raise TaskError(f"learner_cfg.{_show(key)} is not a learner setting")
        return cls(**{str(k): v for k, v in cfg.items()})

    def to_wire(self) -> dict[str, Any]:
        """Plain dict of every setting; ``from_wire(spec.to_wire()) == spec``."""
        wire = asdict(self)
        wire["hidden_sizes"] = list(self.hidden_sizes)
        return wire


def epsilon_at(env_steps: int, start: float, end: float, decay_steps: int) -> float:
    """Linearly decayed exploration rate: ``start`` at step 0, ``end`` from ``decay_steps`` on.

    Linear (rather than exponential) decay keeps exploration high for a known budget,
    which is what a fixed-size task schedule wants.
    """
    if env_steps >= decay_steps:
        return float(end)
    frac = max(env_steps, 0) / decay_steps
    return float(start + frac * (end - start))
