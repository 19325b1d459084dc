"""The collector worker as a real process, driven through the documented protocol."""

from __future__ import annotations

import os
import pickle
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from messaging import BrokerLink, MetadataConsumer, Names, RemoteError, RpcClient, Settings
from tests.broker_admin import close_connections, connections, wait_until
from tests.procs import Proc, role_env, wait_for_queue
from tests.rl_builders import bound
from tests.tasks import drain_data_tasks, start_task
from worker.plugins import Spaces, installed
from worker.protocol import close_task
from worker.storage import PolicyStore, StepStore

pytestmark = pytest.mark.rabbitmq

POLICY = "policy_cartpole"


def start_body(task_id: str, **cfg: Any) -> dict[str, Any]:
    collector_cfg: dict[str, Any] = {
        "env": {"id": "CartPole-v1", "env_num": 3, "seed": 1},
        "policy": {"type": "random"},
        "n_episode": 2,
        **cfg,
    }
    return start_task(task_id, collector_cfg, buffer_id="buf0")


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "policy").mkdir()
    return tmp_path


WorkerFactory = Callable[..., Proc]


@pytest.fixture
def start_worker(settings: Settings, volume: Path, link: BrokerLink) -> Iterator[WorkerFactory]:
    procs: list[Proc] = []

    def start(worker_id: str = "w1", **env: str) -> Proc:
        proc = Proc(
            ["collector", "--worker-id", worker_id, "--policy-wait-s", "3", "--data-wait-s", "5"],
            env=role_env(
                settings, WARREN_PATH_DATA=str(volume / "data"), WARREN_PATH_POLICY=str(volume / "policy"), **env
            ),
            log=volume / f"{worker_id}.log",
        )
        procs.append(proc)
        wait_for_queue(link, Names(settings.prefix).collector_control(worker_id))
        return proc

    yield start
    for proc in procs:
        proc.kill()


@pytest.fixture
def client(settings: Settings) -> Iterator[RpcClient]:
    with RpcClient(settings, "test-coordinator") as rpc:
        yield rpc


DQN_POLICY = {"type": "dqn", "model_config": {"hidden_sizes": [64, 64]}}


def write_policy(volume: Path, iteration: int, seed: int = 0) -> None:
    """A learner's policy file for the tasks' DQN (64x64 mlp on CartPole), with its header."""
    spaces = Spaces(gym.make("CartPole-v1").observation_space, gym.spaces.Discrete(2))
    net = bound("dqn", spaces, {"hidden_sizes": [64, 64]}).q_network(seed)  # type: ignore[attr-defined]
    header = {"algorithm": "dqn", "spaces_digest": spaces.digest}
    PolicyStore(volume / "policy").write(POLICY, net.state_dict(), iteration, header)


def test_whole_protocol_resource_start_data_close(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, volume: Path
) -> None:
    import os

    start_worker("w1")
    tasks = Names(settings.prefix).collector_tasks
    # resource: measured, not hard-coded
    resource = client.call(tasks, {"name": "resource"})
    assert resource["cpu"] == len(os.sched_getaffinity(0))
    assert resource["gpu"] == torch.cuda.device_count()
    assert resource["worker_id"] == "w1" and resource["busy"] is False
    # and the plug-ins it can run: every installed one (WARREN_PLUGINS="*"), at its version
    assert resource["plugins"] == installed().inventory()
    assert {"dqn", "random"} <= set(resource["plugins"]["algorithms"])
    # start
    started = client.call(tasks, start_body("task-a"))
    assert started["message"] == "collector task has started"
    assert started["worker_id"] == "w1"
    control = started["control_queue"]
    # data tasks until collector_done, each stamped with task and buffer ids
    items = drain_data_tasks(client, control)
    assert all(i["task_id"] == "task-a" and i["buffer_id"] == "buf0" for i in items)
    data = [i for i in items if "data_id" in i]
    infos = [i for i in items if "data_id" not in i]
    assert infos[-1]["collector_done"] is True
    assert not any(i["collector_done"] for i in infos[:-1])
    # every data_id names a complete file of the announced size and layout
    store = StepStore(volume / "data")
    for meta in data:
        chunk = store.read(meta["data_id"], wait_s=0)
        rows = (meta["unroll_len"], meta["env_num"])
        assert chunk.count == rows[0] and rows[1] == 3
        assert set(chunk.fields) == {"obs", "action", "reward", "done", "truncated", "valid"}
        # observations have one row more: the one after the last step closes the chunk
        assert chunk.fields["obs"].shape == (rows[0] + 1, 3, 4) and chunk.fields["obs"].dtype == np.float32
        assert chunk.fields["action"].shape == rows and chunk.fields["action"].dtype == np.int64
        assert chunk.fields["done"].dtype == chunk.fields["valid"].dtype == np.bool_
        assert int(chunk.fields["valid"].sum()) == meta["sample_count"]
    assert sum(m["sample_count"] for m in data) == infos[-1]["cur_sample"]
    # close: DI-engine's finish_info plus the task id; 3 envs x 2 episodes
    finish = client.call(control, {"name": "collector_close_task"})
    assert finish["task_id"] == "task-a" and finish["collector_done"] is True
    assert finish["real_episode_count"] == 6 and finish["env_num"] == 3
    assert finish["step_count"] == finish["sample_count"] == infos[-1]["cur_step"]
    for key in ("eval_flag", "duration", "train_iter", "avg_time_per_step", "reward_mean", "reward_std"):
        assert key in finish
    # the worker is idle again and takes the next task
    assert client.call(tasks, {"name": "resource"})["busy"] is False
    assert client.call(tasks, start_body("task-b"))["worker_id"] == "w1"


def test_metadata_can_be_read_straight_from_the_broker(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, volume: Path
) -> None:
    start_worker("w1")
    started = client.call(Names(settings.prefix).collector_tasks, start_body("task-direct", n_episode=3))
    with BrokerLink(settings, "test-stream") as stream_link:
        consumer = MetadataConsumer(stream_link, started["metadata_queue"], prefetch=16)
        messages = []
        while True:
            item = consumer.get(10.0)
            assert item is not None, "stream went silent"
            messages.append(item.message)
            item.ack()
            if "data_id" not in item.message and item.message["collector_done"]:
                break
    # (the counters only grow; a chunk the full queue refused and sent again may come late)
    samples = [m["cur_sample"] for m in messages]
    assert samples[-1] == max(samples)  # published in the order produced
    assert all(m["task_id"] == "task-direct" for m in messages)
    files = {p.name for p in (volume / "data").iterdir() if not p.name.startswith(".")}
    assert {m["data_id"] for m in messages if "data_id" in m} <= files
    finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    assert finish["real_episode_count"] == 9


def test_a_new_policy_file_mid_task_raises_policy_iter(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, volume: Path
) -> None:
    write_policy(volume, 0)
    start_worker("w1")
    body = start_body(
        "task-policy",
        policy=DQN_POLICY,
        n_episode=None,
        n_sample=100_000,
        policy_update_path=POLICY,
        update_policy_second=0.2,
        collect_setting={"eps": 0.5},
    )
    del body["task_info"]["collector_cfg"]["n_episode"]
    started = client.call(Names(settings.prefix).collector_tasks, body)
    control = started["control_queue"]
    first = [client.call(control, {"name": "collector_data_task"}) for _ in range(3)]
    assert {m["policy_iter"] for m in first if "data_id" in m} == {0}
    write_policy(volume, 7, seed=1)
    deadline = time.monotonic() + 20
    seen: set[int] = set()
    while 7 not in seen and time.monotonic() < deadline:
        item = client.call(control, {"name": "collector_data_task"})
        if "data_id" in item:
            seen.add(item["policy_iter"])
    assert 7 in seen
    finish = client.call(control, {"name": "collector_close_task"})
    assert finish["train_iter"] == 7


def test_a_repeated_start_of_the_running_task_gets_the_same_answer_and_another_task_is_refused(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings
) -> None:
    # Given a worker running a long task
    start_worker("w1")
    body = start_body("task-repeat", n_episode=None, n_sample=10**6)
    del body["task_info"]["collector_cfg"]["n_episode"]
    started = client.call(Names(settings.prefix).collector_tasks, body)
    control = started["control_queue"]
    # When the same start comes again (a redelivery after a lost connection)
    again = client.call(control, body)
    # Then the answer is the first one's: the task runs, here is its stream
    assert again == started
    # while the start of another task is refused as before
    other = start_body("task-other", n_episode=None, n_sample=10**6)
    del other["task_info"]["collector_cfg"]["n_episode"]
    with pytest.raises(RemoteError) as refused:
        client.call(control, other)
    assert refused.value.result == {"message": "worker busy", "task_id": "task-repeat"}
    client.call(control, {"name": "collector_close_task"})


def read_stream_to_done(settings: Settings, queue: str) -> list[dict[str, Any]]:
    """Every item of a task's metadata stream up to its ``collector_done`` info."""
    messages: list[dict[str, Any]] = []
    with BrokerLink(settings, "test-stream") as stream_link:
        consumer = MetadataConsumer(stream_link, queue, prefetch=16)
        while not messages or "data_id" in messages[-1] or not messages[-1]["collector_done"]:
            item = consumer.get(10.0)
            assert item is not None, "stream went silent"
            messages.append(item.message)
            item.ack()
    return messages


def test_a_task_started_free_when_done_frees_its_worker_before_the_close_which_still_answers_for_it(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings
) -> None:
    # Given one worker, and a task started with free_when_done
    start_worker("w1")
    tasks = Names(settings.prefix).collector_tasks
    first = start_body("task-first", n_episode=1)
    first["task_info"]["free_when_done"] = True
    started = client.call(tasks, first)
    assert started["free_when_done"] is True
    # and the next start already waiting in the shared queue
    second = start_body("task-second", n_episode=None, n_sample=10**6)
    del second["task_info"]["collector_cfg"]["n_episode"]
    waiting = client.send(tasks, second, timeout_s=30)
    # When the first task is done (its stream says so) and nobody has closed it yet
    assert read_stream_to_done(settings, started["metadata_queue"])[-1]["collector_done"] is True
    # Then the worker takes the waiting start at once, with the first task still unclosed
    assert client.wait(waiting, timeout_s=10)["task_id"] == "task-second"
    resource = client.call(started["control_queue"], {"name": "resource"})
    assert resource["busy"] is True and resource["task_id"] == "task-second"
    # and a data task asks about the running one, not the one that waits for its close
    assert client.call(started["control_queue"], {"name": "collector_data_task"})["task_id"] == "task-second"
    # and the close of the first, by its id, answers with the first's finish_info
    finish = client.call(started["control_queue"], close_task("task-first"))
    assert finish["task_id"] == "task-first" and finish["collector_done"] is True and finish["real_episode_count"] == 3
    # while the second runs on, to be closed by its own id
    assert client.call(started["control_queue"], {"name": "resource"})["task_id"] == "task-second"
    assert client.call(started["control_queue"], close_task("task-second"))["task_id"] == "task-second"


def test_a_worker_publishes_its_tasks_through_one_connection_kept_from_task_to_task(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, amqp_url: str
) -> None:
    # Given a worker that ran one task to its end and was closed
    worker = start_worker("w1")
    tasks = Names(settings.prefix).collector_tasks

    def task_connections() -> set[str]:
        mine = "warren-collector-w1-task@"
        return {
            c["name"]
            for c in connections(amqp_url)
            if c.get("client_properties", {}).get("connection_name", "").startswith(mine)
            and c["client_properties"]["connection_name"].endswith(f":{worker.pid}")
        }

    for task_id in ("kept-1", "kept-2"):
        started = client.call(tasks, start_body(task_id, n_episode=1))
        read_stream_to_done(settings, started["metadata_queue"])
        client.call(started["control_queue"], close_task(task_id))
        if task_id == "kept-1":
            wait_until(lambda: len(task_connections()) == 1, 30, "the task connection to be listed")
            first = task_connections()
    # Then the second task published through the first one's connection, still open, and no other
    assert task_connections() == first


def test_a_task_started_without_free_when_done_holds_its_worker_until_the_close(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings
) -> None:
    # Given a task started as DI-engine starts one (no free_when_done), done
    start_worker("w1")
    started = client.call(Names(settings.prefix).collector_tasks, start_body("task-legacy", n_episode=1))
    assert "free_when_done" not in started
    read_stream_to_done(settings, started["metadata_queue"])
    # Then the worker stays busy with it until the close
    resource = client.call(started["control_queue"], {"name": "resource"})
    assert resource["busy"] is True and resource["task_id"] == "task-legacy"
    assert client.call(started["control_queue"], {"name": "collector_close_task"})["task_id"] == "task-legacy"
    assert client.call(started["control_queue"], {"name": "resource"})["busy"] is False


def test_a_close_naming_another_task_is_refused_and_the_running_task_goes_on(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings
) -> None:
    # Given a worker running a long task
    start_worker("w1")
    body = start_body("task-now", n_episode=None, n_sample=10**6)
    del body["task_info"]["collector_cfg"]["n_episode"]
    control = client.call(Names(settings.prefix).collector_tasks, body)["control_queue"]
    # When a late close of the task it ran before arrives
    with pytest.raises(RemoteError) as refused:
        client.call(control, close_task("task-before"))
    # Then it is refused, and the running task is still there to be closed by its own id
    assert refused.value.result == {"message": "no running collector", "task_id": "task-now"}
    assert "task-before" in str(refused.value)
    assert client.call(control, {"name": "resource"})["task_id"] == "task-now"
    assert client.call(control, close_task("task-now"))["task_id"] == "task-now"


def test_eval_task_writes_no_step_data(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, volume: Path
) -> None:
    start_worker("w1")
    started = client.call(Names(settings.prefix).collector_tasks, start_body("task-eval", eval_flag=True, n_episode=1))
    items = drain_data_tasks(client, started["control_queue"])
    assert all("data_id" not in i for i in items)
    finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    assert finish["eval_flag"] is True and finish["real_episode_count"] == 3
    assert finish["reward_mean"] > 0 and len(finish["reward_raw"]) == 3
    assert list((volume / "data").iterdir()) == []


class _Evil:
    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, ("touch /tmp/warren-pwned-by-policy",))


def test_bad_tasks_are_refused_clearly_and_the_worker_keeps_serving(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, volume: Path
) -> None:
    worker = start_worker("w1")
    names = Names(settings.prefix)
    tasks, control = names.collector_tasks, names.collector_control("w1")

    def refused(queue: str, body: Any) -> RemoteError:
        with pytest.raises(RemoteError) as info:
            client.call(queue, body)
        return info.value

    assert refused(tasks, {"name": "make_coffee"}).result == {"message": "task name error"}
    assert refused(control, {"name": "collector_data_task"}).result == {"message": "no running collector"}
    assert refused(tasks, {"task_info": {}}).result == {"message": "task name error"}
    assert "task_info" in refused(tasks, {"name": "collector_start_task"}).message
    missing = start_body("t-missing")
    del missing["task_info"]["buffer_id"]
    assert "buffer_id" in refused(tasks, missing).message
    wrong_type = refused(tasks, start_body("t-type", env={"id": "CartPole-v1", "env_num": "many"}))
    assert "env_num" in wrong_type.message and wrong_type.result == {"message": "bad collector_cfg"}
    assert "unknown env id" in refused(tasks, start_body("t-env", env={"id": "NoSuchEnv-v9", "env_num": 1})).message
    for path in ("../../etc/passwd", "/etc/passwd", "a/../../b"):
        body = start_body("t-path", policy={"type": "dqn"}, policy_update_path=path, collect_setting={"eps": 0.1})
        assert refused(tasks, body).result == {"message": "unsafe path"}
    assert "task_id" in refused(tasks, start_body("../escape")).message
    # Plug-ins: a name or a version this worker lacks is a refusal naming both, for this worker only
    lacking = refused(tasks, start_body("t-algo", policy={"type": "a3c"}))
    assert lacking.result == {
        "message": "missing plugin",
        "worker_id": "w1",
        "plugin": {"kind": "algorithm", "name": "a3c", "version": None},
        "have": None,
    }
    assert "worker w1" in lacking.message and "'a3c' is not installed here" in lacking.message
    have = installed().inventory()["algorithms"]["random"]
    other = refused(tasks, start_body("t-version", policy={"type": "random", "version": "0.0.0-old"}))
    assert other.result["message"] == "missing plugin" and other.result["have"] == have
    assert (
        refused(tasks, start_body("t-model", policy={**DQN_POLICY, "model": "cnn"})).result["plugin"]["name"] == "cnn"
    )
    # an algorithm that cannot use the env's spaces, or spaces other than the env's: refused naming both
    continuous = refused(
        tasks, start_body("t-box", env={"id": "MountainCarContinuous-v0", "env_num": 1}, policy=DQN_POLICY)
    )
    assert continuous.result == {"message": "unsupported env"}
    assert "algorithm 'dqn' cannot run this env" in continuous.message and "Box(1,) float32" in continuous.message
    five = Spaces(gym.spaces.Box(-1.0, 1.0, (5,), np.float32), gym.spaces.Discrete(2)).to_wire()
    differs = refused(tasks, start_body("t-spaces", spaces=five))
    assert differs.result == {"message": "unsupported env"} and "another version of the env?" in differs.message
    # settings the algorithm refuses, and a learning one with nowhere to read weights from
    eps = refused(
        tasks, start_body("t-eps", policy=DQN_POLICY, policy_update_path=POLICY, collect_setting={"eps": 2.0})
    )
    assert eps.result == {"message": "bad collector_cfg"} and "collect_setting.eps" in eps.message
    nowhere = refused(tasks, start_body("t-nowhere", policy=DQN_POLICY, collect_setting={"eps": 0.1}))
    assert nowhere.result == {"message": "bad collector_cfg"} and "policy_update_path is missing" in nowhere.message
    lr = refused(tasks, start_body("t-lr", policy={**DQN_POLICY, "config": {"lr": -1}}, policy_update_path=POLICY))
    assert lr.result == {"message": "bad collector_cfg"} and "algorithm.lr" in lr.message
    # A policy file that is a malicious pickle: the task fails with a clear error, nothing runs.
    marker = Path("/tmp/warren-pwned-by-policy")
    marker.unlink(missing_ok=True)
    (volume / "policy" / POLICY).write_bytes(pickle.dumps({"model": _Evil(), "iter": 1}))
    body = start_body("t-evil", policy=DQN_POLICY, policy_update_path=POLICY, collect_setting={"eps": 0.1})
    started = client.call(tasks, body)
    items = drain_data_tasks(client, started["control_queue"])
    assert "error" in items[-1] and items[-1]["collector_done"] is True
    finish = client.call(started["control_queue"], {"name": "collector_close_task"})
    assert "no usable policy file" in finish["error"] and "not a safetensors file" in finish["error"]
    assert finish["collector_done"] is True  # a failed task is over, as its final info said
    assert not marker.exists()
    # The same worker still serves a good task.
    assert worker.alive()
    good = client.call(tasks, start_body("t-good"))
    assert len(drain_data_tasks(client, good["control_queue"])) > 1


def test_two_workers_share_the_task_queue(start_worker: WorkerFactory, client: RpcClient, settings: Settings) -> None:
    start_worker("w1")
    start_worker("w2")
    tasks = Names(settings.prefix).collector_tasks
    long_task = {"n_episode": 1000}
    first = client.call(tasks, start_body("share-1", **long_task))
    second = client.call(tasks, start_body("share-2", **long_task))
    # A busy worker stops taking start tasks, so the second one went to the other worker.
    assert {first["worker_id"], second["worker_id"]} == {"w1", "w2"}
    for started in (first, second):
        assert client.call(started["control_queue"], {"name": "collector_close_task"})["task_id"].startswith("share")


def test_sigterm_mid_task_stops_cleanly_and_says_so(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, link: BrokerLink
) -> None:
    worker = start_worker("w1")
    started = client.call(Names(settings.prefix).collector_tasks, start_body("task-term", n_episode=10_000))
    for _ in range(3):
        client.call(started["control_queue"], {"name": "collector_data_task"})
    # Given a coordinator-like reader on the stream, when the worker gets SIGTERM mid-task
    consumer = MetadataConsumer(link, started["metadata_queue"], prefetch=50)
    worker.signal(signal.SIGTERM)
    messages = []
    deadline = time.monotonic() + 30
    while worker.alive() and time.monotonic() < deadline:
        if (item := consumer.get(0.2)) is not None:
            messages.append(item.message)
            item.ack()
    while (item := consumer.get(1.0)) is not None:
        messages.append(item.message)
        item.ack()
    # Then it exits 0, its control queue went with it, and the stream ends with an "aborted" info
    assert worker.wait(5) == 0
    assert not link.queue_exists(started["control_queue"])
    last = messages[-1]
    assert last.get("aborted") is True and last["collector_done"] is False
    # (the counters only grow; a chunk the full queue refused and sent again may come late)
    samples = [m["cur_sample"] for m in messages]
    assert samples[-1] == max(samples)
    assert "stopping cleanly" in worker.log()


def _temp_files(directory: Path) -> tuple[Path, Path]:
    """A temp file a crashed writer left an hour ago, and one a live writer is writing now."""
    stale = directory / ".env_0_dead.0123456789abcdef.tmp"
    fresh = directory / ".env_1_live.fedcba9876543210.tmp"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    return stale, fresh


def test_a_starting_collector_sweeps_temp_files_crashed_writers_left(volume: Path, start_worker: WorkerFactory) -> None:
    stale, fresh = _temp_files(volume / "data")
    start_worker()
    assert not stale.exists()
    assert fresh.exists()  # another collector may be writing it right now


def test_a_starting_learner_sweeps_temp_files_crashed_writers_left(
    settings: Settings, volume: Path, link: BrokerLink
) -> None:
    stale_data, fresh_data = _temp_files(volume / "data")
    stale_policy, fresh_policy = _temp_files(volume / "policy")
    env = role_env(settings, WARREN_PATH_DATA=str(volume / "data"), WARREN_PATH_POLICY=str(volume / "policy"))
    learner = Proc(["learner"], env=env, log=volume / "learner.log")
    try:
        wait_until((volume / "policy" / "policy_main").exists, 60, "the learner's first policy file")
        assert not stale_data.exists() and not stale_policy.exists()
        assert fresh_data.exists() and fresh_policy.exists()
    finally:
        learner.kill()


def test_a_collector_with_a_refused_password_exits_at_once(settings: Settings, volume: Path) -> None:
    # Given a worker whose broker refuses its credentials (a long connect budget, to be sure
    # the refusal, not the budget, ends it)
    url = settings.amqp_url.replace("guest:guest@", "guest:wrong@")
    env = role_env(settings, WARREN_AMQP_URL=url, WARREN_CONNECT_TIMEOUT_S="120")
    started = time.monotonic()
    proc = Proc(["collector", "--worker-id", "w-refused"], env=env, log=volume / "refused.log")
    try:
        assert proc.wait(60) == 1
    finally:
        proc.kill()
    assert time.monotonic() - started < 30
    assert "refused the credentials" in proc.log()


def test_a_task_queue_deleted_by_its_reader_does_not_come_back_after_a_reconnect(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, amqp_url: str, link: BrokerLink
) -> None:
    # Given a worker that ran a task whose reader deleted the metadata queue at the end
    start_worker("w1", WARREN_HEARTBEAT_S="3")
    started = client.call(Names(settings.prefix).collector_tasks, start_body("gone-1"))
    drain_data_tasks(client, started["control_queue"])
    client.call(started["control_queue"], {"name": "collector_close_task"})
    link.delete_queue(started["metadata_queue"])

    # When the broker closes the worker's connections and they come back (the handler's
    # connection, which declared the queue, included)
    def handler_connections() -> set[str]:
        return {
            c["name"]
            for c in connections(amqp_url)
            if c.get("client_properties", {}).get("connection_name", "").startswith("warren-collector-w1-handler@")
        }

    wait_until(lambda: bool(handler_connections()), 30, "the handler connection to be listed")
    before = handler_connections()
    assert close_connections(amqp_url, lambda n: n.startswith("warren-collector-w1")) >= 2
    wait_until(lambda: bool(handler_connections() - before), 60, "the handler to reconnect")
    # Then the deleted queue stays deleted
    assert not link.queue_exists(started["metadata_queue"])


def test_a_start_whose_caller_left_is_undone(
    start_worker: WorkerFactory, settings: Settings, volume: Path, link: BrokerLink
) -> None:
    names = Names(settings.prefix)
    start_worker("w1")
    with RpcClient(settings, "keeper") as keeper:
        # Given a busy worker, and a second start request waiting behind the first
        first = keeper.call(names.collector_tasks, start_body("long-1", n_episode=10**6))
        leaver = RpcClient(settings, "leaver")
        pending = leaver.send(names.collector_tasks, start_body("orphan-1", n_episode=10**6))
        assert pending
        # When its caller leaves (its reply queue goes with it) before the worker takes it
        leaver.close()
        keeper.call(first["control_queue"], {"name": "collector_close_task"})
        # Then the worker runs it only until its start reply bounces, and removes what it made
        wait_until(
            lambda: not keeper.call(names.collector_tasks, {"name": "resource"})["busy"], 30, "the worker to be free"
        )
        wait_until(lambda: not link.queue_exists(names.metadata("orphan-1")), 10, "the orphan's queue to go")


def test_a_task_closed_mid_run_ships_its_partial_chunk(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings, link: BrokerLink
) -> None:
    # Given a long task with big chunks (a chunk ships every 4096 steps or 0.5 s)
    start_worker("w1")
    started = client.call(
        Names(settings.prefix).collector_tasks, start_body("task-partial", n_episode=10**6, traj_len=4096)
    )
    consumer = MetadataConsumer(link, started["metadata_queue"], prefetch=64)
    time.sleep(0.3)
    # When it is closed mid-run
    finish = client.call(started["control_queue"], close_task("task-partial"))
    # Then the stream holds every sample the close reply counts: the partial chunk was not dropped
    messages = []
    while (item := consumer.get(2.0)) is not None:
        messages.append(item.message)
        item.ack()
    shipped = sum(m["sample_count"] for m in messages if "data_id" in m)
    assert finish["sample_count"] > 0 and shipped == finish["sample_count"] == finish["step_count"]
    assert messages[-1]["cur_sample"] == finish["sample_count"]


def test_a_resource_broadcast_reaches_every_collector_through_the_roster_exchange(
    start_worker: WorkerFactory, client: RpcClient, settings: Settings
) -> None:
    # Given two workers (each binds its control queue to the roster exchange)
    start_worker("w1")
    start_worker("w2")
    # When one resource request goes to the exchange
    correlation_id = client.broadcast(Names(settings.prefix).collector_roster, {"name": "resource"}, timeout_s=10)
    replies: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(replies) < 2 and time.monotonic() < deadline:
        replies += client.gathered(correlation_id)
        time.sleep(0.05)
    # Then both answered, each once, with its plug-ins; and a finished broadcast gathers nothing more
    assert sorted(r["worker_id"] for r in replies) == ["w1", "w2"]
    assert all(r["plugins"] == installed().inventory() for r in replies)
    time.sleep(0.5)
    assert client.gathered(correlation_id, done=True) == []
    assert client.gathered(correlation_id) == []
