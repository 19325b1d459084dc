"""DQN's learner: a replay buffer, the replay ratio, the target network's schedule, and checkpoints.

The train step has two implementations of the same math (:mod:`worker.algorithms.numpy_twin.step`):
:class:`~worker.algorithms.dqn.torch_step.TorchDQNStep`, the readable reference that runs
any model, and :class:`~worker.algorithms.dqn.numpy_step.NumpyDQNStep`, the same step
written out in numpy for ReLU MLPs on flat float observations (a third of the cost and
less: on a network this small torch is dispatch-bound, and the train step bounds a whole
run, since the coordinator paces collection to the replay ratio). Both work on the
learner's torch networks (:class:`~worker.algorithms.dqn.network.DQNNets`), the numpy one
through a twin it writes back before they are read, so the weights and checkpoints below
are written once, against torch. On a GPU (its :class:`~worker.plugins.contract.Placement`)
the torch step runs, on networks, Adam's state and batches there; the weights and
checkpoints it gives are CPU tensors all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from worker.algorithms.dqn.config import DQNConfig
from worker.algorithms.dqn.network import DQNNets
from worker.algorithms.dqn.numpy_step import NumpyDQNStep, supports
from worker.algorithms.dqn.torch_step import TorchDQNStep
from worker.algorithms.numpy_twin.step import pick_step
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Placement
from worker.rl.chunks import is_frame_stack
from worker.rl.placement import adam_state
from worker.rl.replay import Columns
from worker.rl.replay_feed import ReplayFeed, ReplayLearner

if TYPE_CHECKING:
    from worker.algorithms.dqn import DQN


class DQNLearner(ReplayLearner):
    """Replay in, train steps at the configured replay ratio, Q-network weights out."""

    def __init__(self, algorithm: DQN, seed: int, placement: Placement | None = None) -> None:
        self.config: DQNConfig = algorithm.config
        placement = placement or Placement()
        self.nets = DQNNets.build(algorithm.model, algorithm.spaces, seed, self.config.lr, placement)
        self.step = pick_step(
            self.config, self.nets, supports(self.nets), NumpyDQNStep, TorchDQNStep, device=placement.device
        )
        self.version = 0
        """Train steps done so far; sent with every policy as its version."""
        self.feed = ReplayFeed(
            self.config.replay_capacity,
            self.config.learning_starts,
            self.config.train_steps_per_sample,
            seed,
            frame_stack=is_frame_stack(algorithm.spaces.observation),
            placement=placement,
        )

    def update(self) -> dict[str, float]:
        return self.learn(self.feed.sample(self.config.batch_size))

    def learn(self, batch: Columns) -> dict[str, float]:
        """One train step on ``batch``, then the target network's sync when one is due.

        Returns ``loss`` (the Huber TD loss before the step), ``q_mean`` and ``grad_norm``.
        """
        metrics = self.step.train_step(batch)
        self.version += 1
        if self.version % self.config.target_update_interval == 0:
            self.step.update_target()
        return metrics

    # -- weights and checkpoints (the torch networks, brought up to date by the step) ----------

    def actor_weights(self) -> dict[str, torch.Tensor]:
        self.step.sync(policy_only=True)
        return _copy(self.nets.online.state_dict())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Online and target weights and Adam's moments: ``online.<name>``, ``target.<name>``,
        ``adam.exp_avg.<name>``, ``adam.exp_avg_sq.<name>`` and ``adam.step`` (a scalar)."""
        self.step.sync()
        nets = self.nets
        out = {f"online.{n}": t for n, t in _copy(nets.online.state_dict()).items()}
        out.update({f"target.{n}": t for n, t in _copy(nets.target.state_dict()).items()})
        step = 0.0
        for name, param in nets.online.named_parameters():
            state = nets.optimizer.state.get(param, {})
            out[f"adam.exp_avg.{name}"] = state.get("exp_avg", torch.zeros_like(param)).detach().cpu().clone()
            out[f"adam.exp_avg_sq.{name}"] = state.get("exp_avg_sq", torch.zeros_like(param)).detach().cpu().clone()
            step = float(state["step"]) if "step" in state else step
        out["adam.step"] = torch.tensor(step, dtype=torch.float32)
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Resume from a checkpoint of either step; one that does not fit is refused and nothing changes."""
        self.step.sync()
        nets = self.nets
        names = [n for n, _ in nets.online.named_parameters()]
        online, target, m, v, step = _split_checkpoint(tensors, names)
        params = dict(nets.online.named_parameters())
        for part in (online, target, m, v):  # all or nothing: a refused checkpoint leaves the nets as they were
            check_fits(params, part, "the checkpoint's tensors", "the Q-network")
        try:
            nets.online.load_state_dict(online, strict=True)
            nets.target.load_state_dict(target, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit this network: {exc}") from None
        nets.optimizer.state.clear()
        if float(step["step"]) > 0:
            for name, param in params.items():
                nets.optimizer.state[param] = adam_state(nets.optimizer, param, step["step"], m[name], v[name])
        self.step.reload()
        self.version = version


def _copy(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu().clone() for name, t in state.items()}


def _split_checkpoint(tensors: Mapping[str, torch.Tensor], names: list[str]) -> tuple[dict[str, torch.Tensor], ...]:
    """A checkpoint's online weights, target weights, Adam moments and step, checked against ``names``.

    Raises:
        ValueError: a tensor is missing or extra.
    """
    parts = ("online", "target", "adam.exp_avg", "adam.exp_avg_sq")
    want = {f"{p}.{n}" for p in parts for n in names} | {"adam.step"}
    if set(tensors) != want:
        missing, extra = sorted(want - set(tensors))[:3], sorted(set(tensors) - want)[:3]
        raise ValueError(f"the checkpoint does not fit this network: missing {missing}, unexpected {extra}")
    return (*({n: tensors[f"{p}.{n}"] for n in names} for p in parts), {"step": tensors["adam.step"]})
