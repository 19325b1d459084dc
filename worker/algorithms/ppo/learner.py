"""PPO's learner: batches of chunks, advantages on the learner (GAE or V-trace), minibatch epochs of the clipped loss.

Everything sample-dependent is computed here, from the chunks' raw columns: the values
of every observation row with the current network (so the bootstrap at a chunk's end, at
a truncation, and V-trace's targets use the newest value function), the advantages, the
observation statistics. The actor's log-probabilities (a chunk column) are PPO's "old"
policy, which is also the policy that acted: the clipped ratio then bounds the step from
the data's own policy, however stale it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from worker.algorithms.ppo.config import PPOConfig
from worker.algorithms.ppo.fast import MinibatchArrays, NumpyPPOStep, supports
from worker.algorithms.ppo.network import ActorCritic
from worker.algorithms.ppo.returns import gae, vtrace
from worker.algorithms.weights import check_fits
from worker.plugins.contract import Chunk, Learner

if TYPE_CHECKING:
    from worker.algorithms.ppo import PPO


@dataclass
class Batch:
    """One update's valid steps, flat: observations (a tensor, or a dict of them) and the rest as tensors."""

    obs: Any
    actions: torch.Tensor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def take(self, idx: torch.Tensor) -> Batch:
        obs = {k: v[idx] for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs[idx]
        return Batch(
            obs,
            self.actions[idx],
            self.old_logp[idx],
            self.old_values[idx],
            self.advantages[idx],
            self.returns[idx],
        )


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped policy loss, ``-mean(min(r A, clip(r, 1 - eps, 1 + eps) A))``, and the clipped fraction."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    fraction = ((ratio - 1.0).abs() > clip_range).float().mean()
    return loss, fraction


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_range_vf: float
) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)``; with ``clip_range_vf`` the worse of the clipped and unclipped errors."""
    if clip_range_vf <= 0.0:
        return 0.5 * ((values - returns) ** 2).mean()
    clipped = old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2).mean()


class PPOLearner(Learner):
    """Gathers ``batch_steps`` valid steps, then runs ``epochs`` passes of minibatch updates."""

    def __init__(self, algorithm: PPO, seed: int) -> None:
        self.config: PPOConfig = algorithm.config
        self.net: ActorCritic = algorithm.network(seed)
        self.optimizer = self._new_optimizer()
        self.generator = torch.Generator().manual_seed(seed)
        self.pending: list[Chunk] = []
        self.pending_steps = 0
        self.samples = 0
        """Valid steps learned from so far (the learning-rate schedule's clock)."""
        self.version = 0
        why_not = supports(self.net)
        if self.config.backend == "numpy" and why_not is not None:
            raise ValueError(f"algorithm.backend = 'numpy' cannot run this job: {why_not}")
        self.fast = NumpyPPOStep(self.config, self.net) if why_not is None and self.config.backend != "torch" else None
        """The numpy minibatch step, where it can run the network; it then owns the
        parameters and Adam's moments, and copies the parameters into :attr:`net` after each update."""

    def _new_optimizer(self) -> torch.optim.Adam:
        # fused: one kernel for all parameters; on small networks the step is dispatch-bound.
        return torch.optim.Adam(self.net.parameters(), lr=self.config.lr, eps=1e-5, fused=True)

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
        # The batch is normalised with the statistics its actors had; this batch's
        # observations go into the statistics after the update, for the next version.
        batch = self._batch(chunks)
        self._set_lr()
        metrics = self._epochs(batch)
        if self.net.obs_norm is not None:
            for chunk in chunks:
                self.net.obs_norm.update(torch.as_tensor(_valid_rows(chunk.obs, chunk.valid)))
        self.samples += len(batch)
        self.version += 1
        return {**metrics, "policy_lag": lag, "batch": float(len(batch)), "lr": self.optimizer.param_groups[0]["lr"]}

    def _set_lr(self) -> None:
        anneal = self.config.lr_anneal_samples
        frac = max(0.0, 1.0 - self.samples / anneal) if anneal else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * frac

    def _batch(self, chunks: list[Chunk]) -> Batch:
        """Advantages and targets of every chunk with the current network, as one flat batch of valid steps."""
        cfg = self.config
        obs_parts: list[Any] = []
        parts: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in ("actions", "logp", "values", "adv", "ret")}
        with torch.no_grad():
            for chunk in chunks:
                rows = self.net.inputs(_flat_rows(chunk.obs))
                values = self.net.value(rows).numpy().reshape(chunk.steps + 1, chunk.num_envs)
                valid = chunk.valid
                if cfg.correction == "vtrace":
                    steps_obs = _take_rows(rows, chunk.steps * chunk.num_envs)
                    actions = torch.as_tensor(np.asarray(chunk.action).reshape(-1, *chunk.action.shape[2:]))
                    logp = self.net.policy(steps_obs).log_prob(actions).numpy().reshape(chunk.steps, chunk.num_envs)
                    adv, ret = vtrace(
                        chunk.reward, values, chunk.terminated, chunk.truncated, valid,
                        log_ratio=logp - chunk.extras["logp"], discount=cfg.discount, lam=cfg.gae_lambda,
                        rho_bar=cfg.vtrace_rho_bar, c_bar=cfg.vtrace_c_bar,
                    )  # fmt: skip
                else:
                    adv, ret = gae(
                        chunk.reward, values, chunk.terminated, chunk.truncated, valid,
                        discount=cfg.discount, lam=cfg.gae_lambda,
                    )  # fmt: skip
                obs_parts.append(_valid_rows(chunk.obs, valid))
                parts["actions"].append(np.asarray(chunk.action)[valid])
                parts["logp"].append(chunk.extras["logp"][valid])
                parts["values"].append(values[:-1][valid])
                parts["adv"].append(adv[valid])
                parts["ret"].append(ret[valid])
        obs = _concat(obs_parts)
        joined = {k: torch.as_tensor(np.concatenate(v)) for k, v in parts.items()}
        return Batch(
            self.net.inputs(obs),
            joined["actions"],
            joined["logp"],
            joined["values"],
            joined["adv"],
            joined["ret"],
        )

    def _epochs(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        arrays = _arrays(batch) if self.fast is not None else None
        lr = float(self.optimizer.param_groups[0]["lr"])
        totals = {"pg_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_fraction": 0.0}
        steps = 0
        stopped_early = 0.0
        n = len(batch)
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator)
            kl_sum, kl_count = 0.0, 0
            for start in range(0, n, cfg.minibatch_size):
                idx = order[start : start + cfg.minibatch_size]
                if self.fast is not None and arrays is not None:
                    metrics = self.fast.minibatch(arrays.take(idx.numpy()), lr)
                else:
                    metrics = self._torch_minibatch(batch.take(idx))
                for key in totals:
                    totals[key] += metrics[key]
                kl_sum += metrics["approx_kl"]
                kl_count += 1
                steps += 1
            if cfg.target_kl and kl_sum / max(kl_count, 1) > 1.5 * cfg.target_kl:
                stopped_early = 1.0
                break
        if self.fast is not None:
            self.fast.write_to(self.net)
        out = {key: value / max(steps, 1) for key, value in totals.items()}
        returns, values = batch.returns.numpy(), batch.old_values.numpy()
        spread = float(np.var(returns))
        out["explained_variance"] = float(1.0 - np.var(returns - values) / spread) if spread > 0 else 0.0
        out["stopped_early"] = stopped_early
        return out

    def _torch_minibatch(self, mb: Batch) -> dict[str, float]:
        """One gradient step in torch: any model, and the reference :class:`NumpyPPOStep` is tested against."""
        cfg = self.config
        advantages = mb.advantages
        if cfg.normalize_advantage and len(mb) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy, values = self.net.policy_and_value(mb.obs)
        logp = policy.log_prob(mb.actions)
        pg_loss, clip_fraction = clipped_surrogate(logp, mb.old_logp, advantages, cfg.clip_range)
        v_loss = value_loss(values, mb.old_values, mb.returns, cfg.clip_range_vf)
        entropy = policy.entropy().mean()
        loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        with torch.no_grad():
            log_ratio = logp - mb.old_logp
            approx_kl = float(((log_ratio.exp() - 1) - log_ratio).mean())
        return {
            "pg_loss": float(pg_loss.detach()),
            "value_loss": float(v_loss.detach()),
            "entropy": float(entropy.detach()),
            "approx_kl": approx_kl,
            "clip_fraction": float(clip_fraction),
        }

    # -- weights -------------------------------------------------------------------------

    def actor_weights(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().cpu().clone() for name, t in self.net.state_dict().items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"net.{name}": t for name, t in self.actor_weights().items()}
        if self.fast is not None:  # the same layout as the torch optimizer's, so either backend resumes it
            moments = self.fast.adam_state() if self.fast.adam.steps else {}
            for i, name in enumerate(self.fast.names if moments else ()):
                out[f"adam.{i}.exp_avg"] = torch.from_numpy(moments[f"{name}.exp_avg"])
                out[f"adam.{i}.exp_avg_sq"] = torch.from_numpy(moments[f"{name}.exp_avg_sq"])
                out[f"adam.{i}.step"] = torch.tensor(float(self.fast.adam.steps), dtype=torch.float32)
            out["samples"] = torch.tensor(float(self.samples), dtype=torch.float64)
            return out
        for i, param in enumerate(self.net.parameters()):
            state = self.optimizer.state.get(param, {})
            if "exp_avg" in state:
                out[f"adam.{i}.exp_avg"] = state["exp_avg"].detach().clone()
                out[f"adam.{i}.exp_avg_sq"] = state["exp_avg_sq"].detach().clone()
                out[f"adam.{i}.step"] = torch.as_tensor(state["step"], dtype=torch.float32).clone()
        out["samples"] = torch.tensor(float(self.samples), dtype=torch.float64)
        return out

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        net = {k.removeprefix("net."): v for k, v in tensors.items() if k.startswith("net.")}
        check_fits(self.net.state_dict(), net, "the checkpoint's tensors", "this actor-critic")  # all or nothing
        try:
            self.net.load_state_dict(net, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"the checkpoint does not fit this actor-critic: {exc}") from None
        self.optimizer = self._new_optimizer()
        for i, param in enumerate(self.net.parameters()):
            if f"adam.{i}.exp_avg" in tensors:
                self.optimizer.state[param] = {
                    "step": tensors[f"adam.{i}.step"].clone(),
                    "exp_avg": tensors[f"adam.{i}.exp_avg"].clone(),
                    "exp_avg_sq": tensors[f"adam.{i}.exp_avg_sq"].clone(),
                }
        if self.fast is not None:
            self.fast.load_from(self.net)
            names = self.fast.names
            if all(f"adam.{i}.exp_avg" in tensors for i in range(len(names))):
                moments = {}
                for i, name in enumerate(names):
                    moments[f"{name}.exp_avg"] = tensors[f"adam.{i}.exp_avg"].numpy()
                    moments[f"{name}.exp_avg_sq"] = tensors[f"adam.{i}.exp_avg_sq"].numpy()
                self.fast.load_adam_state(moments, round(float(tensors["adam.0.step"])))
        self.samples = int(float(tensors["samples"])) if "samples" in tensors else 0
        self.version = version


def _arrays(batch: Batch) -> MinibatchArrays:
    """The batch as numpy arrays for :class:`NumpyPPOStep` (observations flat float32 rows)."""
    n = len(batch)
    obs = batch.obs.numpy().reshape(n, -1).astype(np.float32, copy=False)
    return MinibatchArrays(
        obs,
        batch.actions.numpy(),
        batch.old_logp.numpy().astype(np.float32, copy=False),
        batch.old_values.numpy().astype(np.float32, copy=False),
        batch.advantages.numpy().astype(np.float32, copy=False),
        batch.returns.numpy().astype(np.float32, copy=False),
    )


def _flat_rows(obs: Any) -> Any:
    """``[R, N, ...]`` observations as ``[R * N, ...]`` (per key for a dict)."""
    if isinstance(obs, dict):
        return {k: np.asarray(v).reshape(-1, *v.shape[2:]) for k, v in obs.items()}
    return np.asarray(obs).reshape(-1, *obs.shape[2:])


def _take_rows(x: Any, count: int) -> Any:
    if isinstance(x, dict):
        return {k: v[:count] for k, v in x.items()}
    return x[:count]


def _valid_rows(obs: Any, valid: npt.NDArray[np.bool_]) -> Any:
    if isinstance(obs, dict):
        return {k: np.asarray(v)[:-1][valid] for k, v in obs.items()}
    return np.asarray(obs)[:-1][valid]


def _concat(parts: list[Any]) -> Any:
    if parts and isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)
