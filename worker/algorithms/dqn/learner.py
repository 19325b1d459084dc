"""DQN's learner: a replay buffer, the replay ratio, and the double-DQN train step.

The train step has two implementations of the same math: :class:`TorchDQNStep`, the
readable reference that runs any model, and
:class:`~worker.algorithms.dqn.fast.NumpyDQNStep`, the same step written out in numpy for
ReLU MLPs on flat float observations (about a third of the cost: on a network this small
torch is dispatch-bound, and the train step bounds a whole run, since the coordinator
paces collection to the replay ratio). ``tests/unit/test_dqn_learner.py`` holds them to
the same weights step after step. Checkpoints have one layout for both.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

from worker.algorithms.dqn.config import DQNConfig
from worker.algorithms.dqn.network import QNetwork, split_state
from worker.algorithms.weights import check_fits
from worker.rl.chunks import is_frame_stack
from worker.rl.replay import regroup
from worker.rl.replay_feed import ReplayFeed, ReplayLearner

if TYPE_CHECKING:
    from worker.algorithms.dqn import DQN


class TrainStep(Protocol):
    """One implementation of the DQN train step (torch or numpy)."""

    iter: int

    def train_step(self, batch: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]: ...

    def policy_state(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], iter: int) -> None: ...


class DQNLearner(ReplayLearner):
    """Replay in, train steps at the configured replay ratio, Q-network weights out."""

    def __init__(self, algorithm: DQN, seed: int) -> None:
        from worker.algorithms.dqn.fast import NumpyDQNStep

        self.config: DQNConfig = algorithm.config
        net = algorithm.q_network(seed)
        numpy_ok = net.relu_mlp
        if self.config.backend == "numpy" and not numpy_ok:
            raise ValueError("algorithm.backend = 'numpy' needs the mlp model with ReLU on flat float observations")
        fast = numpy_ok and self.config.backend != "torch"
        self.step: TrainStep = NumpyDQNStep(self.config, net) if fast else TorchDQNStep(self.config, net)
        self.feed = ReplayFeed(
            self.config.replay_capacity,
            self.config.learning_starts,
            self.config.train_steps_per_sample,
            seed,
            frame_stack=is_frame_stack(algorithm.spaces.observation),
        )

    @property
    def version(self) -> int:  # type: ignore[override]
        return self.step.iter

    def update(self) -> dict[str, float]:
        batch = self.feed.sample(self.config.batch_size)
        metrics = self.step.train_step(batch)
        return metrics

    def actor_weights(self) -> dict[str, torch.Tensor]:
        return self.step.policy_state()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.step.state_dict()

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        self.step.load_state_dict(tensors, version)


class TorchDQNStep:
    """Double DQN with a Huber loss, gradient clipping and a periodically synced target net, in torch.

    Batches are numpy columns from :meth:`ReplayBuffer.sample` (``obs``, ``next_obs``,
    ``action``, ``reward``, ``done``; ``obs.<key>`` for ``Dict`` observations).
    """

    def __init__(self, config: DQNConfig, net: QNetwork) -> None:
        self.config = config
        self.q_net = net
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.optimizer = self._new_optimizer()
        self.iter = 0

    def train_step(self, batch: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]:
        """One gradient step. Returns ``loss`` (Huber TD loss before the step), ``q_mean`` and ``grad_norm``."""
        cfg = self.config
        obs, next_obs = _tensors(regroup(batch, "obs")), _tensors(regroup(batch, "next_obs"))
        action = torch.from_numpy(batch["action"]).long()
        reward = torch.from_numpy(batch["reward"]).float()
        not_done = 1.0 - torch.from_numpy(batch["done"]).float()

        # -- TD target: reward + discount * Q_target(s', a*) unless s' is terminal
        with torch.no_grad():
            next_q_target = self.target_net(next_obs)
            if cfg.double_dqn:
                # The online net picks a*, the target net values it: curbs max-bias.
                best = self.q_net(next_obs).argmax(dim=1, keepdim=True)
                next_q = next_q_target.gather(1, best).squeeze(1)
            else:
                next_q = next_q_target.max(dim=1).values
            target = reward + cfg.discount * not_done * next_q

        # -- gradient step on the Huber loss
        q = self.q_net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        grad_norm = torch.nn.utils.clip_grad_norm_(self.q_net.parameters(), cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.iter += 1

        # -- target network
        if self.iter % cfg.target_update_interval == 0:
            with torch.no_grad():
                for t, o in zip(self.target_net.parameters(), self.q_net.parameters(), strict=True):
                    t.copy_(o) if cfg.tau >= 1.0 else t.lerp_(o, cfg.tau)
        return {"loss": float(loss.item()), "q_mean": float(q.mean().item()), "grad_norm": float(grad_norm.item())}

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().cpu().clone() for name, t in self.q_net.state_dict().items()}

    def target_state(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().cpu().clone() for name, t in self.target_net.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"online.{n}": t for n, t in self.policy_state().items()}
        out.update({f"target.{n}": t for n, t in self.target_state().items()})
        step = 0.0
        for name, param in self.q_net.named_parameters():
            state = self.optimizer.state.get(param, {})
            out[f"adam.exp_avg.{name}"] = state.get("exp_avg", torch.zeros_like(param)).detach().clone()
            out[f"adam.exp_avg_sq.{name}"] = state.get("exp_avg_sq", torch.zeros_like(param)).detach().clone()
            step = float(state["step"]) if "step" in state else step
        out["adam.step"] = torch.tensor(step, dtype=torch.float32)
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], iter: int) -> None:
        names = [n for n, _ in self.q_net.named_parameters()]
        online, target, m, v, step = split_state(tensors, names)
        params = dict(self.q_net.named_parameters())
        for part in (online, target, m, v):  # all or nothing: a refused checkpoint leaves the nets as they were
            check_fits(params, part, "the checkpoint's tensors", "the Q-network")
        try:
            self.q_net.load_state_dict(online, strict=True)
            self.target_net.load_state_dict(target, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit this network: {exc}") from None
        self.optimizer = self._new_optimizer()
        if float(step["step"]) > 0:
            for name, param in self.q_net.named_parameters():
                self.optimizer.state[param] = {
                    "step": step["step"].clone().float(),
                    "exp_avg": m[name].clone(),
                    "exp_avg_sq": v[name].clone(),
                }
        self.iter = iter

    def _new_optimizer(self) -> torch.optim.Adam:
        # fused: one kernel for all parameters; the train step is dispatch-bound, not FLOP-bound.
        return torch.optim.Adam(self.q_net.parameters(), lr=self.config.lr, fused=True)


def _tensors(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: torch.from_numpy(v) for k, v in value.items()}
    return torch.from_numpy(value)
