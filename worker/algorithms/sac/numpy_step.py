"""SAC's train step in numpy: :class:`~.torch_step.TorchSACStep`'s math, several times cheaper on small MLPs.

Why: with two 64-wide (Pendulum) or 128-wide layers, a torch SAC step is dispatch-bound
(three networks forward, two backward passes, three Adams and the target lerp: over a
thousand small ops, ~5 ms here), and SAC takes one step per env step, so that step bounds
a run; collection does not. The same arithmetic in numpy, with the backward passes written
by hand (each loss's gradient beside its torch form in :mod:`.losses`), is a few dozen calls.

What it runs (:func:`supports` says it before anything is built): the ``mlp`` model with
ReLU on one flat float ``Box`` of observations. The policy, the twin critics, their
targets and the temperature are each one flat float32 vector with its gradient and Adam's
moments (:mod:`worker.algorithms.numpy_twin`): a gradient clip is one dot product, Adam
and the Polyak update a handful of whole-vector ufuncs. Both steps draw the samples' noise
from the learner's generator in the same order, so ``tests/unit/test_sac_numpy_step.py`` can run
steps both ways from the same weights and batches and compare weights and metrics.
"""

from __future__ import annotations

import numpy as np

from worker.algorithms.numpy_twin.adam import FlatAdam, clip_global_norm
from worker.algorithms.numpy_twin.bridge import (
    linear_names,
    load_adam,
    load_params,
    mlp_problem,
    store_adam,
    store_params,
    twin_of,
)
from worker.algorithms.numpy_twin.layers import F32
from worker.algorithms.numpy_twin.params import FlatParams
from worker.algorithms.numpy_twin.step import NumpyStep
from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.losses import (
    critic_loss_np,
    critic_target_np,
    policy_loss_np,
    squashed_gaussian_backward_np,
    squashed_gaussian_np,
    temperature_loss_np,
)
from worker.algorithms.sac.networks import QFunction, SACNets
from worker.algorithms.sac.numpy_actor import NumpySACPolicy
from worker.rl.replay import Columns

__all__ = ["NumpySACStep", "supports"]


def supports(nets: SACNets) -> str | None:
    """Why the numpy step cannot run these networks (``None``: it can)."""
    for body in (nets.policy.body, nets.critics.q1.body, nets.critics.q2.body):
        why = mlp_problem(body, ("relu",))
        if why is not None:
            return why
    return None


class _Critic:
    """``Q(s, a)``: the body on ``[s, a]`` (joint input), or on ``s`` with ``a`` beside its output; then two layers."""

    def __init__(self, flat: FlatParams, module: QFunction, prefix: str, action_dim: int) -> None:
        self.joint = module.joint
        self.body = flat.dense(linear_names(module.body, f"{prefix}body."), "relu", activate_last=True)
        self.head = flat.dense([f"{prefix}hidden", f"{prefix}out"], "relu", activate_last=False)
        self.action_dim = action_dim

    def forward(self, obs: F32, action: F32) -> F32:
        """``[B]`` Q-values: a view of the head's array, which its next forward pass overwrites."""
        if self.joint:
            q: F32 = self.head.forward(self.body.forward(np.concatenate([obs, action], axis=1)))[:, 0]
        else:
            q = self.head.forward(np.concatenate([self.body.forward(obs), action], axis=1))[:, 0]
        return q

    def backward(self, grad_q: F32) -> None:
        """Write the weights' gradients of a loss from dLoss/dQ ``[B]``."""
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


class NumpySACStep(NumpyStep[Columns]):
    """One SAC train step (critics, policy, temperature, targets) on a numpy twin of the learner's networks."""

    def __init__(self, config: SACConfig, nets: SACNets) -> None:
        why = supports(nets)
        if why is not None:
            raise ValueError(f"numpy cannot run these SAC networks: {why}")
        super().__init__()
        self.config, self.nets = config, nets
        self.policy = NumpySACPolicy({name: tuple(p.shape) for name, p in nets.policy.named_parameters()})
        self.critics = twin_of(nets.critics)
        self.targets = twin_of(nets.targets)
        self.temperature = FlatParams({"log_alpha": ()})
        dim = int(nets.policy.mean.out_features)
        q1, q2 = nets.critics.q1, nets.critics.q2
        self.q = [_Critic(self.critics, q1, "q1.", dim), _Critic(self.critics, q2, "q2.", dim)]
        self.target_q = [_Critic(self.targets, q1, "q1.", dim), _Critic(self.targets, q2, "q2.", dim)]
        self.policy_adam = FlatAdam(self.policy.flat.size)
        self.critic_adam = FlatAdam(self.critics.size)
        self.alpha_adam = FlatAdam(1)
        self._tmp = np.zeros(self.critics.size, dtype=np.float32)
        self.load()

    def numpy_step(self, batch: Columns) -> dict[str, float]:
        cfg, nets = self.config, self.nets
        n = len(batch["reward"])
        next_noise, noise = nets.draw_noise(n)
        obs = np.asarray(batch["obs"], dtype=np.float32).reshape(n, -1)
        next_obs = np.asarray(batch["next_obs"], dtype=np.float32).reshape(n, -1)
        taken = np.asarray(batch["action"], dtype=np.float32).reshape(n, -1)
        action = (taken - self.low) / (self.high - self.low) * np.float32(2.0) - np.float32(1.0)
        reward = np.asarray(batch["reward"], dtype=np.float32)
        alpha = np.float32(np.exp(self.temperature.params[0]))

        # -- the critics' targets and loss
        mean, raw_log_std = self.policy.forward(next_obs)
        assert raw_log_std is not None
        next_action, next_logp, _ = squashed_gaussian_np(mean, raw_log_std, next_noise)
        t1 = self.target_q[0].forward(next_obs, next_action)
        t2 = self.target_q[1].forward(next_obs, next_action)
        target = critic_target_np(reward, batch["done"], t1, t2, next_logp, alpha=alpha, discount=cfg.discount)
        q1 = self.q[0].forward(obs, action)
        q2 = self.q[1].forward(obs, action)
        q_mean = float(q1.mean())  # (q1 is the head's array: read it before the next forward pass)
        critic_loss, grad_q1, grad_q2 = critic_loss_np(q1, q2, target)
        self.q[0].backward(grad_q1)
        self.q[1].backward(grad_q2)
        self._clip(self.critics.grad)
        self.critic_adam.step(self.critics.params, self.critics.grad, cfg.lr)

        # -- the policy's loss, through the updated critics (whose weights it does not change)
        mean, raw_log_std = self.policy.forward(obs)
        assert raw_log_std is not None
        new_action, logp, saved = squashed_gaussian_np(mean, raw_log_std, noise)
        n1 = self.q[0].forward(obs, new_action)
        n2 = self.q[1].forward(obs, new_action)
        policy_loss, grad_logp, grad_n1, grad_n2 = policy_loss_np(alpha, logp, n1, n2)
        grad_action = self.q[0].action_gradient(grad_n1)
        grad_action += self.q[1].action_gradient(grad_n2)
        self.policy.backward(*squashed_gaussian_backward_np(saved, grad_action, grad_logp))
        self._clip(self.policy.flat.grad)
        self.policy_adam.step(self.policy.flat.params, self.policy.flat.grad, cfg.lr)

        # -- the temperature, then the targets: Q' <- Q' + tau (Q - Q')
        if cfg.auto_alpha:
            temperature = self.temperature
            _, temperature.grad[0] = temperature_loss_np(float(temperature.params[0]), logp, nets.target_entropy)
            self.alpha_adam.step(temperature.params, temperature.grad, cfg.lr)
        np.subtract(self.critics.params, self.targets.params, out=self._tmp)
        self._tmp *= np.float32(cfg.tau)
        self.targets.params += self._tmp
        return {
            "critic_loss": critic_loss,
            "policy_loss": policy_loss,
            "alpha": float(alpha),
            "entropy": float(-logp.mean()),
            "q_mean": q_mean,
        }

    def _clip(self, grad: F32) -> None:
        if self.config.max_grad_norm > 0:
            clip_global_norm(grad, self.config.max_grad_norm)

    def store_policy(self) -> None:
        store_params(self.policy.flat, self.nets.policy)

    def store_rest(self) -> None:
        nets = self.nets
        store_params(self.critics, nets.critics)
        store_params(self.targets, nets.targets)
        store_params(self.temperature, {"log_alpha": nets.log_alpha})
        store_adam(self.policy_adam, self.policy.flat, nets.policy_opt, nets.policy)
        store_adam(self.critic_adam, self.critics, nets.critic_opt, nets.critics)
        store_adam(self.alpha_adam, self.temperature, nets.alpha_opt, {"log_alpha": nets.log_alpha})

    def load(self) -> None:
        nets = self.nets
        load_params(self.policy.flat, nets.policy)
        load_params(self.critics, nets.critics)
        load_params(self.targets, nets.targets)
        load_params(self.temperature, {"log_alpha": nets.log_alpha})
        load_adam(self.policy_adam, self.policy.flat, nets.policy_opt, nets.policy)
        load_adam(self.critic_adam, self.critics, nets.critic_opt, nets.critics)
        load_adam(self.alpha_adam, self.temperature, nets.alpha_opt, {"log_alpha": nets.log_alpha})
        self.low = nets.policy.low.numpy().astype(np.float32)
        self.high = nets.policy.high.numpy().astype(np.float32)
