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
from worker.algorithms.ppo.numpy_net import NumpyActorCritic, PPOLayout, gaussian_logp, log_softmax
from worker.models.mlp_encoder import MLPEncoder
from worker.rl.flat_adam import FlatAdam, clip_global_norm

__all__ = ["MinibatchArrays", "NumpyPPOStep", "layout_of", "load_from", "supports", "write_to"]

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


def layout_of(net: ActorCritic) -> PPOLayout:
    """``net``'s layout, read from the network itself (:func:`supports` must accept it).

    :meth:`PPOLayout.of_algorithm` derives the same without torch; the tests hold the two equal.
    """
    shapes = {name: tuple(p.shape) for name, p in net.named_parameters()}
    buffers = {f"obs_norm.{k}": tuple(v.shape) for k, v in net.obs_norm.state_dict().items()} if net.obs_norm else {}

    def linear(prefix: str, body: nn.Module) -> tuple[str, ...]:
        return tuple(f"{prefix}.{n}" for n, m in body.named_modules() if isinstance(m, nn.Linear))

    action = net.action_space
    return PPOLayout(
        params=shapes,
        buffers=buffers,
        pi_body=linear("pi_body", net.pi_body),
        vf_body=None if net.vf_body is None else linear("vf_body", net.vf_body),
        tanh=net.pi_body.activation == "tanh",
        discrete=isinstance(action, gym.spaces.Discrete),
        action_start=int(action.start) if isinstance(action, gym.spaces.Discrete) else 0,
    )


def load_from(model: NumpyActorCritic, net: ActorCritic) -> None:
    """Copy ``net``'s parameters into ``model``."""
    model.load({name: param.detach().cpu() for name, param in net.named_parameters()})


def write_to(model: NumpyActorCritic, net: ActorCritic) -> None:
    """Copy ``model``'s parameters into ``net`` (its buffers, the observation statistics, are left alone)."""
    with torch.no_grad():
        for name, param in net.named_parameters():
            param.copy_(torch.from_numpy(model.views[name]))


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


class NumpyPPOStep:
    """PPO's clipped-objective minibatch step (with value loss, entropy bonus, gradient clip, Adam) in numpy.

    Args:
        config: the hyperparameters.
        net: the actor-critic whose weights it starts from; :func:`supports` must accept it.
    """

    def __init__(self, config: PPOConfig, net: ActorCritic) -> None:
        why = supports(net)
        if why is not None:
            raise ValueError(f"numpy cannot run this PPO network: {why}")
        self.config = config
        self.model = NumpyActorCritic(layout_of(net))
        load_from(self.model, net)
        self.names = self.model.names
        self.adam = FlatAdam(self.model.size, eps=1e-5)  # as PPOLearner's torch optimizer

    # -- weights ---------------------------------------------------------------------------

    def load_from(self, net: ActorCritic) -> None:
        """Copy ``net``'s parameters in (after a checkpoint was loaded into it)."""
        load_from(self.model, net)

    def write_to(self, net: ActorCritic) -> None:
        """Copy the parameters into ``net``."""
        write_to(self.model, net)

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
            model.pi_body.backward(grad_features + grad_vf_features, inputs=False)
        else:
            model.pi_body.backward(grad_features, inputs=False)
            model.vf_body.backward(grad_vf_features, inputs=False)

        clip_global_norm(model.grad, cfg.max_grad_norm)
        self.adam.step(model.params, model.grad, lr)
        return {
            "pg_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": entropy,
            "approx_kl": float((np.expm1(log_ratio) - log_ratio).mean()),
            "clip_fraction": float((np.abs(ratio - 1.0) > cfg.clip_range).mean()),
        }
