"""Policies that act for a whole batch of envs at once.

A collector step costs one forward pass for all envs rather than one per env: on a
small MLP the per-call overhead of torch dominates, so batching is most of the speed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from worker.errors import CollectorError
from worker.protocol import PolicySpec

ActionArray = npt.NDArray[np.int64]


def limit_torch_threads(num_threads: int = 1) -> None:
    """Cap torch's intra-op thread pool.

    Collector processes run tiny batched forward passes; several of them share a
    2-core host with the learner, and torch's default of one thread per core makes
    them fight over the cores for no gain. Call once at process start.
    """
    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


class QNetwork(nn.Module):
    """MLP mapping an observation to one Q-value per discrete action.

    The parameter names (``net.0.weight``...) are the policy-file layout shared by the
    learner and collectors.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, n_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, obs_dim]`` float32 observations to ``[B, n_actions]`` Q-values."""
        out: torch.Tensor = self.net(obs)
        return out


class Policy(Protocol):
    """What the rollout needs from a policy."""

    def act(self, obs: npt.NDArray[np.float32], eps: float) -> ActionArray:
        """Actions for a batch ``[N, obs_dim]`` of observations, ``[N]`` int64."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Swap in new weights (a no-op for weight-less policies)."""
        ...


class DQNPolicy:
    """Epsilon-greedy policy over a :class:`QNetwork`, acting with a numpy copy of its weights.

    The weights are loaded (and checked) through the torch network, then copied into
    numpy arrays: for the small batches a collector steps, a numpy forward pass costs
    a third of torch's (whose per-call dispatch dominates at this size).

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions.
        hidden_sizes: must match the learner's network.
        seed: seeds the exploration RNG (not the weights, which come from the learner).
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int], seed: int | None = None) -> None:
        self.n_actions = n_actions
        self.net = QNetwork(obs_dim, n_actions, hidden_sizes)
        self.net.eval()
        self._rng = np.random.default_rng(seed)
        self._layers = self._numpy_layers()
        self._zero_cache: dict[tuple[int, ...], npt.NDArray[np.float32]] = {}

    def q_values(self, obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """``[N, obs_dim]`` observations to ``[N, n_actions]`` Q-values (numpy, no autograd)."""
        h = obs
        last = len(self._layers) - 1
        for i, (weight_t, bias) in enumerate(self._layers):
            h = h @ weight_t + bias
            if i < last:
                # Against an array of zeros, not the scalar 0.0: numpy's scalar path is ~5x slower here.
                np.maximum(h, self._zeros(h.shape), out=h)
        return h

    def _zeros(self, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
        zeros = self._zero_cache.get(shape)
        if zeros is None:
            zeros = self._zero_cache[shape] = np.zeros(shape, dtype=np.float32)
        return zeros

    def act(self, obs: npt.NDArray[np.float32], eps: float) -> ActionArray:
        """Greedy actions, each replaced by a uniformly random one with probability ``eps``."""
        actions: ActionArray = self.q_values(obs).argmax(axis=1).astype(np.int64)
        if eps > 0.0:
            # One draw per env decides both: u < eps explores, and u / eps is then uniform
            # in [0, 1), which picks the random action.
            u = self._rng.random(len(actions))
            explore = u < eps
            actions[explore] = (u[explore] / eps * self.n_actions).astype(np.int64)
        return actions

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load learner weights.

        Raises:
            CollectorError: the keys or shapes do not match this network (e.g. the
                learner uses other ``hidden_sizes``).
        """
        try:
            self.net.load_state_dict(dict(state_dict), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise CollectorError(f"policy weights do not fit the Q-network: {exc}") from exc
        self._layers = self._numpy_layers()

    def _numpy_layers(self) -> list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
        linears = [m for m in self.net.net if isinstance(m, nn.Linear)]
        return [
            (
                np.ascontiguousarray(m.weight.detach().numpy().T, dtype=np.float32),
                m.bias.detach().numpy().astype(np.float32),
            )
            for m in linears
        ]


class RandomPolicy:
    """Uniformly random actions; a baseline and a policy for tests that needs no learner."""

    def __init__(self, n_actions: int, seed: int | None = None) -> None:
        self.n_actions = n_actions
        self._rng = np.random.default_rng(seed)

    def act(self, obs: npt.NDArray[np.float32], eps: float) -> ActionArray:
        """Random actions for each row of ``obs``; ``eps`` is ignored."""
        return self._rng.integers(0, self.n_actions, size=len(obs), dtype=np.int64)

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Nothing to load."""


def make_policy(spec: PolicySpec, obs_dim: int, n_actions: int, seed: int | None = None) -> DQNPolicy | RandomPolicy:
    """Build the policy a task asks for, sized for the env's spaces."""
    if spec.type == "random":
        return RandomPolicy(n_actions, seed)
    return DQNPolicy(obs_dim, n_actions, spec.hidden_sizes, seed)
