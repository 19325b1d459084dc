"""The benchmarks of the learner on a device run on the CPU (smoke runs); the end-to-end one reads a run's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest

from benchmarks.pong_e2e import learner_figures, returns, summarize
from tests.unit.test_device_telemetry import FakeGPU
from tests.unit.test_telemetry import Clock
from worker.telemetry.learner import BOARD_INTERVAL_S, LearnerTelemetry
from worker.telemetry.metrics import MetricsEndpoint

ROOT = Path(__file__).resolve().parents[2]


def test_the_learner_alone_benchmark_times_ppo_dqn_and_sac_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "learner.json"
    jobs = "configs/pong_ppo.toml,configs/pong_ppo_lstm.toml"  # the second: one frame a step and an LSTM
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.learner_device", "--quick", "--threads", "1", "--jobs", jobs,
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["torch_threads"] == 1
    assert set(report["results"]) == {"ppo", "ppo[pong_ppo_lstm]", "dqn", "sac"}
    for result in report["results"].values():
        assert result["learned_env_steps_per_s"] > 0
    assert "NumpySACStep" in report["results"]["sac"]["what"]  # the CPU runs the numpy step, as warren does
    assert "learned" in done.stdout


def test_a_learner_alone_case_that_fails_costs_its_row_only_and_the_exit_code(tmp_path: Path) -> None:
    # Given a second PPO job whose model is not installed
    broken = tmp_path / "broken.toml"
    broken.write_text('[algorithm]\nname = "ppo"\n\n[model]\nname = "no-such-model"\n')
    out = tmp_path / "learner.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.learner_device", "--quick", "--threads", "1", "--cases", "ppo",
         "--jobs", f"configs/pong_ppo.toml,{broken}", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    # Then the first job is still timed, the broken one is an error naming the model, and the run says it failed
    assert done.returncode == 1, done.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results["ppo"]["learned_env_steps_per_s"] > 0
    assert "no-such-model" in results["ppo[broken]"]["error"]
    assert "ppo[broken]" in done.stdout and "failed:" in done.stdout


def test_the_collector_threads_benchmark_measures_a_pong_collector(tmp_path: Path) -> None:
    pytest.importorskip("ale_py")
    out = tmp_path / "threads.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.collector_threads", "--torch-threads", "1", "--steps", "256", "--repeats",
         "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())["results"]["1"]
    assert result["env_steps_per_s"] > 0 and 0 < result["actor_share"] < 1


def test_the_end_to_end_benchmark_reads_the_learners_figures_off_its_metrics() -> None:
    clock = Clock()
    endpoint = MetricsEndpoint("learner")
    telemetry = LearnerTelemetry(endpoint=endpoint, clock=clock)
    telemetry.device = FakeGPU()
    try:
        telemetry.train_step(0.5)
        clock.now += BOARD_INTERVAL_S
        telemetry.record({"loss": 1.0}, step=1)  # the first interval's point
        figures = learner_figures(generate_latest(endpoint.registry).decode())
    finally:
        telemetry.close()
    assert figures["device_utilization"] == 0.75 and figures["device_memory_allocated"] == 2e9
    assert figures["busy"] == pytest.approx(0.5) and "policy_version" in figures


def test_the_end_to_end_benchmark_sums_up_a_run_from_its_summary_and_run_log(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    records = [
        {"kind": "task", "time": 100.0, "env_steps": 1000, "real_episode_count": 2, "reward_mean": -21.0},
        {"kind": "task", "time": 110.0, "env_steps": 2000, "real_episode_count": 0, "reward_mean": 0.0},
        {"kind": "eval", "time": 160.0, "env_steps": 9000, "real_episode_count": 2, "reward_mean": 18.5},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    collect, evals = returns(log)
    assert collect == [{"t": 0.0, "env_steps": 1000, "mean_return": -21.0, "episodes": 2}]
    assert evals == [{"t": 60.0, "env_steps": 9000, "mean_return": 18.5, "episodes": 2}]
    summary = {"wall_time_s": 100.0, "env_steps": 50_000, "learner_samples": 40_000, "stop_value": 18.0}
    samples = [{"busy": 0.5, "device_memory_used": 2.0}, {"busy": 0.7, "device_memory_used": 3.0}]
    figures = summarize(summary, samples, collect, evals)
    assert figures["collected_env_steps_per_s"] == 500 and figures["learned_env_steps_per_s"] == 400
    assert figures["busy_mean"] == pytest.approx(0.6) and figures["device_memory_used_max"] == 3.0
    assert figures["first_eval_at_stop_value"]["t"] == 60.0
