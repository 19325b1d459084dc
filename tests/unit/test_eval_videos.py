"""Videos during training: every ``coordinator.video_every_evals``-th eval's policy filmed beside the run.

* the K-th eval of a trained policy starts a ``warren eval`` process that films one episode
  of it into ``videos/`` (one frame per step) and into TensorBoard (an animated image at
  the run's env steps); other evals, the untrained policy, and evals that come while a
  video is being made are not filmed;
* the setting is off by default and cannot be negative.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from messaging import ConfigurationError
from tests.trained_policies import job_of, write_policy
from worker.coordinator.eval_videos import EvalVideos
from worker.coordinator.policy_files import RunPolicy
from worker.job import JobConfig
from worker.protocol import FinishInfo


def eval_finish(version: int) -> FinishInfo:
    return FinishInfo.measured(
        eval_flag=True,
        env_num=1,
        duration=1.0,
        train_iter=version,
        collector_done=True,
        predefined_episode_count=1,
        steps=10,
        samples=0,
        returns=[10.0],
    )


def test_every_kth_eval_of_a_trained_policy_is_filmed_into_videos_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("av")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from worker.agent.video import count_frames

    # Given a run whose eval copy holds version 4, filming every 2nd eval
    job = job_of()
    write_policy(tmp_path, job, version=4, name="policy_main.eval")
    task = SimpleNamespace(start=SimpleNamespace(cfg=job.eval_spec("policy_main.eval")))
    videos = EvalVideos(2, RunPolicy(tmp_path / "policy", "policy_main"), tmp_path / "videos", tmp_path / "tb")
    # When evals 1 to 4 end (eval 3 while the 2nd's video is being made)
    started = [
        videos.evaluated(1, task, eval_finish(4), 100),  # type: ignore[arg-type]
        videos.evaluated(2, task, eval_finish(4), 200),  # type: ignore[arg-type]
        videos.evaluated(4, task, eval_finish(4), 400),  # type: ignore[arg-type]
    ]
    videos.close(timeout_s=120)
    # Then only the 2nd was filmed (the 4th came while it was being made)
    assert started == [False, True, False]
    stem = tmp_path / "videos" / "eval-0002-policy-4"
    report = json.loads(stem.with_suffix(".json").read_text())
    assert report["policy_version"] == 4 and report["episodes"] == 1
    assert count_frames(Path(f"{stem}-000.mp4")) == report["lengths"][0]
    # and TensorBoard shows it at the run's env steps
    board = EventAccumulator(str(tmp_path / "tb" / "videos"), size_guidance={"images": 0})
    board.Reload()
    assert [image.step for image in board.Images("eval/video")] == [200]


def test_the_untrained_policy_and_evals_without_the_setting_are_not_filmed(tmp_path: Path) -> None:
    job = job_of()
    write_policy(tmp_path, job, version=0, name="policy_main.eval")
    task = SimpleNamespace(start=SimpleNamespace(cfg=job.eval_spec("policy_main.eval")))
    policy = RunPolicy(tmp_path / "policy", "policy_main")
    # The untrained policy is not filmed, nor is anything when the setting is 0 (its default)
    assert not EvalVideos(1, policy, tmp_path / "videos", None).evaluated(1, task, eval_finish(0), 1)  # type: ignore[arg-type]
    assert JobConfig().coordinator.video_every_evals == 0
    assert not EvalVideos(0, policy, tmp_path / "videos", None).evaluated(1, task, eval_finish(3), 1)  # type: ignore[arg-type]
    assert not (tmp_path / "videos").exists()
    with pytest.raises(ConfigurationError, match="video_every_evals"):
        job_of(**{"coordinator.video_every_evals": -1})
