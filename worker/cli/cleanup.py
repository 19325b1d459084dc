"""What a ``warren run`` leaves behind, and removing it: at its own end, or later for a run that died.

A run declares durable queues under its own prefix (its task queue, its learner's queue,
its dead-letter queue and exchange) and its collectors the roster exchange their control
queues are bound to: none of them expires, so a run whose process dies
without cleaning up (a second Ctrl-C exits at once; a kill; a crash) leaves them on the
broker, the learner's queue still holding messages, and its step files on disk. Its
workdir then shows it was interrupted (:mod:`worker.cli.run_dir`) and names its prefix,
so the next ``warren run`` removes what an interrupted *unnamed* run left (nobody can
join or resume one), and ``warren clean`` removes it for any run, named ones too.

Nothing of a run that is alive is touched: its workdir lock is held, and a queue of the
run that still has consumers (its processes are still stopping, or collectors joined a
named run) is left for the next time, with a log line that says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from messaging import BrokerLink, Names, Settings, WarrenError
from worker import json_text
from worker.cli.run_dir import RunLock, RunRecord, RunState, read_record, state_of
from worker.coordinator.checkpoint import last_checkpoint

logger = logging.getLogger(__name__)

#: Connect budget of a clean-up: a broker is there or it is not.
CLEANUP_CONNECT_S: Final = 5.0


def cleanup_link(transport: Settings) -> BrokerLink:
    """A short-budget link that declares nothing: opening it must not bring back the dead-letter
    exchange and queue it is about to look for and remove."""
    quick = transport.replace(connect_timeout_s=CLEANUP_CONNECT_S)
    return BrokerLink(quick, "run-cleanup", reconnect=False, declare_dead_letters=False)


def remove_existing(link: BrokerLink, queues: Iterable[str] = (), exchanges: Iterable[str] = ()) -> list[str]:
    """Delete those of ``queues`` and ``exchanges`` that exist; returns the names of those it removed.

    Looked up first, so what a clean-up reports is what it removed this time, not what it
    was told to remove (a second ``warren clean`` finds nothing and says nothing).
    """
    removed = []
    for queue in queues:
        if link.queue_exists(queue):
            link.delete_queue(queue)
            removed.append(queue)
    for exchange in exchanges:
        if link.exchange_exists(exchange):
            link.delete_exchange(exchange)
            removed.append(exchange)
    return removed


def remove_run_topology(
    transport: Settings,
    buffer_id: str,
    *,
    keep_shared: bool,
    extra: Iterable[str] = (),
    keep_dead_letters: bool = True,
) -> bool:
    """Delete what a run declared under ``transport.prefix``.

    ``keep_shared``: keep the task queue, the dead-letter queue and the roster exchange (a
    named run's: collectors that joined from elsewhere keep consuming the queue, their control
    queues stay bound to the exchange; ``warren clean`` removes them once none listens).
    Otherwise the roster exchange goes too. ``extra``: more queues of the run (the
    metadata queues of tasks it was following). ``keep_dead_letters``: a dead-letter queue
    holding messages stays, for inspection (``warren clean`` removes it later). Returns
    whether the broker could be used.
    """
    names = Names.of(transport)
    try:
        with cleanup_link(transport) as link:
            link.delete_queue(names.learner_data(buffer_id))
            for queue in extra:
                link.delete_queue(queue)
            if keep_shared:
                logger.info(
                    "kept %s, %s and %s for the collectors that joined the run",
                    names.collector_tasks,
                    names.dead_letter_queue,
                    names.collector_roster,
                )
                return True
            link.delete_queue(names.collector_tasks)
            link.delete_exchange(names.collector_roster)
            kept = link.queue_depth(names.dead_letter_queue) or 0
            if kept and keep_dead_letters:
                logger.warning(
                    "%d dead letters kept in %s for inspection (warren clean removes them)",
                    kept,
                    names.dead_letter_queue,
                )
            else:
                if kept:
                    logger.info("dropping %d dead letters of %s", kept, names.dead_letter_queue)
                link.delete_queue(names.dead_letter_queue)
                link.delete_exchange(names.dead_letter_exchange)
    except WarrenError as exc:
        logger.warning("could not remove the run's queues: %s", exc.message)
        return False
    return True


def remove_step_files(data: Path) -> int:
    """Step files left when a run is over are data no learner will read: the run's volume is its own."""
    removed = 0
    for path in data.iterdir() if data.is_dir() else ():
        if path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _consumers(transport: Settings, queues: list[str]) -> dict[str, int] | None:
    """Consumers of each of ``queues`` that exists (``None``: the broker cannot be asked)."""
    try:
        with cleanup_link(transport) as link:
            return {queue: link.queue_consumers(queue) or 0 for queue in queues}
    except WarrenError as exc:
        logger.warning("could not look at the run's queues: %s", exc.message)
        return None


def clean_interrupted(workdir: Path, transport: Settings, *, named_too: bool, dead_letters_too: bool = False) -> bool:
    """Remove what the interrupted run of ``workdir`` left; returns whether it is clean now.

    ``transport``: this process's broker settings (the run's prefix comes from its record).
    A run that used another broker, is alive, or whose queues still have consumers is left.
    ``named_too``: a named run's too (``warren clean``; the next run leaves one for its
    ``--resume``). ``dead_letters_too``: a dead-letter queue holding messages as well.
    """
    record = read_record(workdir)
    if record is None:
        logger.warning("%s: an interrupted run without a readable run.json; left alone", workdir)
        return False
    if record.named and not named_too:
        return False  # a named run may be resumed (warren run --name ... --resume): only warren clean
    if record.broker != transport.redacted_url:
        logger.info(
            "run %s (%s) used another broker (%s): clean it with warren clean --amqp-url for that broker",
            record.run_id,
            workdir,
            record.broker,
        )
        return False
    lock = RunLock.take(workdir)
    if lock is None:
        return False  # its process, or another clean-up, holds it now
    cleaned = False
    try:
        cleaned = _clean_locked(workdir, record, transport.replace(prefix=record.prefix), dead_letters_too)
    finally:
        if cleaned:
            lock.release()  # clean: the workdir no longer shows an interrupted run
        else:
            lock.unlock()  # still interrupted: the next clean-up tries again
    return cleaned


def _clean_locked(workdir: Path, record: RunRecord, transport: Settings, dead_letters_too: bool) -> bool:
    names = Names.of(transport)
    in_use = _consumers(transport, [names.collector_tasks, names.learner_data(record.buffer_id)])
    if in_use is None:
        return False
    busy = {queue: n for queue, n in in_use.items() if n}
    if busy:
        logger.info(
            "run %s (%s) stopped, but its queues still have consumers (%s): left for the next clean-up",
            record.run_id,
            workdir,
            ", ".join(f"{queue}: {n}" for queue, n in busy.items()),
        )
        return False
    checkpoint = last_checkpoint(workdir / "run.jsonl")
    running = (checkpoint or {}).get("running", {}).values()
    following = [str(task["metadata_queue"]) for task in running if task.get("metadata_queue")]
    removed_queues = remove_run_topology(
        transport, record.buffer_id, keep_shared=False, extra=following, keep_dead_letters=not dead_letters_too
    )
    if not removed_queues:
        return False
    removed = remove_step_files(workdir / "data")
    _write_interrupted_summary(workdir, record, checkpoint)
    logger.warning(
        "removed what the interrupted run %s left: its queues under %s and %d step files in %s",
        record.run_id,
        record.prefix,
        removed,
        workdir / "data",
    )
    return True


def _write_interrupted_summary(workdir: Path, record: RunRecord, checkpoint: dict[str, Any] | None) -> None:
    """A summary for a run that never wrote one: its last checkpoint's counters, and why it ended."""
    summary: dict[str, Any] = {
        "success": False,
        "reason": "interrupted: its process exited without cleaning up (removed by a later clean-up)",
        "error": None,
        **{k: v for k, v in (checkpoint or {}).items() if k not in ("kind", "time", "running", "seq")},
        "cleaned_at": time.time(),
        "run_id": record.run_id,
    }
    if not (workdir / "summary.json").exists():
        (workdir / "summary.json").write_text(json_text.dumps(summary, indent=2))
    run_log = workdir / "run.jsonl"
    if run_log.exists():
        with run_log.open("a", encoding="utf-8") as lines:
            lines.write(json_text.dumps({"kind": "summary", "time": time.time(), **summary}) + "\n")


def sweep_interrupted_runs(runs_dir: Path, transport: Settings, *, skip: Path) -> None:
    """At a run's start: remove what interrupted unnamed runs under ``runs_dir`` left (not ``skip``)."""
    for workdir in sorted(p for p in runs_dir.iterdir() if p.is_dir()) if runs_dir.is_dir() else ():
        if workdir.resolve() == skip.resolve() or state_of(workdir) is not RunState.INTERRUPTED:
            continue
        clean_interrupted(workdir, transport, named_too=False)


def clean_ended(workdir: Path, transport: Settings) -> bool:
    """Remove what an ended run kept: a named run's task queue and roster exchange (once no
    collector listens on the queue), the dead letters any run keeps for inspection, and the
    roster exchange a run of an older warren left. Logs only what it removed this time."""
    record = read_record(workdir)
    if record is None:
        return True  # not a run this version of warren started: nothing known to remove
    if record.broker != transport.redacted_url:
        logger.info("run %s used another broker (%s): give warren clean its URL", record.run_id, record.broker)
        return False
    run_transport = transport.replace(prefix=record.prefix)
    names = Names.of(run_transport)
    in_use = _consumers(run_transport, [names.collector_tasks])
    if in_use is None:
        return False
    if record.named and in_use[names.collector_tasks]:
        logger.info(
            "run %s: %d collectors still listen on %s; kept it (stop them first)",
            record.run_id,
            in_use[names.collector_tasks],
            names.collector_tasks,
        )
        return False
    try:
        with cleanup_link(run_transport) as link:
            dropped = link.queue_depth(names.dead_letter_queue) or 0
            removed = remove_existing(
                link,
                queues=(names.collector_tasks, names.dead_letter_queue),
                exchanges=(names.dead_letter_exchange, names.collector_roster),
            )
    except WarrenError as exc:
        logger.warning("could not remove what run %s kept on the broker: %s", record.run_id, exc.message)
        return False
    if removed:
        logger.info(
            "removed what run %s kept: %s%s",
            record.run_id,
            ", ".join(removed),
            f" ({dropped} dead letters)" if dropped else "",
        )
    return True
