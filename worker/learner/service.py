"""The learner: data metadata in, step files read, DQN trained, policy files out.

The coordinator forwards every data metadata of the run to ``<prefix>.learner.<buffer_id>``.
The learner reads each named step file from the shared volume (bounded wait, clear error
for a missing or corrupt file), adds its samples to a replay buffer, acks the message,
and deletes the file it no longer needs. Between messages it trains at the configured
replay ratio, and publishes ``{model, iter}`` to the policy file atomically, under the
same lock the collectors read with, at most every ``policy_write_interval_s``.

The train step is the job's bottleneck (collection is paced to the replay ratio), so it
runs :class:`worker.rl.fast_dqn.NumpyDQNLearner`, the numpy twin of the torch reference
``DQNLearner``, on numpy batches from :meth:`ReplayBuffer.sample_arrays`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from messaging import BrokerConnectionError, BrokerLink, MetadataConsumer, MetadataItem, Names
from worker.config import LearnerConfig
from worker.errors import MissingFile, StorageError, TaskError
from worker.protocol import DataItem, read_metadata
from worker.rl.dqn import ReplayBuffer
from worker.rl.envs import make_env
from worker.rl.fast_dqn import NumpyDQNLearner
from worker.rl.policy import limit_torch_threads
from worker.storage import STALE_TEMP_S, PolicyStore, StepStore
from worker.telemetry.learner import LearnerTelemetry  # [telemetry]

logger = logging.getLogger(__name__)

#: Messages taken from the queue per loop turn before training resumes.
_MAX_BATCH = 64
#: Data metadata the broker hands the learner ahead of its acks. Small on purpose: what the
#: learner has not taken yet stays visible as the queue's depth, which is how the
#: coordinator sees that the learner is behind and holds the collectors back.
_PREFETCH = 1
#: data_ids remembered to skip redeliveries of data already learned from.
_RECENT_IDS = 100_000


@dataclass
class LearnerStats:
    items: int = 0
    samples: int = 0
    missing_files: int = 0
    duplicates: int = 0
    corrupt_files: int = 0
    train_steps: int = 0
    policies_written: int = 0
    last_loss: float = 0.0


class Learner:
    """The DQN learner loop; see the module docstring."""

    def __init__(self, config: LearnerConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.job = config.job
        self.stop = stop or threading.Event()
        self.names = Names.of(config.transport)
        self.steps = StepStore(config.path_data)
        self.policies = PolicyStore(config.path_policy)
        obs_dim, n_actions = _env_dims(self.job.env.id)
        spec = self.job.learner
        self.buffer = ReplayBuffer(spec.replay_capacity, obs_dim, n_actions=n_actions)
        self.learner = NumpyDQNLearner(spec, obs_dim, n_actions, seed=self.job.env.seed)
        self.rng = np.random.default_rng(self.job.env.seed)
        self.stats = LearnerStats()
        self.telemetry = LearnerTelemetry.from_config(config)  # [telemetry] metrics and TensorBoard, off by default
        self._train_credit = 0.0
        self._recent: set[str] = set()
        self._recent_order: collections.deque[str] = collections.deque()
        self._last_write = 0.0

    def run(self) -> None:
        """Serve until ``stop`` is set."""
        limit_torch_threads(self.config.torch_threads)
        self.telemetry.serve(self.config.metrics_addr, self.config.metrics_port)  # [telemetry]
        queue_decl = self.names.learner_data_decl(self.job.coordinator.buffer_id)
        with BrokerLink(self.config.transport, "learner") as link:
            link.declare(queue_decl)
            swept = self.steps.sweep_temp(STALE_TEMP_S) + self.policies.sweep_temp(STALE_TEMP_S)
            if swept:
                logger.info("removed %d temp files that crashed writers left behind", swept)
            self._resume_or_start()
            consumer = MetadataConsumer(link, queue_decl.name, prefetch=_PREFETCH)
            logger.info("learning from %s, writing %s", queue_decl.name, self.policies.path(self._policy_name))
            last_report = time.monotonic()
            while not self.stop.is_set():
                try:
                    if self._can_train():
                        link.process_events(0.0)  # heartbeats; the data waits until training caught up
                    else:
                        self._take(consumer, 0.2)
                    if self.telemetry.backlog_due():  # [telemetry] samples waiting in the queue
                        self.telemetry.backlog(link.queue_depth(queue_decl.name) or 0)  # [telemetry]
                except BrokerConnectionError as exc:
                    # The link reconnects by itself on its next use; keep training meanwhile.
                    logger.error("broker unavailable: %s", exc.message)
                    self.stop.wait(0.0 if self._can_train() else 1.0)
                self._train_some()
                if time.monotonic() - last_report > 10.0:
                    last_report = time.monotonic()
                    self._report()
            self._write_policy()
            with contextlib.suppress(BrokerConnectionError):
                consumer.close()
        self.telemetry.close()  # [telemetry]
        logger.info("learner stopped after %d train steps", self.stats.train_steps)

    def _resume_or_start(self) -> None:
        """Continue from the policy file of an earlier learner of this run, if there is one.

        The replay buffer starts empty either way; the weights and the iteration count carry
        over, so a restarted learner does not hand collectors an untrained policy.
        """
        try:
            snapshot = self.policies.read(self._policy_name)
        except StorageError as exc:
            logger.warning("cannot resume from the policy file (%s); starting fresh", exc.message)
            snapshot = None
        if snapshot is not None:
            try:
                self.learner.load_policy(snapshot.state_dict, snapshot.iter)
                logger.info("resumed from policy iter %d", snapshot.iter)
                return
            except ValueError as exc:
                logger.warning("policy file does not fit this network (%s); starting fresh", exc)
        self._write_policy()  # iteration 0, so collectors can start before any training

    @property
    def _policy_name(self) -> str:
        return self.job.coordinator.policy_name

    def _take(self, consumer: MetadataConsumer, wait_s: float) -> None:
        """Take data until there is training to do: the replay ratio is kept by never
        ingesting more than the learner has trained on (credit below one step)."""
        for _ in range(_MAX_BATCH):
            item = consumer.get(wait_s)
            if item is None:
                return
            wait_s = 0.0
            self._ingest(item)
            if self._can_train():
                return

    def _ingest(self, item: MetadataItem) -> None:
        try:
            metadata = read_metadata(item.message)
            if not isinstance(metadata, DataItem):
                raise TaskError("a collector info, not data metadata")
        except TaskError as exc:
            logger.warning("dead-lettering a learner message that is not data metadata: %s", exc.message)
            item.delivery.nack(requeue=False)
            return
        data_id = metadata.data_id
        if data_id in self._recent:
            # A redelivery of something already learned from (at-least-once hand-over).
            self.stats.duplicates += 1
            self.telemetry.skipped("duplicate")  # [telemetry]
            item.ack()
            return
        # A redelivered message may name a file this learner already consumed and deleted
        # before its ack was lost: do not wait for it to appear.
        wait_s = 0.0 if item.redelivered else self.job.learner_process.read_wait_s
        try:
            chunk = self.steps.read(data_id, wait_s=wait_s)
            added = self.buffer.add(chunk.fields)
        except StorageError as exc:
            # Missing: already consumed (a duplicate delivery) or never written; corrupt: unusable.
            # Either way retrying cannot help, so the message is settled, and counted.
            if isinstance(exc, MissingFile):
                self.stats.missing_files += 1
            else:
                self.stats.corrupt_files += 1
            self.telemetry.skipped("missing" if isinstance(exc, MissingFile) else "corrupt")  # [telemetry]
            logger.warning("skipping %s: %s", data_id, exc.message)
            item.ack()
            return
        self._remember(data_id)
        self.stats.items += 1
        self.stats.samples += added
        self.telemetry.ingested(added, policy_lag=self.learner.iter - metadata.policy_iter)  # [telemetry]
        self._train_credit += added * self.job.learner.train_steps_per_sample
        item.ack()
        if self.job.learner_process.delete_consumed:
            self.steps.delete(data_id)

    def _remember(self, data_id: str) -> None:
        self._recent.add(data_id)
        self._recent_order.append(data_id)
        if len(self._recent_order) > _RECENT_IDS:
            self._recent.discard(self._recent_order.popleft())

    def _can_train(self) -> bool:
        return len(self.buffer) >= self.job.learner.learning_starts and self._train_credit >= 1.0

    def _train_some(self) -> None:
        # Train in short bursts so new data keeps flowing in between.
        burst = 0
        while self._can_train() and burst < 32 and not self.stop.is_set():
            batch = self.buffer.sample_arrays(self.job.learner.batch_size, self.rng)
            started = time.perf_counter()  # [telemetry]
            metrics = self.learner.train_step(batch)
            self.telemetry.train_step(time.perf_counter() - started)  # [telemetry]
            self.telemetry.record(metrics, step=self.learner.iter)  # [telemetry] the algorithm's statistics
            self.stats.last_loss = metrics["loss"]
            self.stats.train_steps += 1
            self._train_credit -= 1.0
            burst += 1
        if time.monotonic() - self._last_write >= self.job.learner_process.policy_write_interval_s and burst:
            self._write_policy()

    def _write_policy(self) -> None:
        self.policies.write(self._policy_name, self.learner.policy_state(), self.learner.iter)
        self.telemetry.policy_written(self.learner.iter)  # [telemetry]
        self.stats.policies_written += 1
        self._last_write = time.monotonic()

    def _report(self) -> None:
        s = self.stats
        logger.info(
            "iter %d | buffer %d | samples %d from %d files | replay ratio %.3f (configured %.3f) | loss %.4f"
            " | skipped %d missing, %d corrupt",
            self.learner.iter,
            len(self.buffer),
            s.samples,
            s.items,
            s.train_steps / s.samples if s.samples else 0.0,
            self.job.learner.train_steps_per_sample,
            s.last_loss,
            s.missing_files,
            s.corrupt_files,
        )


def _env_dims(env_id: str) -> tuple[int, int]:
    env = make_env(env_id)
    try:
        obs_space: Any = env.observation_space
        act_space: Any = env.action_space
        return int(np.prod(obs_space.shape)), int(act_space.n)
    finally:
        env.close()
