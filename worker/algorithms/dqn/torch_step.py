"""DQN's train step in torch: any model, and the readable specification the numpy step is held to.

Double DQN (or plain max-Q) targets from the target network, the Huber TD loss
(:mod:`.losses`), a global-norm gradient clip and Adam, on the learner's networks
(:class:`~worker.algorithms.dqn.network.DQNNets`), on their device. Batches are columns from
:meth:`~worker.rl.replay.ReplayBuffer.sample` (``obs``, ``next_obs``, ``action``,
``reward``, ``done``; ``obs.<key>`` for ``Dict`` observations): numpy arrays, moved to the
device here, or tensors already there (image replay on a GPU restacks its frames there).
"""

from __future__ import annotations

import torch

from worker.algorithms.dqn.config import DQNConfig
from worker.algorithms.dqn.losses import huber_loss, td_target
from worker.algorithms.dqn.network import DQNNets
from worker.algorithms.numpy_twin.step import TrainStep
from worker.rl.placement import autocast, to_device, torch_device
from worker.rl.replay import Columns, regroup

__all__ = ["TorchDQNStep"]


class TorchDQNStep(TrainStep[Columns]):
    """One gradient step of the online net in torch; the target network synced when the learner says."""

    def __init__(self, config: DQNConfig, nets: DQNNets) -> None:
        self.config, self.nets = config, nets
        self._params = list(nets.online.parameters())
        self._device = torch_device(nets.placement)

    def train_step(self, batch: Columns) -> dict[str, float]:
        """Returns ``loss`` (the Huber TD loss before the step), ``q_mean`` and ``grad_norm`` (before the clip)."""
        cfg, online, optimizer = self.config, self.nets.online, self.nets.optimizer
        device, placement = self._device, self.nets.placement
        obs, next_obs = to_device(regroup(batch, "obs"), device), to_device(regroup(batch, "next_obs"), device)
        action = to_device(batch["action"], device).long()
        reward, done = to_device(batch["reward"], device), to_device(batch["done"], device)
        with torch.no_grad(), autocast(placement):
            next_q_target = self.nets.target(next_obs).float()
            if cfg.double_dqn:
                # The online net picks a*, the target net values it: curbs max-bias.
                best = online(next_obs).argmax(dim=1, keepdim=True)
                next_q = next_q_target.gather(1, best).squeeze(1)
            else:
                next_q = next_q_target.max(dim=1).values
            target = td_target(reward, done, next_q, cfg.discount)
        with autocast(placement):
            q = online(obs).float().gather(1, action.unsqueeze(1)).squeeze(1)
            loss = huber_loss(q, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, cfg.max_grad_norm, foreach=True)
        optimizer.step()
        # One read of the device for the three figures (each .item() would wait for it once).
        loss_value, q_mean, norm = torch.stack([loss.detach(), q.detach().mean(), grad_norm]).tolist()
        return {"loss": float(loss_value), "q_mean": float(q_mean), "grad_norm": float(norm)}

    def update_target(self) -> None:
        """Copy the online net into the target net, or move the target by ``tau`` towards it."""
        tau = self.config.tau
        with torch.no_grad():
            for t, o in zip(self.nets.target.parameters(), self._params, strict=True):
                t.copy_(o) if tau >= 1.0 else t.lerp_(o, tau)
