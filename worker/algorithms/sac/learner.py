"""SAC's learner: replay at the configured ratio, the train step (:mod:`.losses` says what it computes), checkpoints.

The train step has two implementations of the same math (:mod:`worker.algorithms.numpy_twin.step`):
:class:`~worker.algorithms.sac.torch_step.TorchSACStep`, the readable reference that runs
any model, and :class:`~worker.algorithms.sac.numpy_step.NumpySACStep` for the built-in
ReLU mlp (``algorithm.backend``). Both work on the learner's torch networks
(:class:`~worker.algorithms.sac.networks.SACNets`), the numpy one through a twin it writes
back before they are read, so the weights and checkpoints below are written once, against
torch. Both draw their samples' noise from the networks' generator, so the two backends
see the same noise for a seed. On a GPU (its :class:`~worker.plugins.contract.Placement`)
the torch step runs there; the weights and checkpoints are CPU tensors all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from worker.algorithms.numpy_twin.step import pick_step
from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.networks import SACNets
from worker.algorithms.sac.numpy_step import NumpySACStep, supports
from worker.algorithms.sac.torch_step import TorchSACStep
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Placement
from worker.rl.chunks import is_frame_stack
from worker.rl.replay_feed import ReplayFeed, ReplayLearner

if TYPE_CHECKING:
    from worker.algorithms.sac import SAC


class SACLearner(ReplayLearner):
    """Replay in, train steps at the configured replay ratio, the policy's weights out."""

    def __init__(self, algorithm: SAC, seed: int, placement: Placement | None = None) -> None:
        self.config: SACConfig = algorithm.config
        joint = algorithm.joint_critic_input
        self.nets = SACNets.build(
            algorithm.model, algorithm.spaces, self.config, seed, joint=joint, placement=placement
        )
        self.step = pick_step(
            self.config, self.nets, supports(self.nets), NumpySACStep, TorchSACStep, device=self.nets.placement.device
        )
        self.version = 0
        self.feed = ReplayFeed(
            self.config.replay_capacity,
            self.config.learning_starts,
            self.config.train_steps_per_sample,
            seed,
            frame_stack=is_frame_stack(algorithm.spaces.observation),
            placement=placement,
        )

    def update(self) -> dict[str, float]:
        metrics = self.step.train_step(self.feed.sample(self.config.batch_size))
        self.version += 1
        return metrics

    # -- weights and checkpoints (the torch networks, brought up to date by the step) ----------

    def actor_weights(self) -> dict[str, torch.Tensor]:
        self.step.sync(policy_only=True)
        return {name: t.detach().cpu().clone() for name, t in self.nets.policy.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.step.sync()
        nets = self.nets
        out = {f"policy.{k}": v for k, v in self.actor_weights().items()}
        out.update({f"critics.{k}": v.detach().cpu().clone() for k, v in nets.critics.state_dict().items()})
        out.update({f"targets.{k}": v.detach().cpu().clone() for k, v in nets.targets.state_dict().items()})
        out["log_alpha"] = nets.log_alpha.detach().cpu().clone()
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        self.step.sync()  # what the checkpoint lacks (log_alpha, Adam's moments) stays the step's newest
        nets = self.nets
        parts = {
            p: {k[len(p) + 1 :]: v for k, v in tensors.items() if k.startswith(p + ".")}
            for p in ("policy", "critics", "targets")
        }
        for name, module in (("policy", nets.policy), ("critics", nets.critics), ("targets", nets.targets)):
            try:
                check_fits(module.state_dict(), parts[name], "the checkpoint's tensors", f"SAC's {name}")  # all or none
            except ValueError as exc:
                if name == "policy":
                    raise
                raise ValueError(
                    f"{exc} (critics saved with the action beside the body's output, as warren's SAC"
                    " did before algorithm.critic_input, load with critic_input = 'features')"
                ) from None
        try:
            nets.policy.load_state_dict(parts["policy"], strict=True)
            nets.critics.load_state_dict(parts["critics"], strict=True)
            nets.targets.load_state_dict(parts["targets"], strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit SAC's networks: {exc}") from None
        if "log_alpha" in tensors:
            with torch.no_grad():
                nets.log_alpha.copy_(tensors["log_alpha"])
        self.step.reload()
        self.version = version
