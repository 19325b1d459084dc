"""Broker-free reinforcement-learning core: task config, envs, policies, the collector
loop and the DQN learner.

Nothing here imports pika or touches files: the worker wires these pieces to
RabbitMQ and the shared volume through :class:`SampleSink` and :class:`PolicySource`.
"""

from __future__ import annotations

from worker.rl.config import CollectorSpec, EnvSpec, LearnerSpec, PolicySpec, epsilon_at
from worker.rl.dqn import DQNLearner, ReplayBuffer
from worker.rl.envs import EnvBatch, EnvStep, make_env
from worker.rl.policy import DQNPolicy, QNetwork, RandomPolicy, limit_torch_threads, make_policy
from worker.rl.rollout import PolicySnapshot, PolicySource, Rollout, SampleSink

__all__ = [
    "CollectorSpec",
    "DQNLearner",
    "DQNPolicy",
    "EnvBatch",
    "EnvSpec",
    "EnvStep",
    "LearnerSpec",
    "PolicySnapshot",
    "PolicySource",
    "PolicySpec",
    "QNetwork",
    "RandomPolicy",
    "ReplayBuffer",
    "Rollout",
    "SampleSink",
    "epsilon_at",
    "limit_torch_threads",
    "make_env",
    "make_policy",
]
