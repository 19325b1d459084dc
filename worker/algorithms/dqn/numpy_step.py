"""DQN's train step in numpy: :class:`~.torch_step.TorchDQNStep`'s math at ~1/3 to 1/8 the cost.

Why not torch: the network is tiny (obs -> 64..128 -> 64..128 -> actions), so a torch
train step is dispatch-bound: ~350 aten ops of a few us each (autograd bookkeeping, module
calls, the optimizer's kernels), far more than its arithmetic costs. That step bounds a
whole run, since the coordinator paces collection to the learner's replay ratio. Here the
forward pass, its gradient, the clip and Adam are a few dozen numpy calls on arrays made
once per batch size:

* the online net, its gradient, the target net and Adam's moments are each one flat
  float32 vector (:mod:`worker.algorithms.numpy_twin`): the global gradient norm is one dot
  product, Adam and the target sync a handful of whole-vector ufuncs;
* the online net runs once on ``[obs; next_obs]`` stacked (its ``next_obs`` half only picks
  the Double-DQN action), and the backward pass covers the ``obs`` half.

It runs ReLU MLPs on flat float observations (:func:`supports`). ``tests/unit/test_dqn_learner.py``
holds it to the torch step, weights and metrics step after step, from the same weights.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from worker.algorithms.dqn.config import DQNConfig
from worker.algorithms.dqn.losses import huber_loss_np, td_target_np
from worker.algorithms.dqn.network import DQNNets
from worker.algorithms.dqn.numpy_actor import NumpyQNetwork
from worker.algorithms.numpy_twin.adam import FlatAdam, clip_global_norm
from worker.algorithms.numpy_twin.bridge import load_adam, load_params, mlp_problem, store_adam, store_params
from worker.algorithms.numpy_twin.layers import F32
from worker.algorithms.numpy_twin.step import NumpyStep
from worker.rl.replay import Columns

__all__ = ["NumpyDQNStep", "supports"]


def supports(nets: DQNNets) -> str | None:
    """Why the numpy step cannot run these networks (``None``: it can)."""
    return mlp_problem(nets.online.encoder, ("relu",))


class NumpyDQNStep(NumpyStep[Columns]):
    """The DQN train step on a numpy twin of the learner's networks (:mod:`worker.algorithms.numpy_twin.step`)."""

    def __init__(self, config: DQNConfig, nets: DQNNets) -> None:
        why = supports(nets)
        if why is not None:
            raise ValueError(f"numpy cannot run this Q-network: {why}")
        super().__init__()
        self.config, self.nets = config, nets
        shapes = {name: tuple(p.shape) for name, p in nets.online.named_parameters()}
        self.online = NumpyQNetwork(shapes)
        self.target = NumpyQNetwork(shapes)
        self.adam = FlatAdam(self.online.flat.size)  # torch.optim.Adam's defaults, as the torch step's
        self._tmp = np.zeros(self.online.flat.size, dtype=np.float32)
        self._buffers: dict[int, tuple[F32, F32, npt.NDArray[np.int64]]] = {}
        self.load()

    def numpy_step(self, batch: Columns) -> dict[str, float]:
        cfg = self.config
        obs = batch["obs"]
        n = len(obs)
        if obs.ndim != 2:
            obs = obs.reshape(n, -1)
        x, grad_q, rows = self._arrays(n, obs.shape[1])

        # -- forward: the online net on obs (and next_obs for Double DQN), the target net on next_obs
        x[:n] = obs
        x[n:] = batch["next_obs"].reshape(n, -1)
        q_online = self.online.forward(x[: 2 * n] if cfg.double_dqn else x[:n])
        q_next_target = self.target.forward(x[n:])
        # Double DQN: the online net picks a*, the target net values it (curbs max-bias).
        best = q_online[n:].argmax(axis=1) if cfg.double_dqn else q_next_target.argmax(axis=1)
        target = td_target_np(batch["reward"], batch["done"], q_next_target[rows, best], cfg.discount)
        action = batch["action"]
        q = q_online[rows, action]
        loss, grad = huber_loss_np(q, target)

        # -- backward through the online net's obs half, into the flat gradient; clip; Adam
        grad_q.fill(0.0)
        grad_q[rows, action] = grad
        self.online.layers.backward(grad_q, inputs=False)
        grad_norm = clip_global_norm(self.online.flat.grad, cfg.max_grad_norm)
        self.adam.step(self.online.flat.params, self.online.flat.grad, cfg.lr)
        return {"loss": loss, "q_mean": float(np.add.reduce(q)) / n, "grad_norm": grad_norm}

    def update_target(self) -> None:
        """Copy the online net into the target net, or move the target by ``tau`` towards it."""
        online, target = self.online.flat.params, self.target.flat.params
        if self.config.tau >= 1.0:
            target[:] = online
        else:  # Polyak: target += tau * (online - target)
            np.subtract(online, target, out=self._tmp)
            self._tmp *= np.float32(self.config.tau)
            target += self._tmp
        self.mark_stale()

    def store_policy(self) -> None:
        store_params(self.online.flat, self.nets.online)

    def store_rest(self) -> None:
        store_params(self.target.flat, self.nets.target)
        store_adam(self.adam, self.online.flat, self.nets.optimizer, self.nets.online)

    def load(self) -> None:
        load_params(self.online.flat, self.nets.online)
        load_params(self.target.flat, self.nets.target)
        load_adam(self.adam, self.online.flat, self.nets.optimizer, self.nets.online)

    def _arrays(self, n: int, obs_dim: int) -> tuple[F32, F32, npt.NDArray[np.int64]]:
        """``[obs; next_obs]`` and dLoss/dQ arrays for ``n`` rows, and the row numbers, made once per batch size."""
        found = self._buffers.get(n)
        if found is None:
            x = np.empty((2 * n, obs_dim), dtype=np.float32)
            grad_q = np.zeros((n, self.online.n_actions), dtype=np.float32)
            found = self._buffers[n] = (x, grad_q, np.arange(n))
        return found
