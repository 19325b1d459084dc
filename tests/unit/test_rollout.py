"""The collector loop (worker/rl/rollout.py): counters, chunking, ordering, policy waiting and reloading, stopping."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from tests.rl_builders import bound
from worker.envs.gymnasium import GymnasiumEnvs
from worker.errors import CollectorError, CorruptFile, PluginFailed, PolicyUnavailable, TaskError, UnsafePath
from worker.plugins import Actor, Algorithm, Column, EnvContext, Learner, Obs, Spaces
from worker.protocol import CollectorSpec, EnvSpec, PolicySpec
from worker.rl.envs import VecEnvBatch
from worker.rl.rollout import PolicySource, Rollout
from worker.storage import PolicySnapshot

HIDDEN = [8]
META_KEYS = {
    "eval_flag", "policy_iter", "unroll_len", "env_num", "sample_count", "compressor", "get_data_time", "priority",
    "cur_episode", "cur_sample", "cur_step",
}  # fmt: skip
FIELDS = {"obs", "action", "reward", "done", "truncated", "valid"}
STEP_FIELDS = FIELDS - {"obs"}
GYM = GymnasiumEnvs()


def cartpole(num_envs: int, seed: int | None = 0, env_id: str = "CartPole-v1") -> VecEnvBatch:
    return VecEnvBatch(GYM, EnvContext(env_id, num_envs, seed=seed))


CARTPOLE = cartpole(1).spaces


def algorithm(policy: str) -> Algorithm:
    return bound(policy, CARTPOLE, {"hidden_sizes": HIDDEN} if policy == "dqn" else None)


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
    """A valid snapshot whose iter is the number of reads so far (after ``fail_first`` errors, ``none_first`` Nones)."""

    def __init__(self, none_first: int = 0, fail_first: int = 0) -> None:
        self.reads = 0
        self.none_first, self.fail_first = none_first, fail_first
        self.state = algorithm("dqn").q_network(0).state_dict()  # type: ignore[attr-defined]
        self.meta: dict[str, str] = {"algorithm": "dqn", "spaces_digest": CARTPOLE.digest}

    def read(self) -> PolicySnapshot | None:
        self.reads += 1
        if self.reads <= self.fail_first:
            raise CorruptFile("half-written policy file")
        if self.reads <= self.fail_first + self.none_first:
            return None
        return PolicySnapshot(dict(self.state), iter=self.reads, meta=dict(self.meta))


def make_spec(**kwargs: Any) -> CollectorSpec:
    env_num = kwargs.pop("env_num", 3)
    policy = kwargs.pop("policy", "random")
    if policy == "dqn":
        kwargs.setdefault("policy_update_path", "policy_test")
        if not kwargs.get("eval_flag"):
            kwargs.setdefault("collect_setting", {"eps": 0.2})
    model = {"hidden_sizes": HIDDEN} if policy == "dqn" else {}
    return CollectorSpec(
        env=EnvSpec("CartPole-v1", env_num, seed=0), policy=PolicySpec(policy, model_config=model), **kwargs
    )


def run(
    spec: CollectorSpec,
    source: PolicySource | None = None,
    *,
    envs: VecEnvBatch | None = None,
    algo: Algorithm | None = None,
    **kwargs: Any,
) -> tuple[Rollout, RecordingSink]:
    sink = RecordingSink()
    own = envs is None
    batch = envs if envs is not None else cartpole(spec.env.env_num, spec.env.seed)
    try:
        rollout = Rollout(
            spec,
            algo or algorithm(spec.policy.type),
            batch,
            sink,
            source,
            stop=kwargs.pop("stop", threading.Event()),
            **kwargs,
        )
        rollout.run()
    finally:
        if own:
            batch.close()
    return rollout, sink


def is_plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return type(value) in (bool, int, float, str)


def glued(sink: RecordingSink) -> dict[str, np.ndarray]:
    """The chunks glued back together in time: step fields ``[T_total, N]``, obs ``[T_total + 1, N]``."""
    whole = {name: np.concatenate([c[name] for c, _ in sink.chunks]) for name in STEP_FIELDS}
    whole["obs"] = np.concatenate([sink.chunks[0][0]["obs"][:1]] + [c["obs"][1:] for c, _ in sink.chunks])
    return whole


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


def test_an_info_follows_every_chunk_in_which_an_episode_ended_even_past_an_envs_quota() -> None:
    # Given an n_episode task whose envs finish their quota at different times
    rollout, sink = run(make_spec(env_num=4, n_episode=2, traj_len=4))
    # Then the envs that finished first stepped on: more episodes ended in the chunks than the task counts
    ended_per_chunk = [int(((c["done"] | c["truncated"]) & c["valid"]).sum()) for c, _ in sink.chunks]
    info = rollout.finish_info()
    assert info.real_episode_count == sink.infos[-1]["cur_episode"] == 8
    assert sum(ended_per_chunk) > 8
    # and every chunk in which an episode ended, counted or not, is followed by an info (protocol.md section 5)
    chunk_index = 0
    for position, (kind, _) in enumerate(sink.events):
        if kind != "chunk":
            continue
        if ended_per_chunk[chunk_index]:
            assert sink.events[position + 1][0] == "info", f"chunk {chunk_index} ended an episode and no info followed"
        chunk_index += 1


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
        # observations have one row more: the one after the last step closes the chunk
        assert samples["obs"].shape == (t + 1, n, 4) and samples["obs"].dtype == np.float32
        assert samples["action"].shape == (t, n) and samples["action"].dtype == np.int64
        assert samples["reward"].dtype == np.float32
        for name in ("done", "truncated", "valid"):
            assert samples[name].shape == (t, n) and samples[name].dtype == np.bool_
        assert meta["sample_count"] == int(samples["valid"].sum())


def test_chunks_chain_and_reset_steps_are_not_transitions() -> None:
    _, sink = run(make_spec(env_num=3, n_episode=4, traj_len=16))
    # each chunk starts where the one before ended: its closing observation is the next one's first
    for (before, _), (after, _) in itertools.pairwise(sink.chunks):
        np.testing.assert_array_equal(before["obs"][-1], after["obs"][0])
    whole = glued(sink)
    ended = (whole["done"] | whole["truncated"]) & whole["valid"]
    assert ended.sum() >= 12
    # the row after an episode's end is the env's reset step: not a transition
    assert not (ended[:-1] & whole["valid"][1:]).any()
    # invalid rows carry no reward and no episode end
    assert not (whole["done"] | whole["truncated"])[~whole["valid"]].any()
    # and CartPole pays 1 per real step: the rewards are the steps taken
    assert float(whole["reward"][whole["valid"]].sum()) == whole["valid"].sum()


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


def test_a_chunk_older_than_its_max_age_is_shipped_before_it_is_full() -> None:
    # A fake clock that advances 1 s per call: every chunk is past CHUNK_MAX_AGE_S after one row.
    ticks = itertools.count()
    _, sink = run(make_spec(env_num=2, n_sample=20, traj_len=64), clock=lambda: float(next(ticks)))
    assert {m["unroll_len"] for _, m in sink.chunks} == {1}


# -- an algorithm's own columns ---------------------------------------------------------


class _ScoringActor(Actor):
    """Acts 0 and writes a log-prob per env: ``-step number``."""

    def __init__(self) -> None:
        self.calls = 0

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.calls += 1
        n = len(obs)
        return np.zeros(n, np.int64), {"logp": np.full(n, -float(self.calls), np.float32)}

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        pass


class Scoring(Algorithm):
    kind = "none"

    def columns(self) -> Mapping[str, Column]:
        return {"logp": Column(())}

    def make_actor(self, seed: int | None) -> Actor:
        return _ScoringActor()

    def make_learner(self, seed: int) -> Learner:
        raise NotImplementedError


class _BrokenActor(_ScoringActor):
    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        raise ZeroDivisionError("the policy divided by zero")


class Broken(Scoring):
    def make_actor(self, seed: int | None) -> Actor:
        return _BrokenActor()


class Unbuildable(Scoring):
    def make_actor(self, seed: int | None) -> Actor:
        raise ImportError("no module named 'jax'")


class _NanActor(_ScoringActor):
    """Acts, and writes NaN log-probs from its third step on (a model gone NaN)."""

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, extras = super().act(obs, explore=explore, settings=settings)
        if self.calls >= 3:
            extras["logp"][:] = np.nan
        return actions, extras


class GoesNan(Scoring):
    def make_actor(self, seed: int | None) -> Actor:
        return _NanActor()


def test_the_columns_an_algorithm_asks_for_are_written_into_every_chunk() -> None:
    algo = Scoring(None, CARTPOLE, bound("random", CARTPOLE).model)
    _, sink = run(make_spec(env_num=2, n_sample=12, traj_len=3), algo=algo)
    assert all(set(samples) == FIELDS | {"logp"} for samples, _ in sink.chunks)
    logp = np.concatenate([samples["logp"] for samples, _ in sink.chunks])
    assert logp.dtype == np.float32 and logp[:, 0].tolist() == [-float(i) for i in range(1, len(logp) + 1)]


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (Broken, r"algorithm plug-in 'random' \?: act: ZeroDivisionError: the policy divided by zero"),
        (Unbuildable, r"algorithm plug-in 'random' \?: make_actor: ImportError: no module named 'jax'"),
    ],
)
def test_an_algorithm_that_raises_fails_its_task_with_the_errors_summary(cls: type, message: str) -> None:
    algo = cls(None, CARTPOLE, bound("random", CARTPOLE).model)
    with pytest.raises(PluginFailed, match=message):
        run(make_spec(env_num=2, n_episode=1), algo=algo)


def test_an_actor_that_returns_nan_fails_its_task_naming_the_algorithm_instead_of_acting_on_it() -> None:
    # Given an actor whose log-probs go NaN at its third step
    algo = GoesNan(None, CARTPOLE, bound("random", CARTPOLE).model)
    sink = RecordingSink()
    envs = cartpole(2)
    rollout = Rollout(make_spec(env_num=2, n_sample=100, traj_len=1), algo, envs, sink, stop=threading.Event())
    # When the task runs, then it fails there, naming the algorithm and the column
    with pytest.raises(
        PluginFailed, match=r"algorithm plug-in 'random' \?: act: returned NaN or infinite column 'logp'"
    ):
        rollout.run()
    envs.close()
    # and the env never stepped on the NaN step: two steps, two one-row chunks, nothing NaN in them
    assert rollout.finish_info().step_count == 4
    assert all(np.isfinite(samples["logp"]).all() for samples, _ in sink.chunks)


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


class SameFileSource(CountingSource):
    """The same file (same version) at every read."""

    def read(self) -> PolicySnapshot | None:
        self.reads += 1
        return PolicySnapshot(dict(self.state), iter=5, meta=dict(self.meta))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.__setattr__("state", bound("dqn", CARTPOLE, {"hidden_sizes": [16]}).q_network(0).state_dict()),  # type: ignore[attr-defined]
         "loading the policy weights failed: ValueError: the weights do not fit the Q-network: "
         "'encoder.net.0.weight' is (16, 4), needs (8, 4)"),
        (lambda s: s.meta.update(spaces_digest="0000000000000000"),
         f"its spaces digest 0000000000000000 is not the task's {CARTPOLE.digest} "
         "(another env, or another env version)"),
        (lambda s: s.meta.update(algorithm="ppo"), "it was written by algorithm 'ppo'; this task runs 'dqn'"),
    ],
)  # fmt: skip
def test_a_first_policy_that_does_not_fit_is_refused_and_waited_past(
    change: Any, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a policy file of another network, env or algorithm (and nothing better coming)
    source = SameFileSource()
    change(source)
    # When a dqn task waits for its first policy
    with caplog.at_level(logging.ERROR, logger="worker.rl.rollout"), pytest.raises(PolicyUnavailable) as info:
        run(make_spec(policy="dqn", n_sample=10), source, policy_wait_s=1.2)
    # Then it never acted on it: it gave up naming the problem
    assert info.value.message == f"no usable policy file at policy_test after 1.2 s: {problem}"
    # and said so once in the log, though it read the same file again and again
    refusals = [r.getMessage() for r in caplog.records if "refused policy" in r.getMessage()]
    assert source.reads >= 2 and refusals == [f"refused policy policy_test version 5: {problem}"]


def test_a_refused_policy_mid_task_keeps_the_current_one() -> None:
    # Given a task running on a good policy, whose file is then replaced by one of another env
    class TurningSource(CountingSource):
        def read(self) -> PolicySnapshot | None:
            snapshot = super().read()
            if self.reads > 1 and snapshot is not None:
                snapshot.meta["spaces_digest"] = "ffffffffffffffff"
            return snapshot

    ticks = itertools.count()
    source = TurningSource()
    rollout, sink = run(
        make_spec(policy="dqn", n_sample=30, update_policy_second=0.5), source, clock=lambda: float(next(ticks))
    )
    # Then reloads were tried, none taken, and the task finished on the first policy
    assert source.reads > 3
    assert {m["policy_iter"] for _, m in sink.chunks} == {1}
    assert rollout.finish_info().collector_done is True and rollout.finish_info().train_iter == 1


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
    envs = cartpole(3)
    try:
        with pytest.raises(ValueError, match="a dqn rollout needs a policy source"):
            Rollout(
                make_spec(policy="dqn", n_sample=10),
                algorithm("dqn"),
                envs,
                RecordingSink(),
                None,
                stop=threading.Event(),
            )
    finally:
        envs.close()


# -- stopping and failures -----------------------------------------------------------


def test_stop_event_ends_a_long_task_promptly_and_ships_its_partial_chunk() -> None:
    stop = threading.Event()
    sink = RecordingSink()
    envs = cartpole(2)
    rollout = Rollout(
        make_spec(env_num=2, n_sample=10**8, max_env_steps=10**9, traj_len=4096),
        algorithm("random"),
        envs,
        sink,
        stop=stop,
    )
    thread = threading.Thread(target=rollout.run)
    thread.start()
    time.sleep(0.2)

    stop.set()
    thread.join(timeout=2.0)
    envs.close()

    assert not thread.is_alive()
    info = rollout.finish_info()
    assert info.collector_done is False and info.step_count > 0
    assert not any(i["collector_done"] for i in sink.infos)
    # what was collected when the task was stopped reached the sink: not one step short
    assert sum(m["sample_count"] for _, m in sink.chunks) == info.sample_count == info.step_count


class _StoppingActor(_ScoringActor):
    def __init__(self, stop: threading.Event, after: int) -> None:
        super().__init__()
        self.stop, self.after = stop, after

    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if self.calls + 1 == self.after:
            self.stop.set()  # (a close arriving while the env steps)
        return super().act(obs, explore=explore, settings=settings)


def test_a_task_stopped_mid_chunk_ships_the_steps_it_made() -> None:
    # Given a task of 64-step chunks that is stopped during its 10th step
    stop = threading.Event()

    class Stopping(Scoring):
        def make_actor(self, seed: int | None) -> Actor:
            return _StoppingActor(stop, after=10)

    algo = Stopping(None, CARTPOLE, bound("random", CARTPOLE).model)
    rollout, sink = run(make_spec(env_num=2, n_sample=10**6, traj_len=64), algo=algo, stop=stop)
    # Then those 10 steps reached the sink as one chunk, closed by the observation after them
    ((samples, meta),) = sink.chunks
    assert meta["unroll_len"] == 10 and samples["obs"].shape == (11, 2, 4) and samples["logp"].shape == (10, 2)
    info = rollout.finish_info()
    assert meta["sample_count"] == int(samples["valid"].sum()) == info.sample_count == info.step_count >= 16
    assert rollout.finish_info().collector_done is False


def test_stop_while_waiting_for_a_policy_returns_without_error() -> None:
    stop = threading.Event()
    envs = cartpole(3)
    rollout = Rollout(
        make_spec(policy="dqn", n_sample=10), algorithm("dqn"), envs, RecordingSink(), CountingSource(10**9), stop=stop
    )
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()

    rollout.run()
    envs.close()

    assert time.monotonic() - start < 2.0
    assert rollout.finish_info().step_count == 0


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


def test_an_env_crash_fails_the_task_naming_the_env_plugin_and_its_call() -> None:
    if "WarrenExploding-v0" not in gym.registry:
        gym.register("WarrenExploding-v0", entry_point=lambda **_: _ExplodingEnv())
    spec = CollectorSpec(env=EnvSpec("WarrenExploding-v0", 2), policy=PolicySpec("random"), n_episode=1)
    envs = cartpole(2, env_id="WarrenExploding-v0")

    with pytest.raises(
        PluginFailed,
        match=r"env plug-in 'gymnasium' \? \(env 'WarrenExploding-v0'\): step: RuntimeError: physics exploded",
    ):
        run(spec, envs=envs, algo=bound("random", envs.spaces))
    envs.close()


def test_finish_info_is_safe_before_run_and_has_plain_values() -> None:
    envs = cartpole(3)
    rollout = Rollout(
        make_spec(policy="dqn", n_sample=5),
        algorithm("dqn"),
        envs,
        RecordingSink(),
        CountingSource(),
        stop=threading.Event(),
    )
    envs.close()

    info = rollout.finish_info()

    assert info.duration == 0.0 and info.avg_time_per_step == 0.0 and info.reward_mean == 0.0
    assert info.collect_setting == {"eps": 0.2}
    assert is_plain(info.to_wire())


def test_a_rollout_runs_only_once() -> None:
    envs = cartpole(3)
    try:
        rollout, _ = run(make_spec(n_episode=1), envs=envs)
        with pytest.raises(RuntimeError, match="only once"):
            rollout.run()
    finally:
        envs.close()


# -- persistent envs -----------------------------------------------------------------


def test_caller_owned_envs_continue_their_episodes_across_tasks() -> None:
    spec = make_spec(env_num=2, n_sample=3)
    envs = cartpole(2)
    try:
        _, first = run(spec, envs=envs)
        last_obs = first.chunks[-1][0]["obs"][-1]

        _, second = run(spec, envs=envs)

        np.testing.assert_array_equal(second.chunks[0][0]["obs"][0], last_obs)
    finally:
        envs.close()


def test_caller_owned_envs_must_match_the_task() -> None:
    envs = cartpole(2)
    try:
        with pytest.raises(ValueError, match=r"envs are 2 x 'CartPole-v1', the task wants 3 x 'CartPole-v1'"):
            Rollout(
                make_spec(env_num=3, n_episode=1), algorithm("random"), envs, RecordingSink(), stop=threading.Event()
            )
    finally:
        envs.close()


def test_seeded_tasks_are_reproducible() -> None:
    _, a = run(make_spec(env_num=2, n_sample=30))
    _, b = run(make_spec(env_num=2, n_sample=30))

    assert len(a.chunks) == len(b.chunks)
    for (sa, _), (sb, _) in zip(a.chunks, b.chunks, strict=True):
        for key in sa:
            np.testing.assert_array_equal(sa[key], sb[key])


def test_an_unknown_env_id_is_a_task_error_before_anything_runs() -> None:
    with pytest.raises(TaskError, match="unknown env id 'NoSuchEnv-v9'"):
        cartpole(1, env_id="NoSuchEnv-v9")


def test_spaces_of_another_env_are_not_what_the_rollout_checks_against_the_envs() -> None:
    # (the worker refuses a task whose spaces differ from its env's before a rollout exists;
    # the rollout checks policy files against the algorithm's spaces, the task's)
    algo = bound(
        "dqn", Spaces(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)), {"hidden_sizes": HIDDEN}
    )
    source = CountingSource()
    with pytest.raises(PolicyUnavailable, match=r"its spaces digest .* is not the task's"):
        run(make_spec(policy="dqn", n_sample=10), source, algo=algo, policy_wait_s=0.3)
