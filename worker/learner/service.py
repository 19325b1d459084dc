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
``checkpoint_interval_s`` and at exit; a restarted learner resumes from it. An algorithm
whose actor needs no weights (``random``) gets neither file: its learner only counts the
samples, which the counters next to the policy file report.

An update whose metrics are NaN or infinite stops the learner before anything of it is
written: the last good policy stays on the volume, and the run ends with the reason. So
does a GPU that runs out of memory, naming the settings to lower (:mod:`.device`).

The learner trains where ``learner.device`` says (:mod:`.device`: the CPU, or a CUDA GPU).
On a GPU, step files are read and decompressed on a thread of their own while it updates
(``learner.read_ahead``, :mod:`.reader`); on the CPU they are read between updates.

A run that reaches its stop value *keeps* the policy file (``<name>.kept``, see
:meth:`~worker.storage.PolicyStore.keep`): the coordinator puts the evaluated policy
there and the learner's next write is refused. The learner then stops updating and
taking data, so the file stays the policy the run reported, until the marker is gone
(it releases it itself when it starts: a new or resumed run).

It is one piece, over 400 lines: taking data in, training and publishing take turns on
the learner's one thread and share its algorithm, counters and kept state; what runs or
decides apart already lives apart (the device, :mod:`.device`; the read-ahead, :mod:`.reader`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from messaging import BrokerConnectionError, BrokerLink, MetadataConsumer, MetadataItem, Names
from worker.agent.header import policy_header
from worker.config import LearnerConfig
from worker.errors import (
    CorruptChunk,
    CorruptFile,
    MissingFile,
    PluginFailed,
    PolicyKept,
    StorageError,
    TaskError,
)
from worker.job import job_plugins
from worker.learner.device import is_out_of_memory, out_of_memory, resolve_placement
from worker.learner.reader import StepReader
from worker.lifecycle import limit_torch_threads
from worker.plugins.contract import Chunk
from worker.plugins.contract import Learner as AlgorithmLearner
from worker.plugins.faults import blame, exception_problem, fault_line
from worker.protocol import DataItem, read_metadata
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.storage import STALE_TEMP_S, PolicyStore, StepStore
from worker.storage.counters import LearnerCounters, counters_path, read_counters, write_counters
from worker.telemetry.device import DeviceMonitor
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
#: While the policy file is kept (its run ended), how often the learner looks whether it was released.
KEPT_CHECK_S = 1.0
#: Step files read ahead on the reader's thread on a GPU, unless ``learner.read_ahead`` says.
GPU_READ_AHEAD = 4


class LearningDiverged(PluginFailed):
    """An update produced NaN or infinite metrics; nothing of it was written."""


#: The fields of a chunk the env made (the rest its actor made: the actions and the algorithm's columns).
_ENV_FIELDS = ("obs", "reward", "done", "truncated")


@dataclass(frozen=True)
class _ToRead:
    """A data message that passed its checks, and how long to wait for its file."""

    item: MetadataItem
    metadata: DataItem
    wait_s: float


@dataclass(frozen=True)
class _StepRead:
    """A step file read and checked: its chunk, and its size on the volume."""

    chunk: Chunk
    nbytes: int


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
        self.layout = ChunkLayout.of_algorithm(self.algorithm)
        self.plugins = job_plugins(self.job)
        """The job's plug-ins: the one a failure comes from is named (rejected chunks, NaN updates)."""
        setting, where = config.device_setting
        section = self.job.learner
        self.placement = resolve_placement(
            setting,
            where,
            autocast=section.autocast,
            device_replay=section.device_replay,
            supported="cuda" in self.algorithm.devices,
        )
        self._written_version = 0
        with self._algorithm_call("make_learner"):
            self.learner = self._make_learner()
        depth = section.read_ahead if section.read_ahead >= 0 else (0 if self.placement.on_cpu else GPU_READ_AHEAD)
        self.reader: StepReader[_ToRead, _StepRead] = StepReader(self._read, depth)
        #: ``random`` acts without weights: no policy file or checkpoint, only the counters.
        self._writes_policy = self.algorithm.kind != "none"
        self.stats = LearnerStats()
        self._rejected_in_a_row = 0
        #: The header of every policy file: what collectors check before they load it, and the job
        #: that trained it (so the file alone rebuilds its actor: :mod:`worker.agent.header`).
        self.header = policy_header(self.job)
        self._recent: set[str] = set()
        self._recent_order: collections.deque[str] = collections.deque()
        self._last_write = 0.0
        # The first updates are checkpointed at once: a learner killed before its first
        # interval is over must not come back untrained (and hand collectors that policy).
        self._last_checkpoint = -math.inf
        self._kept_version: int | None = None
        """The version of the policy file its run kept (no updates meanwhile); ``None``: not kept."""
        self._reported = (time.monotonic(), 0.0)
        self._reported_from = self._reported[0]
        self._counters = counters_path(config.path_policy, self.job.coordinator.policy_name)
        self.telemetry = LearnerTelemetry.from_config(config)  # metrics and TensorBoard, off by default
        if not self.placement.on_cpu:
            self.telemetry.device = DeviceMonitor(self.placement)

    def _placement_notes(self) -> str:
        """What the start line says of how the learner uses its device, beyond its name."""
        notes = [
            note
            for note, on in (
                ("bf16 autocast", self.placement.autocast == "bf16"),
                ("image replay in its memory", self.placement.device_replay),
                (f"{self.reader.depth} step files read ahead", self.reader.depth > 0),
            )
            if on
        ]
        return f" ({', '.join(notes)})" if notes else ""

    def _make_learner(self) -> AlgorithmLearner:
        """The algorithm's learner, told where to run when its plug-in can run elsewhere than the CPU."""
        if "cuda" in self.algorithm.devices:
            make: Callable[..., AlgorithmLearner] = self.algorithm.make_learner
            return make(self.job.env.seed, placement=self.placement)
        return self.algorithm.make_learner(self.job.env.seed)

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
            consumer = MetadataConsumer(link, queue_decl.name, prefetch=max(_PREFETCH, self.reader.depth))
            logger.info(
                "learning %s (%s model) on %s, on %s%s, from %s, writing %s",
                self.job.algorithm.name,
                self.job.model.name,
                self.spaces.describe(),
                self.placement.device,
                self._placement_notes(),
                queue_decl.name,
                self.policies.path(self._policy_name),
            )
            last_report = time.monotonic()
            try:
                while not self.stop.is_set():
                    if self._kept_version is not None and self._still_kept():
                        with contextlib.suppress(BrokerConnectionError):
                            link.process_events(0.0)  # heartbeats only: the run is over, nothing to learn
                        self.stop.wait(KEPT_CHECK_S)
                        continue
                    try:
                        if self.telemetry.backlog_due():  # samples waiting in the queue
                            self.telemetry.backlog(link.queue_depth(queue_decl.name) or 0)
                        if self.learner.can_update():
                            self._read_ahead(consumer, link)  # the data waits until training caught up
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
                self.reader.close()  # reads not learned from: their messages go back to the queue, unacked
                with contextlib.suppress(BrokerConnectionError):
                    consumer.close()
        self.telemetry.close()
        lifetime = max(time.monotonic() - self._reported_from, 1e-9)
        logger.info(
            "learner stopped after %d updates, %.1f s of them in %.1f s (%.0f%% busy); "
            "step files: %.0f bytes an env step; %s",
            self.stats.train_steps,
            self.stats.update_s,
            lifetime,
            100 * self.stats.update_s / lifetime,
            self.stats.file_bytes / max(self.stats.file_env_steps, 1),
            f"{self._policy_name} is version {self._written_version}"
            if self._kept_version is None
            else f"{self._policy_name} is version {self._kept_version}, kept by its run",
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
        an untrained policy. A policy file an earlier run kept is released: this run writes it.
        """
        if self.policies.release(self._policy_name):
            logger.info("%s was kept by the run that wrote it: released, this run writes it", self._policy_name)
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
        """Take data until there is training to do: the learner says when it has enough.

        Each message's file is read by :attr:`reader` (at once on the CPU; on its thread,
        a few ahead, on a GPU) and learned from here, in the order the messages came.
        """
        for _ in range(_MAX_BATCH):
            if not self.reader.has_room:
                self._learn_ready(wait_s)  # the oldest read first
                if not self.reader.has_room:  # reads that take long (a file that is late): serve the link meanwhile
                    item = consumer.get(0.0)  # none normally: every message the broker may hand over is being read
                    if item is not None:
                        self._ingest(item)
                    return
                if not self.learner.wants_data():
                    return
            item = consumer.get(wait_s)
            if item is None:
                self._learn_ready()
                return
            wait_s = 0.0
            to_read = self._check(item)
            if to_read is not None:
                self.reader.submit(to_read)
            self._learn_ready()
            if not self.learner.wants_data():
                return

    def _read_ahead(self, consumer: MetadataConsumer, link: BrokerLink) -> None:
        """While the learner has updates to run: hand the reader the messages it has room for, without waiting.

        Their files are read while the updates run; they are learned from once the learner wants
        data again. On the CPU (no reads ahead) only the link's heartbeats are served.
        """
        if not self.reader.depth:
            link.process_events(0.0)
            return
        while self.reader.has_room:
            item = consumer.get(0.0)  # serves the link's events too
            if item is None:
                return
            to_read = self._check(item)
            if to_read is not None:
                self.reader.submit(to_read)

    def _learn_ready(self, wait_s: float = 0.0) -> None:
        """Learn from the reads that finished (waiting up to ``wait_s`` for the oldest), in order."""
        for to_read, result in self.reader.ready(wait_s):
            self._learn(to_read, result.result)

    def _ingest(self, item: MetadataItem) -> None:
        """Check one data message, read its file and learn from it, all at once."""
        to_read = self._check(item)
        if to_read is not None:
            self._learn(to_read, lambda: self._read(to_read))

    def _check(self, item: MetadataItem) -> _ToRead | None:
        """The message's file to read; ``None``: the message is settled already (not data, a duplicate, stale)."""
        try:
            metadata = read_metadata(item.message)
            if not isinstance(metadata, DataItem):
                raise TaskError("a collector info, not data metadata")
        except TaskError as exc:
            logger.warning("dead-lettering a learner message that is not data metadata: %s", exc.message)
            item.delivery.nack(requeue=False)
            return None
        if self._settled_unread(item, metadata):
            return None
        # A redelivered message may name a file this learner already consumed and deleted
        # before its ack was lost: do not wait for it to appear.
        wait_s = 0.0 if item.redelivered else self.job.learner.read_wait_s
        return _ToRead(item, metadata, wait_s)

    def _settled_unread(self, item: MetadataItem, metadata: DataItem) -> bool:
        """Settle a duplicate or a stale chunk's message without learning from it; whether it was one."""
        data_id = metadata.data_id
        if data_id in self._recent:
            # A redelivery of something already learned from (at-least-once hand-over).
            self.stats.duplicates += 1
            self.telemetry.skipped("duplicate")  # [telemetry]
            item.ack()
            return True
        lag = self.learner.version - metadata.policy_iter
        max_lag = self.algorithm.max_policy_lag
        if max_lag is not None and lag > max_lag:
            self.stats.stale_chunks += 1
            self.telemetry.skipped("stale")
            logger.debug("dropping %s: its policy is %d versions old (at most %d)", data_id, lag, max_lag)
            item.ack()
            self._delete(data_id)
            return True
        return False

    def _read(self, to_read: _ToRead) -> _StepRead:
        """Read and check a message's step file (on the reader's thread: it touches nothing of the learner's state).

        Raises:
            StorageError: the file is missing or corrupt, or does not hold what its metadata says.
        """
        metadata = to_read.metadata
        data_id = metadata.data_id
        stored = self.steps.read(data_id, wait_s=to_read.wait_s)
        chunk = read_chunk(stored.fields, self.layout, self.spaces, metadata.policy_iter)
        said = (metadata.unroll_len or chunk.steps, metadata.env_num or chunk.num_envs)  # 0: not given
        if (chunk.steps, chunk.num_envs) != said:
            raise CorruptFile(
                f"step file {data_id!r} holds {chunk.steps} steps of {chunk.num_envs} envs; its metadata says "
                f"{metadata.unroll_len} of {metadata.env_num}"
            )
        return _StepRead(chunk, stored.nbytes)

    def _learn(self, to_read: _ToRead, read: Callable[[], _StepRead]) -> None:
        """Give the algorithm the chunk ``read`` returns, and settle the message; a file that failed is counted."""
        item, metadata = to_read.item, to_read.metadata
        data_id = metadata.data_id
        if self.reader.depth and self._settled_unread(item, metadata):
            return  # read ahead, and meanwhile learned from (a redelivery) or outdated by the updates
        lag = self.learner.version - metadata.policy_iter
        try:
            got = read()
            with self._algorithm_call("add"):
                added = self.learner.add(got.chunk)
            self.stats.file_bytes += got.nbytes
            self.stats.file_env_steps += got.chunk.steps * got.chunk.num_envs
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
                self._rejected(exc)
            return
        self._rejected_in_a_row = 0
        self._remember(data_id)
        self.stats.items += 1
        self.stats.samples += added
        self.telemetry.ingested(added, policy_lag=lag)
        item.ack()
        self._delete(data_id)

    @contextlib.contextmanager
    def _algorithm_call(self, call: str) -> Iterator[None]:
        """A call into the algorithm's learner: what it raises stops the learner naming the plug-in (or its model).

        Raises:
            PluginFailed: it raised anything but a TaskError (which says what went wrong already).
        """
        try:
            yield
        except TaskError:
            raise
        except Exception as exc:
            if is_out_of_memory(exc):
                raise out_of_memory(
                    exc,
                    call,
                    algorithm_config=self.algorithm.config,
                    placement=self.placement,
                    policy=f"the run stops; {self._policy_name} keeps the weights of version {self._written_version}",
                ) from exc
            plugin, name = blame(exc, self.plugins.algorithm, self.plugins.model, call)
            raise PluginFailed(fault_line(plugin, name, exception_problem(exc, plugin))) from exc

    def _rejected(self, exc: CorruptFile) -> None:
        """Count a chunk that failed its check; after ``learner.max_rejected_chunks`` in a row, stop.

        A stream of chunks that all fail (an env that gives NaN observations, an actor whose
        columns have the wrong shape) would otherwise be skipped for the whole run while the
        collectors went on collecting it. The learner stops instead, naming the field and the
        plug-in that made it, and with it the run (``warren run`` exits with code 4).

        Raises:
            PluginFailed: the limit is reached.
        """
        self._rejected_in_a_row += 1
        limit = self.job.learner.max_rejected_chunks
        if self._rejected_in_a_row < limit:
            return
        problem = (
            f"the learner rejected {self._rejected_in_a_row} chunks in a row (learner.max_rejected_chunks = {limit}), "
            f"the last: {exc.message}"
        )
        if not isinstance(exc, CorruptChunk):
            raise PluginFailed(f"the collectors' data: {problem}")
        made_by_env = exc.field.split(".")[0] in _ENV_FIELDS
        plugin, call = (self.plugins.env, "step") if made_by_env else (self.plugins.algorithm, "act")
        raise PluginFailed(fault_line(plugin, call, problem))

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
        if self._kept_version is not None:
            return  # the run ended keeping the policy file: nothing more to learn for it
        burst = 0
        while burst < _BURST and not self.stop.is_set() and self.learner.can_update():
            started = time.perf_counter()
            with self._algorithm_call("update"):
                metrics = self.learner.update()
            took = time.perf_counter() - started
            self.stats.update_s += took
            self.telemetry.train_step(took)
            bad = sorted(name for name, value in metrics.items() if not math.isfinite(value))
            if bad:
                model = self.plugins.model
                with_model = f"with model {model.name!r} {model.version}, " if model is not None else ""
                raise LearningDiverged(
                    fault_line(
                        self.plugins.algorithm,
                        "update",
                        f"{with_model}update {self.learner.version} gave non-finite {', '.join(bad)}: the run "
                        f"stops; {self._policy_name} keeps the weights of version {self._written_version}",
                    )
                )
            self.stats.last_metrics = metrics
            self.telemetry.record(metrics, step=self.learner.version)  # the algorithm's statistics
            self.stats.train_steps += 1
            burst += 1
        now = time.monotonic()
        # An on-policy algorithm drops chunks its newest versions outdate: every version it
        # makes must reach the collectors, or they would keep sending data it throws away.
        every_version = self.algorithm.max_policy_lag is not None
        # A learner that never trains (random) still writes its counters, on the same clock.
        to_publish = burst or not self._writes_policy
        if to_publish and (every_version or now - self._last_write >= self.job.learner.policy_write_interval_s):
            self._write_policy()
        if burst and now - self._last_checkpoint >= self.job.learner.checkpoint_interval_s:
            self._write_checkpoint()

    def _write_policy(self) -> None:
        version = self.learner.version
        if self._writes_policy and self._kept_version is None:
            try:
                self.policies.write(self._policy_name, self.learner.actor_weights(), version, self.header)
            except PolicyKept:
                self._kept()
            else:
                self._written_version = version
                self.telemetry.policy_written(version)
                self.stats.policies_written += 1
        self._last_write = time.monotonic()
        counted = LearnerCounters.now(
            train_steps=self.stats.train_steps, samples=self.stats.samples, policy_iter=version
        )
        write_counters(self._counters, counted)  # what the run's summary reports as its replay ratio

    def _kept(self) -> None:
        """The run kept the policy file (it ended at its stop value): stop updating until it is released."""
        try:
            self._kept_version = self.policies.version(self._policy_name) or 0
        except StorageError as exc:
            logger.warning("cannot read the kept %s: %s", self._policy_name, exc.message)
            self._kept_version = 0
        logger.info(
            "the run kept %s at version %d (the policy its evaluation passed); this learner was at %d: no more updates",
            self._policy_name,
            self._kept_version,
            self.learner.version,
        )

    def _still_kept(self) -> bool:
        """Whether the policy file is still kept; looked at every KEPT_CHECK_S (the loop waits that long)."""
        try:
            kept = self.policies.is_kept(self._policy_name)
        except StorageError:
            kept = True
        if not kept:
            logger.info("%s was released: training resumes", self._policy_name)
            self._kept_version = None
        return kept

    def _write_checkpoint(self) -> None:
        if not self._writes_policy:
            return
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
