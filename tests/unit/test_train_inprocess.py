"""The one-process training example (scripts/train_inprocess.py) runs and learns something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_in_process_example_collects_trains_and_evaluates() -> None:
    # Given a small budget and a target no policy reaches, when the example runs one seed
    args = ["--seeds", "3", "--max-steps", "3000", "--eval-every", "1000", "--target", "1e9"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_inprocess.py"), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Then it collected the budget, trained at the replay ratio and evaluated along the way
    assert result["seed"] == 3 and not result["solved"]
    assert result["env_steps"] >= 3000
    assert result["train_iter"] > 0
    assert len(result["evals"]) >= 2 and all(reward > 0 for _, reward in result["evals"])
