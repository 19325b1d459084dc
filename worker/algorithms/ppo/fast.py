"""PPO's minibatch step in numpy: the math of :meth:`PPOLearner._torch_minibatch`, ~3x cheaper on small MLPs.

Why: on an MLP of two 64-wide layers a torch PPO minibatch step of 256 costs 3-6 ms, most
of it dispatch (two bodies, two heads, a distribution object, the losses, autograd, the
clip and the optimizer: hundreds of small ops), and PPO runs many of them per batch of
env steps (rl-baselines3-zoo's CartPole: 20 epochs of 256). That step bounds a PPO run on
a classic-control env; collection does not. The same arithmetic in numpy, with the
backward pass written by hand, is a few dozen calls on arrays of that size.

What it runs (:func:`supports` says it before anything is built): the ``mlp`` model (tanh
or ReLU) on one flat float ``Box`` of observations, separate or shared bodies, and
``Discrete`` (a categorical) or ``Box`` (a diagonal Gaussian with a state-independent log
standard deviation) actions. Observations arrive already normalised (the learner's torch
network does that when it builds the batch). Every parameter is a view of one flat float32
vector (torch's ``[out, in]`` layout, in ``named_parameters`` order), and so are the
gradient and Adam's moments: the global gradient norm is one dot product, Adam a handful
of whole-vector ufuncs (:class:`~worker.rl.flat_adam.FlatAdam`).

The torch step stays the reference: ``tests/unit/test_ppo_fast.py`` runs whole updates
both ways from the same weights and minibatch order and compares weights and metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.network import ActorCritic
from worker.models.mlp_encoder import MLPEncoder
from worker.rl.flat_adam import FlatAdam, clip_global_norm

__all__ = ["MinibatchArrays", "NumpyActorCritic", "NumpyPPOStep", "gaussian_logp", "log_softmax", "supports"]

F32 = npt.NDArray[np.float32]
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def supports(net: ActorCritic) -> str | None:
    """Why the numpy step cannot run ``net`` (``None``: it can)."""
    bodies = [net.pi_body] if net.vf_body is None else [net.pi_body, net.vf_body]
    for body in bodies:
        if not isinstance(body, MLPEncoder):
            return f"the model is not the built-in mlp ({type(body).__name__})"
        if not body.flat_float_input:
            return f"the observation space is not one float Box ({body.flatten.space})"
        if body.activation not in ("tanh", "relu"):
            return f"activation {body.activation!r}"
    if not isinstance(net.action_space, gym.spaces.Discrete | gym.spaces.Box):
        return f"the action space is {type(net.action_space).__name__}, not Discrete or Box"
    return None


@dataclass
class MinibatchArrays:
    """One minibatch as numpy arrays: normalised flat observations ``[B, D]`` and the per-step columns ``[B]``."""

    obs: F32
    actions: npt.NDArray[Any]
    old_logp: F32
    old_values: F32
    advantages: F32
    returns: F32

    def take(self, idx: npt.NDArray[np.int64]) -> MinibatchArrays:
        """The rows ``idx`` of every array."""
        return MinibatchArrays(
            self.obs[idx],
            self.actions[idx],
            self.old_logp[idx],
            self.old_values[idx],
            self.advantages[idx],
            self.returns[idx],
        )


class _Body:
    """Views of one MLP body's weights and gradients, and its activations from the last forward pass."""

    def __init__(self, weights: list[tuple[F32, F32]], grads: list[tuple[F32, F32]], tanh: bool) -> None:
        self.weights, self.grads, self.tanh = weights, grads, tanh
        self.inputs: list[F32] = []
        self.outputs: list[F32] = []

    def forward(self, x: F32) -> F32:
        self.inputs, self.outputs = [], []
        h = x
        for weight, bias in self.weights:
            self.inputs.append(h)
            h = h @ weight.T
            h += bias
            if self.tanh:
                np.tanh(h, out=h)
            else:
                np.maximum(h, np.float32(0.0), out=h)
            self.outputs.append(h)
        return h

    def backward(self, grad_out: F32) -> None:
        """Accumulate the weights' gradients from dLoss/d(body output)."""
        for i in range(len(self.weights) - 1, -1, -1):
            out = self.outputs[i]
            # tanh' = 1 - tanh^2; ReLU passes the gradient where the unit was active
            grad_pre = grad_out * (np.float32(1.0) - out * out) if self.tanh else grad_out * (out > 0.0)
            grad_w, grad_b = self.grads[i]
            grad_w += grad_pre.T @ self.inputs[i]
            grad_b += grad_pre.sum(axis=0)
            if i > 0:
                grad_out = grad_pre @ self.weights[i][0]


class NumpyActorCritic:
    """An :class:`ActorCritic`'s parameters as views of one flat float32 vector, and its forward pass in numpy.

    Shared by the numpy minibatch step (which adds the backward pass) and the numpy actor.

    Raises:
        ValueError: :func:`supports` refuses the network.
    """

    def __init__(self, net: ActorCritic) -> None:
        why = supports(net)
        if why is not None:
            raise ValueError(f"numpy cannot run this PPO network: {why}")
        named = list(net.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.size = sum(math.prod(shape) for shape in self.shapes)
        self.params = np.zeros(self.size, dtype=np.float32)
        self.grad = np.zeros(self.size, dtype=np.float32)
        self.views = self.split(self.params)
        self.grads = self.split(self.grad)
        tanh = net.pi_body.activation == "tanh"
        self.pi_body = self._body("pi_body", net.pi_body, tanh)
        self.vf_body = None if net.vf_body is None else self._body("vf_body", net.vf_body, tanh)
        self.discrete = isinstance(net.action_space, gym.spaces.Discrete)
        self.action_start = int(net.action_space.start) if isinstance(net.action_space, gym.spaces.Discrete) else 0
        self.load_from(net)

    def load_from(self, net: ActorCritic) -> None:
        """Copy ``net``'s parameters in."""
        for name, param in net.named_parameters():
            self.views[name][...] = param.detach().cpu().numpy()

    def write_to(self, net: ActorCritic) -> None:
        """Copy the parameters into ``net`` (its buffers, the observation statistics, are left alone)."""
        with torch.no_grad():
            for name, param in net.named_parameters():
                param.copy_(torch.from_numpy(self.views[name]))

    def forward(self, obs: F32) -> tuple[F32, F32, F32, F32]:
        """The policy head's output (logits or means), the values, and the two bodies' features (for backward)."""
        features = self.pi_body.forward(obs)
        out = features @ self.views["pi_head.weight"].T + self.views["pi_head.bias"]
        vf_features = features if self.vf_body is None else self.vf_body.forward(obs)
        values = (vf_features @ self.views["vf_head.weight"].T)[:, 0] + self.views["vf_head.bias"][0]
        return out, values, features, vf_features

    def split(self, flat: F32) -> dict[str, F32]:
        """Views of ``flat`` per parameter name, shaped as the parameters."""
        views: dict[str, F32] = {}
        offset = 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            size = math.prod(shape)
            views[name] = flat[offset : offset + size].reshape(shape)
            offset += size
        return views

    def _body(self, prefix: str, body: nn.Module, tanh: bool) -> _Body:
        linear = [name for name, module in body.named_modules() if isinstance(module, nn.Linear)]
        weights = [(self.views[f"{prefix}.{n}.weight"], self.views[f"{prefix}.{n}.bias"]) for n in linear]
        grads = [(self.grads[f"{prefix}.{n}.weight"], self.grads[f"{prefix}.{n}.bias"]) for n in linear]
        return _Body(weights, grads, tanh)


def log_softmax(logits: F32) -> F32:
    shifted = logits - logits.max(axis=1, keepdims=True)
    out: F32 = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return out


def gaussian_logp(actions: F32, means: F32, log_std: F32) -> F32:
    """Log-density of a diagonal Gaussian, summed over the action's components (torch's ``Normal.log_prob``)."""
    diff = actions - means
    out: F32 = (-0.5 * diff * diff * np.exp(np.float32(-2.0) * log_std) - log_std - _HALF_LOG_2PI).sum(axis=1)
    return out


class NumpyPPOStep:
    """PPO's clipped-objective minibatch step (with value loss, entropy bonus, gradient clip, Adam) in numpy.

    Args:
        config: the hyperparameters.
        net: the actor-critic whose weights it starts from; :func:`supports` must accept it.
    """

    def __init__(self, config: PPOConfig, net: ActorCritic) -> None:
        self.config = config
        self.model = NumpyActorCritic(net)
        self.names = self.model.names
        self.adam = FlatAdam(self.model.size, eps=1e-5)  # as PPOLearner's torch optimizer

    # -- weights ---------------------------------------------------------------------------

    def load_from(self, net: ActorCritic) -> None:
        """Copy ``net``'s parameters in (after a checkpoint was loaded into it)."""
        self.model.load_from(net)

    def write_to(self, net: ActorCritic) -> None:
        """Copy the parameters into ``net``."""
        self.model.write_to(net)

    def adam_state(self) -> dict[str, F32]:
        """Adam's moments per parameter name (copies), for a checkpoint."""
        out: dict[str, F32] = {}
        m, v = self.model.split(self.adam.m), self.model.split(self.adam.v)
        for name in self.names:
            out[f"{name}.exp_avg"] = m[name].copy()
            out[f"{name}.exp_avg_sq"] = v[name].copy()
        return out

    def load_adam_state(self, moments: Mapping[str, Any], steps: int) -> None:
        m, v = self.model.split(self.adam.m), self.model.split(self.adam.v)
        for name in self.names:
            m[name][...] = np.asarray(moments[f"{name}.exp_avg"], dtype=np.float32)
            v[name][...] = np.asarray(moments[f"{name}.exp_avg_sq"], dtype=np.float32)
        self.adam.steps = steps

    # -- the step --------------------------------------------------------------------------

    def minibatch(self, mb: MinibatchArrays, lr: float) -> dict[str, float]:
        """One gradient step on ``mb`` at learning rate ``lr``; the same metrics as the torch step."""
        cfg = self.config
        n = len(mb.advantages)
        adv = mb.advantages
        if cfg.normalize_advantage and n > 1:
            adv = (adv - adv.mean()) / (np.float32(adv.std(ddof=1)) + np.float32(1e-8))

        # -- forward
        model, views, grads = self.model, self.model.views, self.model.grads
        out, values, features, vf_features = model.forward(mb.obs)
        if model.discrete:
            actions = mb.actions.astype(np.int64).reshape(n) - model.action_start
            log_probs = log_softmax(out)
            probs = np.exp(log_probs)
            logp = log_probs[np.arange(n), actions]
            entropy_rows = -(probs * log_probs).sum(axis=1)
        else:
            log_std = views["log_std"]
            inv_var = np.exp(np.float32(-2.0) * log_std)
            sampled = mb.actions.reshape(n, -1).astype(np.float32)
            diff = sampled - out
            logp = gaussian_logp(sampled, out, log_std)
            entropy_rows = np.full(n, float((0.5 + _HALF_LOG_2PI + log_std).sum()), dtype=np.float32)

        log_ratio = logp - mb.old_logp
        ratio = np.exp(log_ratio)
        low, high = 1.0 - cfg.clip_range, 1.0 + cfg.clip_range
        clipped_ratio = np.clip(ratio, low, high)
        unclipped, clipped = ratio * adv, clipped_ratio * adv
        pg_loss = -float(np.minimum(unclipped, clipped).mean())

        # -- dLoss/dlogp from the clipped surrogate: torch's minimum sends a tie half to each
        # side, and clamp passes its gradient inside [low, high] only.
        inside = (ratio >= low) & (ratio <= high)
        weight = np.where(unclipped < clipped, 1.0, np.where(unclipped > clipped, inside, 0.5 + 0.5 * inside))
        grad_logp = (-(adv * ratio) * weight / n).astype(np.float32)

        # -- the value loss and dLoss/dV
        err = values - mb.returns
        if cfg.clip_range_vf <= 0.0:
            v_loss = 0.5 * float((err * err).mean())
            grad_v = err / n
        else:
            delta = values - mb.old_values
            c = cfg.clip_range_vf
            err_c = mb.old_values + np.clip(delta, -c, c) - mb.returns
            sq, sq_c = err * err, err_c * err_c
            v_loss = 0.5 * float(np.maximum(sq, sq_c).mean())
            inside_v = (delta >= -c) & (delta <= c)
            w_plain = np.where(sq > sq_c, 1.0, np.where(sq < sq_c, 0.0, 0.5))
            grad_v = (w_plain * err + (1.0 - w_plain) * inside_v * err_c) / n
        grad_v = (cfg.vf_coef * grad_v).astype(np.float32)
        entropy = float(entropy_rows.mean())

        # -- backward into the flat gradient
        model.grad.fill(0.0)
        ent = np.float32(cfg.ent_coef / n)
        if model.discrete:
            # dlogp/dz = onehot - p; d(-ent_coef * H)/dz = ent_coef/n * p * (log p + H)
            grad_out = -probs * grad_logp[:, None]
            grad_out[np.arange(n), actions] += grad_logp
            grad_out += ent * probs * (log_probs + entropy_rows[:, None])
        else:
            grad_out = grad_logp[:, None] * diff * inv_var
            grads["log_std"][...] = (grad_logp[:, None] * (diff * diff * inv_var - 1.0)).sum(axis=0)
            grads["log_std"][...] -= np.float32(cfg.ent_coef)
        grad_out = grad_out.astype(np.float32, copy=False)
        grads["pi_head.weight"][...] = grad_out.T @ features
        grads["pi_head.bias"][...] = grad_out.sum(axis=0)
        grads["vf_head.weight"][...] = grad_v[None, :] @ vf_features
        grads["vf_head.bias"][...] = grad_v.sum()
        grad_features: F32 = grad_out @ views["pi_head.weight"]
        grad_vf_features: F32 = (grad_v[:, None] * views["vf_head.weight"]).astype(np.float32, copy=False)
        if model.vf_body is None:
            model.pi_body.backward(grad_features + grad_vf_features)
        else:
            model.pi_body.backward(grad_features)
            model.vf_body.backward(grad_vf_features)

        clip_global_norm(model.grad, cfg.max_grad_norm)
        self.adam.step(model.params, model.grad, lr)
        return {
            "pg_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": float((np.expm1(log_ratio) - log_ratio).mean()),
            "clip_fraction": float((np.abs(ratio - 1.0) > cfg.clip_range).mean()),
        }
