"""PPO's actor in torch: samples from the policy (the mode when evaluating), and writes log-prob and value.

It runs any model the plug-in gives; MLP jobs get the numpy actor instead
(:mod:`.numpy_actor`), which is tested against this one. With a recurrent model it keeps
one state per env, carried from act to act and zeroed by :meth:`PPOActor.forget`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.ppo.distributions import Policy
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
        self._state: dict[str, torch.Tensor] | None = None
        """A recurrent model's state per env (zeros for a batch of another size than the last)."""

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        with torch.no_grad():
            if not self._generator_ready:
                # Sampling draws from torch's global RNG; seed it once per actor for reproducible runs.
                torch.manual_seed(self._seed)
                self._generator_ready = True
            x = self.net.inputs(obs)
            if self.net.recurrent:
                policy, value = self._recurrent_step(x)
            else:
                policy, value = self.net.policy_and_value(x)
            actions = policy.sample() if explore else policy.mode()
            logp = policy.log_prob(actions)
        out = actions.numpy()
        if out.dtype == np.float64:
            out = out.astype(np.float32)
        return out, {"logp": logp.numpy().astype(np.float32), "value": value.numpy().astype(np.float32)}

    def _recurrent_step(self, x: Any) -> tuple[Policy, torch.Tensor]:
        batch = len(next(iter(x.values())) if isinstance(x, dict) else x)
        state = self._state
        if state is None or len(next(iter(state.values()))) != batch:
            state = self.net.zero_state(batch)
        one_step = {k: v.unsqueeze(0) for k, v in x.items()} if isinstance(x, dict) else x.unsqueeze(0)
        first = torch.zeros(1, batch, dtype=torch.bool)  # resets happened in forget(): the state is zeros there
        head, values, self._state = self.net.forward_sequence(one_step, state, first)
        return Policy(self.net.action_space, head[0], self.net.log_std), values[0]

    def memory(self) -> dict[str, npt.NDArray[np.float32]] | None:
        if not self.net.recurrent or self._state is None:
            return None
        return {name: t.numpy().copy() for name, t in self._state.items()}

    def set_memory(self, memory: Mapping[str, npt.NDArray[np.float32]]) -> None:
        if not self.net.recurrent:
            return
        shapes = self.net.state_shapes
        got = {name: tuple(np.shape(v)) for name, v in memory.items()}
        batches = {shape[0] for shape in got.values() if shape}
        want = {name: (next(iter(batches), 0), *shape) for name, shape in shapes.items()}
        if got != want or len(batches) != 1:
            raise ValueError(f"a state of shapes {got} does not fit this model's state {shapes} per env")
        self._state = {name: torch.as_tensor(np.array(v, dtype=np.float32)) for name, v in memory.items()}

    def forget(self, envs: npt.NDArray[np.bool_]) -> None:
        if self._state is None or not envs.any():
            return
        where = torch.as_tensor(np.asarray(envs, dtype=bool))
        for tensor in self._state.values():
            tensor[where] = 0.0

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        check_fits(self.net.state_dict(), weights, "the weights", "the PPO actor-critic")  # all or nothing
        try:
            self.net.load_state_dict(dict(weights), strict=True)
        except (RuntimeError, TypeError, KeyError) as exc:
            raise ValueError(f"the weights do not fit the PPO actor-critic: {exc}") from None
