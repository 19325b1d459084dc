"""``reinforce``: the simplest policy gradient, as a warren algorithm plug-in.

On-policy: the actor samples from a softmax over the model's output and writes the
log-probability of each action into the chunk (an extra column); the learner gathers
``batch_steps`` valid steps, computes discounted returns-to-go within each chunk (cut at
the chunk's end: with the default ``discount = 0`` the return is the step's reward, which
is exact for the cue env), subtracts a running-mean baseline, and takes one gradient
step on ``-logp * advantage``. Chunks from a policy more than ``max_lag`` versions old are
dropped by warren before they reach it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from warren.plugins import Actor, Algorithm, Chunk, Column, Learner, Spaces, UnsupportedSpace


@dataclass(frozen=True)
class ReinforceConfig:
    lr: float = 0.05
    discount: float = 0.0
    batch_steps: int = 2048
    """Valid steps per update."""
    max_lag: int = 2
    """Drop chunks made by a policy more than this many updates old."""

    def __post_init__(self) -> None:
        if not (0.0 < self.lr <= 1.0 and 0.0 <= self.discount <= 1.0 and self.batch_steps >= 1 and self.max_lag >= 0):
            raise ValueError("reinforce: lr in (0, 1], discount in [0, 1], batch_steps >= 1, max_lag >= 0")


class Reinforce(Algorithm):
    Config = ReinforceConfig
    kind = "on_policy"
    default_model = "tiny"
    config: ReinforceConfig

    @classmethod
    def check_spaces(cls, spaces: Spaces) -> None:
        if not isinstance(spaces.action, gym.spaces.Discrete):
            raise UnsupportedSpace("reinforce needs Discrete actions")

    def columns(self) -> Mapping[str, Column]:
        return {"logp": Column((), "float32")}

    @property
    def max_policy_lag(self) -> int:
        return self.config.max_lag

    def make_actor(self, seed: int | None) -> Actor:
        return SoftmaxActor(self.policy_net(), seed)

    def make_learner(self, seed: int) -> Learner:
        return ReinforceLearner(self, seed)

    def policy_net(self) -> Any:
        from torch import nn

        encoder = self.model.encoder(self.spaces.observation)
        action = self.spaces.action
        assert isinstance(action, gym.spaces.Discrete)
        width: int = encoder.out_dim  # type: ignore[assignment]  # an int, by the model contract
        return nn.ModuleDict({"encoder": encoder, "head": nn.Linear(width, int(action.n))})


def _logits(net: Any, obs: Mapping[str, Any]) -> Any:
    import torch

    tensors = {key: torch.as_tensor(np.asarray(value)) for key, value in obs.items()}
    return net["head"](net["encoder"](tensors))


class SoftmaxActor(Actor):
    def __init__(self, net: Any, seed: int | None) -> None:
        import torch

        self.net = net
        self._generator = torch.Generator().manual_seed(seed or 0)

    def act(self, obs: Any, *, explore: bool, settings: Mapping[str, float]) -> tuple[Any, dict[str, Any]]:
        import torch

        with torch.no_grad():
            logits = _logits(self.net, obs)
            if explore:
                actions = torch.multinomial(torch.softmax(logits, dim=1), 1, generator=self._generator).squeeze(1)
            else:
                actions = logits.argmax(dim=1)
            logp = torch.log_softmax(logits, dim=1).gather(1, actions.unsqueeze(1)).squeeze(1)
        return actions.numpy().astype(np.int64), {"logp": logp.numpy().astype(np.float32)}

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        try:
            self.net.load_state_dict(dict(weights), strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the weights do not fit the reinforce policy: {exc}") from None


class ReinforceLearner(Learner):
    def __init__(self, algorithm: Reinforce, seed: int) -> None:
        import torch

        torch.manual_seed(seed)
        self.config = algorithm.config
        self.net = algorithm.policy_net()
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.config.lr)
        self.pending: list[Chunk] = []
        self.pending_steps = 0
        self.baseline = 0.0
        self.version = 0

    def add(self, chunk: Chunk) -> int:
        steps = int(chunk.valid.sum())
        self.pending.append(chunk)
        self.pending_steps += steps
        return steps

    def wants_data(self) -> bool:
        return self.pending_steps < self.config.batch_steps

    def can_update(self) -> bool:
        return self.pending_steps >= self.config.batch_steps

    def update(self) -> dict[str, float]:
        import torch

        obs_parts: dict[str, list[Any]] = {}
        actions, returns = [], []
        for chunk in self.pending:
            ret = _returns_to_go(chunk, self.config.discount)
            valid = chunk.valid
            assert isinstance(chunk.obs, dict)
            for key, value in chunk.obs.items():
                obs_parts.setdefault(key, []).append(value[:-1][valid])
            actions.append(chunk.action[valid])
            returns.append(ret[valid])
        self.pending, self.pending_steps = [], 0
        obs = {key: np.concatenate(parts) for key, parts in obs_parts.items()}
        g = torch.as_tensor(np.concatenate(returns))
        advantage = g - self.baseline
        self.baseline = 0.9 * self.baseline + 0.1 * float(g.mean())
        logp = torch.log_softmax(_logits(self.net, obs), dim=1)
        taken = logp.gather(1, torch.as_tensor(np.concatenate(actions)).unsqueeze(1)).squeeze(1)
        loss = -(taken * advantage).mean()
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.version += 1
        return {"loss": loss.item(), "return_mean": float(g.mean()), "baseline": self.baseline}

    def actor_weights(self) -> dict[str, Any]:
        return {name: t.detach().clone() for name, t in self.net.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return self.actor_weights()

    def load_state_dict(self, tensors: Mapping[str, Any], version: int) -> None:
        try:
            self.net.load_state_dict(dict(tensors), strict=True)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None
        self.version = version


def _returns_to_go(chunk: Chunk, discount: float) -> np.ndarray:
    """Discounted rewards to go within the chunk, restarting where an episode ended."""
    ret = np.zeros_like(chunk.reward)
    running = np.zeros(chunk.num_envs, dtype=np.float32)
    ended = chunk.terminated | chunk.truncated
    for t in range(chunk.steps - 1, -1, -1):
        running = np.where(ended[t], 0.0, running) * discount + chunk.reward[t]
        ret[t] = running
    return ret
