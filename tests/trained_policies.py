"""Policy files as a run leaves them, without the run: a job's learner's weights, written with the learner's header.

The weights are the learner's own at the start (seeded), so a test that only needs a
policy file of a job's shape pays no training. The header is the learner service's
(:func:`~worker.agent.header.policy_header`), and the run directory gets its ``job.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from worker.agent.header import policy_header
from worker.collector.prepare import build_policy
from worker.collector.run import FilePolicySource
from worker.job import JobConfig
from worker.plugins.contract import Actor
from worker.plugins.registry import installed
from worker.storage import PolicyStore

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def job_of(config: str | None = None, /, **overrides: Any) -> JobConfig:
    """A shipped job (``configs/<config>``, default: warren's default job) with ``section.key`` overrides."""
    return JobConfig.load(CONFIGS / config if config is not None else None, **overrides)


def image_job(algorithm: str, shape: tuple[int, ...] = (4, 36, 36)) -> JobConfig:
    """A job on a small fake image space (uint8 frames, Discrete(3) actions) with the nature_cnn model."""
    spaces = {
        "observation": {"kind": "Box", "shape": list(shape), "dtype": "uint8", "low": 0, "high": 255},
        "action": {"kind": "Discrete", "n": 3, "start": 0},
    }
    return JobConfig.from_dict(
        {
            "env": {"id": "CartPole-v1", "stop_value": 1.0},
            "algorithm": {"name": algorithm},
            "model": {"name": "nature_cnn", "features": 32},
            "spaces": spaces,
        }
    )


def write_policy(run_dir: Path, job: JobConfig, *, seed: int = 0, version: int = 1, name: str | None = None) -> Path:
    """The job's learner's seeded weights as the run's policy file ``name`` (default the job's), header and all."""
    learner = job.bound.make_learner(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "job.json").write_text(job.to_json())
    store = PolicyStore(run_dir / "policy")
    return store.write(name or job.coordinator.policy_name, learner.actor_weights(), version, policy_header(job))


def collectors_actor(job: JobConfig, policy_dir: Path, name: str, seed: int = 0) -> Actor:
    """The actor a collector runs for the job's eval tasks, the policy file ``name`` loaded as collectors load it."""
    spec = job.eval_spec(name)
    policy = spec.policy
    assert spec.spaces is not None
    algorithm = build_policy(installed(), spec.spaces, policy)
    actor = algorithm.make_actor(seed)
    source = FilePolicySource(PolicyStore(policy_dir), name, numpy=algorithm.weights_format == "numpy")
    snapshot = source.read()
    assert snapshot is not None
    actor.load_weights(snapshot.state_dict)
    return actor


def observations(job: JobConfig, count: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """``count`` observations of the job's space, as a batch in its dtype."""
    assert job.spaces is not None
    space = gym.vector.utils.batch_space(job.spaces.observation, count)
    space.seed(seed)
    return np.asarray(space.sample())
