"""The shipped Pong job, shortened, through ``warren run``: a learner and two collectors as processes, a real broker.

What must hold at Atari data rates, whatever the speed: the chunks reach the learner and
are learned from (none refused), the policy versions advance, and the step files carry
single frames (about a quarter of the stacked observations' bytes), not stacks
(uncompressed here, so the bytes are the layout's; lz4 would make them ~60x fewer).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from messaging import Settings
from tests.integration.test_run_dirs import run_env

pytest.importorskip("ale_py")
pytestmark = pytest.mark.rabbitmq

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "pong_ppo.toml"
#: One stacked observation: 4 frames of 84 x 84 bytes.
STACKED_BYTES = 4 * 84 * 84
#: The shipped job with smaller batches, so a few updates fit in seconds.
SHORTER = {
    "collector_env_num": "4",
    "batch_steps": "256",
    "epochs": "1",
    "minibatch_size": "128",
    "n_sample": "256",
    "traj_len": "64",
    "max_run_ahead_samples": "512",
}


def shortened_job(path: Path) -> Path:
    text = SHIPPED.read_text()
    for key, value in SHORTER.items():
        text, found = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.MULTILINE)
        assert found == 1, key
    path.write_text(text)
    return path


def test_the_pong_job_learns_from_single_frame_chunks_in_separate_processes(settings: Settings, tmp_path: Path) -> None:
    job = shortened_job(tmp_path / "pong.toml")
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "run", "--progress", "log", "--collectors", "2", "--config", str(job),
         "--max-env-steps", "2500", "--stop-value", "inf"],
        env={**run_env(settings), "WARREN_STEP_COMPRESSION": "none"},
        cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]  # the step budget ended it
    (workdir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["children_exit_codes"] == {"learner": 0, "collector-0": 0, "collector-1": 0}
    assert summary["policy_iter"] >= 3 and summary["learner_samples"] >= 3 * 256
    assert sorted(summary["workers_seen"]) == ["c0", "c1"]
    learner_log = (workdir / "logs" / "learner.log").read_text()
    assert "skipping" not in learner_log  # no chunk refused (corrupt), none missing
    per_step = float(re.findall(r"step files: (\d+) bytes an env step", learner_log)[-1])
    assert 0.24 * STACKED_BYTES < per_step < 0.3 * STACKED_BYTES  # one frame, plus heads and the other columns
