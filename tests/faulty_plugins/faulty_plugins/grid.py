"""The ``grid`` env plug-in: a corridor gridworld, and the faults an env plug-in can have.

The agent walks left or right along ``size`` cells towards a goal at one end; it sees its
position and the goal's (a ``Box``) and which side the goal is on (a ``Discrete``), as one
``Dict`` observation. Reaching the goal pays 1 and ends the episode; each step costs 0.05.

The env id picks the fault, from the ``fail_after``-th step of an env on (``[env.kwargs]``):

* ``grid``: none.
* ``grid-raises``: every step raises.
* ``grid-breaks``: one env of the process raises once at the process's ``fail_after``-th env
  step (and again every ``break_every`` steps after, if given), and is broken from then on:
  each later step or reset raises. Envs made after it work.
* ``grid-bad-obs``: positions of three numbers, where the space says two.
* ``grid-nan``: NaN positions.
* ``grid-hangs``: a step that never returns.
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np

from warren.plugins import EnvContext, EnvPlugin

FAULTS = ("raises", "breaks", "bad-obs", "nan", "hangs")

#: Env steps taken by every ``grid-breaks`` env of this process, and when the next one breaks.
_process = {"steps": 0, "next_break": -1}
_process_lock = threading.Lock()


class GridEnv(gym.Env[dict[str, Any], int]):
    """One corridor; ``fault`` is one of :data:`FAULTS` or empty."""

    def __init__(self, fault: str = "", size: int = 6, fail_after: int = 0, break_every: int = 0) -> None:
        self.fault, self.size, self.fail_after, self.break_every = fault, size, fail_after, break_every
        self.observation_space = gym.spaces.Dict(
            {
                "pos": gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32),
                "goal_side": gym.spaces.Discrete(2),
            }
        )
        self.action_space = gym.spaces.Discrete(2)  # type: ignore[assignment]  # gymnasium's generic Space
        self._agent = self._goal = self._t = self._steps = 0
        self._broken = False
        if fault == "breaks":
            with _process_lock:
                if _process["next_break"] < 0:
                    _process["next_break"] = fail_after

    def _observe(self) -> dict[str, Any]:
        scale = self.size - 1
        pos = np.array([self._agent / scale, self._goal / scale], dtype=np.float32)
        if self._faulty("bad-obs"):
            pos = np.append(pos, np.float32(0.5))
        if self._faulty("nan"):
            pos[:] = np.nan
        return {"pos": pos, "goal_side": int(self._goal > 0)}

    def _faulty(self, fault: str) -> bool:
        return self.fault == fault and self._steps >= self.fail_after

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        if self._broken:
            raise RuntimeError("grid env is broken since an earlier step failed")
        self._goal = int(self.np_random.integers(2)) * (self.size - 1)
        self._agent = int(self.np_random.integers(1, self.size - 1))
        self._t = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self._broken:
            raise RuntimeError("grid env is broken since an earlier step failed")
        if self._faulty("raises"):
            raise RuntimeError(f"grid step {self._steps}: the simulator lost its state")
        if self._faulty("hangs"):
            threading.Event().wait()  # never set: the call never returns
        if self.fault == "breaks":
            self._maybe_break()
        self._steps += 1
        self._t += 1
        self._agent = min(self.size - 1, max(0, self._agent + (1 if int(action) == 1 else -1)))
        reached = self._agent == self._goal
        return self._observe(), (1.0 if reached else -0.05), reached, self._t >= 4 * self.size, {}

    def _maybe_break(self) -> None:
        with _process_lock:
            _process["steps"] += 1
            due = 0 <= _process["next_break"] <= _process["steps"]
            if due:
                _process["next_break"] = _process["steps"] + self.break_every if self.break_every > 0 else -2
        if due:
            self._broken = True
            raise RuntimeError(f"grid step {self._steps}: a cell went missing (process step {_process['steps']})")


class GridEnvs(EnvPlugin):
    """The env plug-in: ``env.id`` is ``grid`` or ``grid-<fault>``; ``[env.kwargs]`` go to :class:`GridEnv`."""

    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        fault = ctx.env_id.removeprefix("grid").removeprefix("-")
        if ctx.env_id != "grid" and fault not in FAULTS:
            raise ValueError(
                f"the grid plug-in makes 'grid' and 'grid-<fault>' ({', '.join(FAULTS)}), not {ctx.env_id!r}"
            )
        return GridEnv(fault, **dict(ctx.kwargs))
