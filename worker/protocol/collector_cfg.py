"""``collector_cfg``: what a collect or eval task asks a collector to run, typed and validated.

It arrives in a msgpack task message, so it is untrusted: every field is type- and
range-checked once, here, and any problem becomes a :class:`~worker.errors.TaskError`
whose message names the offending key. Validation lives in ``__post_init__`` so specs
built in code (the coordinator's job config, tests) obey the same rules as specs parsed
from the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from worker.errors import TaskError, short_repr
from worker.protocol.checks import (
    MAX_COUNT,
    check_bool,
    check_float,
    check_int,
    check_sizes,
    check_str,
    mapping,
    required,
)

PolicyType = Literal["dqn", "random"]

#: Policy types a collector can run.
POLICY_TYPES: Final[tuple[PolicyType, ...]] = ("dqn", "random")
#: Q-network hidden layer widths shared by collectors and the learner; the two must
#: agree or the learner's state_dict cannot be loaded by the collectors.
DEFAULT_HIDDEN_SIZES: Final = (128, 128)
#: More envs than this in one task would starve the other processes on a worker host.
MAX_ENV_NUM: Final = 256
_MAX_SEED: Final = 2**32 - 1


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
        check_str(self.id, "collector_cfg.env.id", max_len=200)
        object.__setattr__(self, "env_num", check_int(self.env_num, "collector_cfg.env.env_num", 1, MAX_ENV_NUM))
        if self.seed is not None:
            object.__setattr__(self, "seed", check_int(self.seed, "collector_cfg.env.seed", 0, _MAX_SEED))


@dataclass(frozen=True)
class PolicySpec:
    """Which policy acts in the envs."""

    type: PolicyType
    """``dqn`` (epsilon-greedy Q-network, needs a policy file) or ``random`` (uniform actions)."""
    hidden_sizes: tuple[int, ...] = DEFAULT_HIDDEN_SIZES
    """Q-network hidden layer widths; must match the learner's."""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or self.type not in POLICY_TYPES:
            raise TaskError(
                f"collector_cfg.policy.type must be one of {list(POLICY_TYPES)}, got {short_repr(self.type)}"
            )
        sizes = check_sizes(self.hidden_sizes, "collector_cfg.policy.hidden_sizes")
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
    traj_len: int = 64
    """Steps per chunk (``T``): one step file and one metadata message per ``traj_len`` steps of all envs."""
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
        flag = check_bool(self.eval_flag, f"{p}.eval_flag")
        object.__setattr__(self, "eval_flag", flag)
        if self.n_sample is not None:
            if flag:
                raise TaskError(f"{p}.n_sample cannot be used by eval tasks (they produce no samples); use n_episode")
            object.__setattr__(self, "n_sample", check_int(self.n_sample, f"{p}.n_sample", 1, MAX_COUNT))
        if self.n_episode is not None:
            object.__setattr__(self, "n_episode", check_int(self.n_episode, f"{p}.n_episode", 1, 10**6))
        object.__setattr__(self, "traj_len", check_int(self.traj_len, f"{p}.traj_len", 1, 4096))
        if self.eps is not None:
            object.__setattr__(self, "eps", check_float(self.eps, f"{p}.collect_setting.eps", 0.0, 1.0))
        elif self.policy.type == "dqn" and not flag:
            raise TaskError(f"{p}.collect_setting.eps is missing (required by dqn collect tasks)")
        if self.policy_update_path is not None:
            check_str(self.policy_update_path, f"{p}.policy_update_path")
        elif self.policy.type == "dqn":
            raise TaskError(f"{p}.policy_update_path is missing (required by dqn policies)")
        ups = check_float(self.update_policy_second, f"{p}.update_policy_second", 0.0, 3600.0, lo_open=True)
        object.__setattr__(self, "update_policy_second", ups)
        steps = check_int(self.max_env_steps, f"{p}.max_env_steps", 1, MAX_COUNT)
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
        cfg = mapping(cfg, p)
        env_cfg = mapping(required(cfg, "env", p), f"{p}.env")
        pol_cfg = mapping(required(cfg, "policy", p), f"{p}.policy")
        env = EnvSpec(
            id=required(env_cfg, "id", f"{p}.env"),
            env_num=required(env_cfg, "env_num", f"{p}.env"),
            seed=env_cfg.get("seed"),
        )
        policy = PolicySpec(
            type=required(pol_cfg, "type", f"{p}.policy"),
            hidden_sizes=pol_cfg.get("hidden_sizes", DEFAULT_HIDDEN_SIZES),
        )
        eval_flag = cfg.get("eval_flag", False)
        eps = None
        if "collect_setting" in cfg and eval_flag is not True:
            eps = required(mapping(cfg["collect_setting"], f"{p}.collect_setting"), "eps", f"{p}.collect_setting")
        return cls(
            env=env,
            policy=policy,
            n_sample=cfg.get("n_sample"),
            n_episode=cfg.get("n_episode"),
            traj_len=cfg.get("traj_len", 64),
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
