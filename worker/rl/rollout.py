"""The collector loop: run a policy in a batch of envs and hand chunks of samples to a sink.

This is DI-engine's ``ZerglingParallelCollector`` without the transport: where the data
goes (:class:`SampleSink`) and where the weights come from (:class:`PolicySource`) are
narrow interfaces in the style of acme's ``Adder`` and ``VariableClient``, so this
module knows nothing about RabbitMQ or files and runs the same in tests. What acts is
the algorithm plug-in's :class:`~worker.plugins.Actor`.

Unlike DI-engine, samples travel as columnar chunks (:mod:`worker.rl.chunks`): ``T``
steps of all ``N`` envs of the batch in one array per field, one chunk per step file
and metadata message, instead of one message per env and trajectory.

It is one piece, over 400 lines: the loop, its policy reads, its checks of what plug-in
code returns and the shipping of chunks all run on the rollout's one thread and share its
counters and its state; what could live apart already does (chunks, envs, the sink).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from worker.errors import CollectorError, PluginFailed, PolicyUnavailable, StorageError, TaskError, UnsafePath
from worker.plugins.contract import Actor, Algorithm
from worker.plugins.faults import PluginRef, TaskPlugins, blame, exception_problem, fault_line
from worker.protocol import CollectorSpec, FinishInfo
from worker.rl.chunks import ChunkBuffer, ChunkLayout
from worker.rl.envs import VecEnvBatch, VecStep
from worker.storage.policy_format import PolicySnapshot

logger = logging.getLogger(__name__)

#: Seconds between two reads of a policy source that has no policy yet.
POLICY_POLL_S = 0.05


#: A chunk older than this is shipped even if not full: with a slow env or a paced
#: collector, data still reaches the learner within this long.
CHUNK_MAX_AGE_S = 0.5
#: The same for chunks of frame stacks: each carries the whole stacks of its first row
#: (:mod:`worker.rl.chunks`), so a chunk cut short by age costs bytes. At Pong's ~80 vector
#: steps/s a 128-row chunk takes 1.6 s; 0.5 s chunks would add 5 % to every step's bytes.
FRAME_CHUNK_MAX_AGE_S = 2.0


class SampleSink(Protocol):
    """Where collected data goes (a publisher, a replay buffer, a test list)."""

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Take one chunk (fields ``[T, N, ...]``); the sink assigns its ``data_id``."""
        ...

    def add_info(self, info: dict[str, Any]) -> None:
        """Take a collector-info dict (after chunks in which an episode ended, and at the end)."""
        ...


class PolicySource(Protocol):
    """Where policy weights come from (the shared policy file, or the learner in-process)."""

    def read(self) -> PolicySnapshot | None:
        """The newest policy, or ``None`` while no policy exists yet."""
        ...


@contextlib.contextmanager
def _failures_as(what: str) -> Iterator[None]:
    # What is not one plug-in's call (reading the policy, loading weights that may not fit
    # the actor) can raise anything too; the worker must see a TaskError to reply
    # ``ok: false`` and keep serving. Our own TaskErrors already say what went wrong.
    try:
        yield
    except TaskError:
        raise
    except Exception as exc:
        raise CollectorError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def plugins_of(spec: CollectorSpec) -> TaskPlugins:
    """The task's plug-ins as the task names them (a collector that has them adds their packages)."""
    policy = spec.policy
    return TaskPlugins(
        env=PluginRef("env", spec.env.plugin or "gymnasium", spec.env.plugin_version or "?", env_id=spec.env.id),
        algorithm=PluginRef("algorithm", policy.type, policy.version or "?"),
        model=PluginRef("model", policy.model, policy.model_version or "?") if policy.model else None,
    )


class Rollout:
    """One collect or eval task, run to completion by :meth:`run`.

    Args:
        spec: the validated task.
        algorithm: the task's algorithm, bound to its model and the job's spaces.
        envs: the env batch to step, made for this task or kept alive by the caller across
            collect tasks, so that episodes continue where the previous task left them
            instead of restarting (short tasks on fresh envs would only ever see the first
            steps of each episode). Not closed by the rollout.
        sink: receives chunks and collector infos, a chunk's info after the chunk.
        policy_source: where the weights come from; unused by algorithms that learn nothing.
        stop: set it to end :meth:`run` after the current env step (warm shutdown); the
            partly filled chunk is shipped first.
        policy_wait_s: how long to wait for the first usable policy before giving up.
        clock: monotonic seconds; injectable for tests.
        plugins: the task's plug-ins, which its failures name (by default as ``spec`` names them).

    Raises:
        ValueError: a learning algorithm without a policy source, or envs that do not fit the task.
    """

    def __init__(
        self,
        spec: CollectorSpec,
        algorithm: Algorithm,
        envs: VecEnvBatch,
        sink: SampleSink,
        policy_source: PolicySource | None = None,
        *,
        stop: threading.Event,
        policy_wait_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        plugins: TaskPlugins | None = None,
    ) -> None:
        if algorithm.kind != "none" and policy_source is None:
            raise ValueError(f"a {spec.policy.type} rollout needs a policy source")
        if envs.env_id != spec.env.id or len(envs) != spec.env.env_num:
            raise ValueError(
                f"envs are {len(envs)} x {envs.env_id!r}, the task wants {spec.env.env_num} x {spec.env.id!r}"
            )
        self._envs = envs
        self._algorithm = algorithm
        self._digest = algorithm.spaces.digest
        self._spec, self._sink, self._source = spec, sink, policy_source
        self._stop, self._policy_wait_s, self._clock = stop, policy_wait_s, clock
        self._episodes_per_env = np.zeros(spec.env.env_num, dtype=np.int64)
        self._returns: list[float] = []
        self._step_count = self._sample_count = self._episode_count = 0
        self._episodes_unreported = False
        self._policy_iter = 0
        self._policy_error: str | None = None
        self._refused_stamp: tuple[int, str] | None = None
        self._collector_done = False
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._plugins = plugins or plugins_of(spec)
        self._memory = algorithm.memory_columns()
        """The actor's recurrent state per env (empty: an actor without memory)."""
        self._calling: tuple[PluginRef, str, float] | None = None
        """The plug-in call running now, and since when (read from other threads: one tuple, replaced whole)."""
        self._slowest_call_s = 0.0
        """The longest plug-in call that returned: how long a call may take before it looks hung."""

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

    def in_call(self) -> tuple[str, float, float] | None:
        """The plug-in call running now: its description, how long it has run, and the slowest call before it.

        ``None`` between calls. Safe to call from any thread: a task that does not stop is
        reported as stuck in this call (see :class:`~worker.collector.run.CollectorRun`).
        """
        calling = self._calling
        if calling is None:
            return None
        plugin, call, since = calling
        return f"{plugin.describe()}: {call}", self._clock() - since, self._slowest_call_s

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

    def _plugin_call(self, plugin: PluginRef, call: str) -> _PluginCall:
        """Run one call into plug-in code: remembered while it runs, its failure said naming the plug-in.

        Plug-in code can raise anything; the worker must see a TaskError to reply
        ``ok: false`` and keep serving, and the person reading it must see whose code failed
        (:func:`~worker.plugins.faults.fault_line`). A failure while acting is the model's when
        it came out of the model's ``forward``.
        """
        return _PluginCall(self, plugin, call)

    def _call_ended(self, since: float) -> None:
        self._calling = None
        self._slowest_call_s = max(self._slowest_call_s, self._clock() - since)

    def _call_failed(self, plugin: PluginRef, call: str, exc: Exception) -> PluginFailed:
        self._calling = None
        culprit, name = (plugin, call)
        if plugin is self._plugins.algorithm:
            culprit, name = blame(exc, plugin, self._plugins.model, call)
        return PluginFailed(fault_line(culprit, name, exception_problem(exc, culprit)))

    def _run(self) -> None:
        spec = self._spec
        envs = self._envs
        with self._plugin_call(self._plugins.algorithm, "make_actor"):
            actor = self._algorithm.make_actor(envs.spawn_seed())
        if self._algorithm.kind != "none":
            snapshot = self._wait_first_policy(actor)
            if snapshot is None:
                return  # stopped while waiting
        # Eval tasks measure whole episodes, so they always start fresh ones.
        if envs.needs_reset or spec.eval_flag:
            with self._plugin_call(self._plugins.env, "reset"):
                envs.reset()
        self._remember(envs, actor)
        try:
            self._loop(envs, actor)
        finally:
            if self._memory:
                envs.memory = actor.memory()

    def _remember(self, envs: VecEnvBatch, actor: Actor) -> None:
        """An actor with memory starts from the state the envs' last task left (episodes go on), else zeros."""
        if not self._memory:
            return
        zeros = {name: np.zeros((len(envs), *c.shape), dtype=c.dtype) for name, c in self._memory.items()}
        kept = envs.memory
        with self._plugin_call(self._plugins.algorithm, "set_memory"):
            if kept is not None and {k: v.shape for k, v in kept.items()} == {k: v.shape for k, v in zeros.items()}:
                actor.set_memory(kept)
            else:
                actor.set_memory(zeros)

    def _read_policy(self) -> PolicySnapshot | None:
        if self._source is None:
            return None
        with _failures_as("reading the policy"):
            try:
                return self._source.read()
            except UnsafePath as exc:  # will not fix itself: fail the task
                raise CollectorError(f"cannot read the policy: {exc.message}") from exc
            except StorageError as exc:
                # Most likely caught the learner mid-write; the next read will do. Once per
                # distinct failure: a bad first file is read again every POLICY_POLL_S.
                if exc.message != self._policy_error:
                    logger.warning("policy read failed, will retry: %s", exc.message)
                self._policy_error = exc.message
                return None

    def _wait_first_policy(self, actor: Actor) -> PolicySnapshot | None:
        deadline = self._clock() + self._policy_wait_s
        while (snapshot := self._read_policy()) is None or not self._load(actor, snapshot):
            remaining = deadline - self._clock()
            if remaining <= 0:
                found = f": {self._policy_error}" if self._policy_error else ""
                raise PolicyUnavailable(
                    f"no usable policy file at {self._spec.policy_update_path} after {self._policy_wait_s:g} s{found}"
                )
            if self._stop.wait(min(POLICY_POLL_S, remaining)):
                return None
        return snapshot

    def _load(self, actor: Actor, snapshot: PolicySnapshot) -> bool:
        """Give the actor the snapshot's weights; a file that does not fit is refused and the actor keeps its own.

        Returns:
            Whether the weights were loaded.
        """
        problem = self._mismatch(snapshot)
        if problem is None:
            try:
                with _failures_as("loading the policy weights"):
                    actor.load_weights(snapshot.state_dict)
            except CollectorError as exc:
                problem = exc.message
        if problem is not None:
            # Once per file version: the same refused file is read again every period.
            stamp = (snapshot.iter, problem)
            if stamp != self._refused_stamp:
                logger.error("refused policy %s version %d: %s", self._spec.policy_update_path, snapshot.iter, problem)
                self._refused_stamp = stamp
            self._policy_error = problem
            return False
        self._policy_iter = int(snapshot.iter)
        return True

    def _mismatch(self, snapshot: PolicySnapshot) -> str | None:
        meta = snapshot.meta
        algorithm = meta.get("algorithm")
        if algorithm is not None and algorithm != self._spec.policy.type:
            return f"it was written by algorithm {algorithm!r}; this task runs {self._spec.policy.type!r}"
        digest = meta.get("spaces_digest")
        if digest is not None and digest != self._digest:
            return f"its spaces digest {digest} is not the task's {self._digest} (another env, or another env version)"
        return None

    # -- the loop --------------------------------------------------------------------

    def _loop(self, envs: VecEnvBatch, actor: Actor) -> None:
        spec = self._spec
        settings = spec.collect_setting
        explore = not spec.eval_flag
        # Eval tasks keep the policy they started with (as in DI-engine).
        reloadable = actor if self._algorithm.kind != "none" and not spec.eval_flag else None
        chunk = None if spec.eval_flag else ChunkBuffer(self._layout(), spec.traj_len, len(envs))
        max_age = FRAME_CHUNK_MAX_AGE_S if chunk is not None and chunk.layout.frame_fields else CHUNK_MAX_AGE_S
        next_reload = self._clock() + spec.update_policy_second
        while not self._stop.is_set():
            # Policies change only between chunks, so every chunk has one policy version.
            if reloadable is not None and (chunk is None or chunk.filled == 0) and self._clock() >= next_reload:
                if (snapshot := self._read_policy()) is not None:
                    self._load(reloadable, snapshot)
                next_reload = self._clock() + spec.update_policy_second
            obs = envs.obs
            # The state a chunk starts from travels with it (the learner unrolls its sequences from it).
            memory = self._chunk_memory(actor) if self._memory and chunk is not None and chunk.filled == 0 else None
            with self._plugin_call(self._plugins.algorithm, "act"):
                actions, extras = actor.act(obs, explore=explore, settings=settings)
            self._check_finite(actions, extras)
            with self._plugin_call(self._plugins.env, "step"):
                step = envs.step(actions)
            self._count(step)
            if self._memory and not step.valid.all():
                # A reset step: the env's next observation begins an episode, which starts from zeros.
                with self._plugin_call(self._plugins.algorithm, "forget"):
                    actor.forget(~step.valid)
            if chunk is not None:
                chunk.add(obs, actions, extras, step, self._clock(), memory=memory)
            done = self._check_done(chunk)
            if chunk is not None and (done or chunk.full or chunk.age(self._clock()) >= max_age):
                self._ship(chunk)
            if done or (chunk is None and step.ended.any()):
                self._collector_done = done
                self._report()
            if done:
                return
        # Closed or stopped mid-chunk: what was collected so far is shipped, not dropped.
        if chunk is not None:
            self._ship(chunk)

    def _chunk_memory(self, actor: Actor) -> dict[str, np.ndarray]:
        """The actor's state before the chunk's first step, checked against the algorithm's memory columns."""
        with self._plugin_call(self._plugins.algorithm, "memory"):
            memory = actor.memory()
        want = {name: (len(self._envs), *column.shape) for name, column in self._memory.items()}
        got = {name: np.shape(value) for name, value in (memory or {}).items()}
        if got != want:
            raise PluginFailed(
                fault_line(
                    self._plugins.algorithm,
                    "memory",
                    f"returned a state of shapes {got}; its memory_columns make {want}",
                )
            )
        assert memory is not None
        return memory

    def _layout(self) -> ChunkLayout:
        with self._plugin_call(self._plugins.algorithm, "columns"):
            return ChunkLayout.of_algorithm(self._algorithm)

    def _check_finite(self, actions: Any, extras: Mapping[str, Any]) -> None:
        """Refuse to act on NaN: the actor's float outputs (continuous actions, extra columns) must be finite.

        Stepping envs with NaN actions, or shipping NaN log-probabilities to the learner
        (which would skip every chunk), only hides the fault; the task fails instead, naming
        the algorithm and its model.
        """
        for name, values in (("actions", actions), *((f"column {key!r}", value) for key, value in extras.items())):
            array = np.asarray(values)
            if array.dtype.kind == "f" and not bool(np.isfinite(array).all()):
                model = self._plugins.model
                with_model = f" (model {model.name!r} {model.version})" if model is not None else ""
                raise PluginFailed(
                    fault_line(self._plugins.algorithm, "act", f"returned NaN or infinite {name}{with_model}")
                )

    def _count(self, step: VecStep) -> None:
        """Count one vector step; record the returns of the episodes it ended."""
        spec = self._spec
        self._step_count += int(step.valid.sum())
        if not step.ended.any():
            return
        for i in np.flatnonzero(step.ended):
            self._episodes_per_env[i] += 1
            # Every episode end is followed by an info (docs/protocol.md section 5), even one
            # that the task does not count.
            self._episodes_unreported = True
            if spec.n_episode is not None and self._episodes_per_env[i] > spec.n_episode:
                # This env did its share; it steps on with the others until every env has, and its
                # transitions are in the chunks, but its later episodes are not part of the task's
                # episodes and returns (the returns would lean towards short episodes).
                continue
            self._episode_count += 1
            self._returns.append(float(step.episode_returns[i]))

    def _check_done(self, chunk: ChunkBuffer | None) -> bool:
        spec = self._spec
        if spec.n_sample is not None and chunk is not None and self._sample_count + chunk.samples >= spec.n_sample:
            return True
        if spec.n_episode is not None and bool((self._episodes_per_env >= spec.n_episode).all()):
            return True
        if self._step_count >= spec.max_env_steps:
            logger.warning("task hit max_env_steps=%d before its finish condition", spec.max_env_steps)
            return True
        return False

    def _ship(self, chunk: ChunkBuffer) -> None:
        """Hand the chunk to the sink, then (if an episode ended in it) a collector info."""
        rows, samples = chunk.filled, chunk.samples
        if rows == 0:
            return
        self._sample_count += samples
        meta = {
            "eval_flag": False,
            "policy_iter": self._policy_iter,
            "unroll_len": rows,
            "env_num": chunk.num_envs,
            "sample_count": samples,
            "compressor": "none",
            "get_data_time": time.time(),
            "priority": 1.0,
            **self._counters(),
        }
        self._sink.add_chunk(chunk.take(self._envs.obs), meta)
        if self._episodes_unreported:
            self._report()

    def _report(self) -> None:
        self._episodes_unreported = False
        self._sink.add_info(
            {
                "eval_flag": self._spec.eval_flag,
                "get_info_time": time.time(),
                "collector_done": self._collector_done,
                **self._counters(),
            }
        )

    def _counters(self) -> dict[str, int]:
        return {"cur_episode": self._episode_count, "cur_sample": self._sample_count, "cur_step": self._step_count}


class _PluginCall:
    """The context of one plug-in call (see :meth:`Rollout._plugin_call`).

    A class rather than a generator-based context manager: two of these run every vector
    step, and a generator's set-up cost several times the class's there.
    """

    __slots__ = ("call", "plugin", "rollout", "since")

    def __init__(self, rollout: Rollout, plugin: PluginRef, call: str) -> None:
        self.rollout, self.plugin, self.call = rollout, plugin, call
        self.since = 0.0

    def __enter__(self) -> None:
        rollout = self.rollout
        self.since = rollout._clock()
        rollout._calling = (self.plugin, self.call, self.since)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.rollout._call_ended(self.since)
        elif isinstance(exc, TaskError) or not isinstance(exc, Exception):
            self.rollout._calling = None
        else:
            raise self.rollout._call_failed(self.plugin, self.call, exc) from exc
