"""PPO's actor: samples from the policy (the mode when evaluating), and writes log-prob and value into the chunk.

A collector step is one forward pass for all its envs. On an MLP torch's per-op dispatch
(two bodies, two heads, a distribution object) costs several times the arithmetic, so
where the numpy step can run the network the actor runs a numpy copy of its weights
(:class:`NumpyPPOActor`); :class:`PPOActor` runs any model in torch and is the reference
the numpy one is tested against. Both load weights through the torch network, strictly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.ppo.fast import NumpyActorCritic, gaussian_logp, log_softmax, supports
from worker.algorithms.ppo.network import OBS_CLIP, ActorCritic
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Obs

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO


def make_actor(algorithm: PPO, seed: int | None) -> Actor:
    """The fastest actor that runs this algorithm's network exactly."""
    net = algorithm.network()
    if algorithm.config.backend != "torch" and supports(net) is None:
        return NumpyPPOActor(net, seed)
    return PPOActor(net, seed)


class PPOActor(Actor):
    """The policy in torch: any model the plug-in gives."""

    def __init__(self, net: ActorCritic, seed: int | None) -> None:
        self.net = net
        self.net.eval()
        self._seed = 0 if seed is None else int(seed) % (2**63)
        self._generator_ready = False

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        with torch.no_grad():
            if not self._generator_ready:
                # Sampling draws from torch's global RNG; seed it once per actor for reproducible runs.
                torch.manual_seed(self._seed)
                self._generator_ready = True
            x = self.net.inputs(obs)
            policy, value = self.net.policy_and_value(x)
            actions = policy.sample() if explore else policy.mode()
            logp = policy.log_prob(actions)
        out = actions.numpy()
        if out.dtype == np.float64:
            out = out.astype(np.float32)
        return out, {"logp": logp.numpy().astype(np.float32), "value": value.numpy().astype(np.float32)}

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        check_fits(self.net.state_dict(), weights, "the weights", "the PPO actor-critic")  # all or nothing
        try:
            self.net.load_state_dict(dict(weights), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise ValueError(f"the weights do not fit the PPO actor-critic: {exc}") from None


class NumpyPPOActor(PPOActor):
    """The same policy with a numpy copy of an MLP actor-critic's weights (and its observation statistics)."""

    def __init__(self, net: ActorCritic, seed: int | None) -> None:
        super().__init__(net, seed)
        self.model = NumpyActorCritic(net)
        self.rng = np.random.default_rng(seed)
        self._norm = self._statistics()

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        assert isinstance(obs, np.ndarray)
        n = len(obs)
        x = obs.reshape(n, -1)
        if self._norm is not None:  # as RunningNorm: in float64, clipped, then float32
            mean, std = self._norm
            x = np.clip((x - mean) / std, -OBS_CLIP, OBS_CLIP)
        out, values, _, _ = self.model.forward(x.astype(np.float32, copy=False))
        if self.model.discrete:
            log_probs = log_softmax(out)
            if explore:  # inverse CDF: the first action whose cumulative probability passes u
                u = self.rng.random((n, 1))
                picked = (np.cumsum(np.exp(log_probs), axis=1) < u).sum(axis=1)
                picked = np.minimum(picked, out.shape[1] - 1)
            else:
                picked = out.argmax(axis=1)
            logp = log_probs[np.arange(n), picked]
            actions: npt.NDArray[Any] = picked.astype(np.int64) + self.model.action_start
        else:
            log_std = self.model.views["log_std"]
            actions = out + np.exp(log_std) * self.rng.standard_normal(out.shape, dtype=np.float32) if explore else out
            actions = actions.astype(np.float32, copy=False)
            logp = gaussian_logp(actions, out, log_std)
        return actions, {"logp": logp.astype(np.float32), "value": values.astype(np.float32)}

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        super().load_weights(weights)
        self.model.load_from(self.net)
        self._norm = self._statistics()

    def _statistics(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None:
        norm = self.net.obs_norm
        if norm is None:
            return None
        return norm.mean.numpy().reshape(-1).copy(), np.sqrt(norm.var.numpy().reshape(-1) + 1e-8)
