"""PPO's minibatch step in numpy: :class:`~.torch_step.TorchPPOStep`'s math, ~3x cheaper on small MLPs.

Why: on an MLP of two 64-wide layers a torch PPO minibatch step of 256 costs 1.5-3 ms,
most of it dispatch (two bodies, two heads, the losses, autograd, the clip and the
optimizer: hundreds of small ops), and PPO runs many of them per batch of env steps
(rl-baselines3-zoo's CartPole: 20 epochs of 256). That step bounds a PPO run on a
classic-control env; collection does not. The same arithmetic in numpy, with the backward
pass written by hand (each loss's gradient beside its torch form in :mod:`.losses`), is a
few dozen calls on arrays of that size.

What it runs (:func:`supports` says it before anything is built): the ``mlp`` model (tanh
or ReLU) on one flat float ``Box`` of observations, separate or shared bodies, and
``Discrete`` (a categorical) or ``Box`` (a diagonal Gaussian with a state-independent log
standard deviation) actions. Observations arrive already normalised (the learner's torch
network does that when it builds the batch). ``tests/unit/test_ppo_numpy_step.py`` runs whole
updates both ways from the same weights and minibatch order and compares weights and metrics.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from worker.algorithms.numpy_twin.adam import FlatAdam, clip_global_norm
from worker.algorithms.numpy_twin.bridge import (
    linear_names,
    load_adam,
    load_params,
    mlp_problem,
    store_adam,
    store_params,
)
from worker.algorithms.numpy_twin.layers import F32
from worker.algorithms.numpy_twin.step import NumpyStep
from worker.algorithms.ppo.batch import Batch
from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.losses import (
    categorical_backward_np,
    categorical_np,
    clipped_surrogate_np,
    gaussian_backward_np,
    gaussian_np,
    normalized_np,
    value_loss_np,
)
from worker.algorithms.ppo.network import ActorCritic, PPONets
from worker.algorithms.ppo.numpy_actor import NumpyActorCritic, PPOLayout

__all__ = ["NumpyPPOStep", "layout_of", "supports"]


def supports(nets: PPONets) -> str | None:
    """Why the numpy step cannot run these networks (``None``: it can)."""
    net = nets.actor_critic
    for body in (net.pi_body,) if net.vf_body is None else (net.pi_body, net.vf_body):
        why = mlp_problem(body, ("tanh", "relu"))
        if why is not None:
            return why
    if not isinstance(net.action_space, gym.spaces.Discrete | gym.spaces.Box):
        return f"the action space is {type(net.action_space).__name__}, not Discrete or Box"
    return None


def layout_of(net: ActorCritic) -> PPOLayout:
    """``net``'s layout, read from the network itself (:func:`supports` must accept it).

    :meth:`PPOLayout.of_algorithm` derives the same without torch; the tests hold the two equal.
    """
    shapes = {name: tuple(p.shape) for name, p in net.named_parameters()}
    buffers = {f"obs_norm.{k}": tuple(v.shape) for k, v in net.obs_norm.state_dict().items()} if net.obs_norm else {}
    action = net.action_space
    return PPOLayout(
        params=shapes,
        buffers=buffers,
        pi_body=tuple(linear_names(net.pi_body, "pi_body.")),
        vf_body=None if net.vf_body is None else tuple(linear_names(net.vf_body, "vf_body.")),
        tanh=net.pi_body.activation == "tanh",
        discrete=isinstance(action, gym.spaces.Discrete),
        action_start=int(action.start) if isinstance(action, gym.spaces.Discrete) else 0,
    )


class NumpyPPOStep(NumpyStep[Batch]):
    """The PPO minibatch step on a numpy twin of the learner's actor-critic.

    How the learner delegates to it: :mod:`worker.algorithms.numpy_twin.step`.
    """

    def __init__(self, config: PPOConfig, nets: PPONets) -> None:
        why = supports(nets)
        if why is not None:
            raise ValueError(f"numpy cannot run this PPO network: {why}")
        super().__init__()
        self.config, self.nets = config, nets
        self.model = NumpyActorCritic(layout_of(nets.actor_critic))
        self.adam = FlatAdam(self.model.flat.size, eps=1e-5)  # as the torch optimizer's
        self.load()

    def numpy_step(self, batch: Batch) -> dict[str, float]:
        cfg, model = self.config, self.model
        flat, views, grads = model.flat, model.flat.views, model.flat.grads
        n = len(batch)
        adv = normalized_np(batch.advantages) if cfg.normalize_advantage and n > 1 else batch.advantages

        # -- forward, and the losses with their gradients
        out, values, features, vf_features = model.forward(batch.obs.reshape(n, -1).astype(np.float32, copy=False))
        if model.discrete:
            actions = batch.actions.astype(np.int64).reshape(n) - model.action_start
            logp, entropy, categorical = categorical_np(out, actions)
        else:
            sampled = batch.actions.reshape(n, -1).astype(np.float32)
            logp, entropy, gaussian = gaussian_np(out, views["log_std"], sampled)
        pg_loss, clip_fraction, grad_logp = clipped_surrogate_np(logp, batch.old_logp, adv, cfg.clip_range)
        v_loss, grad_v = value_loss_np(values, batch.old_values, batch.returns, cfg.clip_range_vf)
        grad_v = (cfg.vf_coef * grad_v).astype(np.float32)

        # -- backward into the flat gradient (each parameter's gradient written once)
        if model.discrete:
            grad_out = categorical_backward_np(categorical, entropy, grad_logp, cfg.ent_coef)
        else:
            grad_out, grads["log_std"][...] = gaussian_backward_np(gaussian, grad_logp, cfg.ent_coef)
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

        clip_global_norm(flat.grad, cfg.max_grad_norm)
        self.adam.step(flat.params, flat.grad, self.nets.optimizer.param_groups[0]["lr"])
        log_ratio = logp - batch.old_logp
        return {
            "pg_loss": pg_loss,
            "value_loss": v_loss,
            "entropy": float(entropy.mean()),
            "approx_kl": float((np.expm1(log_ratio) - log_ratio).mean()),
            "clip_fraction": clip_fraction,
        }

    def store_policy(self) -> None:
        store_params(self.model.flat, self.nets.actor_critic)

    def store_rest(self) -> None:
        store_adam(self.adam, self.model.flat, self.nets.optimizer, self.nets.actor_critic)

    def load(self) -> None:
        load_params(self.model.flat, self.nets.actor_critic)
        load_adam(self.adam, self.model.flat, self.nets.optimizer, self.nets.actor_critic)
