"""PPO's learner: batches of chunks, advantages on the learner (GAE or V-trace), minibatch epochs of the clipped loss.

Everything sample-dependent is computed here, from the chunks' raw columns: the values
of every observation row with the current network (so the bootstrap at a chunk's end, at
a truncation, and V-trace's targets use the newest value function), the advantages, the
observation statistics. The actor's log-probabilities (a chunk column) are PPO's "old"
policy, which is also the policy that acted: the clipped ratio then bounds the step from
the data's own policy, however stale it is.

On a GPU (its :class:`~worker.plugins.contract.Placement`) the batch's observations go to
the GPU once, as they are (uint8 frames stay uint8 until the model converts them there),
the values and the update run there, and the minibatches are drawn from the batch on the
GPU; the advantages are computed on the CPU (a few thousand numbers), as on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.numpy_twin.step import pick_step
from worker.algorithms.ppo.batch import Batch
from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.network import PPONets
from worker.algorithms.ppo.numpy_step import NumpyPPOStep, supports
from worker.algorithms.ppo.returns import gae, vtrace
from worker.algorithms.ppo.reward_scale import RewardScale
from worker.algorithms.ppo.sequences import SequenceBatch
from worker.algorithms.ppo.torch_step import TorchPPOStep
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Chunk, Learner, Placement
from worker.rl.placement import adam_state, to_device, torch_device

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO


class PPOLearner(Learner):
    """Gathers ``batch_steps`` valid steps, then runs ``epochs`` passes of minibatch updates."""

    def __init__(self, algorithm: PPO, seed: int, placement: Placement | None = None) -> None:
        self.config: PPOConfig = algorithm.config
        self.nets = PPONets.build(algorithm, seed, placement)
        self.device = torch_device(placement)
        self.tensor_batches = self.device.type != "cpu"
        """The batch as tensors on the device (a GPU's), else numpy arrays (as the numpy step takes them)."""
        self.step = pick_step(
            self.config, self.nets, supports(self.nets), NumpyPPOStep, TorchPPOStep, device=self.nets.placement.device
        )
        self.reward_scale = RewardScale(self.config.discount) if self.config.normalize_reward else None
        self._scale = 1.0
        """What this update divides rewards by (``normalize_reward``)."""
        self.generator = torch.Generator().manual_seed(seed)
        self.pending: list[Chunk] = []
        self.pending_steps = 0
        self.samples = 0
        """Valid steps learned from so far (the learning-rate schedule's clock)."""
        self.version = 0

    # -- data ----------------------------------------------------------------------------

    def add(self, chunk: Chunk) -> int:
        steps = int(chunk.valid.sum())
        if steps:
            self.pending.append(chunk)
            self.pending_steps += steps
        return steps

    def wants_data(self) -> bool:
        return self.pending_steps < self.config.batch_steps

    def can_update(self) -> bool:
        return self.pending_steps >= self.config.batch_steps

    # -- the update ----------------------------------------------------------------------

    def update(self) -> dict[str, float]:
        chunks, self.pending, self.pending_steps = self.pending, [], 0
        lag = float(np.mean([self.version - c.policy_version for c in chunks]))
        net = self.nets.actor_critic
        self.step.sync(policy_only=True)  # the batch's values come from the newest weights
        # The batch is normalised with the statistics its actors had; this batch's
        # observations go into the statistics after the update, for the next version.
        self._scale = self.reward_scale.scale if self.reward_scale is not None else 1.0
        batch = self._sequences(chunks) if net.recurrent else self._batch(chunks)
        lr = self._set_lr()
        metrics = self._epochs(batch)
        if self.reward_scale is not None:
            for chunk in chunks:
                self.reward_scale.update(chunk)
            metrics["reward_scale"] = self._scale
        if net.obs_norm is not None:
            for chunk in chunks:
                net.obs_norm.update(to_device(_valid_rows(chunk.obs, chunk.valid), self.device))
        self.samples += len(batch)
        self.version += 1
        return {**metrics, "policy_lag": lag, "batch": float(len(batch)), "lr": lr}

    def _set_lr(self) -> float:
        anneal = self.config.lr_anneal_samples
        lr = self.config.lr * (max(0.0, 1.0 - self.samples / anneal) if anneal else 1.0)
        for group in self.nets.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _returns(
        self, chunk: Chunk, values: npt.NDArray[np.float32], logp: npt.NDArray[np.float32] | None
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """The chunk's advantages and value targets from its rows' values (and, for V-trace, the policy's log-probs)."""
        cfg = self.config
        reward = chunk.reward if self._scale == 1.0 else (chunk.reward / np.float32(self._scale)).astype(np.float32)
        if cfg.correction == "vtrace":
            assert logp is not None
            return vtrace(
                reward, values, chunk.terminated, chunk.truncated, chunk.valid,
                log_ratio=logp - chunk.extras["logp"], discount=cfg.discount, lam=cfg.gae_lambda,
                rho_bar=cfg.vtrace_rho_bar, c_bar=cfg.vtrace_c_bar,
            )  # fmt: skip
        return gae(
            reward, values, chunk.terminated, chunk.truncated, chunk.valid,
            discount=cfg.discount, lam=cfg.gae_lambda,
        )  # fmt: skip

    def _sequences(self, chunks: list[Chunk]) -> SequenceBatch:
        """A recurrent model's batch: the chunks as sequences (:mod:`.sequences`), on the learner's device."""
        return SequenceBatch.build(
            chunks,
            self.nets.actor_critic,
            self.config.seq_len,
            self.device,
            self._returns,
            needs_logp=self.config.correction == "vtrace",
        )

    def _batch(self, chunks: list[Chunk]) -> Batch:
        """Advantages and targets of every chunk with the current network, as one flat batch of valid steps.

        On a GPU the batch's arrays are tensors there; on the CPU numpy arrays, as the numpy step takes them.
        """
        cfg, net, device = self.config, self.nets.actor_critic, self.device
        obs_parts: list[Any] = []
        parts: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in ("actions", "logp", "values", "adv", "ret")}
        with torch.no_grad():
            for chunk in chunks:
                rows = net.inputs(to_device(_flat_rows(chunk.obs), device))
                values = net.value(rows).float().cpu().numpy().reshape(chunk.steps + 1, chunk.num_envs)
                valid = chunk.valid
                logp = None
                if cfg.correction == "vtrace":
                    steps_obs = _take_rows(rows, chunk.steps * chunk.num_envs)
                    actions = to_device(np.asarray(chunk.action).reshape(-1, *chunk.action.shape[2:]), device)
                    logp = net.policy(steps_obs).log_prob(actions).cpu().numpy().reshape(chunk.steps, chunk.num_envs)
                adv, ret = self._returns(chunk, values, logp)
                if self.tensor_batches:  # the rows are on the device already: pick the valid ones there
                    where = to_device(np.flatnonzero(valid.reshape(-1)), device)
                    obs_parts.append(_take_rows(rows, where))
                else:
                    obs_parts.append(_valid_rows(chunk.obs, valid))
                parts["actions"].append(np.asarray(chunk.action)[valid])
                parts["logp"].append(chunk.extras["logp"][valid])
                parts["values"].append(values[:-1][valid])
                parts["adv"].append(adv[valid])
                parts["ret"].append(ret[valid])
        joined = {k: np.concatenate(v) for k, v in parts.items()}
        floats = (joined[k].astype(np.float32, copy=False) for k in ("logp", "values", "adv", "ret"))
        columns = (joined["actions"], *floats)
        if self.tensor_batches:  # normalised already, with the same statistics (they change after the update)
            return Batch(_cat(obs_parts), *(to_device(column, device) for column in columns))
        with torch.no_grad():
            inputs = net.inputs(to_device(_concat(obs_parts), device))
        obs = {k: v.numpy() for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.numpy()
        return Batch(obs, *columns)

    def _epochs(self, batch: Batch | SequenceBatch) -> dict[str, float]:
        cfg = self.config
        totals = {"pg_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_fraction": 0.0}
        steps = 0
        stopped_early = 0.0
        sequences = isinstance(batch, SequenceBatch)
        # A recurrent model's minibatch is whole sequences, about minibatch_size steps of them.
        n = batch.sequences if isinstance(batch, SequenceBatch) else len(batch)
        size = max(1, cfg.minibatch_size // cfg.seq_len) if sequences else cfg.minibatch_size
        for epoch in range(cfg.epochs):
            if isinstance(batch, SequenceBatch) and cfg.recompute_states and epoch:
                batch.recompute_states(self.nets.actor_critic, cfg.seq_len)
            permutation = torch.randperm(n, generator=self.generator)  # drawn on the CPU: the same on any device
            order: Any = permutation.to(self.device) if self.tensor_batches or sequences else permutation.numpy()
            kl_sum, kl_count = 0.0, 0
            for start in range(0, n, size):
                # A sequence batch goes to the torch step only: numpy runs no recurrent model (supports()).
                metrics = self.step.train_step(batch.take(order[start : start + size]))  # type: ignore[arg-type]
                for key in totals:
                    totals[key] += metrics[key]
                kl_sum += metrics["approx_kl"]
                kl_count += 1
                steps += 1
            if cfg.target_kl and kl_sum / max(kl_count, 1) > 1.5 * cfg.target_kl:
                stopped_early = 1.0
                break
        out = {key: value / max(steps, 1) for key, value in totals.items()}
        returns, values = _numpy(batch.returns), _numpy(batch.old_values)
        if isinstance(batch, SequenceBatch):
            returns, values = returns[_numpy(batch.mask)], values[_numpy(batch.mask)]
        spread = float(np.var(returns))
        out["explained_variance"] = float(1.0 - np.var(returns - values) / spread) if spread > 0 else 0.0
        out["stopped_early"] = stopped_early
        return out

    # -- weights and checkpoints (the torch network, brought up to date by the step) ----------

    def actor_weights(self) -> dict[str, torch.Tensor]:
        self.step.sync(policy_only=True)
        return {name: t.detach().cpu().clone() for name, t in self.nets.actor_critic.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The network (``net.<name>``), Adam's moments per parameter (``adam.<i>.<key>``, once it has
        stepped) and the samples learned from (the learning-rate schedule's clock)."""
        self.step.sync()
        out = {f"net.{name}": t for name, t in self.actor_weights().items()}
        for i, param in enumerate(self.nets.actor_critic.parameters()):
            state = self.nets.optimizer.state.get(param, {})
            if "exp_avg" in state:
                out[f"adam.{i}.exp_avg"] = state["exp_avg"].detach().cpu().clone()
                out[f"adam.{i}.exp_avg_sq"] = state["exp_avg_sq"].detach().cpu().clone()
                out[f"adam.{i}.step"] = torch.as_tensor(state["step"], dtype=torch.float32).cpu().clone()
        out["samples"] = torch.tensor(float(self.samples), dtype=torch.float64)
        if self.reward_scale is not None:
            scale = self.reward_scale
            out["reward_scale"] = torch.tensor([scale.mean, scale.var, scale.count], dtype=torch.float64)
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        self.step.sync()
        net, optimizer = self.nets.actor_critic, self.nets.optimizer
        weights = {k.removeprefix("net."): v for k, v in tensors.items() if k.startswith("net.")}
        check_fits(net.state_dict(), weights, "the checkpoint's tensors", "this actor-critic")  # all or nothing
        try:
            net.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit this actor-critic: {exc}") from None
        optimizer.state.clear()
        for i, param in enumerate(net.parameters()):
            if f"adam.{i}.exp_avg" in tensors:
                optimizer.state[param] = adam_state(
                    optimizer,
                    param,
                    tensors[f"adam.{i}.step"],
                    tensors[f"adam.{i}.exp_avg"],
                    tensors[f"adam.{i}.exp_avg_sq"],
                )
        self.step.reload()
        self.samples = int(float(tensors["samples"])) if "samples" in tensors else 0
        if self.reward_scale is not None and "reward_scale" in tensors:
            mean, var, count = (float(v) for v in tensors["reward_scale"].tolist())
            self.reward_scale.mean, self.reward_scale.var, self.reward_scale.count = mean, var, count
        self.version = version


def _flat_rows(obs: Any) -> Any:
    """``[R, N, ...]`` observations as ``[R * N, ...]`` (per key for a dict)."""
    if isinstance(obs, dict):
        return {k: np.asarray(v).reshape(-1, *v.shape[2:]) for k, v in obs.items()}
    return np.asarray(obs).reshape(-1, *obs.shape[2:])


def _take_rows(x: Any, rows: Any) -> Any:
    """The first ``rows`` rows of ``x`` (a count), or the rows it indexes (an index tensor); per key for a dict."""
    pick = slice(rows) if isinstance(rows, int) else rows
    if isinstance(x, dict):
        return {k: v[pick] for k, v in x.items()}
    return x[pick]


def _cat(parts: list[Any]) -> Any:
    """Tensors of rows, joined (per key for a dict)."""
    if parts and isinstance(parts[0], dict):
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


def _valid_rows(obs: Any, valid: npt.NDArray[np.bool_]) -> Any:
    if isinstance(obs, dict):
        return {k: np.asarray(v)[:-1][valid] for k, v in obs.items()}
    return np.asarray(obs)[:-1][valid]


def _numpy(column: Any) -> npt.NDArray[Any]:
    """A batch column as numpy (a tensor on a GPU comes back to the host)."""
    return column.cpu().numpy() if isinstance(column, torch.Tensor) else np.asarray(column)


def _concat(parts: list[Any]) -> Any:
    if parts and isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)
