"""The learner: data metadata in, step files read, the job's algorithm trained, policy files out.

The coordinator forwards every data metadata of the run to ``<prefix>.learner.<buffer_id>``.
The learner reads each named step file from the shared volume (bounded wait, clear error
for a missing or corrupt file), checks it against the job's spaces, drops it if the
policy that made it is older than the algorithm allows (counted), hands it to the
algorithm's :class:`~worker.plugins.Learner`, acks the message, and deletes the file.
Between messages it runs updates while the algorithm can (an off-policy one at its
replay ratio, an on-policy one once it has a batch), and publishes the actor's weights
to the policy file (safetensors, tagged with the policy version, the plug-ins and the
spaces digest) under the lock collectors read with: at most every
``policy_write_interval_s``, or after every update for an algorithm that bounds its
policy lag (its collectors must see each version it makes). A full checkpoint (targets, optimizer) goes next to it every
``checkpoint_interval_s`` and at exit; a restarted learner resumes from it.

An update whose metrics are NaN or infinite stops the learner before anything of it is
written: the last good policy stays on the volume, and the run ends with the reason.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from messaging import BrokerConnectionError, BrokerLink, MetadataConsumer, MetadataItem, Names
from worker.config import LearnerConfig
from worker.errors import CorruptFile, MissingFile, StorageError, TaskError, WarrenError
from worker.lifecycle import limit_torch_threads
from worker.protocol import DataItem, read_metadata
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.storage import STALE_TEMP_S, PolicyStore, StepStore
from worker.storage.counters import LearnerCounters, counters_path, read_counters, write_counters
from worker.telemetry.learner import LearnerTelemetry

logger = logging.getLogger(__name__)

#: Messages taken from the queue per loop turn before training resumes.
_MAX_BATCH = 64
#: Data metadata the broker hands the learner ahead of its acks. Small on purpose: what the
#: learner has not taken yet stays visible as the queue's depth, which is how the
#: coordinator sees that the learner is behind and holds the collectors back.
_PREFETCH = 1
#: data_ids remembered to skip redeliveries of data already learned from.
_RECENT_IDS = 100_000
#: Updates run back to back before the queue is looked at again.
_BURST = 32
#: Suffix of the learner's full checkpoint next to the policy file.
CHECKPOINT_SUFFIX = ".ckpt"


class LearningDiverged(WarrenError):
    """An update produced NaN or infinite metrics; nothing of it was written."""


@dataclass
class LearnerStats:
    items: int = 0
    samples: int = 0
    missing_files: int = 0
    duplicates: int = 0
    corrupt_files: int = 0
    stale_chunks: int = 0
    """Chunks dropped because their policy was older than the algorithm's ``max_policy_lag``."""
    train_steps: int = 0
    policies_written: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict)
    update_s: float = 0.0
    """Seconds spent in updates: over wall time, the learner's utilisation (the rest it waited for data)."""
    file_bytes: int = 0
    """Bytes of the step files learned from."""
    file_env_steps: int = 0
    """Env steps (rows x envs, reset steps included) in those files."""


class Learner:
    """The learner loop; see the module docstring."""

    def __init__(self, config: LearnerConfig, stop: threading.Event | None = None) -> None:
        self.config = config
        self.job = config.job
        self.stop = stop or threading.Event()
        self.names = Names.of(config.transport)
        self.steps = StepStore(config.path_data)
        self.policies = PolicyStore(config.path_policy)
        limit_torch_threads(config.learner_threads)
        self.algorithm = self.job.bound
        assert self.job.spaces is not None
        self.spaces = self.job.spaces
        self.layout = ChunkLayout.of(self.spaces, self.algorithm.columns())
        self.learner = self.algorithm.make_learner(self.job.env.seed)
        self.stats = LearnerStats()
        #: The header of every policy file: what collectors check before they load it.
        self.header = {
            "algorithm": self.job.algorithm.name,
            "algorithm_version": self.job.algorithm.version or "",
            "model": self.job.model.name or "",
            "model_version": self.job.model.version or "",
            "spaces_digest": self.spaces.digest,
        }
        self._recent: set[str] = set()
        self._recent_order: collections.deque[str] = collections.deque()
        self._last_write = 0.0
        # The first updates are checkpointed at once: a learner killed before its first
        # interval is over must not come back untrained (and hand collectors that policy).
        self._last_checkpoint = -math.inf
        self._written_version = 0
        self._reported = (time.monotonic(), 0.0)
        self._reported_from = self._reported[0]
        self._counters = counters_path(config.path_policy, self.job.coordinator.policy_name)
        self.telemetry = LearnerTelemetry.from_config(config)  # metrics and TensorBoard, off by default

    def run(self) -> None:
        """Serve until ``stop`` is set.

        Raises:
            LearningDiverged: an update went NaN (the policy file keeps the last good weights).
        """
        queue_decl = self.names.learner_data_decl(self.job.coordinator.buffer_id)
        self.telemetry.serve(self.config.metrics_addr, self.config.metrics_port)
        with BrokerLink(self.config.transport, "learner") as link:
            link.declare(queue_decl)
            swept = self.steps.sweep_temp(STALE_TEMP_S) + self.policies.sweep_temp(STALE_TEMP_S)
            if swept:
                logger.info("removed %d temp files that crashed writers left behind", swept)
            self._resume_or_start()
            consumer = MetadataConsumer(link, queue_decl.name, prefetch=_PREFETCH)
            logger.info(
                "learning %s (%s model) on %s from %s, writing %s",
                self.job.algorithm.name,
                self.job.model.name,
                self.spaces.describe(),
                queue_decl.name,
                self.policies.path(self._policy_name),
            )
            last_report = time.monotonic()
            try:
                while not self.stop.is_set():
                    try:
                        if self.telemetry.backlog_due():  # samples waiting in the queue
                            self.telemetry.backlog(link.queue_depth(queue_decl.name) or 0)
                        if self.learner.can_update():
                            link.process_events(0.0)  # heartbeats; the data waits until training caught up
                        else:
                            self._take(consumer, 0.2)
                    except BrokerConnectionError as exc:
                        # The link reconnects by itself on its next use; keep training meanwhile.
                        logger.error("broker unavailable: %s", exc.message)
                        self.stop.wait(0.0 if self.learner.can_update() else 1.0)
                    self._train_some()
                    if time.monotonic() - last_report > 10.0:
                        last_report = time.monotonic()
                        self._report()
                self._write_policy()
                self._write_checkpoint()
            finally:
                with contextlib.suppress(BrokerConnectionError):
                    consumer.close()
        self.telemetry.close()
        lifetime = max(time.monotonic() - self._reported_from, 1e-9)
        logger.info(
            "learner stopped after %d updates, %.1f s of them in %.1f s (%.0f%% busy); "
            "step files: %.0f bytes an env step",
            self.stats.train_steps,
            self.stats.update_s,
            lifetime,
            100 * self.stats.update_s / lifetime,
            self.stats.file_bytes / max(self.stats.file_env_steps, 1),
        )

    @property
    def _policy_name(self) -> str:
        return self.job.coordinator.policy_name

    @property
    def _checkpoint_name(self) -> str:
        return self._policy_name + CHECKPOINT_SUFFIX

    def _resume_or_start(self) -> None:
        """Continue from the checkpoint of an earlier learner of this run, if there is one.

        The replay buffer starts empty either way; the weights, targets, optimizer state
        and the policy version carry over, so a restarted learner does not hand collectors
        an untrained policy.
        """
        try:
            snapshot = self.policies.read(self._checkpoint_name)
        except StorageError as exc:
            logger.warning("cannot resume from the checkpoint (%s); starting fresh", exc.message)
            snapshot = None
        if snapshot is not None:
            digest = snapshot.meta.get("spaces_digest")
            algorithm = snapshot.meta.get("algorithm")
            if digest != self.spaces.digest or algorithm != self.job.algorithm.name:
                logger.warning(
                    "the checkpoint is of algorithm %r on spaces %s, this job runs %r on %s; starting fresh",
                    algorithm,
                    digest,
                    self.job.algorithm.name,
                    self.spaces.digest,
                )
            else:
                try:
                    self.learner.load_state_dict(snapshot.state_dict, snapshot.iter)
                    logger.info("resumed from the checkpoint at policy version %d", snapshot.iter)
                    counted = read_counters(self._counters)  # the run's counters go on with its policy
                    if counted is not None:
                        self.stats.train_steps, self.stats.samples = counted.train_steps, counted.samples
                except ValueError as exc:
                    logger.warning("the checkpoint does not fit this learner (%s); starting fresh", exc)
        self._write_policy()  # so collectors can start before any training

    def _take(self, consumer: MetadataConsumer, wait_s: float) -> None:
        """Take data until there is training to do: the learner says when it has enough."""
        for _ in range(_MAX_BATCH):
            item = consumer.get(wait_s)
            if item is None:
                return
            wait_s = 0.0
            self._ingest(item)
            if not self.learner.wants_data():
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
        lag = self.learner.version - metadata.policy_iter
        max_lag = self.algorithm.max_policy_lag
        if max_lag is not None and lag > max_lag:
            self.stats.stale_chunks += 1
            self.telemetry.skipped("stale")
            logger.debug("dropping %s: its policy is %d versions old (at most %d)", data_id, lag, max_lag)
            item.ack()
            self._delete(data_id)
            return
        # A redelivered message may name a file this learner already consumed and deleted
        # before its ack was lost: do not wait for it to appear.
        wait_s = 0.0 if item.redelivered else self.job.learner.read_wait_s
        try:
            stored = self.steps.read(data_id, wait_s=wait_s)
            chunk = read_chunk(stored.fields, self.layout, self.spaces, metadata.policy_iter)
            said = (metadata.unroll_len or chunk.steps, metadata.env_num or chunk.num_envs)  # 0: not given
            if (chunk.steps, chunk.num_envs) != said:
                raise CorruptFile(
                    f"step file {data_id!r} holds {chunk.steps} steps of {chunk.num_envs} envs; its metadata says "
                    f"{metadata.unroll_len} of {metadata.env_num}"
                )
            added = self.learner.add(chunk)
            self.stats.file_bytes += stored.nbytes
            self.stats.file_env_steps += chunk.steps * chunk.num_envs
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
            if isinstance(exc, CorruptFile):
                self._delete(data_id)
            return
        self._remember(data_id)
        self.stats.items += 1
        self.stats.samples += added
        self.telemetry.ingested(added, policy_lag=lag)
        item.ack()
        self._delete(data_id)

    def _delete(self, data_id: str) -> None:
        if self.job.learner.delete_consumed:
            with contextlib.suppress(StorageError):
                self.steps.delete(data_id)

    def _remember(self, data_id: str) -> None:
        self._recent.add(data_id)
        self._recent_order.append(data_id)
        if len(self._recent_order) > _RECENT_IDS:
            self._recent.discard(self._recent_order.popleft())

    def _train_some(self) -> None:
        # Train in short bursts so new data keeps flowing in between.
        burst = 0
        while burst < _BURST and not self.stop.is_set() and self.learner.can_update():
            started = time.perf_counter()
            metrics = self.learner.update()
            took = time.perf_counter() - started
            self.stats.update_s += took
            self.telemetry.train_step(took)
            bad = sorted(name for name, value in metrics.items() if not math.isfinite(value))
            if bad:
                raise LearningDiverged(
                    f"update {self.learner.version} of {self.job.algorithm.name} gave non-finite {', '.join(bad)}: "
                    f"the run stops; {self._policy_name} keeps the weights of version {self._written_version}"
                )
            self.stats.last_metrics = metrics
            self.telemetry.record(metrics, step=self.learner.version)  # the algorithm's statistics
            self.stats.train_steps += 1
            burst += 1
        now = time.monotonic()
        # An on-policy algorithm drops chunks its newest versions outdate: every version it
        # makes must reach the collectors, or they would keep sending data it throws away.
        every_version = self.algorithm.max_policy_lag is not None
        if burst and (every_version or now - self._last_write >= self.job.learner.policy_write_interval_s):
            self._write_policy()
        if burst and now - self._last_checkpoint >= self.job.learner.checkpoint_interval_s:
            self._write_checkpoint()

    def _write_policy(self) -> None:
        version = self.learner.version
        self.policies.write(self._policy_name, self.learner.actor_weights(), version, self.header)
        self._written_version = version
        self.telemetry.policy_written(version)
        self.stats.policies_written += 1
        self._last_write = time.monotonic()
        counted = LearnerCounters.now(
            train_steps=self.stats.train_steps, samples=self.stats.samples, policy_iter=version
        )
        write_counters(self._counters, counted)  # what the run's summary reports as its replay ratio

    def _write_checkpoint(self) -> None:
        self.policies.write(self._checkpoint_name, self.learner.state_dict(), self.learner.version, self.header)
        self._last_checkpoint = time.monotonic()

    def _report(self) -> None:
        s = self.stats
        ratio = self.algorithm.replay_ratio
        metrics = " ".join(f"{k} {v:.4g}" for k, v in sorted(s.last_metrics.items()))
        now = time.monotonic()
        busy = (s.update_s - self._reported[1]) / max(now - self._reported[0], 1e-9)
        self._reported = (now, s.update_s)
        logger.info(
            "version %d | samples %d from %d files | updates %d (%.0f%% of the time)%s | %s"
            " | skipped %d missing, %d corrupt, %d stale",
            self.learner.version,
            s.samples,
            s.items,
            s.train_steps,
            100 * busy,
            f" | replay ratio {s.train_steps / s.samples if s.samples else 0.0:.3f} (configured {ratio:.3f})"
            if ratio is not None
            else "",
            metrics or "no update yet",
            s.missing_files,
            s.corrupt_files,
            s.stale_chunks,
        )
