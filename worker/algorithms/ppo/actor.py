"""PPO's actor in torch: samples from the policy (the mode when evaluating), and writes log-prob and value.

It runs any model the plug-in gives; MLP jobs get the numpy actor instead
(:mod:`.numpy_actor`), which is tested against this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.ppo.network import ActorCritic
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Obs


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
