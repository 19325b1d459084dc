"""``warren plot``: a run's learning curve from its run log, or from the run's directory."""

from __future__ import annotations

import json
from pathlib import Path

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
