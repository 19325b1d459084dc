"""Bad input, fuzzed: nothing crashes a process, nothing is silently lost.

Every message published here is accounted for. A request on a collector's task or
control queue must end in one of the outcomes docs/protocol.md section 3 gives it:

* no ``reply_to``: dead-lettered, unanswered;
* no ``correlation_id``, another ``content_type``, a ``schema`` header that is not 1,
  a body over ``WARREN_MAX_MESSAGE_BYTES`` or undecodable: an error reply with
  ``result.message == "bad request"`` **and** dead-lettered;
* anything else: exactly one reply, ``ok: false`` with a clear error (the offending key
  named, never ``internal error``), or ``ok: true`` where the body is valid; never
  dead-lettered.

Each message carries a ``fuzz-id`` header (kept by dead-lettering) and, when it has one,
a unique correlation id; requests without one get a reply queue of their own, so even
their replies are matched to them. After each batch a valid ``resource`` task and a
whole start/data/close cycle must succeed and the worker must still be alive.

Policy files (malicious pickles, truncated, junk, wrong layouts, FIFOs, symlinks) must
fail their task with a final info carrying ``error`` and a ``finish_info`` with
``error``, without running a line of the pickle. Garbage in a metadata queue the
coordinator reads, and in the learner's data queue, must be dead-lettered or skipped
with a log line, and neither process may stop.

Scale: ``WARREN_FAULT_SCALE=ci`` (default; bounded, well under 90 s for the file) or ``full``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pika
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from messaging import BrokerLink, Names, RemoteError, RpcClient, Settings
from messaging.codec import CONTENT_TYPE, SCHEMA_VERSION, decode, encode
from messaging.connection import connect
from messaging.errors import DecodeError, PublishRejected, QueueNotFound
from messaging.subscription import Delivery, Subscription
from messaging.topology import QueueDecl
from tests.broker_admin import wait_until
from tests.fault_report import record, scaled
from tests.fuzz_strategies import (
    Garbage,
    PolicyFile,
    Probe,
    metadata_garbage,
    policy_file_examples,
    policy_files,
    probes,
    valid_start,
)
from tests.procs import Proc, role_env
from tests.tasks import drain_data_tasks
from worker.protocol import Refusal
from worker.storage import PolicyStore, StepStore

pytestmark = pytest.mark.rabbitmq

#: The worker's body limit, small so oversized messages are cheap to make.
LIMIT = 65_536
WORKER = "fz1"
#: Hypothesis runs the batches; no shrinking (a batch costs broker round trips, and the
#: failure report below already names every offending message).
FUZZ_SETTINGS = hypothesis_settings(
    deadline=None,
    database=None,
    derandomize=False,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)


def _fuzz_settings(**kw: Any) -> Any:
    return hypothesis_settings(FUZZ_SETTINGS, **kw)


def wait_started(proc: Proc, link: BrokerLink, queue: str, timeout_s: float = 60.0) -> None:
    """Wait for ``proc`` to declare ``queue``; fail at once, with its log, if it exits first."""
    wait_until(lambda: not proc.alive() or link.queue_exists(queue), timeout_s, f"queue {queue}")
    assert proc.alive(), f"{proc.args[0]} exited on start:\n{proc.log()[-3000:]}"


# -- fixtures: one collector worker for the module -----------------------------------


@pytest.fixture(scope="module")
def fz_settings(amqp_url: str) -> Settings:
    return Settings.from_env(
        {}, amqp_url=amqp_url, prefix=f"fz{uuid.uuid4().hex[:8]}", connect_timeout_s=10, rpc_timeout_s=20
    )


@pytest.fixture(scope="module")
def fz_volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "data").mkdir()
    (root / "policy").mkdir()
    return root


@pytest.fixture(scope="module")
def fz_link(fz_settings: Settings) -> Iterator[BrokerLink]:
    with BrokerLink(fz_settings, "fuzz") as fuzz_link:
        yield fuzz_link


@pytest.fixture(scope="module")
def worker(fz_settings: Settings, fz_volume: Path, fz_link: BrokerLink) -> Iterator[Proc]:
    proc = Proc(
        ["collector", "--worker-id", WORKER, "--policy-wait-s", "0.5", "--data-wait-s", "3", "--stop-grace-s", "5"],
        env=role_env(
            fz_settings,
            WARREN_PATH_DATA=str(fz_volume / "data"),
            WARREN_PATH_POLICY=str(fz_volume / "policy"),
            WARREN_MAX_MESSAGE_BYTES=str(LIMIT),
        ),
        log=fz_volume / "worker.log",
    )
    try:
        wait_started(proc, fz_link, Names(fz_settings.prefix).collector_control(WORKER))
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def client(fz_settings: Settings) -> Iterator[RpcClient]:
    with RpcClient(fz_settings, "fuzz-client") as rpc:
        yield rpc


# -- the oracle ------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    reply: str
    """``none``, ``bad request`` or ``handled``."""
    dead: bool


def expected(probe: Probe) -> Expect:
    """What docs/protocol.md section 3 says must happen to ``probe``."""
    if probe.reply_to != "yes":
        return Expect("none", True)
    if (
        probe.correlation != "yes"
        or probe.content_type not in (None, "", CONTENT_TYPE)
        or (probe.schema is not None and probe.schema != SCHEMA_VERSION)
        or len(probe.body.raw) > LIMIT
    ):
        return Expect("bad request", True)
    try:
        decode(probe.body.raw, max_bytes=LIMIT)
    except DecodeError:
        return Expect("bad request", True)
    return Expect("handled", False)


# -- publishing and accounting --------------------------------------------------------


@dataclass
class Sent:
    probe: Probe
    fuzz_id: str
    correlation_id: str | None
    reply_queue: str | None
    replies: list[Any] = field(default_factory=list)
    dead: int = 0


@dataclass
class Totals:
    tried: int = 0
    answered: int = 0
    dead_lettered: int = 0
    unanswered: int = 0
    accepted: int = 0
    batches: int = 0
    by_category: Counter[str] = field(default_factory=Counter)
    violations: dict[str, str] = field(default_factory=dict)
    """Distinct problem -> one message showing it (with the full probe)."""
    violation_count: int = 0

    def violate(self, key: str, detail: str) -> None:
        self.violation_count += 1
        self.violations.setdefault(key, detail)


def _headers_of(delivery: Delivery) -> dict[str, Any]:
    return {str(k): (v.decode() if isinstance(v, bytes) else v) for k, v in delivery.envelope.headers.items()}


def _drain(sub: Subscription, first_wait_s: float = 0.0) -> list[Delivery]:
    out = []
    wait = first_wait_s
    while (delivery := sub.get(wait)) is not None:
        delivery.ack()
        out.append(delivery)
        wait = 0.0
    return out


class Harness:
    """Publishes probes and watches the reply queues and the dead-letter queue."""

    def __init__(self, settings: Settings, link: BrokerLink) -> None:
        self.settings = settings
        self.link = link
        self.names = Names(settings.prefix)
        self.reply_decl = self.names.reply_decl(f"fuzz-{uuid.uuid4().hex[:8]}", expires_s=600)
        self.replies = link.subscribe(self.reply_decl, prefetch=2000)
        self.dlq = link.subscribe(QueueDecl(self.names.dead_letter_queue), prefetch=2000, declare=False)
        self.foreign_dead: list[bytes] = []
        self._raw = connect(settings, "fuzz-raw")
        self._raw_channel = self._raw.channel()
        self._raw_channel.confirm_delivery()
        self._seq = 0
        # Nothing from earlier tests may be mistaken for ours.
        _drain(self.dlq, 0.2)

    def close(self) -> None:
        self.replies.close()
        self.dlq.close()
        with contextlib.suppress(Exception):
            self._raw.close()

    def queue_of(self, probe: Probe) -> str:
        return self.names.collector_tasks if probe.target == "tasks" else self.names.collector_control(WORKER)

    def publish(self, probe: Probe) -> tuple[Sent, Subscription | None]:
        self._seq += 1
        fuzz_id = f"{self._seq}-{uuid.uuid4().hex[:6]}"
        corr = {"yes": uuid.uuid4().hex, "none": None, "empty": ""}[probe.correlation]
        own: Subscription | None = None
        reply_queue: str | None
        if probe.reply_to == "yes":
            reply_queue = self.reply_decl.name
            if probe.correlation != "yes":  # its reply cannot be told apart by id: a queue of its own
                decl = QueueDecl(
                    self.names.reply(f"fuzz-nocorr-{fuzz_id}"), durable=False, arguments={"x-expires": 600_000}
                )
                own = self.link.subscribe(decl, prefetch=10)
                reply_queue = decl.name
        else:
            reply_queue = None if probe.reply_to == "none" else ""
        headers: dict[str, Any] = {"fuzz-id": fuzz_id}
        if probe.schema is not None:
            headers["schema"] = probe.schema
        queue = self.queue_of(probe)
        if probe.raw_pika:
            # BrokerLink always sends application/msgpack; other content types need pika itself.
            props = pika.BasicProperties(
                content_type=probe.content_type,
                correlation_id=corr,
                reply_to=reply_queue,
                headers={"schema": SCHEMA_VERSION, **headers},
            )
            self._raw_channel.basic_publish("", queue, probe.body.raw, properties=props, mandatory=True)
        else:
            self.link.publish(queue, probe.body.raw, correlation_id=corr, reply_to=reply_queue, headers=headers)
        return Sent(probe, fuzz_id, corr, reply_queue), own

    def _close_if_started(self, sent: Sent) -> None:
        """A start that should have been refused made the worker busy: a busy worker stops
        consuming the shared queue, so close the task at once and let the batch go on."""
        reply = sent.replies[-1]
        result = reply.get("result") if isinstance(reply, dict) and reply.get("ok") is True else None
        if isinstance(result, dict) and "control_queue" in result:
            self.link.publish(
                str(result["control_queue"]),
                encode({"name": "collector_close_task"}),
                correlation_id=f"close-{sent.fuzz_id}",
                reply_to=self.reply_decl.name,
            )

    def run_batch(self, batch: list[Probe], totals: Totals, timeout_s: float = 30.0) -> list[Sent]:
        sent: list[Sent] = []
        own: dict[str, Subscription] = {}
        for probe in batch:
            item, sub = self.publish(probe)
            sent.append(item)
            if sub is not None:
                own[item.fuzz_id] = sub
        by_corr = {s.correlation_id: s for s in sent if s.correlation_id}
        by_id = {s.fuzz_id: s for s in sent}

        def satisfied(s: Sent) -> bool:
            exp = expected(s.probe)
            return (exp.reply == "none" or bool(s.replies)) and (not exp.dead or s.dead > 0)

        deadline = time.monotonic() + timeout_s
        settled_at: float | None = None
        while True:
            for d in _drain(self.replies, 0.05):
                corr = d.envelope.correlation_id or ""
                target = by_corr.get(corr)
                if target is not None:
                    target.replies.append(_decoded(d.envelope.body))
                    self._close_if_started(target)
                elif not corr.startswith("close-"):
                    totals.violate("reply matching no request", f"correlation_id {corr!r}")
            for fid, sub in own.items():
                for d in _drain(sub):
                    by_id[fid].replies.append(_decoded(d.envelope.body))
                    self._close_if_started(by_id[fid])
            for d in _drain(self.dlq):
                dead_id = _headers_of(d).get("fuzz-id")
                if isinstance(dead_id, str) and dead_id in by_id:
                    by_id[dead_id].dead += 1
                else:
                    self.foreign_dead.append(d.envelope.body[:200])
            self._raw.process_data_events(0)
            now = time.monotonic()
            if all(satisfied(s) for s in sent):
                # Linger a little: an outcome that should not exist (a dead letter for a
                # handled request, a second reply) would arrive within moments.
                settled_at = settled_at or now
                if now - settled_at > 0.4:
                    break
            elif now > deadline:
                break
        for fid, sub in own.items():
            sub.close()
            with contextlib.suppress(QueueNotFound):
                self.link.delete_queue(self.names.reply(f"fuzz-nocorr-{fid}"))
        started_one = any(_started(s) for s in sent)
        for s in sent:
            judge(s, totals, busy_ok=started_one)
        return sent


def _decoded(body: bytes) -> Any:
    try:
        return decode(body)
    except DecodeError as exc:
        return f"<undecodable reply: {exc.message}>"


def _started(s: Sent) -> bool:
    return any(
        isinstance(r, dict) and r.get("ok") is True and "control_queue" in r.get("result", {}) for r in s.replies
    )


def judge(s: Sent, totals: Totals, *, busy_ok: bool = False) -> None:
    """Count ``s`` and note every way its outcome differs from the contract.

    ``busy_ok``: a start task of the batch was (wrongly) accepted, so "worker busy" is a
    fair answer to the others.
    """
    probe, body = s.probe, s.probe.body
    exp = expected(probe)
    totals.tried += 1
    totals.by_category[body.category.split(" (")[0]] += 1
    totals.answered += bool(s.replies)
    totals.dead_lettered += s.dead > 0
    where = f"[{probe.describe()}] replies={s.replies!r:.600} dead={s.dead}"
    if not s.replies and not s.dead:
        totals.unanswered += 1
        totals.violate(f"silently lost: {body.category} / {exp.reply}", where)
        return
    if exp.dead != (s.dead > 0):
        totals.violate(f"dead-lettered={s.dead > 0}, expected {exp.dead}: {exp.reply}", where)
    if exp.reply == "none":
        if s.replies:
            totals.violate("reply to a request without reply_to", where)
        return
    if len(s.replies) != 1:
        totals.violate(f"{len(s.replies)} replies instead of 1 ({exp.reply})", where)
        if not s.replies:
            return
    reply = s.replies[0]
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        totals.violate("reply is not a warren reply envelope", where)
        return
    if exp.reply == "bad request":
        result = (reply.get("error") or {}).get("result") or {}
        if reply["ok"] or result.get("message") != "bad request":
            totals.violate("bad request not answered with result.message 'bad request'", where)
        return
    if reply["ok"]:
        if not body.may_succeed:
            totals.accepted += 1
            totals.violate(f"accepted a bad request: {body.category}", where)
        return
    error = reply.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error["message"]:
        totals.violate("error reply without a message", where)
        return
    result = error.get("result")
    code = result.get("message") if isinstance(result, dict) else None
    if code == "internal error":
        totals.violate(f"internal error (a handler bug) on {body.category}: {error['message'][:160]}", where)
        return
    if body.valid:
        totals.violate(f"valid request refused: {body.category}", where)
        return
    if code == "worker busy" and busy_ok:
        return
    allowed = body.messages
    if allowed is not None and code not in allowed:
        totals.violate(f"{body.category}: result.message {code!r}, expected one of {sorted(allowed)}", where)
    if body.text is not None and body.text not in error["message"]:
        totals.violate(f"{body.category}: error does not name {body.text!r}", where)


# -- the valid task after each batch ---------------------------------------------------


def free_worker(client: RpcClient, names: Names) -> None:
    """Close a task a fuzz message managed to start (counted as a violation already)."""
    if client.call(names.collector_control(WORKER), {"name": "resource"}, timeout_s=10)["busy"]:
        with contextlib.suppress(RemoteError):
            client.call(names.collector_control(WORKER), {"name": "collector_close_task"})


def valid_cycle(client: RpcClient, names: Names, tag: str, proc: Proc) -> None:
    assert proc.alive(), "the collector died:\n" + proc.log()[-4000:]
    resource = client.call(names.collector_tasks, {"name": "resource"})
    assert resource["worker_id"] == WORKER and resource["busy"] is False, resource
    assert client.call(names.collector_control(WORKER), {"name": "resource"})["worker_id"] == WORKER
    started = client.call(names.collector_tasks, valid_start(f"ok-{tag}"))
    assert started["message"] == "collector task has started" and started["worker_id"] == WORKER
    items = drain_data_tasks(client, started["control_queue"], limit=400)
    assert "error" not in items[-1], items[-1]
    finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    assert "error" not in finish and finish["real_episode_count"] == 1, finish
    assert proc.alive()


def crash_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Traceback" in line or " CRITICAL " in line]


# -- 1. task and control queues -------------------------------------------------------


def test_fuzzed_requests_are_answered_or_dead_lettered_and_the_worker_keeps_serving(
    worker: Proc, fz_settings: Settings, fz_link: BrokerLink, client: RpcClient
) -> None:
    names = Names(fz_settings.prefix)
    harness = Harness(fz_settings, fz_link)
    totals = Totals()
    started = time.monotonic()

    @_fuzz_settings(max_examples=scaled(7, 150))
    @given(batch=st.lists(probes(LIMIT), min_size=15, max_size=scaled(30, 70)))
    def run(batch: list[Probe]) -> None:
        harness.run_batch(batch, totals)
        totals.batches += 1
        free_worker(client, names)
        valid_cycle(client, names, f"b{totals.batches}", worker)

    try:
        # Every documented case once, whatever hypothesis draws.
        harness.run_batch(fixed_probes(), totals)
        free_worker(client, names)
        valid_cycle(client, names, "fixed", worker)
        run()
    finally:
        harness.close()
    seconds = time.monotonic() - started
    log = worker.log()
    record(
        "bad input",
        tried=totals.tried,
        answered=totals.answered,
        dead_lettered=totals.dead_lettered,
        unanswered=totals.unanswered,
        accepted_bad=totals.accepted,
        violations=totals.violation_count,
        batches=totals.batches + 1,
        processes_alive=int(worker.alive()),
        seconds=round(seconds, 1),
    )
    print(f"fuzz: {totals.tried} requests in {totals.batches + 1} batches, {seconds:.1f} s; {dict(totals.by_category)}")
    assert totals.unanswered == 0 and not harness.foreign_dead, (totals.unanswered, harness.foreign_dead[:5])
    assert not totals.violations, _report(totals)
    assert worker.alive()
    assert not crash_lines(log), "\n".join(crash_lines(log)[:20]) + "\n...\n" + log[-3000:]


def _report(totals: Totals) -> str:
    lines = [f"{totals.violation_count} contract violations in {totals.tried} requests; one example of each:"]
    for key, detail in totals.violations.items():
        lines.append(f"- {key}\n    {detail}")
    return "\n".join(lines)


def fixed_probes() -> list[Probe]:
    """The cases the issue names, each at least once."""
    from tests import fuzz_strategies as fs

    def start(mutate: Callable[[dict[str, Any]], None], *, dqn: bool = False) -> bytes:
        body = valid_start(f"fz-fixed-{uuid.uuid4().hex[:8]}", dqn=dqn)
        mutate(body["task_info"]["collector_cfg"])
        return encode(body)

    def path(p: str) -> fs.Body:
        return fs.Body(
            f"unsafe policy path ({p})",
            start(lambda c: c.update(policy_update_path=p), dqn=True),
            fs.codes(Refusal.UNSAFE_PATH),
            "policy_update_path",
        )

    def env(e: str) -> fs.Body:
        return fs.Body(f"unknown env id ({e})", start(lambda c: c["env"].update(id=e)), fs.ENV_REFUSALS, "env")

    deep = b"\x91" * 1010 + b"\xc0"
    tid_key = encode("task_id")
    deep_start = encode(valid_start("fz-deep"))
    at = deep_start.index(tid_key) + len(tid_key)
    deep_start = deep_start[:at] + deep + deep_start[at + len(encode("fz-deep")) :]
    bodies = [
        fs.Body("random bytes", b"\x00\xff\xfe garbage \xc1", fs.NAME_REFUSALS),
        fs.Body("valid msgpack, wrong shape", encode([1, 2, 3]), fs.NAME_REFUSALS),
        fs.Body("valid msgpack, wrong shape (no name)", encode({"task_info": {}}), fs.NAME_REFUSALS),
        fs.Body("unknown task name", encode({"name": "make_coffee"}), fs.codes(Refusal.TASK_NAME_ERROR)),
        fs.Body(
            "bad task_info (env_num a string)",
            start(lambda c: c["env"].update(env_num="many")),
            fs.codes(Refusal.BAD_COLLECTOR_CFG),
            "env_num",
        ),
        fs.Body(
            "bad task_info (policy.type an array)",
            start(lambda c: c["policy"].update(type=np.arange(3))),
            fs.codes(Refusal.BAD_COLLECTOR_CFG),
            "policy.type",
        ),
        fs.Body(
            "huge number (env_num)",
            start(lambda c: c["env"].update(env_num=2**64 - 1)),
            fs.codes(Refusal.BAD_COLLECTOR_CFG),
            "env_num",
        ),
        fs.Body("huge string (name)", encode({"name": "x" * 50_000}), fs.codes(Refusal.TASK_NAME_ERROR), "illegal"),
        fs.Body("crafted msgpack (deep task_id)", deep_start, fs.codes(Refusal.BAD_TASK_ID), "task_id"),
        fs.Body("crafted msgpack (deep list)", b"\x91" * 3000 + b"\xc0", fs.NAME_REFUSALS),
        fs.Body("crafted msgpack (lying length)", b"\xdd\xff\xff\xff\xff", fs.NAME_REFUSALS),
        path(".."),
        path("../../etc/passwd"),
        path("/etc/passwd"),
        path("a/../../b"),
        path("sub/policy"),
        env("NoSuchEnv-v0"),
        env("os:system"),
        fs.Body(
            "continuous actions for dqn (Pendulum-v1)",
            start(lambda c: c["env"].update(id="Pendulum-v1"), dqn=True),
            fs.codes(Refusal.UNSUPPORTED_ENV),
            "algorithm 'dqn' cannot run this env",
        ),
        fs.Body(
            "missing algorithm plug-in",
            start(lambda c: c["policy"].update(type="a3c")),
            fs.codes(Refusal.MISSING_PLUGIN),
            "algorithm plug-in 'a3c' is not installed here",
        ),
        fs.Body(
            "algorithm plug-in of another version",
            start(lambda c: c["policy"].update(version="0.0.0-other"), dqn=True),
            fs.codes(Refusal.MISSING_PLUGIN),
            "the task wants 0.0.0-other",
        ),
        fs.Body(
            "unknown env id (eval task)",
            start(lambda c: c.update(eval_flag=True, env={"id": "NoSuchEnv-v0", "env_num": 1})),
            fs.codes(Refusal.UNKNOWN_ENV),
            "env",
        ),
        fs.Body(
            "data/close without a collector",
            encode({"name": "collector_data_task"}),
            fs.DATA_CLOSE_REFUSALS,
            may_succeed=True,
        ),
        fs.Body("oversized", encode({"name": "resource", "pad": "x" * (LIMIT + 1)}), fs.codes(Refusal.BAD_REQUEST)),
    ]
    probes_ = [Probe(b, "tasks") for b in bodies]
    resource = fs.Body("valid resource", encode({"name": "resource"}), may_succeed=True, valid=True)
    probes_ += [
        Probe(resource, "control"),
        Probe(resource, "tasks", reply_to="none"),
        Probe(resource, "control", correlation="none"),
        Probe(resource, "tasks", correlation="empty"),
        Probe(resource, "tasks", content_type="application/json"),
        Probe(resource, "tasks", content_type="application/x-python-pickle", correlation="none"),
        Probe(resource, "tasks", content_type=None),
        Probe(resource, "tasks", schema=1),
        Probe(bodies[0], "control", reply_to="none", correlation="none", content_type="text/plain"),
        Probe(bodies[-1], "control"),
    ]
    return probes_


REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], None], Refusal]] = {
    "policy path in a sub-directory": (lambda c: c.update(policy_update_path="sub/policy"), Refusal.UNSAFE_PATH),
    "unknown env id in an eval task": (
        lambda c: c.update(eval_flag=True, env={"id": "NoSuch-v0", "env_num": 1}),
        Refusal.UNKNOWN_ENV,
    ),
    "continuous actions": (lambda c: c["env"].update(id="Pendulum-v1"), Refusal.UNSUPPORTED_ENV),
    "policy.type an array": (lambda c: c["policy"].update(type=np.arange(3)), Refusal.BAD_COLLECTOR_CFG),
    "an algorithm this worker lacks": (lambda c: c["policy"].update(type="a3c"), Refusal.MISSING_PLUGIN),
    "a model of another version": (lambda c: c["policy"].update(model_version="0.0.0-x"), Refusal.MISSING_PLUGIN),
    "spaces other than the env's": (
        lambda c: c.update(
            spaces={"observation": {"kind": "Discrete", "n": 3}, "action": {"kind": "Discrete", "n": 2}}
        ),
        Refusal.UNSUPPORTED_ENV,
    ),
    "spaces of a kind warren does not carry": (
        lambda c: c.update(
            spaces={"observation": {"kind": "Text", "max_length": 8}, "action": {"kind": "Discrete", "n": 2}}
        ),
        Refusal.UNSUPPORTED_ENV,
    ),
    "a dqn task with nowhere to read weights": (lambda c: c.pop("policy_update_path"), Refusal.BAD_COLLECTOR_CFG),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_documented_refusals(worker: Proc, fz_settings: Settings, client: RpcClient, case: str) -> None:
    """Regressions the fuzzer found, one by one (docs/protocol.md section 4, "Refusals")."""
    mutate, code = REFUSALS[case]
    names = Names(fz_settings.prefix)
    body = valid_start(f"fz-doc-{uuid.uuid4().hex[:8]}", dqn=True)
    mutate(body["task_info"]["collector_cfg"])
    try:
        with pytest.raises(RemoteError) as refused:
            client.call(names.collector_tasks, body)
    finally:
        free_worker(client, names)
    assert refused.value.result.get("message") == code, refused.value.message


def test_a_deeply_nested_value_is_refused_not_an_internal_error(
    worker: Proc, fz_settings: Settings, fz_link: BrokerLink
) -> None:
    """A task_id nested 1010 lists deep still decodes (msgpack allows 1024); its refusal must not recurse."""
    harness = Harness(fz_settings, fz_link)
    totals = Totals()
    deep = next(p for p in fixed_probes() if p.body.category == "crafted msgpack (deep task_id)")
    try:
        harness.run_batch([deep], totals, timeout_s=15)
    finally:
        harness.close()
    assert totals.unanswered == 0 and not totals.violations, _report(totals)
    assert worker.alive()


# -- 2. policy files -------------------------------------------------------------------


def _place(policy_dir: Path, name: str, case: PolicyFile) -> None:
    target = policy_dir / name
    if case.kind == "fifo":
        os.mkfifo(target)
    elif case.kind == "directory":
        target.mkdir()
    elif case.kind == "symlink out":
        target.symlink_to("/etc/passwd")
    else:
        assert case.content is not None
        target.write_bytes(case.content)


def dqn_start(task_id: str, policy: str) -> dict[str, Any]:
    body = valid_start(task_id, dqn=True)
    body["task_info"]["collector_cfg"]["policy_update_path"] = policy
    return body


def test_hostile_policy_files_fail_their_task_clearly_and_run_no_code(
    worker: Proc, fz_settings: Settings, fz_volume: Path, client: RpcClient
) -> None:
    names = Names(fz_settings.prefix)
    marker = Path(f"/tmp/warren-fuzz-pwned-{uuid.uuid4().hex[:8]}")
    problems: dict[str, list[str]] = {}
    kinds: Counter[str] = Counter()
    seq, bad_cases = [0], [0]
    started_at = time.monotonic()

    def check(case: PolicyFile) -> None:
        seq[0] += 1
        name = f"pol-{seq[0]}"
        kinds[case.kind.split(" (")[0]] += 1
        _place(fz_volume / "policy", name, case)
        found = policy_case_problems(client, names, case, dqn_start(f"fz-pol-{seq[0]}", name))
        if found:
            problems.setdefault(case.kind, []).extend(found)
            bad_cases[0] += 1
        assert not marker.exists(), f"{case.kind}: the pickle ran code"
        free_worker(client, names)
        valid_cycle(client, names, f"p{seq[0]}", worker)

    @_fuzz_settings(max_examples=scaled(2, 40))
    @given(case=policy_files(str(marker)))
    def run(case: PolicyFile) -> None:
        check(case)

    # Every kind once, then random ones (truncation points, bytes, pickle protocols).
    for case in policy_file_examples(str(marker)):
        check(case)
    run()
    # A good policy file still works: the failures above were the files' fault.
    torch_net = _good_policy_file(fz_volume / "policy", "pol-good")
    started = client.call(names.collector_tasks, dqn_start("fz-pol-good", torch_net))
    assert "error" not in drain_data_tasks(client, started["control_queue"], limit=400)[-1]
    finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    assert "error" not in finish and finish["train_iter"] == 3
    log = worker.log()
    record(
        "hostile policy files",
        tried=sum(kinds.values()),
        failed_clearly=sum(kinds.values()) - bad_cases[0],
        code_ran=int(marker.exists()),
        processes_alive=int(worker.alive()),
        seconds=round(time.monotonic() - started_at, 1),
    )
    print(f"policy files: {dict(kinds)}")
    assert not marker.exists()
    assert not problems, "\n".join(f"- {k}: {'; '.join(v)}" for k, v in problems.items())
    assert worker.alive()
    assert not crash_lines(log), "\n".join(crash_lines(log)[:20])


def policy_case_problems(client: RpcClient, names: Names, case: PolicyFile, body: dict[str, Any]) -> list[str]:
    """How the worker's handling of one policy file departs from the contract (empty: it does not)."""
    if case.kind == "symlink out":
        # resolve_under follows the link, finds it leaves the volume: refused at start.
        try:
            client.call(names.collector_tasks, body)
        except RemoteError as exc:
            return [] if exc.result.get("message") == "unsafe path" else [f"refused with {exc.result}"]
        return ["a policy path linking out of the volume was accepted"]
    found = []
    control = client.call(names.collector_tasks, body)["control_queue"]
    try:
        last = drain_data_tasks(client, control, limit=400)[-1]
        if "error" not in last or last.get("collector_done") is not True:
            found.append(f"final info without error: {last}")
    except RemoteError as exc:
        found.append(f"no final info; collector_data_task got {exc.message!r} {exc.result}")
    try:
        error = str(client.call(control, {"name": "collector_close_task"}).get("error", ""))
        if "policy" not in error:
            found.append(f"finish_info error does not say what failed: {error[:300]!r}")
    except RemoteError as exc:
        found.append(f"close refused: {exc.message!r} {exc.result}")
    return found


def _good_policy_file(policy_dir: Path, name: str) -> str:
    from tests.fuzz_strategies import _good_weights, _header

    header = _header()
    del header["warren.format"], header["policy_version"]  # the store writes those
    PolicyStore(policy_dir).write(name, _good_weights(), 3, header)
    return name


# -- 3. the learner's data queue and the coordinator's metadata queues ------------------


def _checkpoints(run_log: Path) -> list[dict[str, Any]]:
    if not run_log.exists():
        return []
    rows = [json.loads(line) for line in run_log.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "checkpoint"]


def _env_steps(run_log: Path) -> int:
    return max((int(c.get("env_steps", 0)) for c in _checkpoints(run_log)), default=0)


def _metadata_queue(run_log: Path) -> str | None:
    for row in reversed(_checkpoints(run_log)):
        for task in row.get("running", {}).values():
            if task.get("metadata_queue"):
                return str(task["metadata_queue"])
    return None


def _write_step_file(data: Path, data_id: str, kind: str) -> None:
    """A step file named ``data_id``: ``good``, or broken in the way ``kind`` says."""
    store = StepStore(data)
    k, n = 4, 2
    fields: dict[str, Any] = {
        "obs": np.zeros((k + 1, n, 4), np.float32),  # T + 1 rows: the last closes the chunk
        "action": np.zeros((k, n), np.int64),
        "reward": np.ones((k, n), np.float32),
        "done": np.zeros((k, n), np.bool_),
        "truncated": np.zeros((k, n), np.bool_),
        "valid": np.ones((k, n), np.bool_),
    }
    if kind == "nan obs":
        fields["obs"][0, 0, 0] = np.nan
    elif kind == "action out of range":
        fields["action"][:] = 7
    elif kind == "wrong obs dim":
        fields["obs"] = np.zeros((k + 1, n, 9), np.float32)
    elif kind == "obs without the closing row":
        fields["obs"] = np.zeros((k, n, 4), np.float32)
    elif kind == "missing field":
        del fields["reward"]
    elif kind == "junk bytes":
        (data / data_id).write_bytes(os.urandom(64))
        return
    elif kind == "wrong document":
        (data / data_id).write_bytes(
            encode({"schema": SCHEMA_VERSION, "kind": "warren.samples", "data_id": data_id, "count": "x"})
        )
        return
    elif kind == "fifo":
        os.mkfifo(data / data_id)
        return
    store.write(data_id, fields)


STEP_FILE_KINDS = (
    "nan obs",
    "action out of range",
    "wrong obs dim",
    "obs without the closing row",
    "missing field",
    "junk bytes",
    "wrong document",
    "fifo",
)

PROGRESS = ("--progress", "log")
LEARNER = "learner"
METADATA = "metadata"


def _garbage(category: str, value: Any = None, *, raw: bytes | None = None, **fields: Any) -> Garbage:
    """A hand-made garbage message; ``{token}`` in string fields is replaced by its token."""
    token = uuid.uuid4().hex[:12]
    if raw is None:
        message = {k: v.replace("{token}", token) if isinstance(v, str) else v for k, v in fields.items()}
        raw = encode(value if value is not None else {"fuzz_id": token, **message})
    return Garbage(category, raw, token)


class GarbageRun:
    """Publishes garbage and follows every message to a dead letter or a log line naming it."""

    def __init__(
        self, link: BrokerLink, names: Names, data: Path, procs: dict[str, Proc], run_log: Path | None
    ) -> None:
        self.link = link
        self.names = names
        self.data = data
        self.procs = procs
        self.run_log = run_log
        self.learner_queue = names.learner_data("main")
        self.dlq = link.subscribe(QueueDecl(names.dead_letter_queue), prefetch=2000, declare=False)
        self.tried: Counter[str] = Counter()
        self.fates: Counter[str] = Counter()
        self.lost: list[str] = []
        self._probes = 0

    def close(self) -> None:
        self.dlq.close()

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs.values())

    def logs(self) -> str:
        return "\n".join(f"===== {name}\n{p.log()[-3000:]}" for name, p in self.procs.items())

    def _dead_tokens(self) -> set[str]:
        found = set()
        for d in _drain(self.dlq):
            token = _headers_of(d).get("fuzz-id")
            if not isinstance(token, str):  # forwarded by the coordinator: headers are not kept
                with contextlib.suppress(Exception):
                    body = msgpack.unpackb(d.envelope.body, strict_map_key=False)
                    token = body.get("fuzz_id") if isinstance(body, dict) else None
            if isinstance(token, str):
                found.add(token)
        return found

    def _publish(self, where: str, garbage: Garbage) -> str | None:
        """Publish to the learner queue or the running task's metadata queue; the queue used."""
        for _ in range(3):
            queue = self.learner_queue
            if where == METADATA:
                assert self.run_log is not None
                queue = _metadata_queue(self.run_log) or ""
            deadline = time.monotonic() + 10
            while True:
                try:
                    self.link.publish(queue, garbage.raw, headers={"fuzz-id": garbage.token}, persistent=True)
                    return queue
                except PublishRejected:  # a full metadata queue (reject-publish): wait for the reader
                    assert time.monotonic() < deadline, f"{queue} stayed full"
                    self.link.process_events(0.05)
                except QueueNotFound:  # the task ended meanwhile: its successor's queue is in the run log
                    time.sleep(1.0)
                    break
        return None

    def send(self, items: list[tuple[str, Garbage]], step_files: Sequence[str] = ()) -> None:
        sent: dict[str, str] = {}
        for where, garbage in items:
            if self._publish(where, garbage) is None:
                self.fates["refused by the broker (no queue)"] += 1
                continue
            sent[garbage.token] = f"{where} {garbage.category}: {garbage.raw[:200]!r}"
            self.tried[f"{where}: {garbage.category}"] += 1
        for kind in step_files:
            token = uuid.uuid4().hex[:12]
            _write_step_file(self.data, f"fz-{token}", kind)
            body = encode({"data_id": f"fz-{token}", "policy_iter": 0, "fuzz_id": token})
            self.link.publish(self.learner_queue, body, persistent=True)
            sent[token] = f"learner step file: {kind}"
            self.tried[f"learner: step file {kind}"] += 1
        pending = dict(sent)
        deadline = time.monotonic() + 10
        while pending and time.monotonic() < deadline and self.alive():
            for token in self._dead_tokens() & set(pending):
                pending.pop(token)
                self.fates["dead-lettered"] += 1
            logged = "\n".join(p.log() for p in self.procs.values())
            for token in [t for t in pending if t in logged]:
                pending.pop(token)
                self.fates["skipped with a log line"] += 1
            self.link.process_events(0.2)
        self.lost.extend(pending.values())
        assert self.alive(), (
            "a process stopped on garbage:\n"
            + self.logs()
            + "\n\nthe batch:\n"
            + "\n".join(sent.values())
            + "\n\nconsumed without a trace before that:\n"
            + "\n".join(self.lost)
        )

    def progress(self) -> None:
        """The learner still learns from a good file, and the coordinator still counts steps."""
        self._probes += 1
        data_id = f"fz-good-{self._probes}-{uuid.uuid4().hex[:6]}"
        _write_step_file(self.data, data_id, "good")
        steps_before = _env_steps(self.run_log) if self.run_log is not None else 0
        self.link.publish(self.learner_queue, encode({"data_id": data_id, "policy_iter": 0}), persistent=True)
        wait_until(lambda: not (self.data / data_id).exists() or not self.alive(), 30, f"the learner to read {data_id}")
        assert self.alive(), self.logs()
        assert not (self.data / data_id).exists()
        if self.run_log is not None:
            run_log = self.run_log
            wait_until(lambda: _env_steps(run_log) > steps_before or not self.alive(), 30, "more counted env steps")
            assert self.alive(), self.logs()

    def finish(self, fault: str, started_at: float) -> None:
        record(
            fault,
            tried=sum(self.tried.values()),
            dead_lettered=self.fates["dead-lettered"],
            skipped_logged=self.fates["skipped with a log line"],
            unaccounted=len(self.lost),
            processes_alive=sum(p.alive() for p in self.procs.values()),
            seconds=round(time.monotonic() - started_at, 1),
        )
        print(f"{fault}: {dict(self.tried)} -> {dict(self.fates)}")
        assert self.alive(), self.logs()
        assert not self.lost, f"{len(self.lost)} messages consumed without a trace, e.g.:\n" + "\n".join(self.lost[:10])
        for name, proc in self.procs.items():
            assert not crash_lines(proc.log()), f"{name}:\n" + "\n".join(crash_lines(proc.log())[:10])


JOB_TOML = (
    "[env]\ncollector_env_num = 1\n"
    "[collector]\nn_sample = 100000000\n"
    "[coordinator]\ncollect_tasks = 1\neval_interval_s = 3600.0\nmax_env_steps = 1000000000000\nmax_time_s = 900.0\n"
    "max_run_ahead_samples = 100000000\n"
    "[learner]\nread_wait_s = 0.1\n"
    # no training: the learner only reads, so it keeps up (the warm-up must fit the buffer,
    # whose pages are only touched as transitions come; one env does not fill 10M in a test)
    "[algorithm]\nlearning_starts = 10000000\nreplay_capacity = 10000000\n"
)


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "job.toml").write_text(JOB_TOML)
    return tmp_path


def _volume(root: Path) -> dict[str, str]:
    return {"WARREN_PATH_DATA": str(root / "data"), "WARREN_PATH_POLICY": str(root / "policy")}


@pytest.fixture
def learner(settings: Settings, job_dir: Path, link: BrokerLink) -> Iterator[Proc]:
    proc = Proc(
        ["learner", "--config", str(job_dir / "job.toml")],
        env=role_env(settings, **_volume(job_dir)),
        log=job_dir / "learner.log",
    )
    try:
        wait_started(proc, link, Names(settings.prefix).learner_data("main"))
        wait_until(lambda: "learning dqn (mlp model) on" in proc.log() or not proc.alive(), 60, "the learner to start")
        assert proc.alive(), proc.log()[-3000:]
        yield proc
    finally:
        proc.kill()


def learner_fixed_garbage() -> list[tuple[str, Garbage]]:
    return [
        (LEARNER, _garbage("random bytes", raw=b"\xc1\x00garbage")),
        (LEARNER, _garbage("not a map", [1, 2, 3])),
        (LEARNER, _garbage("crafted", raw=b"\x91" * 3000 + b"\xc0")),
        (LEARNER, _garbage("no data_id", policy_iter=0)),
        (LEARNER, _garbage("data_id not a string", data_id=12345, policy_iter=0)),
        (LEARNER, _garbage("data_id of a missing file", data_id="fz-{token}", policy_iter=0)),
        (LEARNER, _garbage("data_id with ..", data_id="../fz-{token}", policy_iter=0)),
        (LEARNER, _garbage("data_id absolute", data_id="/etc/fz-{token}", policy_iter=0)),
        (LEARNER, _garbage("data_id with NUL", data_id="fz-{token}\x00", policy_iter=0)),
        (LEARNER, _garbage("data_id too long", data_id="fz-{token}" + "y" * 400, policy_iter=0)),
    ]


def test_garbage_in_the_learner_queue_is_dead_lettered_or_skipped(
    learner: Proc, settings: Settings, link: BrokerLink, job_dir: Path
) -> None:
    run = GarbageRun(link, Names(settings.prefix), job_dir / "data", {"learner": learner}, None)
    started_at = time.monotonic()

    @_fuzz_settings(max_examples=scaled(3, 40))
    @given(
        batch=st.lists(metadata_garbage(), min_size=5, max_size=scaled(12, 40)),
        files=st.lists(st.sampled_from(STEP_FILE_KINDS), max_size=3),
    )
    def fuzz(batch: list[Garbage], files: list[str]) -> None:
        run.send([(LEARNER, g) for g in batch], files)
        run.progress()

    try:
        run.send(learner_fixed_garbage(), list(STEP_FILE_KINDS))
        run.progress()
        fuzz()
    finally:
        run.close()
    run.finish("garbage for the learner", started_at)


@pytest.fixture
def job(settings: Settings, job_dir: Path, link: BrokerLink, learner: Proc) -> Iterator[dict[str, Proc]]:
    procs: list[Proc] = []
    try:
        collector = Proc(
            ["collector", "--worker-id", "jc1"], env=role_env(settings, **_volume(job_dir)), log=job_dir / "c.log"
        )
        procs.append(collector)
        wait_started(collector, link, Names(settings.prefix).collector_control("jc1"))
        coordinator = Proc(
            ["coordinator", "--config", str(job_dir / "job.toml"), "--run-log", str(job_dir / "run.jsonl"), *PROGRESS],
            env=role_env(settings),
            log=job_dir / "coordinator.log",
        )
        procs.append(coordinator)
        wait_until(
            lambda: _metadata_queue(job_dir / "run.jsonl") is not None or not coordinator.alive(),
            60,
            "the first running task",
        )
        assert coordinator.alive(), coordinator.log()[-3000:]
        yield {"coordinator": coordinator, "learner": learner, "collector": collector}
    finally:
        for proc in procs:
            proc.kill()


def test_garbage_in_a_metadata_queue_does_not_stop_the_coordinator(
    job: dict[str, Proc], settings: Settings, link: BrokerLink, job_dir: Path
) -> None:
    run = GarbageRun(link, Names(settings.prefix), job_dir / "data", job, job_dir / "run.jsonl")
    started_at = time.monotonic()

    @_fuzz_settings(max_examples=scaled(3, 40))
    @given(batch=st.lists(metadata_garbage(), min_size=5, max_size=scaled(12, 40)))
    def fuzz(batch: list[Garbage]) -> None:
        run.send([(METADATA, g) for g in batch])
        run.progress()

    try:
        # Malformed, but without a value that breaks a conversion: must not vanish silently.
        run.send(
            [
                (METADATA, _garbage("random bytes", raw=b"\xc1\x00garbage")),
                (METADATA, _garbage("not a map", [1, 2, 3])),
                (METADATA, _garbage("neither data nor info", hello="world")),
                (METADATA, _garbage("part of an info", cur_step=1)),
                (METADATA, _garbage("data of a missing file", data_id="fz-{token}", policy_iter=0, unroll_len=1)),
                (METADATA, _garbage("data_id not a string", data_id=7, policy_iter=0)),
            ]
        )
        run.progress()
        # Values of the wrong type or size where the coordinator converts or adds them.
        run.send(
            [
                (METADATA, _garbage("unroll_len a string", data_id="fz-{token}", policy_iter=0, unroll_len="many")),
                (METADATA, _garbage("policy_iter NaN", data_id="fz-{token}", policy_iter=float("nan"))),
                (
                    METADATA,
                    _garbage("cur_step a string", collector_done=False, cur_episode=0, cur_sample=0, cur_step="x"),
                ),
                (
                    METADATA,
                    _garbage("cur_step 2**64-1", collector_done=False, cur_episode=0, cur_sample=0, cur_step=2**64 - 1),
                ),
            ]
        )
        run.progress()
        fuzz()
    finally:
        run.close()
    run.finish("garbage for the coordinator", started_at)
