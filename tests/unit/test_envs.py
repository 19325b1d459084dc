"""The env batch (worker/rl/envs.py) over env plug-ins: episode bookkeeping, seeding, refusals; gymnasium's plug-in."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from worker.envs.gymnasium import GymnasiumEnvs
from worker.errors import TaskError
from worker.plugins import EnvContext, EnvPlugin
from worker.rl.envs import VecEnvBatch, worker_seed

SHORT = "WarrenShortCartPole-v0"
if SHORT not in gym.registry:
    gym.register(
        SHORT,
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point="gymnasium.envs.classic_control.cartpole:CartPoleVectorEnv",
        max_episode_steps=3,
    )
GYM = GymnasiumEnvs()


def batch(env_id: str, num_envs: int, seed: int | None = None, plugin: EnvPlugin = GYM, **kwargs: Any) -> VecEnvBatch:
    return VecEnvBatch(plugin, EnvContext(env_id, num_envs, kwargs=kwargs, seed=seed))


def test_cartpole_runs_as_a_native_vector_env_and_others_as_sync() -> None:
    native, sync = batch("CartPole-v1", 2), batch("Acrobot-v1", 2)
    try:
        assert native.backend == "CartPoleVectorEnv" and sync.backend == "SyncVectorEnv"
        assert native.spaces.describe() == "observations Box(4,) float32, actions Discrete(2)"
        assert sync.spaces.describe() == "observations Box(6,) float32, actions Discrete(3)"
    finally:
        native.close()
        sync.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
def test_the_step_after_an_episode_end_is_a_reset_step_not_a_transition(env_id: str) -> None:
    envs = batch(env_id, 4, seed=0)
    try:
        envs.reset()
        rng = np.random.default_rng(0)
        ended_before = np.zeros(4, dtype=bool)
        episodes: list[float] = []
        n_actions = int(envs.spaces.action.n)  # type: ignore[attr-defined]
        for _ in range(600):
            step = envs.step(rng.integers(0, n_actions, 4))
            # exactly the envs that ended an episode last step take their reset step now
            np.testing.assert_array_equal(step.valid, ~ended_before)
            assert not (step.terminated | step.truncated)[~step.valid].any()
            # the policy sees the final observation until the reset step replaces it
            np.testing.assert_array_equal(envs.obs, step.next_obs)
            episodes += [float(r) for r in step.episode_returns[step.ended]]
            ended_before = step.ended
        assert len(episodes) >= 4
    finally:
        envs.close()


def test_a_time_limit_end_is_truncated_not_terminated_and_returns_its_reward() -> None:
    envs = batch(SHORT, 1, seed=0)
    try:
        envs.reset()
        steps = [envs.step(np.array([i % 2])) for i in range(4)]
        assert [bool(s.truncated[0]) for s in steps] == [False, False, True, False]
        assert not any(bool(s.terminated[0]) for s in steps)
        assert steps[2].episode_returns[0] == 3.0 and steps[2].ended[0]
        assert not steps[3].valid[0] and steps[3].reward[0] == 0.0
        # the reset step brings a fresh start, not the final observation again
        after_reset: Any = steps[3].next_obs
        final: Any = steps[2].next_obs
        assert not np.array_equal(after_reset, final)
    finally:
        envs.close()


def test_observations_are_fresh_arrays_a_later_step_never_writes_into() -> None:
    envs = batch("CartPole-v1", 2, seed=0)
    try:
        first = envs.reset()
        kept = first.copy()
        envs.step(np.array([0, 1]))
        envs.step(np.array([1, 0]))
        np.testing.assert_array_equal(first, kept)
    finally:
        envs.close()


def test_only_the_first_reset_seeds_the_envs() -> None:
    envs = batch("CartPole-v1", 2, seed=3)
    try:
        first: Any = envs.reset().copy()
        second: Any = envs.reset().copy()
        fresh = batch("CartPole-v1", 2, seed=3)
        np.testing.assert_array_equal(fresh.reset(), first)
        fresh.close()
        assert not np.array_equal(first, second)
    finally:
        envs.close()


def test_spawned_exploration_seeds_differ_per_task_but_follow_the_batch_seed() -> None:
    a, b = batch("CartPole-v1", 1, seed=3), batch("CartPole-v1", 1, seed=3)
    try:
        seeds_a = [a.spawn_seed() for _ in range(3)]
        seeds_b = [b.spawn_seed() for _ in range(3)]
    finally:
        a.close()
        b.close()

    assert seeds_a == seeds_b and len(set(seeds_a)) == 3


def test_collectors_of_one_seeded_job_step_episodes_of_their_own_and_each_the_same_every_run() -> None:
    def first_obs(worker_id: str) -> Any:
        envs = batch("CartPole-v1", 4, seed=worker_seed(7, worker_id))
        try:
            return envs.reset().copy(), envs.spawn_seed()
        finally:
            envs.close()

    (c0, explore0), (c1, explore1), (again, explore_again) = first_obs("c0"), first_obs("c1"), first_obs("c0")
    assert not np.array_equal(c0, c1) and explore0 != explore1
    np.testing.assert_array_equal(c0, again)
    assert explore0 == explore_again
    assert worker_seed(7, "c0") != worker_seed(8, "c0")
    assert all(0 <= worker_seed(s, w) < 2**31 for s in (0, 2**31 - 1) for w in ("c0", "x" * 200))


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("NoSuchEnv-v0", "unknown env id 'NoSuchEnv-v0': not in the gymnasium registry"),
        ("os:system", "unknown env id 'os:system'"),  # gym.make would import module "os"
        ("gymnasium.envs.classic_control:CartPoleEnv", "unknown env id"),
    ],
)
def test_ids_outside_gymnasiums_registry_are_refused_without_importing_anything(env_id: str, message: str) -> None:
    with pytest.raises(TaskError, match=message) as info:
        batch(env_id, 2)
    assert info.value.result == {"message": "unknown env"}
    with pytest.raises(TaskError, match=message):
        GYM.make_env(EnvContext(env_id, 1))


def test_bad_env_kwargs_are_an_unknown_env_naming_the_env() -> None:
    with pytest.raises(TaskError, match="cannot create env 'CartPole-v1'") as info:
        batch("CartPole-v1", 1, no_such_kwarg=3)
    assert info.value.result == {"message": "unknown env"}


def test_a_continuous_env_is_accepted_here_its_algorithm_decides() -> None:
    # (DQN refuses Box actions when it is bound; the env batch carries any supported space)
    envs = batch("MountainCarContinuous-v0", 2, seed=0)
    try:
        envs.reset()
        step = envs.step(np.zeros((2, 1), np.float32))
        assert step.valid.all() and envs.spaces.describe().endswith("actions Box(1,) float32")
    finally:
        envs.close()


# -- env plug-ins of other shapes --------------------------------------------------------


class _Grid(gym.Env[dict[str, Any], np.int64]):
    """A Dict observation of a uint8 image and a direction; ends after 5 steps."""

    observation_space = gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 255, (3, 3), np.uint8), "direction": gym.spaces.Discrete(4)}
    )
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, self.t >= 5, False, {}

    def _obs(self) -> dict[str, Any]:
        return {"image": np.full((3, 3), self.t * 10, np.uint8), "direction": int(self.t % 4)}


class GridEnvs(EnvPlugin):
    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        return _Grid()


class SameStepEnvs(GridEnvs):
    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        return gym.vector.SyncVectorEnv(
            [_Grid for _ in range(ctx.num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )


class TooFewEnvs(GridEnvs):
    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        return gym.vector.SyncVectorEnv([_Grid])


class CrashingEnvs(GridEnvs):
    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        raise RuntimeError("simulator licence expired")


class _Texty(_Grid):
    observation_space = gym.spaces.Text(5)  # type: ignore[assignment]


class TextEnvs(GridEnvs):
    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        return _Texty()


class _CroppingVectorEnv(gym.vector.SyncVectorEnv):
    """A plug-in's own vector env that crops its images to 2 x 3, whatever its space says (3 x 3)."""

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        return {**obs, "image": obs["image"][:, :2]}, info


class CroppingEnvs(GridEnvs):
    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        return _CroppingVectorEnv([_Grid for _ in range(ctx.num_envs)])


def test_an_observation_of_another_shape_than_its_space_fails_the_reset_that_returned_it() -> None:
    # (not the actor, whose failure would name the algorithm, nor the learner, chunks later)
    envs = batch("grid", 2, seed=0, plugin=CroppingEnvs())
    try:
        with pytest.raises(
            ValueError, match=r"observation 'image' of 2 envs has shape \(2, 2, 3\), .* wants \(2, 3, 3\)"
        ):
            envs.reset()
    finally:
        envs.close()


def test_an_env_plugin_with_dict_image_observations_steps_in_the_spaces_dtypes() -> None:
    envs = batch("grid", 2, seed=0, plugin=GridEnvs())
    try:
        obs = envs.reset()
        assert isinstance(obs, dict) and obs["image"].dtype == np.uint8 and obs["direction"].dtype == np.int64
        assert obs["image"].shape == (2, 3, 3) and obs["direction"].shape == (2,)
        returns = []
        for _ in range(6):
            step = envs.step(np.array([0, 1]))
            returns += step.episode_returns[step.ended].tolist()
        assert returns == [5.0, 5.0]
        assert not step.valid.any()  # the sixth step is both envs' reset step
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("plugin", "refusal", "message"),
    [
        (SameStepEnvs(), "unsupported env", "autoreset.* warren needs NEXT_STEP"),
        (TooFewEnvs(), "unsupported env", "env 'grid' made 1 envs, 3 asked"),
        (CrashingEnvs(), "unknown env", "cannot create env 'grid': RuntimeError: simulator licence expired"),
        (TextEnvs(), "unsupported env", r"env 'grid': observation space Text\(.*\) is not supported"),
    ],
)
def test_env_plugins_that_cannot_serve_a_task_are_refused_with_the_reason(
    plugin: EnvPlugin, refusal: str, message: str
) -> None:
    with pytest.raises(TaskError, match=message) as info:
        batch("grid", 3, plugin=plugin)
    assert info.value.result == {"message": refusal}


def test_a_vector_entry_point_with_threads_gets_the_workers_thread_budget_and_others_do_not() -> None:
    pytest.importorskip("ale_py")
    from worker.envs.gymnasium import _takes_threads
    from worker.plugins.registry import import_env_packages

    import_env_packages("ale_py")
    assert _takes_threads(gym.spec("ALE/Pong-v5")) and not _takes_threads(gym.spec("CartPole-v1"))


def test_warren_run_shares_the_cpus_among_its_collectors_unless_told() -> None:
    from worker.cli.run_plan import collector_env_threads
    from worker.config import cpu_budget

    assert collector_env_threads(1, {}) == ["--env-threads", str(cpu_budget())]
    assert collector_env_threads(64, {}) == ["--env-threads", "1"]
    assert collector_env_threads(2, {"WARREN_ENV_THREADS": "3"}) == []
