"""Columnar chunks: ``T`` steps of ``N`` envs as one array per field, laid out from the spaces.

A chunk is what a collector ships as one step file and one metadata message. Its fields
(``docs/protocol.md`` section 6) follow from the env's spaces and the algorithm's extra
columns (:class:`ChunkLayout`):

* ``obs`` (``obs.<key>`` per key of a ``Dict`` space): ``[T + 1, N, ...]`` in the space's
  own dtype (uint8 images stay uint8). Row ``t + 1`` is the observation after step ``t``,
  so the next observation is never stored twice (see :class:`~worker.plugins.Chunk`);
* ``action`` ``[T, N, ...]``, ``reward`` float32, ``done`` (terminated), ``truncated``,
  ``valid`` bool ``[T, N]``;
* one field per extra column of the algorithm (``logp``, ``value``...), ``[T, N, ...]``.

:class:`ChunkBuffer` is preallocated once and filled a row per vector-env step, so the env
loop creates no per-step Python objects. :func:`read_chunk` checks a chunk read back
against the layout, so a file that is not what its metadata claims is refused before it
reaches a replay buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.errors import CorruptFile
from worker.plugins.contract import Chunk, Column, Obs
from worker.plugins.spaces import Spaces, leaf_layout

#: Fields every chunk has besides its observations and extras.
CORE_FIELDS: Final = ("action", "reward", "done", "truncated", "valid")
_STEP_DTYPES: Final = {"reward": np.dtype(np.float32), "done": np.dtype(bool), "truncated": np.dtype(bool)}


@dataclass(frozen=True)
class FieldLayout:
    """One field of a chunk: its per-env shape and dtype, and whether it has ``T + 1`` rows."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    bootstrap_row: bool = False


@dataclass(frozen=True)
class ChunkLayout:
    """The fields of the chunks of one job, from its spaces and its algorithm's extra columns."""

    fields: Mapping[str, FieldLayout]
    obs_keys: tuple[str, ...] | None
    """Keys of a ``Dict`` observation space (fields ``obs.<key>``), or None (field ``obs``)."""

    @classmethod
    def of(cls, spaces: Spaces, columns: Mapping[str, Column] | None = None) -> ChunkLayout:
        """Raises: ValueError: an extra column takes a core field's name."""
        fields: dict[str, FieldLayout] = {}
        obs = spaces.observation
        keys: tuple[str, ...] | None = None
        leaves: list[tuple[str, gym.Space[Any]]] = [("obs", obs)]
        if isinstance(obs, gym.spaces.Dict):
            keys = tuple(obs.spaces)
            leaves = [(f"obs.{k}", sub) for k, sub in obs.spaces.items()]
        for name, space in leaves:
            shape, dtype = leaf_layout(space)
            fields[name] = FieldLayout(shape, dtype, bootstrap_row=True)
        shape, dtype = leaf_layout(spaces.action)
        fields["action"] = FieldLayout(shape, dtype)
        for name, dtype in _STEP_DTYPES.items():
            fields[name] = FieldLayout((), dtype)
        fields["valid"] = FieldLayout((), np.dtype(bool))
        for name, column in (columns or {}).items():
            if name in fields or name.startswith("obs"):
                raise ValueError(f"extra column {name!r} takes the name of a chunk field")
            fields[name] = FieldLayout(tuple(column.shape), np.dtype(column.dtype))
        return cls(fields=fields, obs_keys=keys)

    @property
    def extras(self) -> tuple[str, ...]:
        return tuple(n for n in self.fields if not n.startswith("obs") and n not in CORE_FIELDS)

    def bytes_per_step(self, num_envs: int) -> int:
        """Bytes one env step adds to a chunk (observations counted once)."""
        return num_envs * sum(int(np.prod(f.shape, dtype=np.int64)) * f.dtype.itemsize for f in self.fields.values())


class ChunkBuffer:
    """A preallocated chunk of up to ``rows`` steps of ``num_envs`` envs, filled a step at a time.

    Args:
        layout: the job's chunk layout.
        rows: steps per chunk (``T``).
        num_envs: envs per step (``N``).
    """

    def __init__(self, layout: ChunkLayout, rows: int, num_envs: int) -> None:
        self.layout = layout
        self.rows = rows
        self.num_envs = num_envs
        self.arrays = {
            name: np.zeros((rows + int(f.bootstrap_row), num_envs, *f.shape), dtype=f.dtype)
            for name, f in layout.fields.items()
        }
        self.filled = 0
        """Rows written since the last :meth:`take`."""
        self.samples = 0
        """Valid transitions in those rows."""
        self.started_at = 0.0

    @property
    def full(self) -> bool:
        return self.filled == self.rows

    def age(self, now: float) -> float:
        """Seconds since the first row of the chunk in progress (0 when empty)."""
        return now - self.started_at if self.filled else 0.0

    def add(
        self,
        obs: Obs,
        action: npt.NDArray[Any],
        extras: Mapping[str, npt.NDArray[Any]],
        step: Any,
        now: float,
    ) -> None:
        """Write one vector-env step as the next row: what was seen, done, and got (a ``VecStep``)."""
        t = self.filled
        if t == 0:
            self.started_at = now
        arrays = self.arrays
        self._put_obs(t, obs)
        arrays["action"][t] = action
        arrays["reward"][t] = step.reward
        arrays["done"][t] = step.terminated
        arrays["truncated"][t] = step.truncated
        arrays["valid"][t] = step.valid
        for name in self.layout.extras:
            arrays[name][t] = extras[name]
        self.filled = t + 1
        self.samples += int(step.valid.sum())

    def take(self, last_obs: Obs) -> dict[str, npt.NDArray[Any]]:
        """The filled rows, closed by ``last_obs`` (what followed the last step), as new arrays."""
        t = self.filled
        self._put_obs(t, last_obs)
        self.filled, self.samples = 0, 0
        return {
            name: array[: t + int(self.layout.fields[name].bootstrap_row)].copy() for name, array in self.arrays.items()
        }

    def _put_obs(self, row: int, obs: Obs) -> None:
        if self.layout.obs_keys is None:
            self.arrays["obs"][row] = obs
        else:
            assert isinstance(obs, dict)
            for key in self.layout.obs_keys:
                self.arrays[f"obs.{key}"][row] = obs[key]


def read_chunk(fields: Mapping[str, Any], layout: ChunkLayout, spaces: Spaces, policy_version: int) -> Chunk:
    """A step file's fields as a :class:`~worker.plugins.Chunk`, after checking them against the layout.

    Raises:
        CorruptFile: a field is missing, extra, or of the wrong shape or dtype; a float
            field holds NaN or infinity; an action lies outside the action space.
    """
    if not isinstance(fields, Mapping):
        raise CorruptFile(f"sample chunk must be a map of fields, got {type(fields).__name__}")
    missing = sorted(set(layout.fields) - set(fields))
    if missing:
        raise CorruptFile(f"sample chunk lacks fields {missing} (has {sorted(fields)})")
    valid = fields["valid"]
    if not isinstance(valid, np.ndarray) or valid.ndim != 2:
        raise CorruptFile("sample chunk field 'valid' must be a [T, N] array")
    steps, num_envs = valid.shape
    for name, f in layout.fields.items():
        array = fields[name]
        want = (steps + int(f.bootstrap_row), num_envs, *f.shape)
        if not isinstance(array, np.ndarray) or array.shape != want or array.dtype != f.dtype:
            got = f"{array.shape} {array.dtype}" if isinstance(array, np.ndarray) else type(array).__name__
            raise CorruptFile(f"sample chunk field {name!r} is {got}; the job's spaces make it {want} {f.dtype}")
        if array.dtype.kind == "f" and not np.isfinite(array[valid] if not f.bootstrap_row else array).all():
            raise CorruptFile(f"sample chunk field {name!r} holds NaN or infinite values")
    _check_actions(fields["action"][valid], spaces.action)
    keys = layout.obs_keys
    obs: Obs = fields["obs"] if keys is None else {key: fields[f"obs.{key}"] for key in keys}
    return Chunk(
        obs=obs,
        action=fields["action"],
        reward=fields["reward"],
        terminated=fields["done"],
        truncated=fields["truncated"],
        valid=valid,
        extras={name: fields[name] for name in layout.extras},
        policy_version=policy_version,
    )


def _check_actions(actions: npt.NDArray[Any], space: gym.Space[Any]) -> None:
    if not len(actions):
        return
    if isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n) - 1
        if actions.min() < low or actions.max() > high:
            raise CorruptFile(f"sample chunk actions must lie in [{low}, {high}], got {actions.min()}..{actions.max()}")
    elif isinstance(space, gym.spaces.MultiDiscrete):
        starts = space.start.reshape(1, -1)
        highest = starts + space.nvec.reshape(1, -1) - 1
        if (actions < starts).any() or (actions > highest).any():
            raise CorruptFile("sample chunk actions lie outside the MultiDiscrete action space")
    elif isinstance(space, gym.spaces.MultiBinary):
        if ((actions != 0) & (actions != 1)).any():
            raise CorruptFile("sample chunk actions must be 0 or 1 (MultiBinary)")
    elif isinstance(space, gym.spaces.Box) and space.dtype.kind == "f" and not np.isfinite(actions).all():
        raise CorruptFile("sample chunk actions hold NaN or infinite values")
