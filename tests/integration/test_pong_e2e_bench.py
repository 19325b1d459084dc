"""``benchmarks.pong_e2e`` on the CPU: a shortened GPU Pong job run end to end, its figures read off the run.

The GPU run is scripts/gpu-session's; this is its smoke run here (the learner on the CPU
through ``--device cpu``, which overrides the job's ``cuda``), so the script a GPU machine
runs is known to work before it gets there.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from messaging import Settings
from tests.integration.test_run_dirs import run_env

pytest.importorskip("ale_py")
pytestmark = pytest.mark.rabbitmq

ROOT = Path(__file__).resolve().parents[2]
#: The GPU job with CPU-sized batches, so that updates happen within seconds.
SHORTER = {"batch_steps": "256", "epochs": "1", "minibatch_size": "128", "n_sample": "256", "traj_len": "32",
           "collector_env_num": "4", "max_run_ahead_samples": "512"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_end_to_end_benchmark_runs_the_gpu_job_on_the_cpu_and_reports_its_figures(
    settings: Settings, tmp_path: Path
) -> None:
    job = (ROOT / "configs" / "pong_ppo_gpu.toml").read_text()
    for key, value in SHORTER.items():
        job, found = re.subn(rf"^{key} = .*$", f"{key} = {value}", job, flags=re.MULTILINE)
        assert found == 1, key
    (tmp_path / "pong.toml").write_text(job)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.pong_e2e", "--config", str(tmp_path / "pong.toml"), "--device", "cpu",
         "--collectors", "1", "--max-time-s", "25", "--sample-s", "1", "--metrics-port", str(free_port()),
         "--out", str(tmp_path / "out")],
        env=run_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "pong_e2e.json").read_text())
    assert report["exit_code"] == 3  # the time budget ended it
    figures = report["figures"]
    assert figures["collected_env_steps_per_s"] > 0 and figures["learned_env_steps_per_s"] > 0
    assert 0 <= figures["busy_mean"] <= 1 and report["samples"]
    assert "device_utilization_mean" not in figures  # a CPU learner has no device figures
    assert "learning ppo (nature_cnn model)" in (Path(report["workdir"]) / "logs" / "learner.log").read_text()
