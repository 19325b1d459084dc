"""``warren eval``: a trained policy's episodes, their mean and spread, their videos; bad input as one line, exit 2.

* seeded as an eval task is, it plays that eval's very episodes again (the same return);
* it prints the mean and spread of return and length and writes every episode as JSON;
* a video decodes and has one frame per step; an env that cannot render but observes
  pixels is filmed through its observations;
* a file that is not a warren policy, an env of other spaces, a plug-in that is not
  installed, an env that cannot be filmed: one line on stderr, exit code 2;
* (slow) every shipped job's policy is evaluated and filmed in its own env.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from tests.trained_policies import CONFIGS, image_job, job_of, write_policy
from worker.agent.header import policy_header
from worker.agent.video import count_frames, read_frames
from worker.cli import main
from worker.inprocess import InProcessJob
from worker.storage import PolicyStore
from worker.storage.policies import read_policy_header

#: A CartPole that cannot render (its ``render`` gives nothing), and an env of uint8 frames that cannot either.
NO_RENDER_ID = "WarrenTest/CartPoleNoRender-v0"
FRAMES_ID = "WarrenTest/Frames-v0"
FRAMES_EPISODE = 20


class CartPoleNoRender(CartPoleEnv):
    def render(self) -> Any:
        return None


class Frames(gym.Env[np.ndarray, np.int64]):
    """Four stacked 36x36 grey frames, 3 actions, episodes of exactly FRAMES_EPISODE steps; renders nothing."""

    observation_space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.full((4, 36, 36), self.t * 10, dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, self.t >= FRAMES_EPISODE, False, {}


for env_id, entry in ((NO_RENDER_ID, "CartPoleNoRender"), (FRAMES_ID, "Frames")):
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=f"{__name__}:{entry}", max_episode_steps=500)


def warren_eval(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["eval", *args, "--log-level", "ERROR"])
    out, err = capsys.readouterr()
    return code, out, err


def test_seeded_as_an_eval_task_it_plays_that_evals_episodes_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a job's learner after a little training, its eval task's return, and its weights in a policy file
    job = job_of(**{"collector.n_sample": 256})
    run = InProcessJob(job)
    run.collect()
    run.train()
    expected = run.evaluate()
    (tmp_path / "policy").mkdir()
    PolicyStore(tmp_path / "policy").write("policy_main", run.learner.actor_weights(), 3, policy_header(job))
    run.close()
    # When warren eval plays the eval task's episodes: its seed, its envs, one episode each
    spec = job.eval_spec()
    out = tmp_path / "eval.json"
    code, _, err = warren_eval(
        capsys,
        str(tmp_path),
        "--seed",
        str(spec.env.seed),
        "--envs",
        str(spec.env.env_num),
        "--episodes",
        str(spec.env.env_num * (spec.n_episode or 1)),
        "--json",
        str(out),
    )
    # Then its mean return is the eval's
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["return_mean"] == pytest.approx(expected, abs=1e-9)
    assert len(set(report["returns"])) > 1  # not one episode played five times


def test_it_prints_the_mean_and_spread_of_return_and_length_and_writes_every_episode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a CartPole run directory
    write_policy(tmp_path, job_of(), seed=2)
    # When 12 episodes are played over 5 envs
    code, out, err = warren_eval(capsys, str(tmp_path), "--episodes", "12", "--envs", "5")
    # Then it says mean and spread of both, and eval.json of the run holds the 12 episodes
    assert code == 0, err
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["episodes"] == len(report["returns"]) == len(report["lengths"]) == 12
    assert report["returns"] == [float(n) for n in report["lengths"]]  # CartPole: +1 a step
    assert report["policy_version"] == 1 and report["deterministic"] is True and report["env_id"] == "CartPole-v1"
    assert out.strip() == (
        f"return {report['return_mean']:.2f} ± {report['return_std']:.2f}, length {report['length_mean']:.1f} ± "
        f"{report['length_std']:.1f} over 12 episodes of CartPole-v1 (policy policy_main, version 1, deterministic)"
    )
    assert report["return_mean"] == pytest.approx(float(np.mean(report["returns"])))


def test_a_video_decodes_and_has_one_frame_per_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("av")
    # Given a CartPole run directory
    write_policy(tmp_path / "run", job_of(), seed=2)
    # When three episodes are played, the first two filmed
    videos = tmp_path / "videos"
    code, _, err = warren_eval(
        capsys, str(tmp_path / "run"), "--episodes", "3", "--video", str(videos), "--video-episodes", "2"
    )
    # Then each filmed episode is an mp4 that decodes to one frame per step of that episode
    assert code == 0, err
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert report["videos"] == [str(videos / "episode-000.mp4"), str(videos / "episode-001.mp4")]
    assert [count_frames(Path(v)) for v in report["videos"]] == report["lengths"][:2]
    assert read_frames(Path(report["videos"][0]))[0].shape == (400, 600, 3)  # CartPole's own picture


def test_an_env_that_cannot_render_but_observes_pixels_is_filmed_through_its_observations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("av")
    # Given a policy for uint8 frame stacks, and an env of such frames that renders nothing
    write_policy(tmp_path / "run", image_job("dqn"))
    # When an episode of it is filmed
    code, _, err = warren_eval(
        capsys, str(tmp_path / "run"), "--env-id", FRAMES_ID, "--episodes", "1", "--video", str(tmp_path / "v")
    )
    # Then the video shows the newest frame of each observation the policy acted on, one per step
    assert code == 0, err
    frames = read_frames(tmp_path / "v" / "episode-000.mp4")
    assert len(frames) == FRAMES_EPISODE
    assert frames[0].shape == (36, 36, 3)
    assert [round(float(f.mean()) / 10) for f in frames] == list(range(FRAMES_EPISODE))


def _not_a_policy(run: Path) -> list[str]:
    (run / "notes.txt").write_text("not a policy")
    return [str(run / "notes.txt")]


def _other_spaces(run: Path) -> list[str]:
    return [str(run), "--env-id", "Pendulum-v1"]


def _missing_plugin(run: Path) -> list[str]:
    path = run / "policy" / "policy_main"
    version, meta = read_policy_header(path)
    meta.update({"model": "resnet9", "model_version": "0.3.1"})
    store = PolicyStore(path.parent)
    store.write("policy_main", dict(store.read("policy_main").state_dict), version, meta)  # type: ignore[union-attr]
    return [str(run)]


def _cannot_render(run: Path) -> list[str]:
    return [str(run), "--env-id", NO_RENDER_ID, "--video", str(run / "videos")]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (_not_a_policy, "is not a safetensors file"),
        (_other_spaces, "env Pendulum-v1 has observations Box(3,)"),
        (_missing_plugin, "model plug-in 'resnet9' 0.3.1, which is not installed here"),
        (_cannot_render, f"env '{NO_RENDER_ID}' cannot render"),
    ],
    ids=["not a policy", "other spaces", "plug-in not installed", "cannot render"],
)
def test_bad_input_is_one_line_on_stderr_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: Any, says: str
) -> None:
    if bad is _cannot_render:
        pytest.importorskip("av")
    # Given a CartPole run directory and one bad input
    write_policy(tmp_path, job_of())
    args = bad(tmp_path)
    # When warren eval is given it
    code, out, err = warren_eval(capsys, *args, "--episodes", "1")
    # Then it exits 2 with one line saying what is wrong, and plays nothing
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("warren eval: ") and says in err, err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "videos").exists()


SHIPPED_JOBS = sorted(p.name for p in CONFIGS.glob("*.toml") if p.name != "defaults.toml")
#: What each shipped job's env needs installed.
NEEDS = {"lunarlander": "Box2D", "halfcheetah": "mujoco", "pong": "ale_py"}
#: Episodes cut short where a whole one costs minutes here (MuJoCo renders in software without a GPU: ~50 ms a frame).
SHORTER = {"halfcheetah_sac.toml": {"env.kwargs": {"max_episode_steps": 30}}}


@pytest.mark.slow
@pytest.mark.parametrize("config", SHIPPED_JOBS)
def test_every_shipped_jobs_policy_is_evaluated_and_filmed_in_its_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str
) -> None:
    pytest.importorskip("av")
    for prefix, module in NEEDS.items():
        if config.startswith(prefix):
            pytest.importorskip(module)
    # Given a policy of the shipped job (its learner's first weights)
    write_policy(tmp_path / "run", job_of(config, **SHORTER.get(config, {})))
    # When one episode is played and filmed
    code, _, err = warren_eval(capsys, str(tmp_path / "run"), "--episodes", "1", "--video", str(tmp_path / "v"))
    # Then the video has one frame per step of the episode
    assert code == 0, err
    report = json.loads((tmp_path / "run" / "eval.json").read_text())
    assert count_frames(tmp_path / "v" / "episode-000.mp4") == report["lengths"][0] > 0
