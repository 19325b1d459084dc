"""The DQN learner core: a replay ring buffer and the reference Double-DQN train step in torch.

Broker-free like the rest of :mod:`worker.rl`; the learner process feeds the buffer
with the sample chunks collectors publish (see :class:`worker.rl.rollout.SampleSink`)
and writes its learner's ``policy_state()`` to the policy file collectors read.

The learner process trains with :class:`worker.rl.fast_dqn.NumpyDQNLearner`, the same
math in numpy at a fraction of the cost; :class:`DQNLearner` here is the readable torch
reference it is tested against, and what ``scripts/train_inprocess.py`` uses.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812  (the universal torch alias)

from worker.errors import CorruptFile
from worker.rl.config import LearnerSpec, epsilon_at
from worker.rl.policy import QNetwork

__all__ = ["DQNLearner", "ReplayBuffer", "epsilon_at", "seeded_q_network"]

#: Chunk fields the learner needs (see :mod:`worker.rl.chunks`); ``truncated`` is accepted
#: but not stored, because ``next_obs`` already holds the real final observation and
#: ``done`` is the bootstrap mask (terminated only).
REQUIRED_FIELDS = ("obs", "next_obs", "action", "reward", "done", "valid")
_STORED = ("obs", "next_obs", "action", "reward", "done")


class ReplayBuffer:
    """Fixed-capacity numpy ring buffer of transitions; the oldest are overwritten first.

    Args:
        capacity: max transitions kept.
        obs_dim: observation size every chunk must have.
        n_actions: when given, actions outside ``[0, n_actions)`` are refused.
    """

    def __init__(self, capacity: int, obs_dim: int, *, n_actions: int | None = None) -> None:
        if capacity < 1 or obs_dim < 1:
            raise ValueError(f"capacity and obs_dim must be >= 1, got {capacity} and {obs_dim}")
        self.capacity, self.obs_dim, self.n_actions = capacity, obs_dim, n_actions
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.done = np.zeros(capacity, dtype=bool)
        self._pos = 0
        self._size = 0
        self.total_added = 0
        """Transitions ever added, including overwritten ones."""

    def __len__(self) -> int:
        return self._size

    def add(self, samples: Mapping[str, Any]) -> int:
        """Append the valid transitions of one chunk (fields ``[T, N, ...]``, see :mod:`worker.rl.chunks`).

        One slice copy per field (two where the ring wraps), so a chunk of thousands of
        transitions costs tens of microseconds.

        Returns:
            The number of transitions added.

        Raises:
            CorruptFile: a field is missing or has the wrong shape, dtype or values;
                nothing is added then.
        """
        chunk = self._validate(samples)
        n = len(chunk["action"])
        if n > self.capacity:  # only the newest ``capacity`` would survive anyway
            chunk = {name: array[-self.capacity :] for name, array in chunk.items()}
        k = len(chunk["action"])
        first = min(k, self.capacity - self._pos)
        for name, array in chunk.items():
            store = getattr(self, name)
            store[self._pos : self._pos + first] = array[:first]
            store[: k - first] = array[first:]
        self._pos = (self._pos + k) % self.capacity
        self._size = min(self._size + k, self.capacity)
        self.total_added += n
        return n

    def sample_arrays(self, batch_size: int, rng: np.random.Generator) -> dict[str, npt.NDArray[Any]]:
        """Uniformly sample ``batch_size`` transitions (with replacement) as new numpy arrays.

        ``np.take`` per field rather than fancy indexing (``self.obs[idx]``), which costs two to
        three times more for these few rows; sampling is once per train step.

        Raises:
            ValueError: the buffer is empty.
        """
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = rng.integers(0, self._size, size=batch_size)
        return {name: np.take(getattr(self, name), idx, axis=0) for name in _STORED}

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        """:meth:`sample_arrays` as CPU tensors (the same transitions for the same ``rng`` state)."""
        return {name: torch.from_numpy(array) for name, array in self.sample_arrays(batch_size, rng).items()}

    def _validate(self, samples: Mapping[str, Any]) -> dict[str, npt.NDArray[Any]]:
        """The chunk's valid transitions as flat ``[k, ...]`` arrays, after checking every field."""
        if not isinstance(samples, Mapping):
            raise CorruptFile(f"sample chunk must be a map, got {type(samples).__name__}")
        chunk: dict[str, npt.NDArray[Any]] = {}
        for name in REQUIRED_FIELDS:
            array = samples.get(name)
            if not isinstance(array, np.ndarray):
                raise CorruptFile(f"sample chunk field {name!r} must be a numpy array, got {type(array).__name__}")
            chunk[name] = array
        rows = chunk["valid"].shape[:2] if chunk["valid"].ndim == 2 else (-1, -1)
        for name in ("obs", "next_obs"):
            self._check(chunk[name], name, (*rows, self.obs_dim), "f")
        self._check(chunk["action"], "action", rows, "iu")
        self._check(chunk["reward"], "reward", rows, "fiu")
        for name in ("done", "valid"):
            self._check(chunk[name], name, rows, "b")
        valid = chunk.pop("valid").reshape(-1)
        flat = {name: array.reshape(-1, *array.shape[2:])[valid] for name, array in chunk.items()}
        for name in ("obs", "next_obs", "reward"):
            if not np.isfinite(flat[name]).all():
                raise CorruptFile(f"sample chunk field {name!r} holds NaN or infinite values")
        action = flat["action"]
        if len(action) and (action.min() < 0 or (self.n_actions is not None and action.max() >= self.n_actions)):
            raise CorruptFile(
                f"sample chunk actions must lie in [0, {self.n_actions}), got {action.min()}..{action.max()}"
            )
        return {name: flat[name] for name in _STORED}

    @staticmethod
    def _check(array: npt.NDArray[Any], name: str, shape: tuple[int, ...], kinds: str) -> None:
        if array.shape != shape or array.dtype.kind not in kinds:
            raise CorruptFile(
                f"sample chunk field {name!r} has shape {array.shape} dtype {array.dtype}; expected {shape}"
            )


def seeded_q_network(obs_dim: int, n_actions: int, hidden_sizes: tuple[int, ...], seed: int) -> QNetwork:
    """A freshly initialised :class:`QNetwork` whose weights depend on ``seed`` only.

    Torch's global RNG is forked, so seeding here neither depends on nor disturbs it;
    every learner implementation starts from these weights, so seeded runs start alike.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return QNetwork(obs_dim, n_actions, hidden_sizes)


class DQNLearner:
    """Double DQN with a Huber loss, gradient clipping and a periodically synced target net, in torch.

    The reference implementation: :class:`worker.rl.fast_dqn.NumpyDQNLearner`, which the
    learner process runs, must match it step for step (``tests/unit/test_rl_fast_dqn.py``).

    Args:
        spec: hyperparameters.
        obs_dim: observation size.
        n_actions: number of discrete actions.
        seed: seeds the weight initialisation (without touching torch's global RNG).
    """

    def __init__(self, spec: LearnerSpec, obs_dim: int, n_actions: int, seed: int = 0) -> None:
        self.spec = spec
        self.q_net = seeded_q_network(obs_dim, n_actions, spec.hidden_sizes, seed)
        self.target_net = copy.deepcopy(self.q_net)
        self.target_net.requires_grad_(False)
        self.optimizer = self._new_optimizer()
        self.iter = 0
        """Train steps done so far; sent with every policy as its ``iter``."""

    def train_step(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """One gradient step on a batch from :meth:`ReplayBuffer.sample`.

        Returns:
            ``loss`` (Huber TD loss before the step), ``q_mean`` (mean Q of the taken
            actions) and ``grad_norm`` (before clipping).
        """
        spec = self.spec
        obs, next_obs = batch["obs"], batch["next_obs"]
        action, reward = batch["action"].long(), batch["reward"].float()
        not_done = 1.0 - batch["done"].float()

        # -- TD target: reward + discount * Q_target(s', a*) unless s' is terminal
        with torch.no_grad():
            next_q_target = self.target_net(next_obs)
            if spec.double_dqn:
                # The online net picks a*, the target net values it: curbs max-bias.
                best = self.q_net(next_obs).argmax(dim=1, keepdim=True)
                next_q = next_q_target.gather(1, best).squeeze(1)
            else:
                next_q = next_q_target.max(dim=1).values
            target = reward + spec.discount * not_done * next_q

        # -- gradient step on the Huber loss
        q = self.q_net(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        grad_norm = torch.nn.utils.clip_grad_norm_(self.q_net.parameters(), spec.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.iter += 1

        # -- target network
        if self.iter % spec.target_update_interval == 0:
            self._update_target()
        return {"loss": float(loss.item()), "q_mean": float(q.mean().item()), "grad_norm": float(grad_norm.item())}

    def policy_state(self) -> dict[str, torch.Tensor]:
        """A detached CPU copy of the online net's weights, loadable by ``DQNPolicy.load_state_dict``."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self.q_net.state_dict().items()}

    def load_policy(self, state_dict: Mapping[str, torch.Tensor], iter: int) -> None:
        """Resume from a policy file: online and target nets get ``state_dict``, ``iter`` carries over.

        Adam starts afresh, since the file holds no optimizer state.

        Raises:
            RuntimeError: the keys or shapes do not match this network.
        """
        self.q_net.load_state_dict(state_dict)
        self.target_net.load_state_dict(state_dict)
        self.optimizer = self._new_optimizer()
        self.iter = iter

    def _new_optimizer(self) -> torch.optim.Adam:
        # fused: one kernel for all parameters; the train step is dispatch-bound, not FLOP-bound.
        return torch.optim.Adam(self.q_net.parameters(), lr=self.spec.lr, fused=True)

    def _update_target(self) -> None:
        tau = self.spec.tau
        with torch.no_grad():
            for target, online in zip(self.target_net.parameters(), self.q_net.parameters(), strict=True):
                if tau >= 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)
