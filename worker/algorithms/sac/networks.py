"""SAC's networks: a tanh-squashed Gaussian policy and a pair of Q functions, each on a body from the model plug-in.

The policy's body (the model's encoder) feeds one more ReLU layer and two heads, the
mean and the log standard deviation (clamped to [-20, 2]) of a Gaussian whose samples
are squashed by tanh and scaled into the action box. A Q function takes the action in
one of two places (``algorithm.critic_input``): joined with a flat observation before its
body (the model's encoder, given the joint vector's Box), or beside the body's output of
any observation; either way one more ReLU layer follows, then one output. With the
default model (one hidden layer of 256) both networks have two hidden layers of 256, as
Stable-Baselines3's SAC has. Critics take actions scaled to [-1, 1], whatever the box.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)
from torch import nn

from worker.algorithms.sac.numpy_actor import LOG_STD_MAX, LOG_STD_MIN
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Model, Obs
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


def squashed_log_prob(normal: torch.distributions.Normal, raw: torch.Tensor) -> torch.Tensor:
    """log-density of ``tanh(raw)`` where ``raw ~ normal``: the Gaussian's, minus log|d tanh/du| per dimension.

    ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, which stays finite where
    ``tanh(u)`` rounds to 1.
    """
    correction = 2.0 * (math.log(2.0) - raw - F.softplus(-2.0 * raw))
    out: torch.Tensor = (normal.log_prob(raw) - correction).sum(dim=-1)  # type: ignore[no-untyped-call]
    return out


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

    def _normal(self, x: Any) -> torch.distributions.Normal:
        h = F.relu(self.hidden(self.body(x)))
        log_std = self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return torch.distributions.Normal(self.mean(h), log_std.exp())

    def sample(self, x: Any, noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions in [-1, 1] and their log-probabilities (``[B, d]``, ``[B]``).

        ``noise``: the standard normal draws of ``mean + std * noise`` (the learner draws its own,
        so that its torch and numpy steps can be given the same); ``None``: torch's RNG.
        """
        normal = self._normal(x)
        raw = normal.rsample() if noise is None else normal.loc + normal.scale * noise
        return torch.tanh(raw), squashed_log_prob(normal, raw)

    def mode(self, x: Any) -> torch.Tensor:
        return torch.tanh(self._normal(x).loc)

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
            h = F.relu(self.hidden(self.body(torch.cat([x.float(), action], dim=1))))
        else:
            h = F.relu(self.hidden(torch.cat([self.body(x), action], dim=1)))
        q: torch.Tensor = self.out(h).squeeze(-1)
        return q


class TwinQ(nn.Module):
    """Two Q functions; SAC's target is the smaller of the two (against over-estimation)."""

    def __init__(self, model: Model, spaces: Spaces, *, joint: bool) -> None:
        super().__init__()
        self.q1 = QFunction(model, spaces, joint=joint)
        self.q2 = QFunction(model, spaces, joint=joint)

    def forward(self, x: Any, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
