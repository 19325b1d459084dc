"""Recurrent PPO's data: an update's chunks cut into sequences of ``seq_len`` steps per env.

Each chunk carries its actors' state before its first step (``Chunk.state``). The learner
unrolls the chunk from it with the current weights (no gradient), which gives every
observation row's value (GAE's bootstrap included, as for feed-forward models) and the
state at each sequence's start; ``first`` marks where an episode begins inside the chunk
(the row after a reset step), and the network zeroes the state there. The minibatch step
then runs each sequence from its start state with gradients through its ``seq_len`` steps
(truncated backpropagation through time) and averages the losses over the steps marked
``mask``: real transitions, not reset steps, not padding.

A sequence is one env's stretch of one chunk, so a chunk of ``T`` steps gives
``ceil(T / seq_len)`` sequences per env, the last padded to ``seq_len``. With
``recompute_states`` the chunks are unrolled again before every epoch, so later epochs
start their sequences from states of the weights they train.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from worker.plugins.contract import Chunk
from worker.rl.placement import to_device

if TYPE_CHECKING:
    from worker.algorithms.ppo.network import ActorCritic

__all__ = ["SequenceBatch", "chunk_first", "unroll"]

#: Advantages and value targets of one chunk from its values ``[T + 1, N]`` and its policy's log-probabilities.
Returns = Callable[[Chunk, npt.NDArray[np.float32], "npt.NDArray[np.float32] | None"], tuple[Any, Any]]


def chunk_first(valid: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """``[T + 1, N]``: an episode begins at row ``t`` (``t >= 1``) where step ``t - 1`` was a reset step."""
    first = np.zeros((valid.shape[0] + 1, valid.shape[1]), dtype=bool)
    first[1:] = ~valid
    return first


def unroll(
    net: ActorCritic, x: Any, first: torch.Tensor, state: dict[str, torch.Tensor], seq_len: int
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, torch.Tensor]]]:
    """Run ``net`` over rows ``[R, N, ...]`` from ``state``, ``seq_len`` rows at a time.

    Returns the policy head's outputs ``[R, N, P]``, the values ``[R, N]``, and the state
    before each stretch of ``seq_len`` rows (the sequences' start states).
    """
    rows = first.shape[0]
    heads, values, starts = [], [], []
    for start in range(0, rows, seq_len):
        starts.append(state)
        head, value, state = net.forward_sequence(
            _rows(x, start, start + seq_len), state, first[start : start + seq_len]
        )
        heads.append(head)
        values.append(value)
    return torch.cat(heads), torch.cat(values), starts


@dataclass
class _Chain:
    """One chunk as the learner unrolls it, kept to re-compute its sequences' start states."""

    x: Any
    first: torch.Tensor
    state: dict[str, torch.Tensor]
    sequences: list[slice]
    """Per stretch of ``seq_len`` rows: where its ``N`` sequences are in the batch."""


@dataclass
class SequenceBatch:
    """An update's steps as ``S`` sequences of ``L`` steps: step columns ``[L, S, ...]``, start states ``[S, ...]``."""

    obs: Any
    first: torch.Tensor
    mask: torch.Tensor
    state: dict[str, torch.Tensor]
    actions: torch.Tensor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    chains: list[_Chain] = field(default_factory=list)

    def __len__(self) -> int:
        """Steps learned from (real transitions)."""
        return int(self.mask.sum())

    @property
    def sequences(self) -> int:
        return int(self.mask.shape[1])

    def take(self, idx: torch.Tensor) -> SequenceBatch:
        """The sequences ``idx`` (a minibatch)."""
        obs = {k: v[:, idx] for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs[:, idx]
        return SequenceBatch(
            obs,
            self.first[:, idx],
            self.mask[:, idx],
            {name: t[idx] for name, t in self.state.items()},
            self.actions[:, idx],
            self.old_logp[:, idx],
            self.old_values[:, idx],
            self.advantages[:, idx],
            self.returns[:, idx],
        )

    def recompute_states(self, net: ActorCritic, seq_len: int) -> None:
        """Every sequence's start state again, unrolled with ``net``'s current weights."""
        with torch.no_grad():
            for chain in self.chains:
                _, _, starts = unroll(net, chain.x, chain.first, chain.state, seq_len)
                for where, start in zip(chain.sequences, starts, strict=False):
                    for name, tensor in start.items():
                        self.state[name][where] = tensor

    @classmethod
    def build(
        cls,
        chunks: list[Chunk],
        net: ActorCritic,
        seq_len: int,
        device: torch.device,
        returns: Returns,
        *,
        needs_logp: bool = False,
    ) -> SequenceBatch:
        """The chunks' sequences with their advantages and targets (``returns``, from the unrolled values;
        ``needs_logp``: given the current policy's log-probabilities of the actions too, for V-trace).

        Raises:
            ValueError: a chunk carries no state, or one of other shapes than the network's.
        """
        parts: dict[str, list[Any]] = {
            k: [] for k in ("obs", "first", "mask", "actions", "logp", "values", "adv", "ret")
        }
        states: dict[str, list[torch.Tensor]] = {name: [] for name in net.state_shapes}
        chains: list[_Chain] = []
        count = 0
        with torch.no_grad():
            for chunk in chunks:
                steps, envs = chunk.steps, chunk.num_envs
                state = _chunk_state(chunk, net, device)
                x = net.inputs(to_device(chunk.obs, device))
                first = to_device(chunk_first(np.asarray(chunk.valid)), device)
                heads, values, starts = unroll(net, x, first, state, seq_len)
                values_np = values.float().cpu().numpy()
                logp = None
                if needs_logp:
                    flat = heads[:steps].reshape(steps * envs, -1).float()
                    actions = to_device(np.asarray(chunk.action).reshape(steps * envs, *chunk.action.shape[2:]), device)
                    logp = net.policy_from_head(flat).log_prob(actions).cpu().numpy().reshape(steps, envs)
                adv, ret = returns(chunk, values_np, logp)
                sequences = []
                for k, start in enumerate(range(0, steps, seq_len)):
                    stop = min(start + seq_len, steps)
                    parts["obs"].append(_padded(_rows(x, start, stop), seq_len))
                    parts["first"].append(_padded(first[start:stop], seq_len))
                    parts["mask"].append(_padded(to_device(np.asarray(chunk.valid[start:stop]), device), seq_len))
                    parts["actions"].append(_padded(to_device(np.asarray(chunk.action[start:stop]), device), seq_len))
                    for key, column in (
                        ("logp", chunk.extras["logp"]),
                        ("values", values_np[:-1]),
                        ("adv", adv),
                        ("ret", ret),
                    ):
                        block = np.asarray(column[start:stop], dtype=np.float32)
                        parts[key].append(_padded(to_device(block, device), seq_len))
                    for name, kept in states.items():
                        kept.append(starts[k][name])
                    sequences.append(slice(count, count + envs))
                    count += envs
                chains.append(_Chain(x, first, state, sequences))
        obs = parts["obs"]
        joined_obs = (
            {k: torch.cat([p[k] for p in obs], dim=1) for k in obs[0]}
            if isinstance(obs[0], dict)
            else torch.cat(obs, dim=1)
        )
        joined = {k: torch.cat(v, dim=1) for k, v in parts.items() if k != "obs"}
        return cls(
            joined_obs,
            joined["first"],
            joined["mask"],
            {name: torch.cat(v) for name, v in states.items()},
            joined["actions"],
            joined["logp"],
            joined["values"],
            joined["adv"],
            joined["ret"],
            chains,
        )


def _chunk_state(chunk: Chunk, net: ActorCritic, device: torch.device) -> dict[str, torch.Tensor]:
    want = {name: (chunk.num_envs, *shape) for name, shape in net.state_shapes.items()}
    got = {name: tuple(np.shape(value)) for name, value in chunk.state.items()}
    if got != want:
        raise ValueError(f"the chunk's state is {got or 'missing'}; this recurrent model needs {want}")
    return {name: to_device(np.asarray(value, dtype=np.float32), device) for name, value in chunk.state.items()}


def _rows(x: Any, start: int, stop: int) -> Any:
    if isinstance(x, dict):
        return {k: v[start:stop] for k, v in x.items()}
    return x[start:stop]


def _padded(x: Any, rows: int) -> Any:
    """``x`` (``[r, N, ...]``, per key for a dict) with zero rows appended up to ``rows``."""
    if isinstance(x, dict):
        return {k: _padded(v, rows) for k, v in x.items()}
    if x.shape[0] == rows:
        return x
    out = torch.zeros((rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    out[: x.shape[0]] = x
    return out
