"""SAC's learner: replay at the configured ratio, twin-Q targets, the policy's loss, the temperature's loss.

One train step (Haarnoja et al., 2018, with the temperature of their second paper):

* critics: ``y = r + discount * (1 - done) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``
  with ``a' ~ pi(s')`` and the target critics ``Q'``; loss ``mean((Q1 - y)^2) + mean((Q2 - y)^2)``;
* policy: ``mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))`` with ``a ~ pi(s)`` reparameterised;
* temperature: ``-mean(log_alpha * (log pi(a|s) + target_entropy))``, whose gradient in
  ``log_alpha`` is ``-mean(log pi + target_entropy)``: alpha grows while the entropy
  (``-log pi``) is below the target;
* targets: ``Q' <- (1 - tau) Q' + tau Q``.

Where the networks are the built-in ReLU mlp, the step runs in numpy
(:class:`~worker.algorithms.sac.fast.NumpySACStep`, ``algorithm.backend``); the torch step
here is the reference it is tested against. The learner draws both samples' noise itself,
so the two backends see the same for a seed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.fast import NumpySACStep, supports
from worker.algorithms.sac.networks import SquashedGaussianPolicy, TwinQ, as_inputs, seeded
from worker.algorithms.weights import check_fits
from worker.rl.chunks import is_frame_stack
from worker.rl.replay import regroup
from worker.rl.replay_feed import ReplayFeed, ReplayLearner

if TYPE_CHECKING:
    from worker.algorithms.sac import SAC


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-mean(log_alpha * (logp + target_entropy))``, ``logp`` taken as data."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


class SACLearner(ReplayLearner):
    def __init__(self, algorithm: SAC, seed: int) -> None:
        cfg: SACConfig = algorithm.config
        self.config = cfg
        self.policy: SquashedGaussianPolicy = algorithm.policy_network(seed)
        joint = algorithm.joint_critic_input
        self.critics = seeded(lambda: TwinQ(algorithm.model, algorithm.spaces, joint=joint), seed + 1)
        self.targets = copy.deepcopy(self.critics)
        self.targets.requires_grad_(False)
        self._target_params: list[torch.Tensor] = list(self.targets.parameters())
        self._critic_params: list[torch.Tensor] = list(self.critics.parameters())
        dim = int(algorithm.spaces.action.shape[0])  # type: ignore[index]
        self.target_entropy = cfg.target_entropy if cfg.target_entropy else -float(dim)
        self.log_alpha = torch.tensor(float(np.log(cfg.init_alpha)), requires_grad=True)
        # fused: one kernel for all parameters; on small networks the step is dispatch-bound.
        self.policy_opt = torch.optim.Adam(self.policy.parameters(), lr=cfg.lr, fused=True)
        self.critic_opt = torch.optim.Adam(self.critics.parameters(), lr=cfg.lr, fused=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.feed = ReplayFeed(
            self.config.replay_capacity,
            self.config.learning_starts,
            self.config.train_steps_per_sample,
            seed,
            frame_stack=is_frame_stack(algorithm.spaces.observation),
        )
        self.action_dim = dim
        self.noise = np.random.default_rng(seed + 2)
        """The reparameterised samples' standard normal draws."""
        self.version = 0
        why_not = supports(self.policy, self.critics)
        if cfg.backend == "numpy" and why_not is not None:
            raise ValueError(f"algorithm.backend = 'numpy' cannot run this job: {why_not}")
        self.fast = (
            NumpySACStep(
                cfg,
                self.policy,
                self.critics,
                self.targets,
                log_alpha=float(self.log_alpha.detach()),
                target_entropy=self.target_entropy,
            )
            if why_not is None and cfg.backend != "torch"
            else None
        )
        """The numpy train step, where it can run the networks; it then owns the parameters,
        Adam's moments and the temperature, and copies them into the torch networks when
        weights are asked for (:meth:`_sync`)."""
        self._stale: set[str] = set()
        """What of the torch side the numpy step has moved past: ``policy``, ``rest``."""

    def _sync(self, *, policy_only: bool = False) -> None:
        """Bring the torch networks (and log alpha) up to the numpy step's parameters.

        ``policy_only``: the policy alone, all the collectors' weights need (the critics and
        their targets are four times its size).
        """
        if self.fast is None:
            return
        if "policy" in self._stale:
            self.fast.write_policy_to(self.policy)
            self._stale.discard("policy")
        if "rest" in self._stale and not policy_only:
            self.fast.write_critics_to(self.critics, self.targets)
            with torch.no_grad():
                self.log_alpha.fill_(float(self.fast.log_alpha[0]))
            self._stale.discard("rest")

    # -- the train step -----------------------------------------------------------------

    def update(self) -> dict[str, float]:
        batch = self.feed.sample(self.config.batch_size)
        shape = (len(batch["reward"]), self.action_dim)
        # Drawn here, not in either step: both backends then see the same noise for one seed.
        next_noise = self.noise.standard_normal(shape, dtype=np.float32)
        noise = self.noise.standard_normal(shape, dtype=np.float32)
        if self.fast is not None:
            metrics = self.fast.update(batch, next_noise, noise)
            self._stale = {"policy", "rest"}
        else:
            metrics = self._torch_update(batch, next_noise, noise)
        self.version += 1
        return metrics

    def _torch_update(
        self, batch: Mapping[str, np.ndarray[Any, Any]], next_noise: np.ndarray[Any, Any], noise: np.ndarray[Any, Any]
    ) -> dict[str, float]:
        """The reference step (any model); :class:`NumpySACStep` is held to it."""
        cfg = self.config
        obs, next_obs = as_inputs(regroup(batch, "obs")), as_inputs(regroup(batch, "next_obs"))
        action = self.policy.from_env(torch.from_numpy(batch["action"]).float())
        reward = torch.from_numpy(batch["reward"]).float()
        not_done = 1.0 - torch.from_numpy(batch["done"]).float()
        alpha = self.log_alpha.exp().detach()

        with torch.no_grad():
            next_action, next_logp = self.policy.sample(next_obs, torch.from_numpy(next_noise))
            t1, t2 = self.targets(next_obs, next_action)
            target = reward + cfg.discount * not_done * (torch.minimum(t1, t2) - alpha * next_logp)
        q1, q2 = self.critics(obs, action)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self._step(self.critic_opt, critic_loss, self.critics.parameters())

        new_action, logp = self.policy.sample(obs, torch.from_numpy(noise))
        n1, n2 = self.critics(obs, new_action)
        policy_loss = (alpha * logp - torch.minimum(n1, n2)).mean()
        self._step(self.policy_opt, policy_loss, self.policy.parameters())

        alpha_loss = temperature_loss(self.log_alpha, logp, self.target_entropy)
        if cfg.auto_alpha:
            self._step(self.alpha_opt, alpha_loss, [self.log_alpha])

        with torch.no_grad():
            torch._foreach_lerp_(self._target_params, self._critic_params, cfg.tau)
        return {
            "critic_loss": float(critic_loss.detach()),
            "policy_loss": float(policy_loss.detach()),
            "alpha": float(alpha),
            "entropy": float(-logp.detach().mean()),
            "q_mean": float(q1.detach().mean()),
        }

    def _step(self, optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Any) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm, foreach=True)
        optimizer.step()

    # -- weights ------------------------------------------------------------------------

    def actor_weights(self) -> dict[str, torch.Tensor]:
        self._sync(policy_only=True)
        return {name: t.detach().cpu().clone() for name, t in self.policy.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        self._sync()
        out = {f"policy.{k}": v for k, v in self.actor_weights().items()}
        out.update({f"critics.{k}": v.detach().clone() for k, v in self.critics.state_dict().items()})
        out.update({f"targets.{k}": v.detach().clone() for k, v in self.targets.state_dict().items()})
        out["log_alpha"] = self.log_alpha.detach().clone()
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        self._sync()  # what the checkpoint lacks (log_alpha) stays the numpy step's newest
        parts = {
            p: {k[len(p) + 1 :]: v for k, v in tensors.items() if k.startswith(p + ".")}
            for p in ("policy", "critics", "targets")
        }
        for name, module in (("policy", self.policy), ("critics", self.critics), ("targets", self.targets)):
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
            self.policy.load_state_dict(parts["policy"], strict=True)
            self.critics.load_state_dict(parts["critics"], strict=True)
            self.targets.load_state_dict(parts["targets"], strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit SAC's networks: {exc}") from None
        if "log_alpha" in tensors:
            with torch.no_grad():
                self.log_alpha.copy_(tensors["log_alpha"])
        if self.fast is not None:
            self.fast.load_from(self.policy, self.critics, self.targets, float(self.log_alpha.detach()))
            self._stale = set()
        self.version = version
