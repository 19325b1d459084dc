"""Built-in DQN (double DQN, Huber loss, target network, replay) on the plug-in contract.

This module is what the registry loads, and it stays light (no torch): the coordinator
builds the algorithm to validate a job and to read its exploration schedule. The torch
actor (:mod:`.actor`) and the learner (:mod:`.learner`) import torch when they are made;
the numpy actor (:mod:`.numpy_actor`, ReLU MLP jobs) never does. The learner's train step
is :mod:`.torch_step` or its numpy twin :mod:`.numpy_step`, both from the losses of
:mod:`.losses`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from worker.algorithms.dqn.config import DQNConfig, epsilon_at
from worker.algorithms.numpy_twin.actors import TwoActors
from worker.algorithms.numpy_twin.layout import Shapes, mlp_layout
from worker.errors import TaskError
from worker.plugins.contract import Actor, Learner, Model, Placement, UnsupportedSpace
from worker.plugins.spaces import Spaces, describe_space, leaf_layout
from worker.protocol.checks import check_float
from worker.rl.chunks import is_frame_stack
from worker.rl.frame_replay import frame_replay_bytes_per_transition

__all__ = ["DQN", "DQNConfig", "epsilon_at"]


class DQN(TwoActors):
    """Q-learning from replay: discrete actions, any observation space the model takes."""

    Config = DQNConfig
    kind = "off_policy"
    devices = ("cpu", "cuda")
    config: DQNConfig

    def __init__(self, config: DQNConfig, spaces: Spaces, model: Model) -> None:
        super().__init__(config, spaces, model)
        need = config.replay_capacity * self.replay_bytes_per_transition
        if need > config.replay_max_gib * 2**30:
            raise TaskError(
                f"its replay buffer would take {need / 2**30:.1f} GiB ({config.replay_capacity} transitions x "
                f"{self.replay_bytes_per_transition} bytes), over replay_max_gib = {config.replay_max_gib}: "
                "lower replay_capacity or raise replay_max_gib"
            )

    @property
    def replay_bytes_per_transition(self) -> int:
        """Bytes a transition takes in replay: obs and next_obs, action, reward, done.

        Frame stacks keep each frame once (:class:`~worker.rl.frame_replay.FrameReplay`):
        ~1.1 frames and 72 bytes of frame numbers a transition instead of two stacks.
        """
        obs = self.spaces.observation
        if is_frame_stack(obs):
            stack, height, width = obs.shape  # type: ignore[misc]
            return frame_replay_bytes_per_transition(height * width, stack, 8 + 4 + 1)
        leaves = list(obs.spaces.values()) if isinstance(obs, gym.spaces.Dict) else [obs]
        per_obs = 0
        for leaf in leaves:
            shape, dtype = leaf_layout(leaf)
            per_obs += math.prod(shape) * dtype.itemsize
        return 2 * per_obs + 8 + 4 + 1

    @classmethod
    def check_spaces(cls, spaces: Spaces) -> None:
        if not isinstance(spaces.action, gym.spaces.Discrete):
            raise UnsupportedSpace(
                f"dqn needs Discrete actions (one Q-value per action); the env's actions are "
                f"{describe_space(spaces.action)}: use sac or ppo"
            )

    def collect_settings(self, env_steps: int) -> dict[str, float]:
        return {"eps": self.config.epsilon(env_steps)}

    def check_collect_settings(self, settings: Mapping[str, float]) -> None:
        if "eps" in settings:
            check_float(settings["eps"], "collector_cfg.collect_setting.eps", 0.0, 1.0)

    @property
    def replay_ratio(self) -> float:
        return self.config.train_steps_per_sample

    @property
    def n_actions(self) -> int:
        return int(self.spaces.action.n)  # type: ignore[attr-defined]

    def numpy_actor(self, layout: Shapes, seed: int | None) -> Actor:
        from worker.algorithms.dqn.numpy_actor import NumpyQActor

        return NumpyQActor(layout, seed)

    def torch_actor(self, seed: int | None) -> Actor:
        from worker.algorithms.dqn.actor import TorchQActor

        return TorchQActor(self.q_network(), seed)

    def numpy_layout(self) -> Shapes | None:
        """The Q-network's tensor shapes by name where numpy runs it (a ReLU mlp on one float Box), else ``None``."""
        mlp = mlp_layout(self.model, self.spaces.observation, activations=("relu",))
        if mlp is None:
            return None
        n_actions = int(self.spaces.action.n)  # type: ignore[attr-defined]
        return {**mlp.shapes("encoder."), "head.weight": (n_actions, mlp.out_dim), "head.bias": (n_actions,)}

    def make_learner(self, seed: int, placement: Placement | None = None) -> Learner:
        from worker.algorithms.dqn.learner import DQNLearner

        return DQNLearner(self, seed, placement)

    def q_network(self, seed: int | None = None) -> Any:
        """A fresh :class:`~worker.algorithms.dqn.network.QNetwork` (seeded weights if ``seed``)."""
        from worker.algorithms.dqn.network import QNetwork

        return QNetwork.build(self.model, self.spaces, seed)
