"""Built-in PPO (clipped objective, GAE or V-trace, minibatch epochs) on the plug-in contract.

Light on purpose (no torch): the coordinator builds the algorithm to check a job. The
network, torch actor and learner (:mod:`.network`, :mod:`.actor`, :mod:`.learner`) import
torch when they are made; the numpy actor of MLP jobs (:mod:`.numpy_actor`) never does.
The learner's minibatch step is :mod:`.torch_step` or its numpy twin :mod:`.numpy_step`,
both from the losses of :mod:`.losses`.

On-policy in a distributed system means stale data: collectors keep acting while the
learner updates. Every chunk carries the policy version that made it; the learner drops
chunks more than ``max_lag`` versions old (counted), writes every version it makes so
collectors catch up within ``update_policy_second``, and with ``correction = "vtrace"``
corrects what lag remains with V-trace's truncated importance weights.

With a recurrent model (``lstm``) the actors keep a state per env, the chunks carry it at
their first step, and the learner trains on sequences of ``seq_len`` steps
(:mod:`.sequences`), masked where an episode begins inside one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from worker.algorithms.numpy_twin.actors import TwoActors
from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.numpy_actor import PPOLayout
from worker.plugins.contract import Actor, Column, Learner, Placement, UnsupportedSpace
from worker.plugins.spaces import Spaces, describe_space

__all__ = ["PPO", "PPOConfig"]


class PPO(TwoActors):
    """Proximal policy optimisation: any supported action space, any observation the model takes."""

    Config = PPOConfig
    kind = "on_policy"
    devices = ("cpu", "cuda")
    default_model_config: ClassVar[Mapping[str, Any]] = {"hidden_sizes": [64, 64], "activation": "tanh"}
    config: PPOConfig

    @classmethod
    def check_spaces(cls, spaces: Spaces) -> None:
        action = spaces.action
        if not isinstance(
            action, gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary | gym.spaces.Box
        ):
            raise UnsupportedSpace(f"ppo has no action distribution for {describe_space(action)}")

    recurrent_models = True

    def columns(self) -> Mapping[str, Column]:
        return {"logp": Column((), "float32"), "value": Column((), "float32")}

    def memory_columns(self) -> Mapping[str, Column]:
        """A recurrent model's state per body: ``pi.<name>`` (and ``vf.<name>`` unless ``shared_body``)."""
        shapes = self.model.state_shapes(self.spaces.observation)
        bodies = ("pi",) if self.config.shared_body else ("pi", "vf")
        return {f"{body}.{name}": Column(shape, "float32") for body in bodies for name, shape in shapes.items()}

    @property
    def max_policy_lag(self) -> int:
        return self.config.max_lag

    def numpy_actor(self, layout: PPOLayout, seed: int | None) -> Actor:
        from worker.algorithms.ppo.numpy_actor import NumpyPPOActor

        return NumpyPPOActor(layout, seed)

    def torch_actor(self, seed: int | None) -> Actor:
        from worker.algorithms.ppo.actor import PPOActor

        return PPOActor(self.network(), seed)

    def numpy_layout(self) -> PPOLayout | None:
        """The network's :class:`~worker.algorithms.ppo.numpy_actor.PPOLayout` where numpy runs it, else ``None``."""
        return PPOLayout.of_algorithm(self)

    def make_learner(self, seed: int, placement: Placement | None = None) -> Learner:
        from worker.algorithms.ppo.learner import PPOLearner

        return PPOLearner(self, seed, placement)

    def network(self, seed: int | None = None) -> Any:
        """A fresh actor-critic (seeded weights if ``seed``)."""
        from worker.algorithms.ppo.network import ActorCritic

        return ActorCritic.build(self, seed)
