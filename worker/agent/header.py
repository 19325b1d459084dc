"""What a policy file says about itself, beyond its weights: the job that trained it, the eval that chose it.

A learner writes, in every policy file's safetensors header (``docs/protocol.md`` section 6),
besides ``algorithm``, ``model``, their versions and ``spaces_digest``, the whole job as
``job.json`` holds it (key ``job``, compact JSON): the algorithm's and model's settings, the
spaces, the env. So a policy file alone is enough to rebuild its actor
(:func:`~worker.agent.policy.load_policy`) and to make its env (``warren eval``), on any
machine with the plug-ins it names. A file written before the key existed is read with the
``job.json`` of the run directory it lies in.

The best policy a run's evals saw (``<policy name>.best``, kept by the coordinator) adds
``eval_return`` (the eval's mean return), ``eval_episodes``, ``env_steps`` (the run's env
steps when the eval ended), ``eval_seed`` and ``eval_envs`` (how the eval's envs were
seeded: ``warren eval --seed --envs --episodes`` with them plays its episodes again); its
``policy_version`` is the evaluated version's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker import json_text
from worker.errors import CorruptFile

if TYPE_CHECKING:
    from worker.job import JobConfig

#: Header key of the job that trained the policy (compact ``job.json``).
JOB_KEY: Final = "job"
#: What follows the policy name in the name of the best policy's file.
BEST_SUFFIX: Final = ".best"
#: Header keys of the best policy's file: the eval that chose it.
EVAL_RETURN_KEY: Final = "eval_return"
EVAL_EPISODES_KEY: Final = "eval_episodes"
ENV_STEPS_KEY: Final = "env_steps"
EVAL_SEED_KEY: Final = "eval_seed"
EVAL_ENVS_KEY: Final = "eval_envs"
#: The run directory's job file, two levels above its policy files (``<run>/policy/<name>``).
JOB_FILE: Final = "job.json"


def policy_header(job: JobConfig) -> dict[str, str]:
    """The header a learner writes into each policy file of ``job``: what collectors check before they load
    it (the plug-ins, the spaces' digest), and the job itself, so the file alone rebuilds its actor."""
    assert job.spaces is not None
    return {
        "algorithm": job.algorithm.name,
        "algorithm_version": job.algorithm.version or "",
        "model": job.model.name or "",
        "model_version": job.model.version or "",
        "spaces_digest": job.spaces.digest,
        JOB_KEY: json_text.dumps(job.to_dict()),
    }


def best_header(
    eval_return: float, eval_episodes: int, env_steps: int, eval_seed: int | None, eval_envs: int
) -> dict[str, str]:
    """The header entries of a best policy: the eval that chose it (``repr`` keeps every float bit).

    With ``eval_seed`` and ``eval_envs``, ``warren eval --seed S --envs M --episodes N`` plays
    that eval's very episodes again (an eval task seeds env ``i``'s first reset ``S + i``).
    """
    return {
        EVAL_RETURN_KEY: repr(float(eval_return)),
        EVAL_EPISODES_KEY: str(int(eval_episodes)),
        ENV_STEPS_KEY: str(int(env_steps)),
        **({EVAL_SEED_KEY: str(int(eval_seed))} if eval_seed is not None else {}),
        EVAL_ENVS_KEY: str(int(eval_envs)),
    }


@dataclass(frozen=True)
class PolicyHeader:
    """A policy file's header, read: which plug-ins, which job, which version, and (best policies) which eval."""

    path: Path
    algorithm: str
    algorithm_version: str | None
    model: str | None
    model_version: str | None
    spaces_digest: str | None
    version: int
    """The policy version (the learner's update count) that produced the weights."""
    job: dict[str, Any] | None
    """The job that trained it, as ``job.json`` holds it (``None``: neither the header nor a run directory says)."""
    eval_return: float | None = None
    eval_episodes: int | None = None
    env_steps: int | None = None
    eval_seed: int | None = None
    eval_envs: int | None = None
    meta: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path, meta: dict[str, str], version: int) -> PolicyHeader:
        """The header of the policy file at ``path`` from its metadata (``version``: its checked ``policy_version``).

        Raises:
            CorruptFile: no ``algorithm``, or an entry that does not parse.
        """
        where = f"policy file {str(path)!r}"
        algorithm = meta.get("algorithm")
        if not algorithm:
            raise CorruptFile(f"{where} names no algorithm: it was not written by a warren learner")
        job = _job_of(where, meta.get(JOB_KEY)) if JOB_KEY in meta else _job_beside(path)
        return cls(
            path=path,
            algorithm=algorithm,
            algorithm_version=meta.get("algorithm_version") or None,
            model=meta.get("model") or None,
            model_version=meta.get("model_version") or None,
            spaces_digest=meta.get("spaces_digest") or None,
            version=version,
            job=job,
            eval_return=_number(where, meta, EVAL_RETURN_KEY, float),
            eval_episodes=_number(where, meta, EVAL_EPISODES_KEY, int),
            env_steps=_number(where, meta, ENV_STEPS_KEY, int),
            eval_seed=_number(where, meta, EVAL_SEED_KEY, int),
            eval_envs=_number(where, meta, EVAL_ENVS_KEY, int),
            meta=dict(meta),
        )

    def section(self, name: str) -> dict[str, Any]:
        """One section of the job (``{}`` when the job or the section is unknown)."""
        section = (self.job or {}).get(name)
        return dict(section) if isinstance(section, dict) else {}

    def describe(self) -> str:
        """``policy_main.best (dqn, version 62, eval return 500.0 at 26,732 env steps)``."""
        best = (
            f", eval return {self.eval_return:g} at {self.env_steps:,} env steps"
            if self.eval_return is not None and self.env_steps is not None
            else ""
        )
        return f"{self.path.name} ({self.algorithm}, version {self.version}{best})"


def _job_of(where: str, text: str | None) -> dict[str, Any]:
    try:
        job = json.loads(text or "")
    except ValueError:
        raise CorruptFile(f"{where}: its header's job is not JSON") from None
    if not isinstance(job, dict):
        raise CorruptFile(f"{where}: its header's job is not a JSON object")
    return job


def _job_beside(path: Path) -> dict[str, Any] | None:
    """The ``job.json`` of the run directory a policy file lies in (files from before the header's ``job``)."""
    candidate = path.resolve().parent.parent / JOB_FILE
    try:
        job = json.loads(candidate.read_text())
    except (OSError, ValueError):
        return None
    return job if isinstance(job, dict) else None


def _number(where: str, meta: dict[str, str], key: str, kind: type[Any]) -> Any:
    text = meta.get(key)
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise CorruptFile(f"{where}: its header's {key} is {text[:40]!r}, not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise CorruptFile(f"{where}: its header's {key} is {text[:40]!r}, not a finite number")
    return value
