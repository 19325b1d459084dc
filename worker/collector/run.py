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

from messaging import (
    CodecError,
    ConfirmedPublisher,
    MessagingError,
    MetadataPublisher,
    QueueDecl,
    Settings,
    StreamStopped,
)
from worker.collector.sink import BrokerSink
from worker.errors import WarrenError
from worker.plugins import Algorithm
from worker.protocol import FinishInfo, InfoItem, StartTask
from worker.rl.envs import VecEnvBatch
from worker.rl.rollout import Rollout
from worker.storage import FileStamp, PolicySnapshot, PolicyStore, StepStore

logger = logging.getLogger(__name__)

#: How long the last info of a failed or aborted task, and the data before it, wait for the
#: broker's confirms (for room in a full metadata queue).
FINAL_INFO_WAIT_S = 5.0


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
        transport: broker settings for the task's own link.
        metadata: the task's metadata queue.
        steps: where step files go.
        policies: where policy files come from.
        policy_wait_s: how long to wait for the first policy.
        algorithm: the task's algorithm, bound to its model and spaces.
        envs: the env batch the task steps.
        owns_envs: close ``envs`` when the task ends (eval tasks); else the worker keeps
            them for its next collect task.
    """

    def __init__(
        self,
        start: StartTask,
        *,
        transport: Settings,
        role: str,
        metadata: QueueDecl,
        steps: StepStore,
        policies: PolicyStore,
        policy_wait_s: float,
        stall_timeout_s: float,
        algorithm: Algorithm,
        envs: VecEnvBatch,
        owns_envs: bool = False,
    ) -> None:
        self.start_task = start
        self.metadata = metadata
        self.stop = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self.orphaned = False
        """The task's reader is gone (its metadata queue was deleted or stayed full): nobody will close it."""
        self.finished_at: float | None = None
        self._stall_timeout_s = stall_timeout_s
        self._transport = transport
        self._role = role
        self._steps = steps
        self._policies = policies
        self._policy_wait_s = policy_wait_s
        self._algorithm = algorithm
        self._envs = envs
        self._owns_envs = owns_envs
        self._rollout: Rollout | None = None
        self._sink: BrokerSink | None = None
        self._aborted = False
        self._thread = threading.Thread(target=self._main, name=f"collector-{start.task_id}", daemon=True)

    @property
    def task_id(self) -> str:
        return self.start_task.task_id

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float) -> FinishInfo:
        """Stop the rollout after its current step and return DI-engine's ``finish_info``."""
        self.stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "task %s did not stop within %.0f s (stuck in env or plug-in code?)", self.task_id, timeout_s
            )
        return self.finish_info()

    @property
    def stuck(self) -> bool:
        """Asked to stop, and still running: its thread is caught in env or plug-in code."""
        return self.stop.is_set() and self._thread.is_alive()

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
        confirmed = ConfirmedPublisher(self._transport, self._role, stall_timeout_s=self._stall_timeout_s)
        try:
            publisher = MetadataPublisher(confirmed.open(), self.metadata, stop=self.stop)
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
            confirmed.close(FINAL_INFO_WAIT_S)
            if self._owns_envs:
                self._envs.close()
            self.finished_at = time.monotonic()
            self.finished.set()

    def _collect(self, publisher: MetadataPublisher) -> None:
        start = self.start_task
        sink = BrokerSink(self._steps, publisher, task_id=start.task_id, buffer_id=start.buffer_id)
        self._sink = sink
        source = None
        if start.cfg.policy_update_path is not None:
            numpy = self._algorithm.weights_format == "numpy"
            source = FilePolicySource(self._policies, start.cfg.policy_update_path, numpy=numpy)
        self._rollout = Rollout(
            start.cfg, self._algorithm, self._envs, sink, source, stop=self.stop, policy_wait_s=self._policy_wait_s
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
            logger.error("task %s failed: %s", start.task_id, exc.message)
            self._final_info(publisher, aborted=False)
            return
        except Exception as exc:  # a bug in env or policy code must not kill the worker
            self.error = f"{type(exc).__name__}: {exc}"
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
