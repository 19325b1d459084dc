"""The collector loop: run a policy in a batch of envs and hand chunks of samples to a sink.

This is DI-engine's ``ZerglingParallelCollector`` without the transport: where the data
goes (:class:`SampleSink`) and where the weights come from (:class:`PolicySource`) are
narrow interfaces in the style of acme's ``Adder`` and ``VariableClient``, so this
module knows nothing about RabbitMQ or files and runs the same in tests.

Unlike DI-engine, samples travel in chunks of up to ``traj_len`` transitions per env,
as stacked numpy arrays (one array per field): they encode far faster than one dict
per step.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from worker.errors import CollectorError, PolicyUnavailable, StorageError, TaskError, UnsafePath
from worker.protocol import CollectorSpec, FinishInfo
from worker.rl.envs import EnvBatch, EnvStep
from worker.rl.policy import DQNPolicy, RandomPolicy, limit_torch_threads, make_policy
from worker.storage.policies import PolicySnapshot

logger = logging.getLogger(__name__)

#: Seconds between two reads of a policy source that has no policy yet.
POLICY_POLL_S = 0.5


class SampleSink(Protocol):
    """Where collected data goes (a publisher, a replay buffer, a test list)."""

    def add_samples(self, env_id: int, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Take one chunk of one env's transitions; the sink assigns its ``data_id``."""
        ...

    def add_info(self, info: dict[str, Any]) -> None:
        """Take a collector-info dict (sent after steps in which an episode ended)."""
        ...


class PolicySource(Protocol):
    """Where policy weights come from (the shared policy file, or the learner in-process)."""

    def read(self) -> PolicySnapshot | None:
        """The newest policy, or ``None`` while no policy exists yet."""
        ...


class _TrajBuffer:
    """Preallocated transitions of one env, flushed as one chunk of stacked arrays."""

    def __init__(self, capacity: int, obs_dim: int) -> None:
        self.capacity = capacity
        self.size = 0
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.done = np.zeros(capacity, dtype=bool)
        self.truncated = np.zeros(capacity, dtype=bool)

    def add(self, obs: npt.NDArray[np.float32], action: int, step: EnvStep) -> None:
        k = self.size
        self.obs[k], self.next_obs[k], self.action[k] = obs, step.next_obs, action
        self.reward[k], self.done[k], self.truncated[k] = step.reward, step.terminated, step.truncated
        self.size += 1

    def take(self) -> dict[str, np.ndarray]:
        k, self.size = self.size, 0
        # Copies: the sink may keep the arrays while this buffer is refilled.
        return {
            "obs": self.obs[:k].copy(),
            "next_obs": self.next_obs[:k].copy(),
            "action": self.action[:k].copy(),
            "reward": self.reward[:k].copy(),
            "done": self.done[:k].copy(),
            "truncated": self.truncated[:k].copy(),
        }


@contextlib.contextmanager
def _failures_as(what: str) -> Iterator[None]:
    # Env and policy code can raise anything; the worker must see a TaskError to reply
    # ``ok: false`` and keep serving. Our own TaskErrors already say what went wrong.
    try:
        yield
    except TaskError:
        raise
    except Exception as exc:
        raise CollectorError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


class Rollout:
    """One collect or eval task, run to completion by :meth:`run`.

    Args:
        spec: the validated task.
        sink: receives sample chunks and collector infos, in that order within a step.
        policy_source: where ``dqn`` weights come from; unused by ``random`` policies.
        stop: set it to end :meth:`run` after the current env step (warm shutdown).
        policy_wait_s: how long to wait for the first policy before giving up.
        clock: monotonic seconds; injectable for tests.
        envs: an env batch kept alive by the caller across collect tasks, so that
            episodes continue where the previous task left them instead of restarting
            (short tasks on fresh envs would only ever see the first steps of each
            episode). Not closed by the rollout. ``None``: a fresh batch per task.

    Raises:
        ValueError: a ``dqn`` task without a policy source.
    """

    def __init__(
        self,
        spec: CollectorSpec,
        sink: SampleSink,
        policy_source: PolicySource | None = None,
        *,
        stop: threading.Event,
        policy_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        envs: EnvBatch | None = None,
    ) -> None:
        if spec.policy.type == "dqn" and policy_source is None:
            raise ValueError("a dqn rollout needs a policy source")
        if envs is not None and (envs.env_id != spec.env.id or len(envs) != spec.env.env_num):
            raise ValueError(
                f"envs are {len(envs)} x {envs.env_id!r}, the task wants {spec.env.env_num} x {spec.env.id!r}"
            )
        self._envs = envs
        self._spec, self._sink, self._source = spec, sink, policy_source
        self._stop, self._policy_wait_s, self._clock = stop, policy_wait_s, clock
        n = spec.env.env_num
        self._active = np.ones(n, dtype=bool)
        self._episodes_per_env = np.zeros(n, dtype=np.int64)
        self._bufs: list[_TrajBuffer] = []
        self._returns: list[float] = []
        self._step_count = self._sample_count = self._episode_count = 0
        self._policy_iter = 0
        self._policy_error: str | None = None
        self._collector_done = False
        self._started_at: float | None = None
        self._ended_at: float | None = None

    # -- public API ------------------------------------------------------------------

    def run(self) -> None:
        """Collect until the task is done or ``stop`` is set; a Rollout runs once.

        Raises:
            TaskError: unknown env id or bad env (from the env batch).
            PolicyUnavailable: no policy within ``policy_wait_s``.
            CollectorError: an env, the policy or the policy source failed.
        """
        if self._started_at is not None:
            raise RuntimeError("a Rollout can run only once")
        self._started_at = self._clock()
        try:
            self._run()
        finally:
            self._ended_at = self._clock()

    def finish_info(self) -> FinishInfo:
        """DI-engine's collector ``finish_info``: counters, timings and episode returns.

        Safe to call at any time, from any thread.
        """
        spec = self._spec
        start = self._started_at
        end = self._ended_at if self._ended_at is not None else self._clock()
        return FinishInfo.measured(
            eval_flag=spec.eval_flag,
            env_num=spec.env.env_num,
            duration=float(end - start) if start is not None else 0.0,
            train_iter=self._policy_iter,
            collector_done=self._collector_done,
            predefined_episode_count=spec.env.env_num * (spec.n_episode or 0),
            steps=self._step_count,
            samples=self._sample_count,
            returns=list(self._returns),
            collect_setting=None if spec.eval_flag else dict(spec.collect_setting or {}),
        )

    # -- setup -----------------------------------------------------------------------

    def _run(self) -> None:
        spec = self._spec
        envs = self._envs
        if envs is None:
            with _failures_as(f"creating env {spec.env.id!r}"):
                envs = EnvBatch(spec.env.id, spec.env.env_num, spec.env.seed)
        try:
            policy = make_policy(spec.policy, envs.observation_space, envs.action_space, envs.spawn_seed())
            if isinstance(policy, DQNPolicy):
                limit_torch_threads(1)
                snapshot = self._wait_first_policy()
                if snapshot is None:
                    return  # stopped while waiting
                self._load(policy, snapshot)
            self._bufs = [_TrajBuffer(spec.traj_len, envs.obs_dim) for _ in range(len(envs))]
            # Eval tasks measure whole episodes, so they always start fresh ones.
            if envs.needs_reset or spec.eval_flag:
                with _failures_as(f"resetting env {spec.env.id!r}"):
                    envs.reset()
            self._loop(envs, policy)
        finally:
            if self._envs is None:
                envs.close()

    def _read_policy(self) -> PolicySnapshot | None:
        if self._source is None:
            return None
        with _failures_as("reading the policy"):
            try:
                return self._source.read()
            except UnsafePath as exc:  # will not fix itself: fail the task
                raise CollectorError(f"cannot read the policy: {exc.message}") from exc
            except StorageError as exc:
                # Most likely caught the learner mid-write; the next read will do.
                logger.warning("policy read failed, will retry: %s", exc.message)
                self._policy_error = exc.message
                return None

    def _wait_first_policy(self) -> PolicySnapshot | None:
        deadline = self._clock() + self._policy_wait_s
        while (snapshot := self._read_policy()) is None:
            remaining = deadline - self._clock()
            if remaining <= 0:
                found = f": {self._policy_error}" if self._policy_error else ""
                raise PolicyUnavailable(
                    f"no usable policy file at {self._spec.policy_update_path} after {self._policy_wait_s:g} s{found}"
                )
            if self._stop.wait(min(POLICY_POLL_S, remaining)):
                return None
        return snapshot

    def _load(self, policy: DQNPolicy, snapshot: PolicySnapshot) -> None:
        policy.load_state_dict(snapshot.state_dict)
        self._policy_iter = int(snapshot.iter)

    # -- the loop --------------------------------------------------------------------

    def _loop(self, envs: EnvBatch, policy: DQNPolicy | RandomPolicy) -> None:
        spec = self._spec
        eps = 0.0 if spec.eval_flag else (spec.eps or 0.0)
        # Eval tasks keep the policy they started with (as in DI-engine).
        reloadable = policy if isinstance(policy, DQNPolicy) and not spec.eval_flag else None
        next_reload = self._clock() + spec.update_policy_second
        while not self._stop.is_set():
            if reloadable is not None and self._clock() >= next_reload:
                if (snapshot := self._read_policy()) is not None:
                    self._load(reloadable, snapshot)
                next_reload = self._clock() + spec.update_policy_second
            ids = np.flatnonzero(self._active)
            obs = envs.obs[ids]
            with _failures_as("policy forward pass"):
                actions = policy.act(obs, eps)
            with _failures_as(f"stepping env {spec.env.id!r}"):
                steps = envs.step(ids, actions)
            episode_ended = False
            for o, a, step in zip(obs, actions, steps, strict=True):
                episode_ended |= self._record(o, int(a), step)
            done = self._check_done()
            if episode_ended or done:
                self._collector_done = done
                self._sink.add_info(self._collector_info())
            if done:
                return

    def _record(self, obs: npt.NDArray[np.float32], action: int, step: EnvStep) -> bool:
        """Count one env's step, buffer its transition, flush if due; True if an episode ended."""
        spec, i = self._spec, step.env_id
        self._step_count += 1
        if not spec.eval_flag:
            self._bufs[i].add(obs, action, step)
        if step.episode_return is not None:
            self._episode_count += 1
            self._episodes_per_env[i] += 1
            self._returns.append(step.episode_return)
            if spec.n_episode is not None and self._episodes_per_env[i] >= spec.n_episode:
                self._active[i] = False  # this env has done its share; stop stepping it
        if not spec.eval_flag and (step.episode_end or self._bufs[i].size >= spec.traj_len):
            self._flush(i)
        return step.episode_end

    def _check_done(self) -> bool:
        spec = self._spec
        if spec.n_sample is not None:
            buffered = sum(buf.size for buf in self._bufs)
            if self._sample_count + buffered >= spec.n_sample:
                self._flush_all()  # enough transitions exist: ship them now, not at traj_len
                return True
        if spec.n_episode is not None and not self._active.any():
            return True
        if self._step_count >= spec.max_env_steps:
            logger.warning("task hit max_env_steps=%d before its finish condition", spec.max_env_steps)
            self._flush_all()
            return True
        return False

    def _flush_all(self) -> None:
        for i, buf in enumerate(self._bufs):
            if buf.size:
                self._flush(i)

    def _flush(self, env_id: int) -> None:
        samples = self._bufs[env_id].take()
        k = len(samples["action"])
        self._sample_count += k
        meta = {
            "eval_flag": self._spec.eval_flag,
            "env_id": env_id,
            "policy_iter": self._policy_iter,
            "unroll_len": k,
            "compressor": "none",
            "get_data_time": time.time(),
            "priority": 1.0,
            **self._counters(),
        }
        self._sink.add_samples(env_id, samples, meta)

    def _collector_info(self) -> dict[str, Any]:
        return {
            "eval_flag": self._spec.eval_flag,
            "get_info_time": time.time(),
            "collector_done": self._collector_done,
            **self._counters(),
        }

    def _counters(self) -> dict[str, int]:
        return {"cur_episode": self._episode_count, "cur_sample": self._sample_count, "cur_step": self._step_count}
