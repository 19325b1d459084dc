"""Action distributions of a stochastic policy, one per action space kind.

The policy head outputs ``dist_params(space)`` numbers per observation; :func:`distribution`
turns them into a torch distribution whose ``log_prob`` and ``entropy`` are per sample
(summed over the components of a multi-dimensional action):

* ``Discrete(n)``: a categorical over ``n`` logits;
* ``MultiDiscrete(nvec)``: one categorical per component, ``sum(nvec)`` logits;
* ``MultiBinary(k)``: ``k`` independent Bernoullis (logits);
* ``Box(d)``: a diagonal Gaussian; the head gives the ``d`` means, the standard deviations
  are ``exp(log_std)``, a parameter of their own (state-independent, as in PPO's paper).
  Sampled actions are not squashed: the env batch clips them into the box when it steps,
  and the chunk keeps what was sampled, so log-probabilities stay exact.

The actors sample through these. The learner's minibatch step computes the
log-probabilities and entropies of ``Discrete`` and ``Box`` actions in closed form
(:func:`worker.algorithms.ppo.losses.log_prob_entropy`, held to these by its tests): on a
small network a distribution object costs more than its arithmetic.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import distributions as D  # noqa: N812  (torch's own alias)


def dist_params(space: gym.Space[Any]) -> int:
    """Outputs the policy head needs for ``space``."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.MultiBinary | gym.spaces.Box):
        return int(space.shape[0])
    raise TypeError(f"no action distribution for {space}")


class MultiCategorical:
    """Independent categoricals over the components of a ``MultiDiscrete`` action."""

    def __init__(self, logits: torch.Tensor, nvec: list[int]) -> None:
        self.parts = [D.Categorical(logits=chunk) for chunk in torch.split(logits, nvec, dim=1)]

    def sample(self) -> torch.Tensor:
        return torch.stack([p.sample() for p in self.parts], dim=1)  # type: ignore[no-untyped-call]

    def mode(self) -> torch.Tensor:
        return torch.stack([p.probs.argmax(dim=1) for p in self.parts], dim=1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        logps = [p.log_prob(actions[:, i]) for i, p in enumerate(self.parts)]  # type: ignore[no-untyped-call]
        return torch.stack(logps, dim=1).sum(dim=1)

    def entropy(self) -> torch.Tensor:
        return torch.stack([p.entropy() for p in self.parts], dim=1).sum(dim=1)  # type: ignore[no-untyped-call]


class Policy:
    """A batch of action distributions with one interface (``sample``, ``mode``, ``log_prob``, ``entropy``)."""

    def __init__(self, space: gym.Space[Any], params: torch.Tensor, log_std: torch.Tensor | None) -> None:
        self.space = space
        self._start = int(space.start) if isinstance(space, gym.spaces.Discrete) else 0
        if isinstance(space, gym.spaces.Discrete):
            self.dist: Any = D.Categorical(logits=params)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self._offset = torch.as_tensor(space.start.reshape(1, -1), dtype=torch.long)
            self.dist = MultiCategorical(params, [int(n) for n in space.nvec.reshape(-1)])
        elif isinstance(space, gym.spaces.MultiBinary):
            self.dist = D.Independent(D.Bernoulli(logits=params), 1)
        else:
            assert log_std is not None
            self.dist = D.Independent(D.Normal(params, log_std.exp().expand_as(params)), 1)

    def sample(self) -> torch.Tensor:
        return self._to_space(self.dist.sample())

    def mode(self) -> torch.Tensor:
        """The most likely action (greedy evaluation)."""
        if isinstance(self.space, gym.spaces.Discrete):
            return self._to_space(self.dist.probs.argmax(dim=1))
        if isinstance(self.space, gym.spaces.MultiDiscrete):
            return self._to_space(self.dist.mode())
        if isinstance(self.space, gym.spaces.MultiBinary):
            mode: torch.Tensor = (self.dist.base_dist.probs > 0.5).to(torch.int8)
            return mode
        mean: torch.Tensor = self.dist.base_dist.loc
        return mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        return self.dist.log_prob(self._from_space(actions))  # type: ignore[no-any-return]

    def entropy(self) -> torch.Tensor:
        return self.dist.entropy()  # type: ignore[no-any-return]

    def _to_space(self, raw: torch.Tensor) -> torch.Tensor:
        if isinstance(self.space, gym.spaces.Discrete):
            return raw + self._start
        if isinstance(self.space, gym.spaces.MultiDiscrete):
            return raw + self._offset
        if isinstance(self.space, gym.spaces.MultiBinary):
            return raw.to(torch.int8)
        return raw

    def _from_space(self, actions: torch.Tensor) -> torch.Tensor:
        if isinstance(self.space, gym.spaces.Discrete):
            return actions.long() - self._start
        if isinstance(self.space, gym.spaces.MultiDiscrete):
            return actions.long() - self._offset
        if isinstance(self.space, gym.spaces.MultiBinary):
            return actions.float()
        return actions.float()
