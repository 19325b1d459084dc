"""Columnar chunks: ``T`` steps of ``N`` envs as one array per field, laid out from the spaces.

A chunk is what a collector ships as one step file and one metadata message. Its fields
(``docs/protocol.md`` section 6) follow from the env's spaces and the algorithm's extra
columns (:class:`ChunkLayout`):

* ``obs`` (``obs.<key>`` per key of a ``Dict`` space): ``[T + 1, N, ...]`` in the space's
  own dtype (uint8 images stay uint8). Row ``t + 1`` is the observation after step ``t``,
  so the next observation is never stored twice (see :class:`~worker.plugins.Chunk`);
* ``action`` ``[T, N, ...]``, ``reward`` float32, ``done`` (terminated), ``truncated``,
  ``valid`` bool ``[T, N]``;
* one field per extra column of the algorithm (``logp``, ``value``...), ``[T, N, ...]``;
* an actor with memory (a recurrent model): its state before the chunk's first step,
  ``state.<name>`` float32 ``[N, ...]`` per name of :meth:`Algorithm.memory_columns`, so a
  learner rebuilds sequences without replaying episodes from their starts.

**Frame stacks are stored once per frame.** An observation leaf that is a stack of ``K``
uint8 frames along its first axis (:func:`is_frame_stack`: ale-py's ``(4, 84, 84)``) holds
``K - 1`` frames of the previous row again, so its field keeps only the newest frame of
each row, ``[T + 1, N, H, W]``, and two side tables keep what cannot be derived: the
older ``K - 1`` frames of every row whose stack is not the previous row's shifted by one
(row 0 of every env, and the row after every reset), ``<field>@heads``
``[M, K - 1, H, W]``, and where they go, ``<field>@at`` int32 ``[M, 2]`` (row, env),
sorted. The collector finds those rows by comparing frames, so it assumes nothing about
how an env fills its stack at reset; :func:`read_chunk` rebuilds the stacks exactly, and
learners see ``[T + 1, N, K, H, W]`` as before. Disk and broker carry about ``1 / K`` of
the stacked bytes.

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

from worker.errors import CorruptChunk, CorruptFile
from worker.plugins.contract import Algorithm, Chunk, Column, Obs
from worker.plugins.spaces import Spaces, leaf_layout
from worker.storage.steps import STATE_FIELD

#: Fields every chunk has besides its observations and extras.
CORE_FIELDS: Final = ("action", "reward", "done", "truncated", "valid")
_STEP_DTYPES: Final = {"reward": np.dtype(np.float32), "done": np.dtype(bool), "truncated": np.dtype(bool)}


#: Separates a field's name from the name of one of its side tables (``obs@heads``).
SIDE: Final = "@"
#: Starts the name of a field holding the actor's recurrent state at the chunk's first step (``state.pi.h``).
STATE: Final = STATE_FIELD
#: Most frames a stack may have to be stored deduplicated, and the smallest frame side.
MAX_STACK: Final = 16
MIN_FRAME_SIDE: Final = 16


def is_frame_stack(space: gym.Space[Any]) -> bool:
    """A uint8 ``Box`` of shape ``(K, H, W)``, ``2 <= K <= 16``, ``H, W >= 16``: ``K`` grey frames, newest last.

    A channels-first colour image (``(3, H, W)``) passes too; it is still stored exactly,
    only without savings (every row then needs its own head).
    """
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8 or len(space.shape) != 3:
        return False
    k, h, w = space.shape
    return 2 <= k <= MAX_STACK and min(h, w) >= MIN_FRAME_SIDE


@dataclass(frozen=True)
class FieldLayout:
    """One field of a chunk: its per-env shape and dtype, and whether it has ``T + 1`` rows.

    ``frames`` is ``K`` for a frame stack stored deduplicated (``shape`` is still the
    stack's ``(K, H, W)``, what the learner gets back), else 0. ``per_chunk``: one row for
    the whole chunk (the actor's state at its first step), ``[N, ...]``.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    bootstrap_row: bool = False
    frames: int = 0
    per_chunk: bool = False

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """Per-env shape of a row in the file: one frame for a deduplicated stack."""
        return self.shape[1:] if self.frames else self.shape


@dataclass(frozen=True)
class ChunkLayout:
    """The fields of the chunks of one job, from its spaces and its algorithm's extra columns."""

    fields: Mapping[str, FieldLayout]
    obs_keys: tuple[str, ...] | None
    """Keys of a ``Dict`` observation space (fields ``obs.<key>``), or None (field ``obs``)."""

    @classmethod
    def of_algorithm(cls, algorithm: Algorithm) -> ChunkLayout:
        """The layout of ``algorithm``'s chunks: its spaces, extra columns and memory."""
        return cls.of(algorithm.spaces, algorithm.columns(), algorithm.memory_columns())

    @classmethod
    def of(
        cls, spaces: Spaces, columns: Mapping[str, Column] | None = None, memory: Mapping[str, Column] | None = None
    ) -> ChunkLayout:
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
            frames = shape[0] if is_frame_stack(space) else 0
            fields[name] = FieldLayout(shape, dtype, bootstrap_row=True, frames=frames)
        shape, dtype = leaf_layout(spaces.action)
        fields["action"] = FieldLayout(shape, dtype)
        for name, dtype in _STEP_DTYPES.items():
            fields[name] = FieldLayout((), dtype)
        fields["valid"] = FieldLayout((), np.dtype(bool))
        for name, column in (columns or {}).items():
            if name in fields or name.startswith(("obs", STATE)) or SIDE in name:
                raise ValueError(f"extra column {name!r} takes the name of a chunk field")
            fields[name] = FieldLayout(tuple(column.shape), np.dtype(column.dtype))
        for name, column in (memory or {}).items():
            fields[STATE + name] = FieldLayout(tuple(column.shape), np.dtype(column.dtype), per_chunk=True)
        return cls(fields=fields, obs_keys=keys)

    @property
    def extras(self) -> tuple[str, ...]:
        return tuple(n for n in self.fields if not n.startswith(("obs", STATE)) and n not in CORE_FIELDS)

    @property
    def state_fields(self) -> tuple[str, ...]:
        """The fields of the actor's state at the chunk's first step (``state.<name>``)."""
        return tuple(n for n in self.fields if n.startswith(STATE))

    @property
    def frame_fields(self) -> tuple[str, ...]:
        """Observation fields stored as deduplicated frame stacks."""
        return tuple(n for n, f in self.fields.items() if f.frames)

    def bytes_per_step(self, num_envs: int) -> int:
        """Bytes one env step adds to a chunk (observations counted once, frame stacks one frame; heads not counted)."""
        return num_envs * sum(
            int(np.prod(f.stored_shape, dtype=np.int64)) * f.dtype.itemsize
            for f in self.fields.values()
            if not f.per_chunk
        )


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
            name: np.zeros(
                ((rows + int(f.bootstrap_row),) if not f.per_chunk else ()) + (num_envs, *f.stored_shape), dtype=f.dtype
            )
            for name, f in layout.fields.items()
        }
        self._state = layout.state_fields
        self._stacks = {name: _FrameHeads(layout.fields[name], num_envs) for name in layout.frame_fields}
        self._extras = layout.extras
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
        *,
        memory: Mapping[str, npt.NDArray[Any]] | None = None,
    ) -> None:
        """Write one vector-env step as the next row: what was seen, done, and got (a ``VecStep``).

        ``memory``: the actor's state before this step (kept when it is the chunk's first; a
        layout with state fields needs it then).
        """
        t = self.filled
        arrays = self.arrays
        if t == 0:
            self.started_at = now
            for name in self._state:
                if memory is None:
                    raise ValueError("this chunk layout holds the actor's state, and the actor gave none")
                arrays[name][:] = memory[name.removeprefix(STATE)]
        self._put_obs(t, obs)
        arrays["action"][t] = action
        arrays["reward"][t] = step.reward
        arrays["done"][t] = step.terminated
        arrays["truncated"][t] = step.truncated
        arrays["valid"][t] = step.valid
        for name in self._extras:
            arrays[name][t] = extras[name]
        self.filled = t + 1
        self.samples += int(step.valid.sum())

    def take(self, last_obs: Obs) -> dict[str, npt.NDArray[Any]]:
        """The filled rows, closed by ``last_obs`` (what followed the last step), as new arrays."""
        t = self.filled
        self._put_obs(t, last_obs)
        self.filled, self.samples = 0, 0
        fields = self.layout.fields
        out = {
            name: (array if fields[name].per_chunk else array[: t + int(fields[name].bootstrap_row)]).copy()
            for name, array in self.arrays.items()
        }
        for name, stack in self._stacks.items():
            out[f"{name}{SIDE}heads"], out[f"{name}{SIDE}at"] = stack.take()
        return out

    def _put_obs(self, row: int, obs: Obs) -> None:
        if self.layout.obs_keys is None:
            self._put_leaf("obs", row, obs)
        else:
            assert isinstance(obs, dict)
            for key in self.layout.obs_keys:
                self._put_leaf(f"obs.{key}", row, obs[key])

    def _put_leaf(self, name: str, row: int, values: Any) -> None:
        stack = self._stacks.get(name)
        if stack is None:
            self.arrays[name][row] = values
        else:
            self.arrays[name][row] = values[:, -1]
            stack.add(row, values)


class _FrameHeads:
    """The heads of one frame-stack field while its chunk fills: rows whose stack is not the previous one shifted."""

    def __init__(self, layout: FieldLayout, num_envs: int) -> None:
        self._older = (layout.frames - 1, *layout.shape[1:])
        self._prev = np.zeros((num_envs, *self._older), dtype=layout.dtype)
        self._rows: list[tuple[int, npt.NDArray[np.int32], npt.NDArray[Any]]] = []

    def add(self, row: int, stacks: npt.NDArray[Any]) -> None:
        older = stacks[:, :-1]
        if row == 0:
            envs = np.arange(len(stacks), dtype=np.int32)
        else:
            same = (older == self._prev).reshape(len(stacks), -1).all(axis=1)
            envs = np.flatnonzero(~same).astype(np.int32)
        if len(envs):
            self._rows.append((row, envs, older[envs].copy()))
        self._prev[:] = stacks[:, 1:]

    def take(self) -> tuple[npt.NDArray[Any], npt.NDArray[np.int32]]:
        rows, self._rows = self._rows, []
        heads = np.concatenate([h for _, _, h in rows])
        at = np.concatenate([np.stack([np.full(len(e), r, np.int32), e], axis=1) for r, e, _ in rows])
        return heads, at


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
    frame_sides = {f"{name}{SIDE}{side}" for name in layout.frame_fields for side in ("heads", "at")}
    unknown_sides = sorted(n for n in fields if SIDE in n and n not in frame_sides)
    if unknown_sides or not frame_sides <= set(fields):
        raise CorruptFile(
            f"sample chunk frame tables are {sorted(n for n in fields if SIDE in n)}; the job's spaces make them "
            f"{sorted(frame_sides)}"
        )
    for name, f in layout.fields.items():
        array = fields[name]
        rows = () if f.per_chunk else (steps + int(f.bootstrap_row),)
        want = (*rows, num_envs, *f.stored_shape)
        if not isinstance(array, np.ndarray) or array.shape != want or array.dtype != f.dtype:
            got = f"{array.shape} {array.dtype}" if isinstance(array, np.ndarray) else type(array).__name__
            made = "the job's model makes" if f.per_chunk else "the job's spaces make"
            raise CorruptChunk(f"sample chunk field {name!r} is {got}; {made} it {want} {f.dtype}", name)
        if (
            array.dtype.kind == "f"
            and not np.isfinite(array[valid] if not (f.bootstrap_row or f.per_chunk) else array).all()
        ):
            raise CorruptChunk(f"sample chunk field {name!r} holds NaN or infinite values", name)
    _check_actions(fields["action"][valid], spaces.action)
    stacks = {name: rebuild_stacks(fields, name, layout.fields[name]) for name in layout.frame_fields}
    leaf = {**fields, **stacks}
    keys = layout.obs_keys
    obs: Obs = leaf["obs"] if keys is None else {key: leaf[f"obs.{key}"] for key in keys}
    return Chunk(
        obs=obs,
        action=fields["action"],
        reward=fields["reward"],
        terminated=fields["done"],
        truncated=fields["truncated"],
        valid=valid,
        extras={name: fields[name] for name in layout.extras},
        policy_version=policy_version,
        state={name.removeprefix(STATE): fields[name] for name in layout.state_fields},
    )


def rebuild_stacks(fields: Mapping[str, Any], name: str, f: FieldLayout) -> npt.NDArray[Any]:
    """The ``[T + 1, N, K, H, W]`` stacks of frame field ``name`` from its frames and heads (see the module docstring).

    Raises:
        CorruptFile: the heads' shapes or positions disagree with the frames and the layout.
    """
    frames, heads, at = fields[name], fields[f"{name}{SIDE}heads"], fields[f"{name}{SIDE}at"]
    rows, num_envs = frames.shape[:2]
    older = (f.frames - 1, *f.shape[1:])
    if not isinstance(heads, np.ndarray) or heads.dtype != f.dtype or heads.ndim != 4 or heads.shape[1:] != older:
        got = f"{heads.shape} {heads.dtype}" if isinstance(heads, np.ndarray) else type(heads).__name__
        raise CorruptFile(f"sample chunk field '{name}{SIDE}heads' is {got}; the job's frames make it [M, *{older}]")
    if not isinstance(at, np.ndarray) or at.dtype.kind not in "iu" or at.shape != (len(heads), 2):
        got = f"{at.shape} {at.dtype}" if isinstance(at, np.ndarray) else type(at).__name__
        raise CorruptFile(f"sample chunk field '{name}{SIDE}at' is {got}; it must be [{len(heads)}, 2] integers")
    at = at.astype(np.int64)
    keys = at[:, 0] * num_envs + at[:, 1]
    in_range = bool(((at[:, 0] >= 0) & (at[:, 0] < rows) & (at[:, 1] >= 0) & (at[:, 1] < num_envs)).all())
    if not in_range or bool((np.diff(keys) <= 0).any()) or len(keys) < num_envs or keys[num_envs - 1] != num_envs - 1:
        raise CorruptFile(
            f"sample chunk field '{name}{SIDE}at' must list (row, env) pairs in order, every env's row 0 first"
        )
    stacks = np.empty((rows, num_envs, *f.shape), dtype=f.dtype)
    stacks[:, :, -1] = frames
    starts = np.searchsorted(at[:, 0], np.arange(rows + 1))
    for row in range(rows):
        if row:
            stacks[row, :, :-1] = stacks[row - 1, :, 1:]
        first, last = starts[row], starts[row + 1]
        if first < last:
            stacks[row, at[first:last, 1], :-1] = heads[first:last]
    return stacks


def _check_actions(actions: npt.NDArray[Any], space: gym.Space[Any]) -> None:
    if not len(actions):
        return
    if isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n) - 1
        if actions.min() < low or actions.max() > high:
            raise CorruptChunk(
                f"sample chunk actions must lie in [{low}, {high}], got {actions.min()}..{actions.max()}", "action"
            )
    elif isinstance(space, gym.spaces.MultiDiscrete):
        starts = space.start.reshape(1, -1)
        highest = starts + space.nvec.reshape(1, -1) - 1
        if (actions < starts).any() or (actions > highest).any():
            raise CorruptChunk("sample chunk actions lie outside the MultiDiscrete action space", "action")
    elif isinstance(space, gym.spaces.MultiBinary):
        if ((actions != 0) & (actions != 1)).any():
            raise CorruptChunk("sample chunk actions must be 0 or 1 (MultiBinary)", "action")
    elif isinstance(space, gym.spaces.Box) and space.dtype.kind == "f" and not np.isfinite(actions).all():
        raise CorruptChunk("sample chunk actions hold NaN or infinite values", "action")
