"""``warren plot``: a run's learning curve from its run log, or from the run's directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.cli import main


def write_run(workdir: Path) -> Path:
    workdir.mkdir()
    records = [
        {"kind": "task", "env_steps": 4096},
        {"kind": "eval", "env_steps": 4096, "reward_mean": 21.0, "steps_per_s": 1800.0},
        {"kind": "eval", "env_steps": 8192, "reward_mean": 200.0, "steps_per_s": 2000.0},
        {"kind": "summary", "success": True, "stop_value": 195.0, "wall_time_s": 9.0},
    ]
    run_log = workdir / "run.jsonl"
    run_log.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_log


@pytest.mark.parametrize("given", ["file", "directory"])
def test_plot_takes_the_run_log_or_the_run_directory(
    given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    run_log = write_run(tmp_path / "run")
    target = run_log if given == "file" else run_log.parent
    assert main(["plot", str(target)]) == 0
    png = run_log.parent / "run.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_a_directory_without_a_run_log_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    assert "is a directory without a run.jsonl" in capsys.readouterr().err


def test_a_run_with_no_eval_finished_is_drawn_from_its_training_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    # Given a short Pong try: collect tasks finished episodes, no eval finished before its end
    run = tmp_path / "pong"
    run.mkdir()
    records = [
        {"kind": "checkpoint", "env_steps": 0, "elapsed_s": 0.0},
        {"kind": "task", "env_steps": 8192, "eval_flag": False, "real_episode_count": 0, "reward_mean": 0.0},
        {"kind": "task", "env_steps": 16384, "eval_flag": False, "real_episode_count": 2, "reward_mean": -21.0},
        {"kind": "checkpoint", "env_steps": 16384, "elapsed_s": 20.0},
        {"kind": "task", "env_steps": 24576, "eval_flag": False, "real_episode_count": 1, "reward_mean": -20.0},
        {"kind": "checkpoint", "env_steps": 24576, "elapsed_s": 30.0},
        {"kind": "summary", "success": False, "stop_value": 18.0, "wall_time_s": 150.0},
    ]
    (run / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    titles: list[str] = []
    original = matplotlib.figure.Figure.savefig

    def savefig(figure: matplotlib.figure.Figure, *args: Any, **kwargs: Any) -> None:
        titles.extend(axis.get_title() for axis in figure.axes)
        original(figure, *args, **kwargs)

    # When it is plotted
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    assert main(["plot", str(run)]) == 0
    # Then the PNG shows the two tasks' training returns, and its title says so
    assert (run / "run.png").read_bytes().startswith(b"\x89PNG")
    assert any("no eval finished: 3 training episodes" in title for title in titles), titles


def test_a_run_log_without_evals_or_training_episodes_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "new"
    run.mkdir()
    (run / "run.jsonl").write_text(json.dumps({"kind": "task", "env_steps": 64, "real_episode_count": 0}) + "\n")
    assert main(["plot", str(run)]) == 2
    assert "no eval records and no finished training episode yet" in capsys.readouterr().err
