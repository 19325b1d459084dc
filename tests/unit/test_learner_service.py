"""The learner process's training side (no broker): start, resume from the policy file, train, publish."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from worker.config import LearnerConfig
from worker.learner.service import Learner
from worker.rl.dqn import DQNLearner
from worker.rl.fast_dqn import NumpyDQNLearner
from worker.rl.policy import QNetwork
from worker.storage import PolicySnapshot


def make_learner(tmp_path: Path) -> Learner:
    return Learner(LearnerConfig(path_data=tmp_path / "data", path_policy=tmp_path / "policy"))


def published(learner: Learner) -> PolicySnapshot:
    snapshot = learner.policies.read(learner.job.coordinator.policy_name)
    assert snapshot is not None
    return snapshot


def cartpole_chunk(k: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``k`` random CartPole-shaped transitions as a ``[k, 1]`` chunk."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(k, 1, 4)).astype(np.float32),
        "next_obs": rng.normal(size=(k, 1, 4)).astype(np.float32),
        "action": rng.integers(0, 2, (k, 1)),
        "reward": np.ones((k, 1), np.float32),
        "done": rng.random((k, 1)) < 0.05,
        "truncated": np.zeros((k, 1), bool),
        "valid": np.ones((k, 1), bool),
    }


def assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(actual) == list(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)


def test_a_fresh_learner_publishes_the_seeded_initial_weights_at_iter_0(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    assert isinstance(learner.learner, NumpyDQNLearner)

    learner._resume_or_start()

    snapshot = published(learner)
    assert snapshot.iter == 0
    job = learner.job
    assert_same_state(snapshot.state_dict, DQNLearner(job.learner, 4, 2, seed=job.env.seed).policy_state())


def test_a_restarted_learner_resumes_from_the_policy_file_and_trains_on(tmp_path: Path) -> None:
    # Given the policy file an earlier learner of the run left at iter 120
    earlier = make_learner(tmp_path)
    state = NumpyDQNLearner(earlier.job.learner, 4, 2, seed=42).policy_state()
    earlier.policies.write(earlier.job.coordinator.policy_name, state, 120)

    # When a new learner starts, it continues from those weights and that iteration
    learner = make_learner(tmp_path)
    learner._resume_or_start()
    assert learner.learner.iter == 120
    assert_same_state(learner.learner.policy_state(), state)

    # and trains on numpy batches from its buffer, publishing the new weights
    learner.buffer.add(cartpole_chunk(learner.job.learner.learning_starts))
    learner._train_credit = 3.0
    learner._train_some()
    assert learner.stats.train_steps == 3 and learner.learner.iter == 123
    snapshot = published(learner)
    assert snapshot.iter == 123
    assert not torch.equal(snapshot.state_dict["net.0.weight"], state["net.0.weight"])


def test_a_policy_file_of_another_network_is_left_for_a_fresh_start(tmp_path: Path) -> None:
    earlier = make_learner(tmp_path)
    foreign = QNetwork(4, 2, (8,)).state_dict()
    earlier.policies.write(earlier.job.coordinator.policy_name, foreign, 77)

    learner = make_learner(tmp_path)
    learner._resume_or_start()

    assert learner.learner.iter == 0
    assert published(learner).iter == 0
