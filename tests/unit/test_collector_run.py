"""A collector task's own state: when it counts as stuck in its envs."""

from __future__ import annotations

import threading
from typing import Any, cast

from messaging import ConnectionFailed, QueueDecl
from worker.collector.run import CollectorRun
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec, StartTask


class NoBroker:
    """Publishers that cannot connect: the task ends at once, on its own thread."""

    def take(self) -> Any:
        raise ConnectionFailed("no broker in this test")

    def give_back(self, publisher: Any, queue: str, *, sound: bool) -> None:
        raise AssertionError("nothing was taken")


def test_a_task_whose_last_act_runs_after_a_close_asked_it_to_stop_is_not_stuck_in_its_envs() -> None:
    # Given a task whose close sets its stop switch just as the task ends by itself
    seen: dict[str, bool] = {}
    ended = threading.Event()

    def last_act(run: CollectorRun) -> None:
        run.stop.set()  # the close's first step, on the worker's thread, racing this one
        seen["stuck"] = run.stuck  # what the worker asks before it keeps the task's envs
        ended.set()

    start = StartTask("collect-1", "main", CollectorSpec(EnvSpec("CartPole-v1", 1), PolicySpec("random"), n_episode=1))
    run = CollectorRun(
        start,
        publishers=cast(Any, NoBroker()),
        metadata=QueueDecl("t.metadata.collect-1"),
        steps=cast(Any, None),
        policies=cast(Any, None),
        policy_wait_s=1.0,
        algorithm=cast(Any, None),
        envs=cast(Any, None),
        on_ended=last_act,
    )
    # When its thread ends
    run.start()
    assert ended.wait(10)
    # Then it was not stuck in its envs (they go to the next task), though its thread was still alive
    assert seen == {"stuck": False}
    assert run.error is not None and "no broker in this test" in run.error
