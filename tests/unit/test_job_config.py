from __future__ import annotations

from pathlib import Path

import pytest

from messaging import ConfigurationError
from worker.job import JobConfig
from worker.protocol import CollectorSpec

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.toml"


def test_the_shipped_config_file_spells_out_the_defaults() -> None:
    assert JobConfig.load(SHIPPED) == JobConfig()


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
