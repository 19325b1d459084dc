"""The collector loop: counters, chunking, ordering, policy waiting and reloading, stopping."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from worker.errors import CollectorError, CorruptFile, PolicyUnavailable, TaskError, UnsafePath
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.envs import VecEnvBatch
from worker.rl.policy import QNetwork
from worker.rl.rollout import PolicySource, Rollout
from worker.storage import PolicySnapshot

HIDDEN = (8,)
META_KEYS = {
    "eval_flag", "policy_iter", "unroll_len", "env_num", "sample_count", "compressor", "get_data_time", "priority",
    "cur_episode", "cur_sample", "cur_step",
}  # fmt: skip
FIELDS = {"obs", "next_obs", "action", "reward", "done", "truncated", "valid"}


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def add_chunk(self, samples: Mapping[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.events.append(("chunk", (dict(samples), meta)))

    def add_info(self, info: dict[str, Any]) -> None:
        self.events.append(("info", info))

    @property
    def chunks(self) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
        return [payload for kind, payload in self.events if kind == "chunk"]

    @property
    def infos(self) -> list[dict[str, Any]]:
        return [payload for kind, payload in self.events if kind == "info"]


class CountingSource:
    """Hands out a valid snapshot whose iter is the number of reads so far (after ``none_first`` Nones)."""

    def __init__(self, none_first: int = 0, fail_first: int = 0) -> None:
        self.reads = 0
        self.none_first, self.fail_first = none_first, fail_first
        self.state = QNetwork(4, 2, HIDDEN).state_dict()

    def read(self) -> PolicySnapshot | None:
        self.reads += 1
        if self.reads <= self.fail_first:
            raise CorruptFile("half-written policy file")
        if self.reads <= self.fail_first + self.none_first:
            return None
        return PolicySnapshot(dict(self.state), iter=self.reads)


def make_spec(**kwargs: Any) -> CollectorSpec:
    env_num = kwargs.pop("env_num", 3)
    policy = kwargs.pop("policy", "random")
    if policy == "dqn":
        kwargs.setdefault("policy_update_path", "policy_test")
        kwargs.setdefault("eps", 0.0 if kwargs.get("eval_flag") else 0.2)
    return CollectorSpec(env=EnvSpec("CartPole-v1", env_num, seed=0), policy=PolicySpec(policy, HIDDEN), **kwargs)


def run(spec: CollectorSpec, source: PolicySource | None = None, **kwargs: Any) -> tuple[Rollout, RecordingSink]:
    sink = RecordingSink()
    rollout = Rollout(spec, sink, source, stop=kwargs.pop("stop", threading.Event()), **kwargs)
    rollout.run()
    return rollout, sink


def is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return type(value) in (bool, int, float, str)


# -- finishing conditions ----------------------------------------------------------


def test_n_episode_task_runs_exactly_env_num_times_n_episode_episodes() -> None:
    rollout, sink = run(make_spec(env_num=3, n_episode=2))

    info = rollout.finish_info()
    assert info.real_episode_count == info.predefined_episode_count == 6
    assert len(info.reward_raw) == 6
    assert [i["collector_done"] for i in sink.infos] == [False] * (len(sink.infos) - 1) + [True]
    assert sink.events[-1] == ("info", sink.infos[-1]) and sink.infos[-1]["cur_episode"] == 6
    assert info.collector_done is True
    assert info.sample_count == sum(m["sample_count"] for _, m in sink.chunks)


def test_n_sample_task_stops_at_the_sample_target_and_reports_done_once() -> None:
    rollout, sink = run(make_spec(env_num=4, n_sample=50, traj_len=8))

    info = rollout.finish_info()
    assert 50 <= info.sample_count < 50 + 4
    assert sum(m["sample_count"] for _, m in sink.chunks) == info.sample_count
    assert sink.events[-1][0] == "info" and sink.infos[-1]["collector_done"] is True
    assert sum(i["collector_done"] for i in sink.infos) == 1
    assert sink.infos[-1]["cur_sample"] == info.sample_count
    assert info.predefined_episode_count == 0
    assert info.collect_setting == {}


def test_max_env_steps_ends_the_task_as_done() -> None:
    rollout, sink = run(make_spec(env_num=2, n_episode=1000, max_env_steps=40))

    info = rollout.finish_info()
    assert info.collector_done is True and 40 <= info.step_count < 42
    assert info.sample_count == info.step_count  # the partial chunk was shipped
    assert sink.infos[-1]["collector_done"] is True


# -- chunks and ordering -------------------------------------------------------------


def test_chunks_are_columnar_arrays_with_matching_meta() -> None:
    _, sink = run(make_spec(env_num=2, n_episode=3, traj_len=5))

    assert sink.chunks
    for samples, meta in sink.chunks:
        t, n = meta["unroll_len"], meta["env_num"]
        assert 1 <= t <= 5 and n == 2 and set(meta) == META_KEYS and set(samples) == FIELDS
        assert meta["compressor"] == "none" and meta["priority"] == 1.0 and meta["eval_flag"] is False
        assert samples["obs"].shape == samples["next_obs"].shape == (t, n, 4)
        assert samples["obs"].dtype == samples["next_obs"].dtype == np.float32
        assert samples["action"].shape == (t, n) and samples["action"].dtype == np.int64
        assert samples["reward"].dtype == np.float32
        for name in ("done", "truncated", "valid"):
            assert samples[name].shape == (t, n) and samples[name].dtype == np.bool_
        assert meta["sample_count"] == int(samples["valid"].sum())


def test_rows_chain_within_episodes_and_reset_steps_are_not_transitions() -> None:
    _, sink = run(make_spec(env_num=3, n_episode=4, traj_len=16))
    # Glue the chunks back together in time: [T_total, N]
    whole = {name: np.concatenate([c[name] for c, _ in sink.chunks]) for name in FIELDS}
    ended = (whole["done"] | whole["truncated"]) & whole["valid"]
    assert ended.sum() >= 12
    # the row after an episode's end is the env's reset step: not a transition
    assert not (ended[:-1] & whole["valid"][1:]).any()
    # otherwise s' of one row is s of the next
    chained = ~ended[:-1]
    np.testing.assert_array_equal(whole["next_obs"][:-1][chained], whole["obs"][1:][chained])
    # invalid rows carry no reward and no episode end
    assert not (whole["done"] | whole["truncated"])[~whole["valid"]].any()


def test_data_reaches_the_sink_before_the_info_counting_it() -> None:
    _, sink = run(make_spec(env_num=3, n_episode=3, traj_len=4))

    delivered = 0
    for kind, payload in sink.events:
        if kind == "chunk":
            delivered += payload[1]["sample_count"]
            assert payload[1]["cur_sample"] == delivered
        else:
            assert payload["cur_sample"] == delivered
    assert len(sink.infos) >= 2


def test_counters_in_meta_only_grow() -> None:
    _, sink = run(make_spec(env_num=3, n_sample=200, traj_len=7))

    for key in ("cur_sample", "cur_step", "cur_episode"):
        values = [m[key] for _, m in sink.chunks]
        assert values == sorted(values)


# -- eval --------------------------------------------------------------------------


def test_eval_writes_no_samples_and_reports_returns() -> None:
    rollout, sink = run(make_spec(env_num=3, n_episode=1, eval_flag=True))

    info = rollout.finish_info()
    assert sink.chunks == []
    assert info.real_episode_count == 3 and info.sample_count == 0
    # CartPole pays 1 per step: the returns add up to no more than the steps taken (envs that
    # finished their share keep stepping until the others finish, uncounted)
    assert 0 < sum(info.reward_raw) <= info.step_count
    assert all(r >= 8 for r in info.reward_raw)
    assert info.reward_mean == pytest.approx(np.mean(info.reward_raw))
    assert info.reward_std == pytest.approx(np.std(info.reward_raw))
    assert "collect_setting" not in info.to_wire() and info.eval_flag is True
    assert is_plain(info.to_wire())


def test_eval_with_dqn_reads_the_policy_once() -> None:
    source = CountingSource()
    rollout, _ = run(make_spec(policy="dqn", env_num=2, n_episode=2, eval_flag=True, update_policy_second=1e-3), source)

    assert source.reads == 1
    assert rollout.finish_info().train_iter == 1


# -- policy handling -----------------------------------------------------------------


def test_dqn_waits_for_the_first_policy() -> None:
    source = CountingSource(none_first=1, fail_first=1)  # a read error counts as "not there yet"
    _, sink = run(make_spec(policy="dqn", n_sample=10), source, policy_wait_s=5.0)

    assert sink.chunks[0][1]["policy_iter"] == 3


def test_dqn_gives_up_after_policy_wait_s() -> None:
    source = CountingSource(none_first=10**9)
    start = time.monotonic()

    with pytest.raises(PolicyUnavailable, match=r"no usable policy file at policy_test after 0\.3 s"):
        run(make_spec(policy="dqn", n_sample=10), source, policy_wait_s=0.3)

    assert 0.3 <= time.monotonic() - start < 3.0
    assert source.reads >= 1


def test_collect_rereads_the_policy_every_update_policy_second() -> None:
    # A fake clock that advances 1 s per call: every step is past the reload deadline.
    ticks = itertools.count()
    source = CountingSource()
    rollout, sink = run(
        make_spec(policy="dqn", env_num=2, n_sample=40, traj_len=4, update_policy_second=0.5),
        source,
        clock=lambda: float(next(ticks)),
    )

    iters = [m["policy_iter"] for _, m in sink.chunks]
    assert iters[0] >= 1 and iters[-1] > iters[0] and iters == sorted(iters)
    assert rollout.finish_info().train_iter == source.reads


def test_policy_that_does_not_fit_the_network_fails_the_task() -> None:
    source = CountingSource()
    source.state = QNetwork(4, 2, (16,)).state_dict()

    with pytest.raises(CollectorError, match="do not fit"):
        run(make_spec(policy="dqn", n_sample=10), source)


def test_unsafe_policy_path_fails_the_task_at_once() -> None:
    class UnsafeSource:
        def read(self) -> PolicySnapshot | None:
            raise UnsafePath("../../etc/passwd leaves the shared volume")

    start = time.monotonic()
    with pytest.raises(CollectorError, match="leaves the shared volume"):
        run(make_spec(policy="dqn", n_sample=10), UnsafeSource(), policy_wait_s=30.0)
    assert time.monotonic() - start < 2.0


def test_failed_reload_keeps_the_current_policy() -> None:
    class FlakySource(CountingSource):
        def read(self) -> PolicySnapshot | None:
            if self.reads >= 1:
                self.reads += 1
                raise CorruptFile("learner is writing")
            return super().read()

    ticks = itertools.count()
    source = FlakySource()
    rollout, sink = run(
        make_spec(policy="dqn", n_sample=30, update_policy_second=0.5), source, clock=lambda: float(next(ticks))
    )

    assert source.reads > 3  # reloads were attempted
    assert {m["policy_iter"] for _, m in sink.chunks} == {1}
    assert rollout.finish_info().collector_done is True


def test_dqn_without_policy_source_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="policy source"):
        Rollout(make_spec(policy="dqn", n_sample=10), RecordingSink(), None, stop=threading.Event())


# -- stopping and failures -----------------------------------------------------------


def test_stop_event_ends_a_long_task_promptly() -> None:
    stop = threading.Event()
    sink = RecordingSink()
    rollout = Rollout(make_spec(env_num=2, n_sample=10**8, max_env_steps=10**9), sink, stop=stop)
    thread = threading.Thread(target=rollout.run)
    thread.start()
    time.sleep(0.2)

    stop.set()
    thread.join(timeout=2.0)

    assert not thread.is_alive()
    info = rollout.finish_info()
    assert info.collector_done is False and info.step_count > 0
    assert not any(i["collector_done"] for i in sink.infos)


def test_stop_while_waiting_for_a_policy_returns_without_error() -> None:
    stop = threading.Event()
    rollout = Rollout(make_spec(policy="dqn", n_sample=10), RecordingSink(), CountingSource(10**9), stop=stop)
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()

    rollout.run()

    assert time.monotonic() - start < 2.0
    assert rollout.finish_info().step_count == 0


def test_unknown_env_id_is_a_task_error() -> None:
    spec = CollectorSpec(env=EnvSpec("NoSuchEnv-v9", 1), policy=PolicySpec("random"), n_episode=1)

    with pytest.raises(TaskError, match="unknown env id 'NoSuchEnv-v9'"):
        run(spec)


class _ExplodingEnv(gym.Env[np.ndarray, np.int64]):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        raise RuntimeError("physics exploded")


def test_env_crash_becomes_a_collector_error() -> None:
    if "WarrenExploding-v0" not in gym.registry:
        gym.register("WarrenExploding-v0", entry_point=lambda **_: _ExplodingEnv())
    spec = CollectorSpec(env=EnvSpec("WarrenExploding-v0", 2), policy=PolicySpec("random"), n_episode=1)

    with pytest.raises(
        CollectorError, match="stepping env 'WarrenExploding-v0' failed: RuntimeError: physics exploded"
    ):
        run(spec)


def test_finish_info_is_safe_before_run_and_has_plain_values() -> None:
    rollout = Rollout(make_spec(policy="dqn", n_sample=5), RecordingSink(), CountingSource(), stop=threading.Event())

    info = rollout.finish_info()

    assert info.duration == 0.0 and info.avg_time_per_step == 0.0 and info.reward_mean == 0.0
    assert info.collect_setting == {"eps": 0.2}
    assert is_plain(info.to_wire())


def test_a_rollout_runs_only_once() -> None:
    rollout, _ = run(make_spec(n_episode=1))

    with pytest.raises(RuntimeError, match="only once"):
        rollout.run()


# -- persistent envs -----------------------------------------------------------------


def test_caller_owned_envs_continue_their_episodes_across_tasks() -> None:
    spec = make_spec(env_num=2, n_sample=3)
    envs = VecEnvBatch("CartPole-v1", 2, seed=0)
    try:
        _, first = run(spec, envs=envs)
        last_obs = first.chunks[-1][0]["next_obs"][-1]

        _, second = run(spec, envs=envs)

        np.testing.assert_array_equal(second.chunks[0][0]["obs"][0], last_obs)
    finally:
        envs.close()


def test_caller_owned_envs_must_match_the_task() -> None:
    envs = VecEnvBatch("CartPole-v1", 2)
    try:
        with pytest.raises(ValueError, match="the task wants 3"):
            Rollout(make_spec(env_num=3, n_episode=1), RecordingSink(), stop=threading.Event(), envs=envs)
    finally:
        envs.close()


def test_seeded_tasks_are_reproducible() -> None:
    _, a = run(make_spec(env_num=2, n_sample=30))
    _, b = run(make_spec(env_num=2, n_sample=30))

    assert len(a.chunks) == len(b.chunks)
    for (sa, _), (sb, _) in zip(a.chunks, b.chunks, strict=True):
        for key in sa:
            np.testing.assert_array_equal(sa[key], sb[key])
