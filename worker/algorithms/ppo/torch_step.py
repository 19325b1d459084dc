"""PPO's minibatch step in torch: any model, and the readable specification the numpy step is held to.

The clipped policy loss, the value loss and the entropy bonus (:mod:`.losses`), a
global-norm gradient clip and Adam, on the learner's actor-critic
(:class:`~worker.algorithms.ppo.network.PPONets`), on their device: a minibatch is numpy
arrays (moved there here) or tensors already there (the learner's batch on a GPU).
"""

from __future__ import annotations

import torch

from worker.algorithms.numpy_twin.step import TrainStep
from worker.algorithms.ppo.batch import Batch
from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.losses import clipped_surrogate, log_prob_entropy, normalized, value_loss
from worker.algorithms.ppo.network import PPONets
from worker.algorithms.ppo.sequences import SequenceBatch
from worker.rl.placement import autocast, to_device, torch_device

__all__ = ["TorchPPOStep"]


class TorchPPOStep(TrainStep[Batch | SequenceBatch]):
    """One gradient step on a minibatch, at the optimizer's learning rate."""

    def __init__(self, config: PPOConfig, nets: PPONets) -> None:
        self.config, self.nets = config, nets
        self._params = list(nets.actor_critic.parameters())
        self._device = torch_device(nets.placement)

    def train_step(self, batch: Batch | SequenceBatch) -> dict[str, float]:
        """Returns ``pg_loss``, ``value_loss``, ``entropy``, ``approx_kl`` and ``clip_fraction`` of the minibatch.

        A :class:`~.sequences.SequenceBatch` (a recurrent model) runs each sequence from its start
        state; the losses then average over its real steps (``mask``) alone.
        """
        cfg, net, optimizer = self.config, self.nets.actor_critic, self.nets.optimizer
        device = self._device
        with autocast(self.nets.placement):
            if isinstance(batch, SequenceBatch):
                head, values, _ = net.forward_sequence(batch.obs, batch.state, batch.first)
            else:
                head, values = net(to_device(batch.obs, device))
        head, values = head.float(), values.float()  # the losses in fp32 (bf16 autocast: the network's passes only)
        columns = (batch.actions, batch.old_logp, batch.old_values, batch.advantages, batch.returns)
        actions, old_logp, old_values, advantages, returns = (to_device(c, device) for c in columns)
        if isinstance(batch, SequenceBatch):
            mask = batch.mask
            head, values, actions = head[mask], values[mask], actions[mask]
            old_logp, old_values, advantages, returns = (
                old_logp[mask],
                old_values[mask],
                advantages[mask],
                returns[mask],
            )
        if cfg.normalize_advantage and len(advantages) > 1:
            advantages = normalized(advantages)
        logp, entropy = log_prob_entropy(net.action_space, head, net.log_std, actions)
        pg_loss, clip_fraction = clipped_surrogate(logp, old_logp, advantages, cfg.clip_range)
        v_loss = value_loss(values, old_values, returns, cfg.clip_range_vf)
        mean_entropy = entropy.mean()
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * mean_entropy
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm, foreach=True)
        optimizer.step()
        with torch.no_grad():
            log_ratio = logp - old_logp
            approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean()
            # One read of the device for the five figures (each .item() would wait for it once).
            figures = torch.stack([pg_loss, v_loss, mean_entropy, approx_kl, clip_fraction.float()]).tolist()
        return dict(zip(("pg_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"), figures, strict=True))
