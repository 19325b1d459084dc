"""SAC's train step in numpy: the math of :meth:`SACLearner._torch_update`, several times cheaper on small MLPs.

Why: with two 64-wide (Pendulum) or 256-wide layers, a torch SAC step is dispatch-bound
(three networks forward, two backward passes, two distribution objects, two fused Adams,
the temperature's Adam and the target lerp: several hundred small ops, 5-7 ms here), and
SAC takes one step per env step, so that step bounds a run; collection does not. The same
arithmetic in numpy, with the backward passes written by hand, is a few dozen calls.

What it runs (:func:`supports` says it before anything is built): the ``mlp`` model with
ReLU on one flat float ``Box`` of observations. Each network's parameters (the policy; the
twin critics; their targets) are views of one flat float32 vector in torch's
``named_parameters`` order and ``[out, in]`` layout, and so are the gradients and Adam's
moments (:class:`~worker.rl.flat_adam.FlatAdam`): the gradient clip is one dot product,
Adam and the Polyak update a handful of whole-vector ufuncs.

The Gaussian noise of the two reparameterised samples is an argument (the learner draws
it), so the torch step, which stays the reference, can be given the same noise:
``tests/unit/test_sac_fast.py`` runs steps both ways from the same weights and batches
and compares weights and metrics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.networks import QFunction, SquashedGaussianPolicy, TwinQ
from worker.algorithms.sac.numpy_actor import LOG_STD_MAX, LOG_STD_MIN
from worker.models.mlp_encoder import MLPEncoder
from worker.rl.dense import Dense
from worker.rl.flat_adam import FlatAdam, clip_global_norm, flat_views

__all__ = ["NumpySACStep", "supports"]

F32 = npt.NDArray[np.float32]
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def supports(policy: SquashedGaussianPolicy, critics: TwinQ) -> str | None:
    """Why the numpy step cannot run these networks (``None``: it can)."""
    for body in (policy.body, critics.q1.body, critics.q2.body):
        if not isinstance(body, MLPEncoder):
            return f"the model is not the built-in mlp ({type(body).__name__})"
        if not body.flat_float_input:
            return f"the observation space is not one float Box ({body.flatten.space})"
        if body.activation != "relu":
            return f"activation {body.activation!r} (the numpy SAC step runs ReLU)"
    return None


class _Flat:
    """A module's parameters as views of one flat float32 vector, with a gradient vector of the same layout."""

    def __init__(self, module: nn.Module) -> None:
        named = list(module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        self.size = sum(math.prod(shape) for shape in self.shapes)
        self.params = np.zeros(self.size, dtype=np.float32)
        self.grad = np.zeros(self.size, dtype=np.float32)
        self.views = self.split(self.params)
        self.grads = self.split(self.grad)
        self.load_from(module)

    def split(self, flat: F32) -> dict[str, F32]:
        return flat_views(flat, self.names, self.shapes)

    def load_from(self, module: nn.Module) -> None:
        for name, param in module.named_parameters():
            self.views[name][...] = param.detach().cpu().numpy()

    def write_to(self, module: nn.Module) -> None:
        with torch.no_grad():
            for name, param in module.named_parameters():
                param.copy_(torch.from_numpy(self.views[name]))


def _dense(flat: _Flat, names: list[str], *, activate_last: bool) -> Dense:
    """ReLU layers ``names`` (module names: ``<name>.weight``, ``<name>.bias``) over ``flat``'s views."""
    weights = [(flat.views[f"{n}.weight"], flat.views[f"{n}.bias"]) for n in names]
    grads = [(flat.grads[f"{n}.weight"], flat.grads[f"{n}.bias"]) for n in names]
    return Dense(weights, grads, "relu", activate_last=activate_last)


def _linear_names(module: nn.Module, prefix: str) -> list[str]:
    return [f"{prefix}{name}" for name, m in module.named_modules() if isinstance(m, nn.Linear)]


class _Policy:
    """The squashed Gaussian policy's forward and backward passes on a :class:`_Flat` of its parameters."""

    def __init__(self, module: SquashedGaussianPolicy) -> None:
        self.flat = _Flat(module)
        self.trunk = _dense(self.flat, [*_linear_names(module.body, "body."), "hidden"], activate_last=True)
        self.mean = _dense(self.flat, ["mean"], activate_last=False)
        self.log_std = _dense(self.flat, ["log_std"], activate_last=False)

    def sample(self, obs: F32, noise: F32) -> tuple[F32, F32, dict[str, F32]]:
        """Actions in [-1, 1], their log-probabilities, and what :meth:`backward` needs."""
        h = self.trunk.forward(obs)
        mean = self.mean.forward(h)
        raw_log_std = self.log_std.forward(h)
        log_std = np.clip(raw_log_std, LOG_STD_MIN, LOG_STD_MAX)
        std = np.exp(log_std)
        raw = mean + std * noise
        action = np.tanh(raw)
        # Normal(mean, std).log_prob(raw) = -0.5 noise^2 - log std - log sqrt(2 pi); minus log(1 - tanh^2(raw))
        correction = 2.0 * (_LOG_2 - raw - np.logaddexp(np.float32(0.0), np.float32(-2.0) * raw))
        logp = (np.float32(-0.5) * noise * noise - log_std - np.float32(_HALF_LOG_2PI) - correction).sum(axis=1)
        saved = {"raw_log_std": raw_log_std, "std": std, "noise": noise, "action": action}
        return action, logp.astype(np.float32, copy=False), saved

    def backward(self, saved: Mapping[str, F32], grad_action: F32, grad_logp: F32) -> None:
        """Accumulate the parameters' gradients from dLoss/d(action) ``[B, d]`` and dLoss/d(logp) ``[B]``.

        With ``raw = mean + std * noise``, ``action = tanh(raw)``: dlogp/draw = 2 tanh(raw)
        (from the tanh correction; the Gaussian term's dependence on ``raw`` and ``mean``
        cancels), dlogp/dlog_std = -1 directly, and draw/dlog_std = std * noise.
        """
        action = saved["action"]
        g_logp = grad_logp[:, None]
        grad_raw = grad_action * (np.float32(1.0) - action * action) + g_logp * np.float32(2.0) * action
        grad_log_std = grad_raw * saved["std"] * saved["noise"] - g_logp
        raw_log_std = saved["raw_log_std"]
        grad_log_std *= (raw_log_std >= LOG_STD_MIN) & (raw_log_std <= LOG_STD_MAX)  # clamp's gradient
        grad_h = self.mean.backward(grad_raw.astype(np.float32, copy=False))
        grad_h_std = self.log_std.backward(grad_log_std.astype(np.float32, copy=False))
        assert grad_h is not None and grad_h_std is not None
        self.trunk.backward(grad_h + grad_h_std, inputs=False)


class _Critic:
    """``Q(s, a)``: the body on ``[s, a]`` (joint input), or on ``s`` with ``a`` beside its output; then two layers."""

    def __init__(self, flat: _Flat, module: QFunction, prefix: str, action_dim: int) -> None:
        self.joint = module.joint
        self.body = _dense(flat, _linear_names(module.body, f"{prefix}body."), activate_last=True)
        self.head = _dense(flat, [f"{prefix}hidden", f"{prefix}out"], activate_last=False)
        self.action_dim = action_dim

    def forward(self, obs: F32, action: F32) -> F32:
        if self.joint:
            q: F32 = self.head.forward(self.body.forward(np.concatenate([obs, action], axis=1)))[:, 0]
        else:
            q = self.head.forward(np.concatenate([self.body.forward(obs), action], axis=1))[:, 0]
        return q

    def accumulate(self, grad_q: F32) -> None:
        """Add the weights' gradients of a loss to the parameters' gradients, from dLoss/dQ ``[B]``."""
        grad_in = self.head.backward(grad_q[:, None])
        assert grad_in is not None
        self.body.backward(grad_in if self.joint else grad_in[:, : -self.action_dim], inputs=False)

    def action_gradient(self, grad_q: F32) -> F32:
        """dLoss/d(action) ``[B, d]`` from dLoss/dQ ``[B]``, leaving the weights' gradients alone."""
        grad_in = self.head.backward(grad_q[:, None], params=False)
        assert grad_in is not None
        if self.joint:
            grad_in = self.body.backward(grad_in, params=False)
            assert grad_in is not None
        return grad_in[:, -self.action_dim :]


def _min_split(a: F32, b: F32) -> F32:
    """The weight of ``a`` in d min(a, b): 1 where it is smaller, 0.5 at a tie (torch's rule), 0 else.

    (A tie between two different critics is all but impossible in float32, and between equal
    ones the split does not change the sum; the rule is kept to be torch's, not for a case.)
    """
    out: F32 = np.where(a < b, 1.0, np.where(a > b, 0.0, 0.5)).astype(np.float32)
    return out


class NumpySACStep:
    """One SAC train step (critics, policy, temperature, targets) on numpy arrays.

    Args:
        config: the hyperparameters.
        policy, critics, targets: the torch networks it starts from; :func:`supports` must
            accept them.
        log_alpha: the temperature's log to start from.
        target_entropy: the entropy the temperature aims at.
    """

    def __init__(
        self,
        config: SACConfig,
        policy: SquashedGaussianPolicy,
        critics: TwinQ,
        targets: TwinQ,
        *,
        log_alpha: float,
        target_entropy: float,
    ) -> None:
        why = supports(policy, critics)
        if why is not None:
            raise ValueError(f"numpy cannot run these SAC networks: {why}")
        self.config = config
        self.policy = _Policy(policy)
        self.critics = _Flat(critics)
        self.targets = _Flat(targets)
        dim = int(policy.mean.out_features)
        self.q = [_Critic(self.critics, critics.q1, "q1.", dim), _Critic(self.critics, critics.q2, "q2.", dim)]
        self.target_q = [_Critic(self.targets, targets.q1, "q1.", dim), _Critic(self.targets, targets.q2, "q2.", dim)]
        self.low = policy.low.numpy().astype(np.float32)
        self.high = policy.high.numpy().astype(np.float32)
        self.policy_adam = FlatAdam(self.policy.flat.size)
        self.critic_adam = FlatAdam(self.critics.size)
        self.log_alpha = np.array([log_alpha], dtype=np.float32)
        self.alpha_grad = np.zeros(1, dtype=np.float32)
        self.alpha_adam = FlatAdam(1)
        self.target_entropy = target_entropy
        self._tmp = np.zeros(self.critics.size, dtype=np.float32)

    # -- weights ---------------------------------------------------------------------------

    def load_from(self, policy: SquashedGaussianPolicy, critics: TwinQ, targets: TwinQ, log_alpha: float) -> None:
        """Copy the networks' parameters in (after a checkpoint was loaded into them)."""
        self.policy.flat.load_from(policy)
        self.critics.load_from(critics)
        self.targets.load_from(targets)
        self.log_alpha[0] = log_alpha
        self.low = policy.low.numpy().astype(np.float32)
        self.high = policy.high.numpy().astype(np.float32)

    def write_policy_to(self, policy: SquashedGaussianPolicy) -> None:
        """Copy the policy's parameters into the torch policy (for weights to publish)."""
        self.policy.flat.write_to(policy)

    def write_critics_to(self, critics: TwinQ, targets: TwinQ) -> None:
        """Copy the critics' and their targets' parameters into the torch networks (for checkpoints)."""
        self.critics.write_to(critics)
        self.targets.write_to(targets)

    # -- the step --------------------------------------------------------------------------

    def update(self, batch: Mapping[str, npt.NDArray[Any]], next_noise: F32, noise: F32) -> dict[str, float]:
        """One train step on a replay batch; ``next_noise`` and ``noise`` are ``[B, d]`` standard normals."""
        cfg = self.config
        n = len(batch["reward"])
        obs = np.asarray(batch["obs"], dtype=np.float32).reshape(n, -1)
        next_obs = np.asarray(batch["next_obs"], dtype=np.float32).reshape(n, -1)
        taken = np.asarray(batch["action"], dtype=np.float32).reshape(n, -1)
        action = (taken - self.low) / (self.high - self.low) * np.float32(2.0) - np.float32(1.0)
        reward = np.asarray(batch["reward"], dtype=np.float32)
        not_done = np.float32(1.0) - np.asarray(batch["done"], dtype=np.float32)
        alpha = np.float32(np.exp(self.log_alpha[0]))

        # -- the critics' targets and loss
        next_action, next_logp, _ = self.policy.sample(next_obs, next_noise)
        t1 = self.target_q[0].forward(next_obs, next_action)
        t2 = self.target_q[1].forward(next_obs, next_action)
        target = reward + np.float32(cfg.discount) * not_done * (np.minimum(t1, t2) - alpha * next_logp)
        q1 = self.q[0].forward(obs, action)
        q2 = self.q[1].forward(obs, action)
        err1, err2 = q1 - target, q2 - target
        critic_loss = float(np.dot(err1, err1) + np.dot(err2, err2)) / n
        self.critics.grad.fill(0.0)
        self.q[0].accumulate(err1 * np.float32(2.0 / n))
        self.q[1].accumulate(err2 * np.float32(2.0 / n))
        self._clip(self.critics.grad)
        self.critic_adam.step(self.critics.params, self.critics.grad, cfg.lr)

        # -- the policy's loss, through the updated critics (whose weights it does not change)
        new_action, logp, saved = self.policy.sample(obs, noise)
        n1 = self.q[0].forward(obs, new_action)
        n2 = self.q[1].forward(obs, new_action)
        policy_loss = float((alpha * logp - np.minimum(n1, n2)).mean())
        w1 = _min_split(n1, n2)
        grad_min = np.float32(-1.0 / n)
        grad_action = self.q[0].action_gradient(grad_min * w1)
        grad_action += self.q[1].action_gradient(grad_min * (np.float32(1.0) - w1))
        self.policy.flat.grad.fill(0.0)
        self.policy.backward(saved, grad_action, np.full(n, alpha / n, dtype=np.float32))
        self._clip(self.policy.flat.grad)
        self.policy_adam.step(self.policy.flat.params, self.policy.flat.grad, cfg.lr)

        # -- the temperature: d/dlog_alpha of -mean(log_alpha * (logp + target_entropy))
        if cfg.auto_alpha:
            self.alpha_grad[0] = -float((logp + np.float32(self.target_entropy)).mean())
            self.alpha_adam.step(self.log_alpha, self.alpha_grad, cfg.lr)

        # -- the targets: Q' <- Q' + tau (Q - Q')
        np.subtract(self.critics.params, self.targets.params, out=self._tmp)
        self._tmp *= np.float32(cfg.tau)
        self.targets.params += self._tmp
        return {
            "critic_loss": critic_loss,
            "policy_loss": policy_loss,
            "alpha": float(alpha),
            "entropy": float(-logp.mean()),
            "q_mean": float(q1.mean()),
        }

    def _clip(self, grad: F32) -> None:
        if self.config.max_grad_norm > 0:
            clip_global_norm(grad, self.config.max_grad_norm)
