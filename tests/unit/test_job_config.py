"""The job: its file and flags, the plug-ins it names and pins, its spaces, the tasks it sends, its stop value."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from pathlib import Path

import gymnasium as gym
import pytest

from messaging import ConfigurationError
from worker.algorithms.dqn import DQN, DQNConfig
from worker.job import JobConfig
from worker.plugins import PluginKind, config_to_dict, installed
from worker.protocol import CollectorSpec

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "defaults.toml"


def test_the_shipped_config_file_spells_out_the_defaults() -> None:
    assert JobConfig.load(SHIPPED) == JobConfig()


def test_the_shipped_config_file_lists_every_setting_of_every_section() -> None:
    # Derived from the dataclasses and the plug-ins' configs, so a setting added to the job
    # (or to the default algorithm or model) must be added to the file too.
    listed = tomllib.loads(SHIPPED.read_text())
    defaults = JobConfig()
    for name in ("env", "collector", "coordinator", "learner"):
        keys = {f.name for f in dataclasses.fields(getattr(defaults, name))}
        if name == "env":
            keys -= {"plugin", "plugin_version", "kwargs"}  # the gymnasium env needs none of them
        assert set(listed.get(name, {})) == keys, f"[{name}]"
    for name, config in (("algorithm", defaults.bound.config), ("model", defaults.bound.model.config)):
        keys = {"name"} | {f.name for f in dataclasses.fields(config)}
        assert set(listed.get(name, {})) == keys, f"[{name}]"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[env]\nstop_value = 100.0\n[algorithm]\nlr = 0.0005\n[model]\nhidden_sizes = [32]\n")
    config = JobConfig.load(
        path, **{"env.stop_value": 150.0, "coordinator.collect_tasks": None, "algorithm.batch_size": 64}
    )
    assert config.env.stop_value == 150.0
    assert config.coordinator.collect_tasks == JobConfig().coordinator.collect_tasks
    # the plug-ins' settings reach the bound algorithm, file and flag alike
    assert (config.bound.config.lr, config.bound.config.batch_size) == (0.0005, 64)
    assert config.bound.model.config.hidden_sizes == (32,)


def test_the_job_names_and_pins_its_plugins_and_spells_out_their_settings() -> None:
    # Given the default job (nothing but defaults)
    job = JobConfig()
    # Then it names the built-ins at the installed version: every task will ask for exactly these
    plugins = installed()
    assert (job.algorithm.name, job.algorithm.version) == ("dqn", plugins.get(PluginKind.ALGORITHM, "dqn").version)
    assert (job.model.name, job.model.version) == ("mlp", plugins.get(PluginKind.MODEL, "mlp").version)
    # and carries every hyperparameter, so job.json and the tasks say what ran, defaults included
    assert job.algorithm.config == config_to_dict(DQNConfig())
    assert job.model.config == {"hidden_sizes": [128, 128], "activation": "relu"}
    # and the spaces, read off the env, so a learner needs no env to build its model
    assert job.spaces is not None and job.spaces.describe() == "observations Box(4,) float32, actions Discrete(2)"
    assert isinstance(job.bound, DQN) and job.bound.spaces == job.spaces


def test_job_json_reads_back_to_the_same_job_with_its_pinned_versions_and_spaces(tmp_path: Path) -> None:
    job = JobConfig.load(None, **{"algorithm.lr": 0.002, "model.hidden_sizes": [16, 16]})
    path = tmp_path / "job.json"
    path.write_text(job.to_json())

    again = JobConfig.load(path)

    assert again == job
    assert json.loads(path.read_text())["spaces"] == job.spaces.to_wire()  # type: ignore[union-attr]


def test_a_job_json_pinned_to_another_plugin_version_is_refused(tmp_path: Path) -> None:
    # (a run's job.json replayed where another warren is installed: its tasks would all be refused)
    data = JobConfig().to_dict()
    data["algorithm"]["version"] = "0.0.0-elsewhere"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ConfigurationError, match=r"algorithm plug-in 'dqn' is .* here, the task wants 0\.0\.0-elsewhere"
    ):
        JobConfig.load(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[envs]\nid = 'x'\n", "unknown config section"),
        ("[env]\nstop_vlaue = 1\n", "unknown keys"),
        (
            "[algorithm]\nlr = -1.0\n",
            r"the job cannot run: algorithm: algorithm\.lr must be a number in \(0\.0, 1\.0\]",
        ),
        ("[algorithm]\nlr_typo = 0.1\n", r"algorithm: unknown keys \['lr_typo'\]"),
        ("[algorithm]\ndouble_dqn = 1\n", r"algorithm\.double_dqn must be a bool"),
        ("[algorithm]\nname = 'nope'\n", r"algorithm plug-in 'nope' is not installed here \(have: dqn, .*random"),
        ("[algorithm]\nname = 3\n", r"\[algorithm\] name must be a string"),
        ("[model]\nhidden_sizes = []\n", r"model\.hidden_sizes must be a list of 1 to 4 layer widths"),
        ("[model]\nname = 'cnn'\n", r"model plug-in 'cnn' is not installed here"),
        ("[learner]\nlr = 0.1\n", r"unknown keys in \[learner\]: \['lr'\]"),  # the process section now
        ("[learner_process]\nread_wait_s = 1.0\n", r"\[learner_process\] is now \[learner\]"),
        ("not toml at all [", "cannot read config"),
        ("[env]\ncollector_env_num = 100000\n", "would be refused: collector_cfg.env.env_num"),
        ("[collector]\nupdate_policy_second = 0\n", "would be refused: collector_cfg.update_policy_second"),
        ("[env]\nseed = 4294967290\n", "would be refused: collector_cfg.env.seed"),
        ("[env]\nseed = '3'\n", r"\[env\]: env\.seed must be a int, got '3'"),
        ("[coordinator]\nmax_env_steps = 1e6\n", r"coordinator\.max_env_steps must be a int, got 1000000\.0"),
        ("seed = 3\n", r"seed = 3 is at the top level, outside any section: it goes in \[env\]"),
        ("lr = 0.1\n", r"lr = 0\.1 is at the top level.*settings in \[algorithm\] or \[model\]"),
    ],
)
def test_mistakes_in_a_config_file_are_configuration_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=match):
        JobConfig.load(path)


def test_task_bodies_are_valid_collector_configs() -> None:
    config = JobConfig()
    collect = CollectorSpec.from_wire(config.collect_spec(0).to_wire())
    assert not collect.eval_flag and collect.n_sample == config.collector.n_sample
    assert collect.policy == config.policy_spec() and collect.spaces == config.spaces
    assert collect.policy.type == "dqn" and collect.policy.version == config.algorithm.version
    assert collect.policy.model_config == {"hidden_sizes": [128, 128], "activation": "relu"}
    evaluation = CollectorSpec.from_wire(config.eval_spec().to_wire())
    assert evaluation.eval_flag and evaluation.n_episode == config.env.eval_episodes
    assert evaluation.collect_setting == {} and evaluation.spaces == config.spaces


def test_collect_tasks_carry_the_algorithms_exploration_schedule() -> None:
    # Given DQN's schedule: eps 1.0 at the start, decaying linearly to 0.05 over 10k env steps
    config = JobConfig()
    # Then each collect task says the eps of the env step count it started at
    assert config.collect_spec(0).collect_setting == {"eps": 1.0}
    assert config.collect_spec(5_000).collect_setting == {"eps": pytest.approx(0.525)}
    assert config.collect_spec(10**9).collect_setting == {"eps": 0.05}


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
        ("Nope-v0", "the job cannot run: unknown env id 'Nope-v0': not in the gymnasium registry"),
        ("os:system", "the job cannot run: unknown env id 'os:system'"),
        ("Pendulum-v1", r"the job cannot run: algorithm 'dqn' cannot run this env: dqn needs Discrete actions"),
        ("Pendulum-v1", r"the env's actions are Box\(1,\) float32"),
    ],
)
def test_an_env_no_collector_would_run_is_refused_before_the_run(env_id: str, match: str) -> None:
    # (with or without a stop value: for an env that cannot run, a missing stop value is not the news)
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


CONFIGURATION_DOC = SHIPPED.parents[1] / "docs" / "configuration.md"


def plugin_config_defaults(kind: PluginKind, name: str) -> dict[str, object]:
    """A built-in plug-in's settings and their defaults, from its config dataclass."""
    return config_to_dict(installed().get(kind, name).obj.Config())


def documented_settings_tables() -> dict[tuple[str, str], dict[str, object]]:
    """``{(section, plug-in): {key: default}}`` from docs/configuration.md's tables of the built-ins' settings."""
    from worker.cli.flags import toml_value

    text = CONFIGURATION_DOC.read_text()
    heading = re.compile(r'^`\[(algorithm|model)\] name = "(\w+)"`.*$', re.MULTILINE)
    tables: dict[tuple[str, str], dict[str, object]] = {}
    for match in heading.finditer(text):
        lines = text[match.end() :].lstrip("\n").splitlines()
        rows: dict[str, object] = {}
        if lines and lines[0].startswith("| key | default | meaning |"):
            for line in lines[2:]:
                cells = [cell.strip() for cell in line.split("|")[1:-1]] if line.startswith("|") else []
                if not cells:
                    break
                rows[cells[0].strip("`")] = toml_value(cells[1].strip("`"))
        tables[(match.group(1), match.group(2))] = rows
    return tables


def test_the_configuration_doc_documents_every_setting_of_every_built_in_algorithm_and_model_with_its_default() -> None:
    tables = documented_settings_tables()
    builtins = [(PluginKind.ALGORITHM, name) for name in ("dqn", "ppo", "sac", "random")]
    builtins += [(PluginKind.MODEL, name) for name in ("mlp", "nature_cnn")]
    for kind, name in builtins:
        section = "algorithm" if kind is PluginKind.ALGORITHM else "model"
        assert tables.get((section, name)) == plugin_config_defaults(kind, name), (section, name)


def test_the_shipped_config_file_shows_ppos_and_sacs_settings_with_their_defaults() -> None:
    from worker.cli.flags import toml_value

    text = SHIPPED.read_text()
    for name in ("ppo", "sac"):
        block = text.split(f'(name = "{name}"', 1)[1].split("\n#\n", 1)[0]
        listed = {
            match.group(1): toml_value(match.group(2))
            for match in re.finditer(r"^# (\w+) = (\S+(?: \S+)*?)\s+#", block, re.MULTILINE)
        }
        assert listed == plugin_config_defaults(PluginKind.ALGORITHM, name), name
    assert '(name = "random") takes no keys' in text


@pytest.mark.parametrize("episodes", [-1, 257])
def test_a_confirmation_of_more_episodes_than_an_eval_task_may_run_is_refused_naming_the_key(episodes: int) -> None:
    with pytest.raises(ConfigurationError, match=r"confirm_episodes must be 0 \(no confirmation\) to 256"):
        JobConfig.load(None, **{"env.confirm_episodes": episodes})


def test_the_confirmation_runs_its_episodes_at_once_on_other_seeds_than_the_evals() -> None:
    job = JobConfig.load(None, **{"env.confirm_episodes": 32})
    confirmation, evaluation = job.confirm_spec("policy_main.eval"), job.eval_spec("policy_main.eval")
    assert (confirmation.env.env_num, confirmation.n_episode, confirmation.eval_flag) == (32, 1, True)
    assert confirmation.policy_update_path == evaluation.policy_update_path == "policy_main.eval"
    assert confirmation.env.seed is not None and evaluation.env.seed is not None
    assert confirmation.env.seed >= evaluation.env.seed + evaluation.env.env_num
