"""A job file: its sections and keys, read into the typed sections a :class:`~worker.job.JobConfig` is made of.

A file looks like::

    [env]
    id = "CartPole-v1"
    stop_value = 195.0

    [algorithm]
    name = "dqn"            # a built-in (dqn, ppo, sac, random) or an installed plug-in
    lr = 0.001              # its hyperparameters, checked by the plug-in

    [model]
    name = "mlp"
    hidden_sizes = [128, 128]

    [collector]
    n_sample = 2048

Unknown sections or keys are errors, so a typo never silently falls back to a default.
The ``[algorithm]`` and ``[model]`` keys besides ``name`` and ``version`` belong to the
plug-in, which says which it knows.

The stop value, when neither the file nor a flag gives one, is the env's: 195 for
CartPole-v1 (DI-engine's value, kept so runs compare with DI-engine's), otherwise the
``reward_threshold`` of the env's gymnasium spec (Acrobot-v1: -100).
"""

from __future__ import annotations

import json
import math
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from messaging import ConfigurationError
from worker import json_text
from worker.errors import TaskError
from worker.plugins import Spaces, config_from_dict, installed
from worker.plugins.binding import env_plugin
from worker.plugins.registry import GYMNASIUM

#: Stop values that differ from the env's gymnasium ``reward_threshold`` (see :func:`default_stop_value`).
#: CartPole-v1: DI-engine's 195 (its cartpole DQN config; gymnasium's threshold is 475), so a
#: run here compares with a DI-engine run of the same job.
STOP_VALUES = {"CartPole-v1": 195.0}


def default_stop_value(env_id: str, plugin: str | None = None) -> float:
    """The stop value of ``env_id`` when the job gives none: :data:`STOP_VALUES`, else its ``reward_threshold``.

    Raises:
        ConfigurationError: the env has no ``reward_threshold`` (then the job must give a stop value).
    """
    if plugin in (None, GYMNASIUM) and env_id in STOP_VALUES:
        return STOP_VALUES[env_id]
    try:
        threshold = env_plugin(installed(), plugin).reward_threshold(env_id)
    except TaskError as exc:
        raise ConfigurationError(f"the job cannot run: {exc.message}") from None
    if threshold is None:
        raise ConfigurationError(
            f"env {env_id!r} has no reward_threshold: give a stop value "
            "(--stop-value, or stop_value in [env]; inf runs until a budget ends the run)"
        )
    return float(threshold)


def _read_float_texts(section_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the texts ``job.json`` writes for non-finite floats (``"inf"``) read back as floats."""
    hints = typing.get_type_hints(section_type)
    return {
        key: float(value)
        if hints.get(key) is float and isinstance(value, str) and value in ("inf", "-inf", "nan")
        else value
        for key, value in values.items()
    }


@dataclass(frozen=True)
class EnvSection:
    id: str = "CartPole-v1"
    """The env: a gymnasium id, or (with ``plugin``) an id the env plug-in knows."""
    plugin: str | None = None
    """The env plug-in that makes it; left out: gymnasium's registry."""
    plugin_version: str | None = None
    """The env plug-in's version (left out: the one installed where the job is loaded)."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env (``[env.kwargs]``), plain data."""
    collector_env_num: int = 64
    """Envs per collect task, stepped as one vector env (one policy forward pass per step)."""
    evaluator_env_num: int = 5
    """Envs per eval task."""
    eval_episodes: int = 1
    """Episodes per eval env; the eval return is the mean over all of them."""
    confirm_episodes: int = 20
    """Episodes of the confirmation eval (one per env, all stepped together) that an eval at
    the stop value gets before the run ends: the same policy version, other episodes. The run
    succeeds only if their mean reaches the stop value too; 0: the first eval at the stop
    value ends the run. Up to 256."""
    stop_value: float = 195.0
    """The run succeeds once an eval's mean return reaches this, confirmed (``confirm_episodes``),
    with a policy that trained (version 1 on); ``inf``: never, a budget ends the run.
    Left out of a config file: the env's (:func:`default_stop_value`)."""
    seed: int = 0


@dataclass(frozen=True)
class AlgorithmSection:
    """``[algorithm]``: the plug-in by name, and its hyperparameters (every other key)."""

    name: str = "dqn"
    version: str | None = None
    """Left out: the version installed where the job is loaded; every task names it."""
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSection:
    """``[model]``: the model plug-in (left out: the algorithm's default) and its settings."""

    name: str | None = None
    version: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorSection:
    n_sample: int = 2048
    """Train samples per collect task (a task is a unit of work a worker takes)."""
    traj_len: int = 32
    """Steps per chunk (``T``): a step data file holds ``traj_len x collector_env_num`` transitions."""
    update_policy_second: float = 1.0
    """How often collectors re-read the policy file."""


@dataclass(frozen=True)
class CoordinatorSection:
    collect_tasks: int = 0
    """Collect tasks kept running at once; 0 (auto): one per collector worker listening, so
    adding workers (``--scale collector=N``) needs no other change."""
    start_ahead: int = -1
    """Start requests kept waiting in the task queue (auto mode) for the next collector to be
    free, so that a collector whose task is done takes its next one at once instead of
    waiting for a round trip through the coordinator; -1: one per 8 collectors (at least
    one); 0: none (docs/performance.md, "Collection at scale")."""
    eval_interval_s: float = 2.0
    """Seconds between eval tasks."""
    max_env_steps: int = 2_000_000
    """Stop the run (unsuccessfully) after this many collected env steps. The default job
    trains one step per 32 samples, so 2M env steps are ~62k train steps: about one seed
    in ten needs 10-12k to reach 195, which the earlier 400k (12.5k train steps) cut off."""
    max_time_s: float = 1800.0
    """Stop the run (unsuccessfully) after this long."""
    start_timeout_s: float = 30.0
    """A start task no worker took within this long is sent again."""
    task_silence_s: float = 60.0
    """A running task that sends nothing for this long is checked on, then re-run elsewhere."""
    max_consecutive_failures: int = 5
    """Tasks in a row that fail the same way (the same plug-in, call and error) end the run,
    naming the plug-in (exit code 4); a task that succeeds in between starts the count again
    (see :mod:`worker.coordinator.giveup`)."""
    max_run_ahead_samples: int = 4096
    """Rate limit: a collect task starts only while the samples collected but not yet taken
    in by the learner (its unread queue, plus what running collect tasks will still
    deliver) stay within this. Collection then runs at the learner's pace, never more than
    this many samples ahead of training, so the replay ratio holds over the whole run."""
    buffer_id: str = "main"
    """Replay buffer id: names the learner's data queue."""
    policy_name: str = "policy_main"
    """Policy file name under the policy directory."""
    video_every_evals: int = 0
    """Film one episode of every this many evals' policy (0: none): an mp4 in ``videos/`` beside
    the policy directory (``runs/<id>/videos``) and an animated image in TensorBoard. Each is
    made by a ``warren eval`` process of its own, one at a time, while the run goes on, on
    the run's CPUs: 2.6 CPU-seconds for a 325-step CartPole episode (0.4 s to start, 5 ms a
    frame to render and encode, 0.5 s for TensorBoard's copy), so off by default (see
    docs/using.md). Needs ``warren[video]`` and the policy directory."""

    def __post_init__(self) -> None:
        if self.video_every_evals < 0:
            raise ValueError(f"video_every_evals must be 0 (no videos) or more, got {self.video_every_evals}")
        if self.collect_tasks < 0:
            raise ValueError(f"collect_tasks must be 0 (one per worker) or more, got {self.collect_tasks}")
        if self.start_ahead < -1:
            raise ValueError(f"start_ahead must be -1 (auto), 0 (none) or more, got {self.start_ahead}")
        if self.max_env_steps < 1 or self.max_time_s <= 0:
            raise ValueError(
                f"budgets must be positive, got max_env_steps {self.max_env_steps}, max_time_s {self.max_time_s}"
            )
        if self.max_consecutive_failures < 1:
            raise ValueError(f"max_consecutive_failures must be 1 or more, got {self.max_consecutive_failures}")


@dataclass(frozen=True)
class LearnerSection:
    policy_write_interval_s: float = 0.5
    """Write the policy file at most this often (it is read every ``update_policy_second``)."""
    checkpoint_interval_s: float = 10.0
    """Write the learner's full checkpoint (targets, optimizer) at most this often, and at exit."""
    delete_consumed: bool = True
    """Delete a step data file once its samples are in the replay buffer."""
    read_wait_s: float = 5.0
    """How long to wait for a step file named in metadata to appear."""
    max_rejected_chunks: int = 20
    """Chunks in a row that fail their check against the job's spaces (NaN observations,
    fields of the wrong shape) stop the learner, naming the field and the plug-in that made
    it, and with it the run (exit code 4); an accepted chunk starts the count again."""
    torch_threads: int = 0
    """torch intra-op threads this job's learner wants (0: one). A CNN learner trains
    faster on every core; an MLP's torch step is dispatch-bound and does not, so 1 is the
    default. The learner process's own ``WARREN_TORCH_THREADS``/``--torch-threads``, when
    given, win: they describe the machine it runs on."""
    device: str = "auto"
    """Where the learner trains: ``auto`` (a CUDA GPU when torch sees one, else the CPU),
    ``cpu``, ``cuda`` or ``cuda:N`` (refused before anything starts where there is none).
    The learner process's ``WARREN_DEVICE``/``--device``, when given, win. On a GPU the
    torch train step runs (the numpy one is a CPU path); policy files and checkpoints are
    the same CPU safetensors either way (:mod:`worker.learner.device`)."""
    autocast: str = "off"
    """``bf16``: the updates' forward and backward passes under bf16 autocast, on a CUDA GPU
    only (refused with ``device = "cpu"``; ``auto`` on a machine without one trains in fp32)."""
    device_replay: bool = False
    """On a GPU, keep image replay (frame stacks) in the GPU's memory, where batches are
    gathered and restacked: ~1.125 frames a transition (7,938 bytes for 84x84 Pong frames)."""
    read_ahead: int = -1
    """Step files read (and decompressed) ahead on a thread of their own while the learner
    updates; -1: 4 on a GPU, 0 (read between updates, on the learner's thread) on the CPU."""

    def __post_init__(self) -> None:
        from worker.devices import check_autocast_setting, check_device_setting

        try:
            check_device_setting(self.device, "learner.device")
            check_autocast_setting(self.autocast, "learner.autocast")
        except ConfigurationError as exc:
            raise ValueError(exc.message) from None
        if not -1 <= self.read_ahead <= 64:
            raise ValueError(f"learner.read_ahead must be -1 (auto), 0 or up to 64, got {self.read_ahead}")
        if not 0 <= self.torch_threads <= 1024:
            raise ValueError(
                f"learner.torch_threads must be 0 (one, unless the learner process sets it) to 1024,"
                f" got {self.torch_threads}"
            )
        if self.max_rejected_chunks < 1:
            raise ValueError(f"learner.max_rejected_chunks must be 1 or more, got {self.max_rejected_chunks}")


#: The sections of a job file, by name; ``[algorithm]`` and ``[model]`` are read apart.
SECTIONS: dict[str, Any] = {
    "env": EnvSection,
    "collector": CollectorSection,
    "coordinator": CoordinatorSection,
    "learner": LearnerSection,
}


def read_job_file(path: Path | None, overrides: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` of the file at ``path`` (TOML, or JSON if it ends in ``.json``; ``None``:
    none), with ``overrides`` (``"section.key": value``; ``None`` values left out) applied.

    Raises:
        ConfigurationError: unreadable file, a top level that is not a table of sections, a key outside any section.
    """
    data: dict[str, dict[str, Any]] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
            raw = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
            raise ConfigurationError(f"cannot read config {path}: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{path}: the top level must be a table of sections")
        for section, values in raw.items():
            if not isinstance(values, dict):
                raise ConfigurationError(f"{path}: {_not_in_a_section(section, values)}")
            data[section] = dict(values)
    for dotted, value in overrides.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        data.setdefault(section, {})[key] = value
    return data


def read_sections(data: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], ConfigurationError | None]:
    """The typed sections of ``{section: {key: value}}``, as :class:`~worker.job.JobConfig` takes them.

    A missing ``env.stop_value`` is the env's (:func:`default_stop_value`); when the env has
    none, the sections get ``inf`` and the error is returned, for the caller to raise once
    the job is known to run.

    Raises:
        ConfigurationError: unknown section or key, wrong type or range.
    """
    known = {*SECTIONS, "algorithm", "model", "spaces"}
    for name in data:
        if name == "learner_process":
            raise ConfigurationError("[learner_process] is now [learner] (the algorithm's settings are in [algorithm])")
        if name not in known:
            raise ConfigurationError(f"unknown config section [{name}]; known: {sorted(known)}")
    env = dict(data.get("env", {}))
    no_stop_value: ConfigurationError | None = None
    if "stop_value" not in env and isinstance(env.get("id", EnvSection.id), str):
        try:
            env["stop_value"] = default_stop_value(env.get("id", EnvSection.id), env.get("plugin"))
        except ConfigurationError as exc:
            # Said only once the env is known to run: for an unknown or unusable env, that is the news.
            no_stop_value, env["stop_value"] = exc, math.inf
    sections: dict[str, Any] = {}
    for name, section_type in SECTIONS.items():
        sections[name] = _section(name, section_type, env if name == "env" else data.get(name, {}))
    sections["algorithm"] = _plugin_section("algorithm", AlgorithmSection, data.get("algorithm", {}))
    sections["model"] = _plugin_section("model", ModelSection, data.get("model", {}))
    if "spaces" in data:
        try:
            sections["spaces"] = Spaces.from_wire(data["spaces"])
        except TaskError as exc:
            raise ConfigurationError(f"[spaces]: {exc.message}") from None
    return sections, no_stop_value


def _not_in_a_section(key: str, value: Any) -> str:
    """Why a top-level ``key = value`` of a job file is wrong, and which section it goes in."""
    homes = [f"[{name}]" for name, section_type in SECTIONS.items() if key in {f.name for f in fields(section_type)}]
    where = (
        f"it goes in {' or '.join(homes)}"
        if homes
        else f"every key goes in a section ({', '.join(f'[{name}]' for name in [*SECTIONS, 'algorithm', 'model'])}; "
        "an algorithm's or a model's settings in [algorithm] or [model])"
    )
    shown = json_text.dumps(value) if isinstance(value, (int, float, str, bool)) else "..."
    return f"{key} = {shown} is at the top level, outside any section: {where}"


def _section(name: str, section_type: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"[{name}] must be a table")
    known = {f.name for f in fields(section_type)}
    unknown = set(raw) - known
    if unknown:
        moved = (
            " (an algorithm's settings, such as lr or learning_starts, go in [algorithm])" if name == "learner" else ""
        )
        raise ConfigurationError(f"unknown keys in [{name}]: {sorted(unknown)}; known: {sorted(known)}{moved}")
    values = _read_float_texts(section_type, raw)
    try:
        # Typed as a plug-in's settings are (an int where an int is due...), so a quoted
        # number is an error naming the key, not a crash deep in the run.
        return config_from_dict(section_type, values, name)
    except (TaskError, TypeError, ValueError) as exc:
        message = str(getattr(exc, "message", exc)).removeprefix(f"{name}: ")
        raise ConfigurationError(f"[{name}]: {message}") from None


def _plugin_section(name: str, section_type: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigurationError(f"[{name}] must be a table")
    values = dict(raw)
    head = {key: values.pop(key) for key in ("name", "version") if key in values}
    for key, value in head.items():
        if not isinstance(value, str):
            raise ConfigurationError(f"[{name}] {key} must be a string, got {value!r}")
    return section_type(**head, config=values)
