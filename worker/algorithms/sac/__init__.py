"""Built-in SAC (continuous actions) on the plug-in contract; light on purpose (no torch at import).

The networks, torch actor and learner (:mod:`.networks`, :mod:`.learner`) import torch when
they are made; the numpy actor of ReLU MLP jobs (:mod:`.numpy_actor`) never does. The
learner's train step is :mod:`.torch_step` or its numpy twin :mod:`.numpy_step`, both from
the losses of :mod:`.losses`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from worker.algorithms.numpy_twin.actors import TwoActors
from worker.algorithms.numpy_twin.layout import Shapes, mlp_layout
from worker.algorithms.sac.config import SACConfig
from worker.models.mlp import MLP
from worker.plugins.contract import Actor, Learner, Model, Placement, UnsupportedSpace
from worker.plugins.spaces import Spaces, describe_space

__all__ = ["SAC", "SACConfig", "flat_observations"]


def flat_observations(spaces: Spaces) -> bool:
    """The observations are one flat float ``Box``, which a critic can take joined with the action."""
    obs = spaces.observation
    return isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1 and np.issubdtype(obs.dtype, np.floating)


class SAC(TwoActors):
    """Off-policy maximum-entropy RL for a flat, bounded ``Box`` of actions."""

    Config = SACConfig
    kind = "off_policy"
    devices = ("cpu", "cuda")
    default_model_config: ClassVar[Mapping[str, Any]] = {"hidden_sizes": [256], "activation": "relu"}
    config: SACConfig

    def __init__(self, config: SACConfig, spaces: Spaces, model: Model) -> None:
        super().__init__(config, spaces, model)
        if config.critic_input == "joint" and not flat_observations(spaces):
            raise UnsupportedSpace(
                "algorithm.critic_input = 'joint' needs one flat float Box of observations; the env's are "
                f"{describe_space(spaces.observation)}: use 'features' (or 'auto')"
            )

    @property
    def joint_critic_input(self) -> bool:
        """The critics take ``[observation, action]`` at their first layer (:attr:`SACConfig.critic_input`).

        ``auto`` joins them for the built-in mlp only: another model plug-in's encoder may
        read meaning into its observation's layout, and a job names ``joint`` to give it both.
        """
        if self.config.critic_input == "auto":
            return type(self.model.plugin) is MLP and flat_observations(self.spaces)
        return self.config.critic_input == "joint"

    @classmethod
    def check_spaces(cls, spaces: Spaces) -> None:
        action = spaces.action
        if not isinstance(action, gym.spaces.Box):
            raise UnsupportedSpace(
                f"sac needs continuous (Box) actions; the env's actions are {describe_space(action)}: use dqn or ppo"
            )
        if not (np.isfinite(action.low).all() and np.isfinite(action.high).all()):
            raise UnsupportedSpace("sac squashes its actions into the action box: every bound must be finite")

    @property
    def replay_ratio(self) -> float:
        return self.config.train_steps_per_sample

    def numpy_actor(self, layout: Shapes, seed: int | None) -> Actor:
        from worker.algorithms.sac.numpy_actor import NumpySACActor

        return NumpySACActor(layout, seed)

    def torch_actor(self, seed: int | None) -> Actor:
        from worker.algorithms.sac.networks import SACActor

        return SACActor(self.policy_network(), seed)

    def numpy_layout(self) -> Shapes | None:
        """The policy's tensor shapes by name where numpy runs it (a ReLU mlp on one float Box), else ``None``."""
        mlp = mlp_layout(self.model, self.spaces.observation, activations=("relu",))
        if mlp is None:
            return None
        from worker.algorithms.sac.numpy_actor import policy_shapes

        return policy_shapes(mlp.shapes(""), mlp.out_dim, int(self.spaces.action.shape[0]))  # type: ignore[index]

    def make_learner(self, seed: int, placement: Placement | None = None) -> Learner:
        from worker.algorithms.sac.learner import SACLearner

        return SACLearner(self, seed, placement)

    def policy_network(self, seed: int | None = None) -> Any:
        from worker.algorithms.sac.networks import SquashedGaussianPolicy, seeded

        return seeded(lambda: SquashedGaussianPolicy(self.model, self.spaces), seed)
