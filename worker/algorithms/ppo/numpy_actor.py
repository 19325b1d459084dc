"""PPO's actor for MLP jobs in numpy, on collectors that never import torch.

A collector step is one forward pass for all its envs; on an MLP torch's per-op dispatch
(two bodies, two heads, a distribution object) costs several times the arithmetic, and
importing torch costs a collector ~2.5 s of CPU at start. This actor is built from the
network's layout (:class:`~worker.algorithms.ppo.numpy_net.PPOLayout`), takes policy files
as numpy arrays, and is held to the torch actor (:class:`~worker.algorithms.ppo.actor.PPOActor`)
in ``tests/unit/test_ppo_actor.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from worker.algorithms.ppo.numpy_net import OBS_CLIP, NumpyActorCritic, PPOLayout, gaussian_logp, log_softmax
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Actor, Obs

__all__ = ["NumpyPPOActor"]


class NumpyPPOActor(Actor):
    """Samples from an MLP actor-critic's policy (its mode when evaluating) and writes log-prob and value.

    Until weights are loaded its parameters are zero (a uniform or zero-mean policy); a
    collector always loads the learner's first policy before acting.
    """

    def __init__(self, layout: PPOLayout, seed: int | None) -> None:
        self.layout = layout
        self.model = NumpyActorCritic(layout)
        self.rng = np.random.default_rng(seed)
        self._norm: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

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

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Take a policy's arrays (numpy, or torch tensors), strictly: all of them fit, or none is taken."""
        check_fits(self.layout.state_shapes, weights, "the weights", "the PPO actor-critic")
        try:  # the statistics first: nothing is changed if any array cannot be read
            norm = None
            if self.layout.buffers:
                mean = np.asarray(weights["obs_norm.mean"], dtype=np.float64).reshape(-1).copy()
                var = np.asarray(weights["obs_norm.var"], dtype=np.float64).reshape(-1)
                norm = mean, np.sqrt(var + 1e-8)
            self.model.load(weights)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"the weights do not fit the PPO actor-critic: {exc}") from None
        self._norm = norm
