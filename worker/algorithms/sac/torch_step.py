"""SAC's train step in torch: any model, and the readable specification the numpy step is held to.

The critics' step, the policy's through the updated critics, the temperature's, then the
targets' Polyak update (:mod:`.losses` says each), on the learner's networks
(:class:`~worker.algorithms.sac.networks.SACNets`), on their device. Batches are columns from
:meth:`~worker.rl.replay.ReplayBuffer.sample`: numpy arrays, moved to the device here (the
noise of the samples too: drawn on the CPU, the same on any device), or tensors already there.
"""

from __future__ import annotations

import torch

from worker.algorithms.numpy_twin.step import TrainStep
from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.losses import critic_loss, critic_target, policy_loss, squashed_gaussian, temperature_loss
from worker.algorithms.sac.networks import SACNets, as_inputs
from worker.rl.placement import autocast, to_device, torch_device
from worker.rl.replay import Columns, regroup

__all__ = ["TorchSACStep"]


class TorchSACStep(TrainStep[Columns]):
    """One SAC train step in torch."""

    def __init__(self, config: SACConfig, nets: SACNets) -> None:
        self.config, self.nets = config, nets
        self._policy_params: list[torch.Tensor] = list(nets.policy.parameters())
        self._critic_params: list[torch.Tensor] = list(nets.critics.parameters())
        self._target_params: list[torch.Tensor] = list(nets.targets.parameters())
        self._device = torch_device(nets.placement)

    def train_step(self, batch: Columns) -> dict[str, float]:
        """Returns ``critic_loss``, ``policy_loss``, ``alpha`` (before the step), ``entropy`` and ``q_mean``."""
        cfg, nets, device = self.config, self.nets, self._device
        policy, critics = nets.policy, nets.critics
        next_noise, noise = (to_device(draws, device) for draws in nets.draw_noise(len(batch["reward"])))
        obs = as_inputs(to_device(regroup(batch, "obs"), device))
        next_obs = as_inputs(to_device(regroup(batch, "next_obs"), device))
        action = policy.from_env(to_device(batch["action"], device).float())
        alpha = nets.log_alpha.exp().detach()

        with torch.no_grad(), autocast(nets.placement):
            mean, raw_log_std = (out.float() for out in policy(next_obs))
            next_action, next_logp = squashed_gaussian(mean, raw_log_std, next_noise)
            t1, t2 = (q.float() for q in nets.targets(next_obs, next_action))
            reward, done = to_device(batch["reward"], device).float(), to_device(batch["done"], device)
            target = critic_target(reward, done, t1, t2, next_logp, alpha=alpha, discount=cfg.discount)
        with autocast(nets.placement):
            q1, q2 = (q.float() for q in critics(obs, action))
            c_loss = critic_loss(q1, q2, target)
        self._step(nets.critic_opt, c_loss, self._critic_params)

        with autocast(nets.placement):
            mean, raw_log_std = (out.float() for out in policy(obs))
            new_action, logp = squashed_gaussian(mean, raw_log_std, noise)
            n1, n2 = (q.float() for q in critics(obs, new_action))
            p_loss = policy_loss(alpha, logp, n1, n2)
        self._step(nets.policy_opt, p_loss, self._policy_params)  # the critics' weights stay out of it

        if cfg.auto_alpha:
            self._step(nets.alpha_opt, temperature_loss(nets.log_alpha, logp, nets.target_entropy), [nets.log_alpha])
        with torch.no_grad():
            torch._foreach_lerp_(self._target_params, self._critic_params, cfg.tau)
        # One read of the device for the five figures (each .item() would wait for it once).
        figures = torch.stack(
            [c_loss.detach(), p_loss.detach(), alpha, -logp.detach().mean(), q1.detach().mean()]
        ).tolist()
        return dict(zip(("critic_loss", "policy_loss", "alpha", "entropy", "q_mean"), figures, strict=True))

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: list[torch.Tensor]) -> None:
        """A gradient step of ``params`` alone on ``loss`` (autograd leaves every other weight's gradient out)."""
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss, inputs=params)
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm, foreach=True)
        optimizer.step()
