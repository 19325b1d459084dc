"""PPO's actor-critic: two bodies from the model plug-in (policy and value), two heads, observation statistics.

Separate bodies for the policy and the value function, as Stable-Baselines3's MLP
policies have by default: a shared body trades the two losses off against each other.
``shared_body`` gives one, as Atari PPO usually has: a CNN body is most of the cost.
Observation normalisation keeps its running mean and variance in buffers, so they are in
the actor's weights and every collector normalises as the learner does. :class:`PPONets`
is the learner's torch side: the network and its Adam.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from worker.algorithms.ppo.distributions import Policy, dist_params
from worker.algorithms.ppo.numpy_actor import OBS_CLIP
from worker.plugins.contract import Obs, Placement

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO

__all__ = ["OBS_CLIP", "ActorCritic", "PPONets", "RunningNorm"]


class RunningNorm(nn.Module):
    """Running mean and variance of float observations (parallel Welford), applied as ``(x - mean) / std``."""

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def update(self, batch: torch.Tensor) -> None:
        x = batch.to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        mean, var = x.mean(dim=0), x.var(dim=0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.mean.add_(delta * n / total)
        self.var.copy_((self.var * self.count + var * n + delta**2 * self.count * n / total) / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scaled = (x.to(torch.float64) - self.mean) / torch.sqrt(self.var + 1e-8)
        return scaled.clamp(-OBS_CLIP, OBS_CLIP).to(torch.float32)


class ActorCritic(nn.Module):
    """``policy(obs)`` (a :class:`Policy`) and ``value(obs)`` (``[B]``), from observations as tensors."""

    def __init__(self, algorithm: PPO) -> None:
        super().__init__()
        spaces, config = algorithm.spaces, algorithm.config
        obs_space, action_space = spaces.observation, spaces.action
        self.action_space = action_space
        self.pi_body = algorithm.model.encoder(obs_space)
        self.vf_body: nn.Module | None = None if config.shared_body else algorithm.model.encoder(obs_space)
        self.pi_head = nn.Linear(int(self.pi_body.out_dim), dist_params(action_space))  # type: ignore[arg-type]
        self.vf_head = nn.Linear(int(self.pi_body.out_dim), 1)  # type: ignore[arg-type]
        self.log_std: nn.Parameter | None = None
        if isinstance(action_space, gym.spaces.Box):
            self.log_std = nn.Parameter(torch.full((dist_params(action_space),), config.log_std_init))
        self.state_shapes: dict[str, tuple[int, ...]] = {
            name: tuple(column.shape) for name, column in algorithm.memory_columns().items()
        }
        """A recurrent model: the state per env of each body (``pi.<name>``, ``vf.<name>``); empty otherwise."""
        self.obs_norm: RunningNorm | None = None
        if config.normalize_obs and isinstance(obs_space, gym.spaces.Box) and obs_space.dtype.kind == "f":
            self.obs_norm = RunningNorm(tuple(obs_space.shape))
        if config.ortho_init:
            self._orthogonal()

    @classmethod
    def build(cls, algorithm: PPO, seed: int | None = None) -> ActorCritic:
        """A fresh network; with ``seed`` its weights depend on the seed only (torch's global RNG untouched)."""
        if seed is None:
            return cls(algorithm)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(algorithm)

    def _orthogonal(self) -> None:
        for body in (self.pi_body, self.vf_body):
            for module in body.modules() if body is not None else ():
                if isinstance(module, nn.Linear | nn.Conv2d):
                    nn.init.orthogonal_(module.weight, gain=math.sqrt(2))
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        for head, gain in ((self.pi_head, 0.01), (self.vf_head, 1.0)):
            nn.init.orthogonal_(head.weight, gain=gain)
            nn.init.zeros_(head.bias)

    def inputs(self, obs: Obs | Any) -> Any:
        """Numpy observations (or tensors) as the bodies' input, normalised where configured."""
        if isinstance(obs, dict):
            return {k: v if isinstance(v, torch.Tensor) else _tensor(v) for k, v in obs.items()}
        x = obs if isinstance(obs, torch.Tensor) else _tensor(obs)
        return self.obs_norm(x) if self.obs_norm is not None else x

    def policy_from_head(self, head: torch.Tensor) -> Policy:
        """The policy a head output (``[B, P]``) stands for."""
        return Policy(self.action_space, head, self.log_std)

    def policy(self, x: Any) -> Policy:
        return Policy(self.action_space, self.pi_head(self.pi_body(x)), self.log_std)

    def value(self, x: Any) -> torch.Tensor:
        body = self.vf_body if self.vf_body is not None else self.pi_body
        out: torch.Tensor = self.vf_head(body(x)).squeeze(-1)
        return out

    def forward(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy head's output (logits, or a Gaussian's means) and the values; a shared body runs once."""
        features = self.pi_body(x)
        head = self.pi_head(features)
        values = self.vf_head(features if self.vf_body is None else self.vf_body(x)).squeeze(-1)
        return head, values

    @property
    def recurrent(self) -> bool:
        return bool(self.state_shapes)

    def zero_state(self, batch: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Every body's state for ``batch`` envs at an episode's start."""
        return {name: torch.zeros(batch, *shape, device=device) for name, shape in self.state_shapes.items()}

    def forward_sequence(
        self, x: Any, state: dict[str, torch.Tensor], first: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """A recurrent model's :meth:`forward` over ``[T, B, ...]`` inputs from ``state``, reset where ``first``.

        Returns the policy head's output ``[T, B, P]``, the values ``[T, B]`` and the state after step ``T - 1``.
        """
        pi_state = {k.removeprefix("pi."): v for k, v in state.items() if k.startswith("pi.")}
        features, pi_after = self.pi_body(x, pi_state, first)
        after = {f"pi.{k}": v for k, v in pi_after.items()}
        if self.vf_body is None:
            vf_features = features
        else:
            vf_state = {k.removeprefix("vf."): v for k, v in state.items() if k.startswith("vf.")}
            vf_features, vf_after = self.vf_body(x, vf_state, first)
            after.update({f"vf.{k}": v for k, v in vf_after.items()})
        return self.pi_head(features), self.vf_head(vf_features).squeeze(-1), after

    def policy_and_value(self, x: Any) -> tuple[Policy, torch.Tensor]:
        """Both at once, the policy as a distribution (the actor's sampling); a shared body runs once."""
        head, values = self(x)
        return Policy(self.action_space, head, self.log_std), values


@dataclass
class PPONets:
    """The learner's torch side: the actor-critic and its Adam.

    Both minibatch steps work on these (:mod:`worker.algorithms.numpy_twin.step`): the
    torch step directly, the numpy step on a twin it writes back before they are read.
    """

    actor_critic: ActorCritic
    optimizer: torch.optim.Adam
    placement: Placement = field(default_factory=Placement)
    """Where the network and Adam's state live (the CPU unless the learner runs on a GPU)."""

    @classmethod
    def build(cls, algorithm: PPO, seed: int, placement: Placement | None = None) -> PPONets:
        """The seeded network (drawn on the CPU, then moved: a seed gives the same weights on any device), Adam."""
        placement = placement or Placement()
        net = ActorCritic.build(algorithm, seed).to(placement.device)
        # fused: one kernel for all parameters; on small networks the step is dispatch-bound.
        optimizer = torch.optim.Adam(net.parameters(), lr=algorithm.config.lr, eps=1e-5, fused=True)
        return cls(net, optimizer, placement)


def _tensor(array: Any) -> torch.Tensor:
    """``array`` as a tensor; a read-only one (a chunk's columns are) is copied, which torch needs to not warn."""
    values = np.asarray(array)
    return torch.as_tensor(values if values.flags.writeable else values.copy())
