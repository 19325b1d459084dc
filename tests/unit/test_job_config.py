from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path

import gymnasium as gym
import pytest

from messaging import ConfigurationError
from worker.job import JobConfig
from worker.protocol import CollectorSpec

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.toml"


def test_the_shipped_config_file_spells_out_the_defaults() -> None:
    assert JobConfig.load(SHIPPED) == JobConfig()


def test_the_shipped_config_file_lists_every_setting_of_every_section() -> None:
    # Derived from the dataclasses, so a setting added to the job must be added to the file too.
    listed = tomllib.loads(SHIPPED.read_text())
    defaults = JobConfig()
    for section in dataclasses.fields(JobConfig):
        keys = {f.name for f in dataclasses.fields(getattr(defaults, section.name))}
        assert set(listed.get(section.name, {})) == keys, f"[{section.name}]"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[env]\nstop_value = 100.0\n[learner]\nlr = 0.0005\n")
    config = JobConfig.load(path, **{"env.stop_value": 150.0, "coordinator.collect_tasks": None})
    assert config.env.stop_value == 150.0
    assert config.learner.lr == 0.0005
    assert config.coordinator.collect_tasks == JobConfig().coordinator.collect_tasks


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[envs]\nid = 'x'\n", "unknown config section"),
        ("[env]\nstop_vlaue = 1\n", "unknown keys"),
        ("[learner]\nlr = -1.0\n", r"\[learner\]"),
        ("not toml at all [", "cannot read config"),
        ("[env]\ncollector_env_num = 100000\n", "would be refused: collector_cfg.env.env_num"),
        ("[collector]\nupdate_policy_second = 0\n", "would be refused: collector_cfg.update_policy_second"),
        ("[env]\nseed = 4294967290\n", "would be refused: collector_cfg.env.seed"),
    ],
)
def test_mistakes_in_a_config_file_are_configuration_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=match):
        JobConfig.load(path)


def test_task_bodies_are_valid_collector_configs() -> None:
    config = JobConfig()
    collect = CollectorSpec.from_wire(config.collect_spec(0.25).to_wire())
    assert collect.eps == 0.25 and not collect.eval_flag and collect.n_sample == config.collector.n_sample
    evaluation = CollectorSpec.from_wire(config.eval_spec().to_wire())
    assert evaluation.eval_flag and evaluation.n_episode == config.env.eval_episodes


# -- the stop value -----------------------------------------------------------------------


def test_cartpole_keeps_di_engines_stop_value_and_other_envs_take_their_reward_threshold(tmp_path: Path) -> None:
    assert JobConfig.load(None).env.stop_value == 195.0  # gymnasium says 475; DI-engine's job uses 195
    assert JobConfig.load(None, **{"env.id": "Acrobot-v1"}).env.stop_value == -100.0
    path = tmp_path / "job.toml"
    path.write_text('[env]\nid = "MountainCar-v0"\n')
    assert JobConfig.load(path).env.stop_value == -110.0
    # A stop value given in the file or as a flag wins
    path.write_text('[env]\nid = "Acrobot-v1"\nstop_value = -80.0\n')
    assert JobConfig.load(path).env.stop_value == -80.0
    assert JobConfig.load(path, **{"env.stop_value": -90.0}).env.stop_value == -90.0


def test_an_env_without_a_reward_threshold_needs_a_stop_value() -> None:
    env_id = "WarrenTest/CartPoleNoThreshold-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=50)
    with pytest.raises(ConfigurationError, match=r"has no reward_threshold.*give a stop value"):
        JobConfig.load(None, **{"env.id": env_id})
    assert JobConfig.load(None, **{"env.id": env_id, "env.stop_value": 40.0}).env.stop_value == 40.0


@pytest.mark.parametrize(
    ("env_id", "match"),
    [
        ("Nope-v0", "would be refused: unknown env id 'Nope-v0': not in the gymnasium registry"),
        ("Pendulum-v1", "would be refused: env 'Pendulum-v1' has action space Box"),
    ],
)
def test_an_env_no_collector_would_run_is_refused_before_the_run(env_id: str, match: str) -> None:
    for stop_value in (None, 10.0):
        with pytest.raises(ConfigurationError, match=match):
            JobConfig.load(None, **{"env.id": env_id, "env.stop_value": stop_value})


@pytest.mark.parametrize(
    ("env_id", "stop_value", "warning"),
    [
        ("Acrobot-v1", 195.0, "stop value 195 is above the highest return Acrobot-v1 can give (0): only a budget"),
        ("CartPole-v1", 1e5, "stop value 100000 is above the highest return CartPole-v1 can give (500)"),
        ("CartPole-v1", -1.0, "stop value -1 is at or below the lowest return CartPole-v1 can give (0): the first"),
        ("CartPole-v1", 195.0, None),
        ("Acrobot-v1", -100.0, None),
        ("Acrobot-v1", math.inf, None),  # deliberately: a run that ends on a budget
    ],
)
def test_a_stop_value_the_env_cannot_reach_is_warned_about(env_id: str, stop_value: float, warning: str | None) -> None:
    job = JobConfig.load(None, **{"env.id": env_id, "env.stop_value": stop_value})
    warnings = job.warnings()
    assert warnings == [] if warning is None else (len(warnings) == 1 and warnings[0].startswith(warning))


def test_job_json_keeps_an_infinite_stop_value(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(JobConfig.load(None, **{"env.stop_value": math.inf}).to_json())
    assert JobConfig.load(path).env.stop_value == math.inf


def strict_json(text: str) -> object:
    """``json.loads`` that refuses ``Infinity`` and ``NaN``, as jq and most JSON parsers do."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_job_json_is_strict_json_with_an_infinite_stop_value_and_reads_back(tmp_path: Path) -> None:
    job = JobConfig.load(None, **{"env.stop_value": math.inf})
    document = strict_json(job.to_json())
    assert isinstance(document, dict) and document["env"]["stop_value"] == "inf"
    path = tmp_path / "job.json"
    path.write_text(job.to_json())
    assert JobConfig.load(path) == job


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[coordinator]\ncollect_tasks = -1\n", "collect_tasks must be 0"),
        ("[coordinator]\nmax_env_steps = 0\n", "budgets must be positive"),
        ("[coordinator]\nmax_time_s = -1.0\n", "budgets must be positive"),
        ("[env]\nstop_value = nan\n", "stop_value is nan"),
    ],
)
def test_impossible_counts_and_budgets_in_a_file_are_refused(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=match):
        JobConfig.load(path)
