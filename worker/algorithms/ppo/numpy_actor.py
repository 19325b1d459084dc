"""PPO's MLP actor-critic in numpy (its layout, parameters and forward pass) and the actor of MLP jobs.

A collector acting in numpy never imports torch. The layout is
:class:`~worker.algorithms.ppo.network.ActorCritic`'s, named and ordered as torch's
``named_parameters`` and ``state_dict`` give it: the Gaussian's ``log_std`` (a parameter
of the network itself, so first), the policy body, the value body unless shared, the two
heads, and the observation statistics' buffers. :class:`NumpyActorCritic` is shared by the
actor (on collectors) and the numpy minibatch step (:mod:`.numpy_step`, on the learner,
which adds the backward pass). :class:`NumpyPPOActor` is built from the layout
(:meth:`PPOLayout.of_algorithm`), takes policy files as numpy arrays, and is held to the
torch actor (:class:`~worker.algorithms.ppo.actor.PPOActor`) in ``tests/unit/test_ppo_actor.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.algorithms.numpy_twin.actors import NumpyActor
from worker.algorithms.numpy_twin.layers import F32, Dense
from worker.algorithms.numpy_twin.layout import Shapes, mlp_layout
from worker.algorithms.numpy_twin.params import FlatParams
from worker.plugins.contract import Obs

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO

__all__ = ["OBS_CLIP", "NumpyActorCritic", "NumpyPPOActor", "PPOLayout", "gaussian_logp", "log_softmax"]

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
    """An actor-critic's parameters (:class:`FlatParams`, zero until loaded) and its forward pass."""

    def __init__(self, layout: PPOLayout) -> None:
        self.layout = layout
        self.flat = FlatParams(layout.params)
        self.pi_body = self._body(layout.pi_body)
        self.vf_body = None if layout.vf_body is None else self._body(layout.vf_body)
        self.discrete = layout.discrete
        self.action_start = layout.action_start

    def forward(self, obs: F32) -> tuple[F32, F32, F32, F32]:
        """The policy head's output (logits or means), the values, and the two bodies' features (for backward).

        The features are the bodies' arrays, which their next forward pass overwrites.
        """
        views = self.flat.views
        features = self.pi_body.forward(obs)
        out = features @ views["pi_head.weight"].T + views["pi_head.bias"]
        vf_features = features if self.vf_body is None else self.vf_body.forward(obs)
        values = (vf_features @ views["vf_head.weight"].T)[:, 0] + views["vf_head.bias"][0]
        return out, values, features, vf_features

    def _body(self, linear: tuple[str, ...]) -> Dense:
        return self.flat.dense(linear, "tanh" if self.layout.tanh else "relu", activate_last=True)


class NumpyPPOActor(NumpyActor):
    """Samples from an MLP actor-critic's policy (its mode when evaluating) and writes log-prob and value.

    Until weights are loaded its parameters are zero (a uniform or zero-mean policy).
    """

    network = "the PPO actor-critic"

    def __init__(self, layout: PPOLayout, seed: int | None) -> None:
        super().__init__(layout.state_shapes, seed)
        self.layout = layout
        self.model = NumpyActorCritic(layout)
        self._norm: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        assert isinstance(obs, np.ndarray)
        n = len(obs)
        x = obs.reshape(n, -1)
        if self._norm is not None:  # as RunningNorm: in float64, clipped, then float32
            mean, std = self._norm
            x = np.clip((x - mean) / std, -OBS_CLIP, OBS_CLIP)
        out, values, _, _ = self.model.forward(x.astype(np.float32, copy=False))
        if self.model.discrete:
            log_probs = log_softmax(out)
            if explore:  # inverse CDF: the first action whose cumulative probability passes u
                u = self.rng.random((n, 1))
                picked = (np.cumsum(np.exp(log_probs), axis=1) < u).sum(axis=1)
                picked = np.minimum(picked, out.shape[1] - 1)
            else:
                picked = out.argmax(axis=1)
            logp = log_probs[np.arange(n), picked]
            actions: npt.NDArray[Any] = picked.astype(np.int64) + self.model.action_start
        else:
            log_std = self.model.flat.views["log_std"]
            actions = out + np.exp(log_std) * self.rng.standard_normal(out.shape, dtype=np.float32) if explore else out
            actions = actions.astype(np.float32, copy=False)
            logp = gaussian_logp(actions, out, log_std)
        return actions, {"logp": logp.astype(np.float32), "value": values.astype(np.float32)}

    def take(self, weights: Mapping[str, Any]) -> None:
        norm = None  # the statistics first: nothing is changed if any array cannot be read
        if self.layout.buffers:
            mean = np.asarray(weights["obs_norm.mean"], dtype=np.float64).reshape(-1).copy()
            var = np.asarray(weights["obs_norm.var"], dtype=np.float64).reshape(-1)
            norm = mean, np.sqrt(var + 1e-8)
        self.model.flat.load(weights)
        self._norm = norm


def log_softmax(logits: F32) -> F32:
    shifted = logits - logits.max(axis=1, keepdims=True)
    out: F32 = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return out


def gaussian_logp(actions: F32, means: F32, log_std: F32) -> F32:
    """Log-density of a diagonal Gaussian, summed over the action's components (torch's ``Normal.log_prob``)."""
    diff = actions - means
    out: F32 = (-0.5 * diff * diff * np.exp(np.float32(-2.0) * log_std) - log_std - _HALF_LOG_2PI).sum(axis=1)
    return out
