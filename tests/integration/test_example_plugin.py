"""The out-of-tree example package (examples/warren-example) trains end to end: its own env, model and algorithm.

The test command installs the package (``scripts/test``). Here ``warren run`` starts the
learner and two collectors as separate processes; they find the plug-ins through the
package's entry points, and the job's tasks name them.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from messaging import Settings
from tests.procs import role_env

pytestmark = [pytest.mark.rabbitmq, pytest.mark.slow]

JOB = Path(__file__).resolve().parents[2] / "examples" / "warren-example" / "job.toml"
#: A policy that ignores the cue scores episode_len / n_cues = 8 / 3 on average.
RANDOM_RETURN = 8 / 3


def _installed() -> None:
    try:
        importlib.metadata.distribution("warren-example")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(
            "the example package is not installed: scripts/test installs it (pip install examples/warren-example)"
        )


def test_the_example_package_trains_its_env_model_and_algorithm_in_separate_processes(
    settings: Settings, tmp_path: Path
) -> None:
    _installed()
    # Given the example's job (cue env, tiny model, reinforce), run by warren run with two collectors
    env = {**os.environ, **role_env(settings)}
    workdir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--config", str(JOB), "--collectors", "2",
         "--workdir", str(workdir), "--progress", "log", "--max-time-s", "120"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    summary = json.loads((workdir / "summary.json").read_text())
    # Then the evaluations rise from where a cue-blind policy stays to the stop value
    assert done.returncode == 0 and summary["success"], (summary, done.stderr[-3000:])
    evals = [json.loads(line) for line in (workdir / "run.jsonl").read_text().splitlines()]
    returns = [r["reward_mean"] for r in evals if r["kind"] == "eval"]
    assert returns[-1] >= 7.0 > RANDOM_RETURN + 2
    # and the tasks ran the example's plug-ins, at the package's version, on both collectors
    job = json.loads((workdir / "job.json").read_text())
    version = importlib.metadata.version("warren-example")
    assert job["algorithm"]["name"] == "reinforce" and job["algorithm"]["version"] == version
    assert job["model"]["name"] == "tiny" and job["env"]["plugin"] == "cue"
    assert set(summary["workers_seen"]) == {"c0", "c1"}
    # and the policy file carries the example's names in its header, no pickle
    policy = (workdir / "policy" / "policy_main").read_bytes()
    header_size = int.from_bytes(policy[:8], "little")
    header = json.loads(policy[8 : 8 + header_size])["__metadata__"]
    assert header["algorithm"] == "reinforce" and header["model"] == "tiny"
    assert int(header["policy_version"]) >= 1
