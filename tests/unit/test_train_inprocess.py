"""The one-process training example (scripts/train_inprocess.py) collects, trains and evaluates."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from worker.rl.config import LearnerSpec

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_inprocess.py"


def test_the_in_process_example_trains_at_the_replay_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("train_inprocess", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["train_inprocess"] = example
    spec.loader.exec_module(example)
    # Given a small budget and a target no policy reaches, when the example runs one seed
    example.main(["--seeds", "3", "--max-steps", "8000", "--eval-every", "4000", "--target", "1e9"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Then it collected the budget, evaluated along the way, and trained at the replay ratio
    # once the buffer held learning_starts transitions
    defaults = LearnerSpec()
    assert result["seed"] == 3 and not result["solved"]
    assert result["env_steps"] >= 8000
    assert len(result["evals"]) >= 2
    ratio = defaults.train_steps_per_sample
    assert (result["env_steps"] - defaults.learning_starts) * ratio <= result["train_iter"] + 1
    assert result["train_iter"] <= result["env_steps"] * ratio
