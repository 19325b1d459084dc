"""One collector task running on its own thread, with its own broker link.

The task thread owns everything the rollout touches (envs, policy, its publishing
connection), so the worker's consuming thread never waits on environment steps and
pika connections never cross threads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from messaging import (
    CodecError,
    ConfirmedPublisher,
    MessagingError,
    MetadataPublisher,
    QueueDecl,
    StreamStopped,
)
from worker.collector.publishers import KeptPublisher
from worker.collector.sink import BrokerSink
from worker.errors import PluginFailed, WarrenError
from worker.plugins import Algorithm, Spaces
from worker.plugins.faults import TaskPlugins
from worker.protocol import FinishInfo, InfoItem, StartTask
from worker.rl.envs import VecEnvBatch
from worker.rl.rollout import Rollout
from worker.storage import FileStamp, PolicySnapshot, PolicyStore, StepStore

logger = logging.getLogger(__name__)

#: How long the last info of a failed or aborted task, and the data before it, wait for the
#: broker's confirms (for room in a full metadata queue).
FINAL_INFO_WAIT_S = 5.0
#: A task asked to stop whose plug-in call has run this long, and ten times as long as its
#: slowest call before, is hung in it: it is not waited for (a close or a shutdown would
#: otherwise wait out the whole grace for a call that never returns).
HUNG_CALL_S = 10.0
HUNG_CALL_FACTOR = 10.0


class FilePolicySource:
    """Reads the newest policy file, and only when it changed since the last read."""

    def __init__(self, store: PolicyStore, name: str, *, numpy: bool = False) -> None:
        self.store = store
        self.name = name
        self.numpy = numpy
        """Load the arrays as numpy arrays (the actor's ``weights_format`` is numpy): no torch import."""
        self._stamp: FileStamp | None = None

    def read(self) -> PolicySnapshot | None:
        snapshot, self._stamp = self.store.read_if_changed(self.name, self._stamp, numpy=self.numpy)
        return snapshot


class CollectorRun:
    """A started ``collector_start_task``: its thread, its stop switch and its outcome.

    Args:
        start: the validated start task.
        publishers: the worker's publisher, kept from task to task.
        metadata: the task's metadata queue.
        steps: where step files go.
        policies: where policy files come from.
        policy_wait_s: how long to wait for the first policy.
        algorithm: the task's algorithm, bound to its model and spaces.
        envs: the env batch the task steps.
        owns_envs: close ``envs`` when the task ends (eval tasks); else the worker keeps
            them for its next collect task.
        plugins: the task's plug-ins, which its failures name.
        on_ended: called on the task's thread as its last act, once the task is over (done,
            failed or stopped) and its envs are no longer stepped.
    """

    def __init__(
        self,
        start: StartTask,
        *,
        publishers: KeptPublisher,
        metadata: QueueDecl,
        steps: StepStore,
        policies: PolicyStore,
        policy_wait_s: float,
        algorithm: Algorithm,
        envs: VecEnvBatch,
        owns_envs: bool = False,
        plugins: TaskPlugins | None = None,
        on_ended: Callable[[CollectorRun], None] | None = None,
    ) -> None:
        self.start_task = start
        self._on_ended = on_ended
        self.metadata = metadata
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self.orphaned = False
        """The task's reader is gone (its metadata queue was deleted or stayed full): nobody will close it."""
        self.finished_at: float | None = None
        self._publishers = publishers
        self._steps = steps
        self._policies = policies
        self._policy_wait_s = policy_wait_s
        self._algorithm = algorithm
        self._envs = envs
        self._owns_envs = owns_envs
        self._plugins = plugins
        self.envs_suspect = False
        """Plug-in code failed while the task ran: its envs may be broken, so they are not used again."""
        self._rollout: Rollout | None = None
        self._sink: BrokerSink | None = None
        self._aborted = False
        self._thread = threading.Thread(target=self._main, name=f"collector-{start.task_id}", daemon=True)

    @property
    def task_id(self) -> str:
        return self.start_task.task_id

    @property
    def spaces(self) -> Spaces:
        """The spaces of the task's env (its start reply carries them)."""
        return self._envs.spaces

    def start(self) -> None:
        self._thread.start()

    @property
    def envs(self) -> VecEnvBatch:
        return self._envs

    def close(self, timeout_s: float) -> FinishInfo:
        """Stop the rollout after its current step and return DI-engine's ``finish_info``.

        Waits up to ``timeout_s`` for the current step to end, less for a plug-in call that
        is hung (:data:`HUNG_CALL_S`): the task is then stuck, and its finish info says in
        which plug-in and call.
        """
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and time.monotonic() < deadline and not self._hung():
            self._thread.join(min(0.1, max(0.0, deadline - time.monotonic())))
        if self._thread.is_alive():
            calling = self._rollout.in_call() if self._rollout is not None else None
            if calling is None:
                logger.warning("task %s did not stop within %.0f s", self.task_id, timeout_s)
            else:
                what, running_s, _ = calling
                if self.error is None:
                    self.error = f"{what}: did not return in {running_s:.0f} s (hung)"
                logger.warning("task %s is stuck: %s has not returned in %.0f s", self.task_id, what, running_s)
        return self.finish_info()

    def _hung(self) -> bool:
        """Whether the task is in a plug-in call that has run too long to be only a slow one."""
        calling = self._rollout.in_call() if self._rollout is not None else None
        if calling is None:
            return False
        _, running_s, slowest_s = calling
        return running_s >= max(HUNG_CALL_S, HUNG_CALL_FACTOR * slowest_s)

    @property
    def stuck(self) -> bool:
        """Asked to stop, and still running: its thread is caught in env or plug-in code.

        Not once :attr:`finished` is set: the thread is past its envs then, only ending
        (its last act, ``on_ended``, asks this while a close may already have set ``stop``).
        """
        return self.stop.is_set() and self._thread.is_alive() and not self.finished.is_set()

    def abort(self, timeout_s: float) -> None:
        """Stop for a worker shutdown: the final info says the task was aborted, not done."""
        self._aborted = True
        self.close(timeout_s)

    def written(self) -> list[str]:
        """Data ids of the step files the task wrote (so that a cancelled task can remove them)."""
        return list(self._sink.written) if self._sink is not None else []

    def finish_info(self) -> FinishInfo:
        if self._rollout is not None:
            info = self._rollout.finish_info()
        else:  # stopped before its rollout began
            info = FinishInfo.measured(
                eval_flag=self.start_task.cfg.eval_flag,
                env_num=self.start_task.cfg.env.env_num,
                duration=0.0,
                train_iter=0,
                collector_done=False,
                predefined_episode_count=0,
                steps=0,
                samples=0,
                returns=[],
            )
        # A failed task is over (its final info says collector_done: true); an aborted one is not.
        done = info.collector_done or (self.error is not None and not self._aborted)
        return dataclasses.replace(info, collector_done=done, error=self.error, task_id=self.task_id)

    # -- the task thread ------------------------------------------------------------

    def _main(self) -> None:
        confirmed: ConfirmedPublisher | None = None
        try:
            confirmed = self._publishers.take()
            publisher = MetadataPublisher(confirmed, self.metadata, stop=self.stop)
            self._collect(publisher)
            if self._aborted:
                self._final_info(publisher, aborted=True)
        except MessagingError as exc:
            # The task thread lost the broker for longer than a reconnect budget: the
            # coordinator will have given the task up, so free the worker for a new one.
            self.error = f"broker: {exc.message}"
            self.orphaned = True
            logger.error("task %s lost its broker link: %s", self.task_id, exc.message)
        finally:
            if confirmed is not None:
                self._publishers.give_back(confirmed, self.metadata.name, sound=not self.orphaned)
            if self._owns_envs:
                self._envs.close()
            self.finished_at = time.monotonic()
            self.finished.set()
            if self._on_ended is not None:
                self._on_ended(self)

    def _collect(self, publisher: MetadataPublisher) -> None:
        start = self.start_task
        sink = BrokerSink(self._steps, publisher, task_id=start.task_id, buffer_id=start.buffer_id)
        self._sink = sink
        source = None
        if start.cfg.policy_update_path is not None:
            numpy = self._algorithm.weights_format == "numpy"
            source = FilePolicySource(self._policies, start.cfg.policy_update_path, numpy=numpy)
        self._rollout = Rollout(
            start.cfg,
            self._algorithm,
            self._envs,
            sink,
            source,
            stop=self.stop,
            policy_wait_s=self._policy_wait_s,
            plugins=self._plugins,
        )
        logger.info("task %s started (%s)", start.task_id, "eval" if start.cfg.eval_flag else "collect")
        try:
            self._rollout.run()
        except StreamStopped:
            logger.info("task %s stopped while its metadata queue was full", start.task_id)
        except CodecError as exc:
            # Something the task produced cannot be encoded: a failure of the task itself.
            self.error = exc.message
            logger.error("task %s failed: %s", start.task_id, exc.message)
            self._final_info(publisher, aborted=False)
            return
        except MessagingError as exc:
            # Deleted or never-drained metadata queue: the coordinator gave this task up.
            self.error = exc.message
            self.orphaned = True
            logger.warning("task %s abandoned: %s", start.task_id, exc.message)
            return
        except WarrenError as exc:
            # The coordinator learns of the failure from the stream: a final info marked done,
            # carrying the error, so it closes the task instead of waiting for data forever.
            self.error = exc.message
            # After plug-in code failed, its envs are in a state nobody knows: not used again.
            self.envs_suspect = isinstance(exc, PluginFailed)
            # The traceback of a plug-in's exception, for its author (the error has its first line).
            logger.error("task %s failed: %s", start.task_id, exc.message, exc_info=self.envs_suspect)
            self._final_info(publisher, aborted=False)
            return
        except Exception as exc:  # a bug in env or policy code must not kill the worker
            self.error = f"{type(exc).__name__}: {exc}"
            self.envs_suspect = True
            logger.exception("task %s crashed", start.task_id)
            self._final_info(publisher, aborted=False)
            return
        info = self._rollout.finish_info()
        logger.info(
            "task %s ended: %d steps, %d samples, %d episodes, reward_mean %.1f",
            start.task_id,
            info.step_count,
            info.sample_count,
            info.real_episode_count,
            info.reward_mean,
        )

    def _final_info(self, publisher: MetadataPublisher, *, aborted: bool) -> None:
        info = self.finish_info()
        message = InfoItem(
            collector_done=not aborted,
            cur_episode=info.real_episode_count,
            cur_sample=info.sample_count,
            cur_step=info.step_count,
            task_id=self.task_id,
            buffer_id=self.start_task.buffer_id,
            eval_flag=self.start_task.cfg.eval_flag,
            error=self.error,
            aborted=aborted,
        )
        # The run's stop switch is set by now; the final info gets its own, bounded patience
        # (a coordinator reading the stream makes room within moments): first for the data
        # before it, which it must not overtake, then for itself.
        deadline = time.monotonic() + FINAL_INFO_WAIT_S
        try:
            publisher.publisher.flush(FINAL_INFO_WAIT_S)
            publisher.publish(message.to_wire(), headers={"kind": "info"})
            publisher.publisher.flush(max(0.0, deadline - time.monotonic()))
        except (StreamStopped, MessagingError) as exc:
            logger.warning("task %s: final info not published: %s", self.task_id, exc)
