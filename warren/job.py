"""A job loaded, changed and run from Python: what :class:`warren.Job` is (a notebook's ``warren run``).

``Job`` wraps the frozen :class:`~worker.job.JobConfig` the CLI builds, with the same
checks: a changed job is built again from plain data, so a key the plug-ins do not know
is an error at once, not in the middle of a run. :meth:`Job.run` is ``warren run``
itself (a learner and collector processes against the broker of ``WARREN_AMQP_URL``, the
coordinator in this process, the run's own directory), and returns the run's summary.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.errors import ConfigurationError, WarrenError
from worker.job import JobConfig

#: Sections of a job whose ``name`` chooses a plug-in: a new name starts the section afresh.
_PLUGIN_SECTIONS = ("algorithm", "model")


class Job:
    """One training job: env, algorithm, model and the run's settings (see ``configs/*.toml``).

    Build one with :meth:`from_toml` (or :meth:`from_dict`, :meth:`from_run`), change it with
    :meth:`replace`, run it with :meth:`run`. It is immutable: :meth:`replace` returns a new one.
    """

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        """The checked job, as the roles use it."""

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str] | None = None, **sections: Mapping[str, Any]) -> Job:
        """The job of a TOML file (``None``: the default CartPole DQN job), ``sections`` changed as :meth:`replace`.

        Raises:
            ConfigurationError: unreadable file, unknown key, a plug-in that is missing or refuses the env.
        """
        job = cls(JobConfig.load(Path(path) if path is not None else None))
        return job.replace(**sections) if sections else job

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> Job:
        """The job of ``{section: {key: value}}``, as a TOML file's tables."""
        return cls(JobConfig.from_dict({name: dict(values) for name, values in data.items()}))

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike[str]) -> Job:
        """The job a run trained (its ``job.json``)."""
        return cls(JobConfig.load(Path(run_dir) / "job.json"))

    def replace(self, **sections: Mapping[str, Any]) -> Job:
        """A copy with some keys changed, by section: ``job.replace(env={"stop_value": 150}, algorithm={"lr": 3e-4})``.

        A new ``env.id`` takes the new env's spaces; a new ``algorithm.name`` or ``model.name``
        starts that section afresh (the old plug-in's settings mean nothing to the new one).

        Raises:
            ConfigurationError: an unknown section or key, or a value the plug-ins refuse.
        """
        data = copy.deepcopy(self.config.to_dict())
        for name, values in sections.items():
            if not isinstance(values, Mapping):
                raise ConfigurationError(f"replace({name}=...) takes a mapping of keys, got {type(values).__name__}")
            current = data.get(name, {})
            if name in _PLUGIN_SECTIONS and "name" in values and values["name"] != current.get("name"):
                current = {}
            if name == "env" and "id" in values and values["id"] != current.get("id"):
                data.pop("spaces", None)
                current = {k: v for k, v in current.items() if k not in ("stop_value", "plugin_version")}
            if name in _PLUGIN_SECTIONS and "name" in values:
                current.pop("version", None)
            data[name] = {**current, **values}
        return Job.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The job as plain data (the layout of ``job.json``, which :meth:`from_dict` reads back)."""
        return self.config.to_dict()

    @property
    def env_id(self) -> str:
        return self.config.env.id

    @property
    def algorithm(self) -> str:
        return self.config.algorithm.name

    def __repr__(self) -> str:
        return f"Job({self.env_id}, {self.algorithm}, model {self.config.model.name})"

    def run(
        self,
        collectors: int = 2,
        *,
        workdir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        resume: bool = False,
        progress: str = "off",
        log_level: str = "WARNING",
        stop: threading.Event | None = None,
    ) -> dict[str, Any]:
        """Train this job as ``warren run`` does, and return its summary (``summary.json``).

        Args:
            collectors: collector processes.
            workdir: the run's directory (default ``runs/<new id>``, or ``runs/<name>``).
            name: a run name collectors elsewhere can join (``--name``).
            resume: continue the run of ``workdir`` or ``name`` (``--resume``).
            progress: ``off``, ``log``, ``line`` (``--progress``).
            log_level: of this process's log lines on stderr.
            stop: set it (from another thread) to end the run early.

        Returns:
            The summary: ``success``, ``reason``, ``best_eval``, ``env_steps``... and ``workdir``
            and ``exit_code`` (0 the stop value, 3 a budget; see ``warren run --help``).

        Raises:
            WarrenError: the run could not start or go on (no broker, a refused workdir...);
                the message says why.
        """
        from worker.cli.flags import read_environment
        from worker.cli.main import build_parser
        from worker.cli.named_run import run_identity
        from worker.cli.run import run as warren_run

        if workdir is None and name is None:
            workdir = run_identity("warren").workdir  # a fresh runs/<id>, known before the run starts
        with tempfile.TemporaryDirectory(prefix="warren-job-") as scratch:
            job_file = Path(scratch) / "job.json"
            job_file.write_text(self.config.to_json())
            argv = ["run", "--config", str(job_file), "--collectors", str(collectors), "--progress", progress]
            argv += ["--log-level", log_level.upper()]
            argv += ["--workdir", str(workdir)] if workdir is not None else []
            argv += ["--name", name] if name is not None else []
            argv += ["--resume"] if resume else []
            args = build_parser().parse_args(argv)
            args.stop = stop or threading.Event()
            read_environment(args)
            started = _mtime(Path(workdir) / "summary.json") if workdir is not None else None
            code = warren_run(args)
        where = Path(workdir) if workdir is not None else Path("runs") / str(name)
        summary_file = where / "summary.json"
        if _mtime(summary_file) in (None, started):
            raise WarrenError(f"the run did not finish (warren run exit code {code}): see above and {where}/logs")
        summary: dict[str, Any] = json.loads(summary_file.read_text())
        summary["exit_code"] = int(code)
        return summary


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
