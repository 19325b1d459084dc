"""PPO's MLP actor-critic in numpy, without torch: its layout, its parameters as one flat vector, its forward pass.

Shared by the numpy actor (on collectors, which then never import torch) and the numpy
minibatch step (:mod:`.fast`, on the learner, which adds the backward pass). The layout
is :class:`~worker.algorithms.ppo.network.ActorCritic`'s, named and ordered as torch's
``named_parameters`` and ``state_dict`` give it: the Gaussian's ``log_std`` (a parameter
of the network itself, so first), the policy body, the value body unless shared, the two
heads, and the observation statistics' buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.models.mlp_layout import Shapes, mlp_layout
from worker.rl.dense import Dense
from worker.rl.flat_adam import flat_views

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO

__all__ = ["NumpyActorCritic", "PPOLayout", "gaussian_logp", "log_softmax"]

F32 = npt.NDArray[np.float32]
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
#: Normalised observations are clipped to this many standard deviations (the torch network's too).
OBS_CLIP = 10.0


@dataclass(frozen=True)
class PPOLayout:
    """What a numpy actor-critic needs to know of the torch one: names, shapes, bodies, activation, actions."""

    params: Shapes
    """Parameters in ``named_parameters`` order."""
    buffers: Shapes
    """The observation statistics (float64), when observations are normalised."""
    pi_body: tuple[str, ...]
    """The policy body's linear layers, in order."""
    vf_body: tuple[str, ...] | None
    """The value body's, or ``None`` when the body is shared."""
    tanh: bool
    discrete: bool
    action_start: int

    @classmethod
    def of_algorithm(cls, algorithm: PPO) -> PPOLayout | None:
        """The layout of ``algorithm.network()`` without building it; ``None`` where numpy cannot run it.

        Numpy runs the ``mlp`` model (tanh or ReLU) on one flat float ``Box``, with
        ``Discrete`` or ``Box`` actions.
        """
        spaces, config = algorithm.spaces, algorithm.config
        mlp = mlp_layout(algorithm.model, spaces.observation)
        action = spaces.action
        if mlp is None or not isinstance(action, gym.spaces.Discrete | gym.spaces.Box):
            return None
        outputs = int(action.n) if isinstance(action, gym.spaces.Discrete) else int(action.shape[0])
        params: Shapes = {"log_std": (outputs,)} if isinstance(action, gym.spaces.Box) else {}
        params.update(mlp.shapes("pi_body."))
        if not config.shared_body:
            params.update(mlp.shapes("vf_body."))
        params.update(
            {
                "pi_head.weight": (outputs, mlp.out_dim),
                "pi_head.bias": (outputs,),
                "vf_head.weight": (1, mlp.out_dim),
                "vf_head.bias": (1,),
            }
        )
        obs_shape = tuple(int(n) for n in spaces.observation.shape)  # type: ignore[union-attr]
        buffers: Shapes = (
            {"obs_norm.mean": obs_shape, "obs_norm.var": obs_shape, "obs_norm.count": ()}
            if config.normalize_obs
            else {}
        )
        return cls(
            params=params,
            buffers=buffers,
            pi_body=tuple(mlp.linear_names("pi_body.")),
            vf_body=None if config.shared_body else tuple(mlp.linear_names("vf_body.")),
            tanh=mlp.activation == "tanh",
            discrete=isinstance(action, gym.spaces.Discrete),
            action_start=int(action.start) if isinstance(action, gym.spaces.Discrete) else 0,
        )

    @property
    def state_shapes(self) -> Shapes:
        """Every tensor a policy file holds for this network."""
        return {**self.params, **self.buffers}


class NumpyActorCritic:
    """An actor-critic's parameters as views of one flat float32 vector, and its forward pass.

    The parameters start at zero: load weights (:meth:`load`) before acting.
    """

    def __init__(self, layout: PPOLayout) -> None:
        self.layout = layout
        self.names = list(layout.params)
        self.shapes = list(layout.params.values())
        self.size = sum(math.prod(shape) for shape in self.shapes)
        self.params = np.zeros(self.size, dtype=np.float32)
        self.grad = np.zeros(self.size, dtype=np.float32)
        self.views = self.split(self.params)
        self.grads = self.split(self.grad)
        self.pi_body = self._body(layout.pi_body)
        self.vf_body = None if layout.vf_body is None else self._body(layout.vf_body)
        self.discrete = layout.discrete
        self.action_start = layout.action_start

    def load(self, weights: Any) -> None:
        """Copy the parameters of ``weights`` (a mapping of torch tensors or numpy arrays, already checked) in.

        Every array is converted before any is copied: one that cannot be leaves the parameters as they were.
        """
        arrays = {name: np.asarray(weights[name], dtype=np.float32) for name in self.names}
        for name, array in arrays.items():
            self.views[name][...] = array

    def forward(self, obs: F32) -> tuple[F32, F32, F32, F32]:
        """The policy head's output (logits or means), the values, and the two bodies' features (for backward)."""
        features = self.pi_body.forward(obs)
        out = features @ self.views["pi_head.weight"].T + self.views["pi_head.bias"]
        vf_features = features if self.vf_body is None else self.vf_body.forward(obs)
        values = (vf_features @ self.views["vf_head.weight"].T)[:, 0] + self.views["vf_head.bias"][0]
        return out, values, features, vf_features

    def split(self, flat: F32) -> dict[str, F32]:
        """Views of ``flat`` per parameter name, shaped as the parameters."""
        return flat_views(flat, self.names, self.shapes)

    def _body(self, linear: tuple[str, ...]) -> Dense:
        weights = [(self.views[f"{n}.weight"], self.views[f"{n}.bias"]) for n in linear]
        grads = [(self.grads[f"{n}.weight"], self.grads[f"{n}.bias"]) for n in linear]
        return Dense(weights, grads, "tanh" if self.layout.tanh else "relu", activate_last=True)


def log_softmax(logits: F32) -> F32:
    shifted = logits - logits.max(axis=1, keepdims=True)
    out: F32 = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return out


def gaussian_logp(actions: F32, means: F32, log_std: F32) -> F32:
    """Log-density of a diagonal Gaussian, summed over the action's components (torch's ``Normal.log_prob``)."""
    diff = actions - means
    out: F32 = (-0.5 * diff * diff * np.exp(np.float32(-2.0) * log_std) - log_std - _HALF_LOG_2PI).sum(axis=1)
    return out
