"""Hand-written torch train steps: the floor warren's torch steps are measured against (``benchmarks.train_step``).

Each is the shortest plain torch that does the same step as warren's, on the same sizes,
hyperparameters and batch: ``nn.Sequential`` networks, the loss written inline on tensors
(no distribution objects, no helpers), ``zero_grad(set_to_none=True)``, one backward,
``clip_grad_norm_(foreach=True)`` and a fused Adam, and the same metrics read back as
floats. What it leaves out is what warren's step carries for any model and any action
space (dicts of observations, the model plug-in's encoder, the action-space dispatch), so
the gap between the two is the price of that generality.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)
from torch import nn

Step = Callable[[Any], dict[str, float]]


def _mlp(sizes: list[int], activation: type[nn.Module], *, last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if last or i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


def dqn_step(obs_dim: int, n_actions: int, hidden: list[int], cfg: Any) -> Step:
    """Double DQN with a Huber loss, a global-norm clip and fused Adam (the target synced by count)."""
    net = _mlp([obs_dim, *hidden, n_actions], nn.ReLU, last=False)
    target = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, fused=True)
    params = list(net.parameters())
    count = [0]

    def step(batch: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]:
        obs, next_obs = torch.from_numpy(batch["obs"]), torch.from_numpy(batch["next_obs"])
        action = torch.from_numpy(batch["action"])
        with torch.no_grad():
            best = net(next_obs).argmax(dim=1, keepdim=True)
            next_q = target(next_obs).gather(1, best).squeeze(1)
            y = (
                torch.from_numpy(batch["reward"])
                + cfg.discount * (1.0 - torch.from_numpy(batch["done"]).float()) * next_q
            )
        q = net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True)
        opt.step()
        count[0] += 1
        if count[0] % cfg.target_update_interval == 0:
            target.load_state_dict(net.state_dict())
        return {"loss": loss.item(), "q_mean": q.mean().item(), "grad_norm": norm.item()}

    return step


def ppo_step(obs_dim: int, n_actions: int, hidden: list[int], cfg: Any) -> Step:
    """PPO's clipped minibatch step on a categorical policy with separate tanh bodies."""
    pi = nn.Sequential(_mlp([obs_dim, *hidden], nn.Tanh, last=True), nn.Linear(hidden[-1], n_actions))
    vf = nn.Sequential(_mlp([obs_dim, *hidden], nn.Tanh, last=True), nn.Linear(hidden[-1], 1))
    params = [*pi.parameters(), *vf.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr, eps=1e-5, fused=True)
    eps = cfg.clip_range

    def step(mb: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]:
        obs = torch.from_numpy(mb["obs"])
        old_logp = torch.from_numpy(mb["old_logp"])
        adv = torch.from_numpy(mb["advantages"])
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        log_probs = F.log_softmax(pi(obs), dim=1)
        logp = log_probs.gather(1, torch.from_numpy(mb["actions"]).unsqueeze(1)).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(dim=1).mean()
        values = vf(obs).squeeze(1)
        log_ratio = logp - old_logp
        ratio = log_ratio.exp()
        pg_loss = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).mean()
        v_loss = 0.5 * (values - torch.from_numpy(mb["returns"])).pow(2).mean()
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, cfg.max_grad_norm, foreach=True)
        opt.step()
        with torch.no_grad():
            approx_kl = (log_ratio.exp() - 1 - log_ratio).mean()
            clip_fraction = ((ratio - 1).abs() > eps).float().mean()
        return {
            "pg_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy.item(),
            "approx_kl": approx_kl.item(),
            "clip_fraction": clip_fraction.item(),
        }

    return step


class _Policy(nn.Module):
    def __init__(self, obs_dim: int, dim: int, width: int) -> None:
        super().__init__()
        self.trunk = _mlp([obs_dim, width, width], nn.ReLU, last=True)
        self.mean = nn.Linear(width, dim)
        self.log_std = nn.Linear(width, dim)

    def forward(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        mean, log_std = self.mean(h), self.log_std(h).clamp(-20.0, 2.0)
        raw = mean + log_std.exp() * noise
        # Normal(mean, std).log_prob(raw) minus log(1 - tanh(raw)^2), summed over the action
        logp = (-0.5 * noise.pow(2) - log_std - 0.5 * np.log(2 * np.pi)).sum(1)
        logp = logp - (2.0 * (np.log(2.0) - raw - F.softplus(-2.0 * raw))).sum(1)
        return torch.tanh(raw), logp


def sac_step(obs_dim: int, dim: int, width: int, *, low: npt.NDArray[Any], high: npt.NDArray[Any], cfg: Any) -> Step:
    """SAC's step: twin critics on ``[obs, action]``, the squashed Gaussian policy, the temperature, Polyak targets."""
    policy = _Policy(obs_dim, dim, width)
    critics = nn.ModuleList(_mlp([obs_dim + dim, width, width, 1], nn.ReLU, last=False) for _ in range(2))
    targets = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = torch.zeros((), requires_grad=True)
    policy_opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, fused=True)
    critic_opt = torch.optim.Adam(critics.parameters(), lr=cfg.lr, fused=True)
    alpha_opt = torch.optim.Adam([log_alpha], lr=cfg.lr)
    target_entropy = -float(dim)
    lo, span = torch.as_tensor(low), torch.as_tensor(high - low)
    critic_params: list[torch.Tensor] = list(critics.parameters())
    target_params: list[torch.Tensor] = list(targets.parameters())
    rng = np.random.default_rng(0)  # the samples' noise, drawn as warren's steps draw it

    def q(nets: nn.ModuleList, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, action], dim=1)
        return nets[0](x).squeeze(1), nets[1](x).squeeze(1)

    def step(batch: Mapping[str, npt.NDArray[Any]]) -> dict[str, float]:
        next_noise = rng.standard_normal((len(batch["reward"]), dim), dtype=np.float32)
        noise = rng.standard_normal((len(batch["reward"]), dim), dtype=np.float32)
        obs, next_obs = torch.from_numpy(batch["obs"]), torch.from_numpy(batch["next_obs"])
        action = (torch.from_numpy(batch["action"]) - lo) / span * 2.0 - 1.0
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_logp = policy(next_obs, torch.from_numpy(next_noise))
            t1, t2 = q(targets, next_obs, next_action)
            not_done = 1.0 - torch.from_numpy(batch["done"]).float()
            y = torch.from_numpy(batch["reward"]) + cfg.discount * not_done * (
                torch.minimum(t1, t2) - alpha * next_logp
            )
        q1, q2 = q(critics, obs, action)
        critic_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()  # type: ignore[no-untyped-call]
        critic_opt.step()
        new_action, logp = policy(obs, torch.from_numpy(noise))
        n1, n2 = q(critics, obs, new_action)
        policy_loss = (alpha * logp - torch.minimum(n1, n2)).mean()
        policy_opt.zero_grad(set_to_none=True)
        policy_loss.backward()
        policy_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
        alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        alpha_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, critic_params, cfg.tau)
        return {
            "critic_loss": critic_loss.item(),
            "policy_loss": policy_loss.item(),
            "alpha": alpha.item(),
            "entropy": -logp.detach().mean().item(),
            "q_mean": q1.detach().mean().item(),
        }

    return step
