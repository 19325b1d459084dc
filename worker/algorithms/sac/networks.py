"""SAC's networks: a tanh-squashed Gaussian policy and a pair of Q functions, each on a body from the model plug-in.

The policy's body (the model's encoder) feeds one more ReLU layer and two heads, the
mean and the log standard deviation (clamped to [-20, 2]) of a Gaussian whose samples
are squashed by tanh and scaled into the action box. A Q function takes the action in
one of two places (``algorithm.critic_input``): joined with a flat observation before its
body (the model's encoder, given the joint vector's Box), or beside the body's output of
any observation; either way one more ReLU layer follows, then one output. With the
default model (one hidden layer of 256) both networks have two hidden layers of 256, as
Stable-Baselines3's SAC has. Critics take actions scaled to [-1, 1], whatever the box.
:class:`SACNets` is the learner's torch side: these networks, the critics' targets, the
temperature and their Adams.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)
from torch import nn

from worker.algorithms.sac.config import SACConfig
from worker.algorithms.sac.losses import squashed_gaussian
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Model, Obs, Placement
from worker.plugins.spaces import Spaces

_M = TypeVar("_M", bound=nn.Module)


def seeded(build: Callable[[], _M], seed: int | None) -> _M:
    """``build()`` with torch's RNG seeded (and torch's global RNG left as it was)."""
    if seed is None:
        return build()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def as_inputs(obs: Obs | Any) -> Any:
    if isinstance(obs, dict):
        return {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)) for k, v in obs.items()}
    return obs if isinstance(obs, torch.Tensor) else torch.as_tensor(np.asarray(obs))


class SquashedGaussianPolicy(nn.Module):
    """Observations to actions in [-1, 1] (``sample``: with their log-probabilities; ``mode``: tanh of the mean)."""

    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, model: Model, spaces: Spaces) -> None:
        super().__init__()
        action = spaces.action
        dim = int(action.shape[0])  # type: ignore[index]
        self.body = model.encoder(spaces.observation)
        width = int(self.body.out_dim)  # type: ignore[arg-type]
        self.hidden = nn.Linear(width, width)
        self.mean = nn.Linear(width, dim)
        self.log_std = nn.Linear(width, dim)
        self.register_buffer("low", torch.as_tensor(action.low, dtype=torch.float32))  # type: ignore[attr-defined]
        self.register_buffer("high", torch.as_tensor(action.high, dtype=torch.float32))  # type: ignore[attr-defined]

    def forward(self, x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's means and unclamped log standard deviations, ``[B, d]`` each."""
        h = F.relu(self.hidden(self.body(x)))
        return self.mean(h), self.log_std(h)

    def sample(self, x: Any, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions in [-1, 1] and their log-probabilities, ``[B, d]`` and ``[B]``.

        The sample and its density are :func:`~worker.algorithms.sac.losses.squashed_gaussian`'s.

        ``noise``: the standard normal draws of ``mean + std * noise`` (the learner draws its own,
        so that its torch and numpy steps can be given the same); ``None``: torch's RNG.
        """
        mean, raw_log_std = self(x)
        if noise is None:
            noise = torch.empty_like(mean).normal_()
        return squashed_gaussian(mean, raw_log_std, noise)

    def mode(self, x: Any) -> torch.Tensor:
        return torch.tanh(self(x)[0])

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        """Actions in [-1, 1] as the env's box wants them."""
        return self.low + (squashed + 1.0) * 0.5 * (self.high - self.low)

    def from_env(self, actions: torch.Tensor) -> torch.Tensor:
        """The env's actions back in [-1, 1] (replayed actions, for the critics)."""
        return ((actions - self.low) / (self.high - self.low)) * 2.0 - 1.0


class QFunction(nn.Module):
    """``Q(s, a)``: a body from the model, one more ReLU layer, one output.

    ``joint``: the body takes ``[s, a]`` (``s`` one flat float vector), so the action acts
    through every hidden layer; otherwise the body encodes ``s`` and ``a`` joins its output.
    """

    def __init__(self, model: Model, spaces: Spaces, *, joint: bool) -> None:
        super().__init__()
        dim = int(spaces.action.shape[0])  # type: ignore[index]
        self.joint = joint
        if joint:
            size = int(spaces.observation.shape[0]) + dim  # type: ignore[index]
            self.body = model.encoder(gym.spaces.Box(-np.inf, np.inf, (size,), np.float32))
            width = int(self.body.out_dim)  # type: ignore[arg-type]
            self.hidden = nn.Linear(width, width)
        else:
            self.body = model.encoder(spaces.observation)
            width = int(self.body.out_dim)  # type: ignore[arg-type]
            self.hidden = nn.Linear(width + dim, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x: Any, action: torch.Tensor) -> torch.Tensor:
        if self.joint:
            return self.from_joint(torch.cat([x.float(), action], dim=1))
        h = F.relu(self.hidden(torch.cat([self.body(x), action], dim=1)))
        q: torch.Tensor = self.out(h).squeeze(-1)
        return q

    def from_joint(self, joint: torch.Tensor) -> torch.Tensor:
        """``Q`` of ``[s, a]`` already joined (``joint`` critics)."""
        q: torch.Tensor = self.out(F.relu(self.hidden(self.body(joint)))).squeeze(-1)
        return q


class TwinQ(nn.Module):
    """Two Q functions; SAC's target is the smaller of the two (against over-estimation)."""

    def __init__(self, model: Model, spaces: Spaces, *, joint: bool) -> None:
        super().__init__()
        self.q1 = QFunction(model, spaces, joint=joint)
        self.q2 = QFunction(model, spaces, joint=joint)

    def forward(self, x: Any, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.q1.joint:  # one [s, a] for both
            joint = torch.cat([x.float(), action], dim=1)
            return self.q1.from_joint(joint), self.q2.from_joint(joint)
        return self.q1(x, action), self.q2(x, action)


class SACActor(Actor):
    """Samples squashed Gaussian actions for a batch of envs (the tanh of the mean when evaluating)."""

    def __init__(self, policy: SquashedGaussianPolicy, seed: int | None) -> None:
        self.policy = policy
        self.policy.eval()
        self._seed = 0 if seed is None else int(seed) % (2**63)
        self._seeded = False

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        with torch.no_grad():
            if not self._seeded:
                torch.manual_seed(self._seed)
                self._seeded = True
            x = as_inputs(obs)
            squashed = self.policy.sample(x)[0] if explore else self.policy.mode(x)
            actions = self.policy.to_env(squashed)
        return actions.numpy().astype(np.float32), {}

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        check_fits(self.policy.state_dict(), weights, "the weights", "the SAC policy")  # all or nothing
        try:
            self.policy.load_state_dict(dict(weights), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise ValueError(f"the weights do not fit the SAC policy: {exc}") from None


@dataclass
class SACNets:
    """The learner's torch side: the policy, the twin critics and their targets, the temperature, their Adams.

    Both train steps work on these (:mod:`worker.algorithms.numpy_twin.step`): the torch step
    directly, the numpy step on a twin it writes back before they are read. ``noise`` gives
    both steps the standard normal draws of their reparameterised samples, in the same
    order, so the two backends see the same noise for a seed.
    """

    policy: SquashedGaussianPolicy
    critics: TwinQ
    targets: TwinQ
    log_alpha: torch.Tensor
    policy_opt: torch.optim.Adam
    critic_opt: torch.optim.Adam
    alpha_opt: torch.optim.Adam
    target_entropy: float
    """The entropy the temperature aims at: ``algorithm.target_entropy``, or ``-action_dim``."""
    noise: np.random.Generator
    placement: Placement = field(default_factory=Placement)
    """Where the networks, the temperature and Adam's state live (the CPU unless the learner runs on a GPU)."""

    @classmethod
    def build(
        cls, model: Model, spaces: Spaces, cfg: SACConfig, seed: int, *, joint: bool, placement: Placement | None = None
    ) -> SACNets:
        """Seeded networks (the policy from ``seed``, the critics from ``seed + 1``); the targets copy the critics.

        The weights are drawn on the CPU and then moved, so a seed gives the same ones on any device.
        """
        placement = placement or Placement()
        device = placement.device
        policy = seeded(lambda: SquashedGaussianPolicy(model, spaces), seed).to(device)
        critics = seeded(lambda: TwinQ(model, spaces, joint=joint), seed + 1).to(device)
        targets = copy.deepcopy(critics).requires_grad_(False)
        dim = int(policy.mean.out_features)
        log_alpha = torch.tensor(float(np.log(cfg.init_alpha)), requires_grad=True, device=device)
        return cls(
            policy,
            critics,
            targets,
            log_alpha,
            # fused: one kernel for all parameters; on small networks the step is dispatch-bound.
            torch.optim.Adam(policy.parameters(), lr=cfg.lr, fused=True),
            torch.optim.Adam(critics.parameters(), lr=cfg.lr, fused=True),
            torch.optim.Adam([log_alpha], lr=cfg.lr),
            cfg.target_entropy if cfg.target_entropy else -float(dim),
            np.random.default_rng(seed + 2),
            placement,
        )

    def draw_noise(self, rows: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One step's draws, ``[rows, action_dim]`` each: for the sample at ``next_obs``, then at ``obs``."""
        shape = (rows, int(self.policy.mean.out_features))
        return self.noise.standard_normal(shape, dtype=np.float32), self.noise.standard_normal(shape, dtype=np.float32)
