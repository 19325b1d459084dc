"""The learner's busy share, and its GPU's utilisation and memory, in TensorBoard and on ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.observe import scalars
from tests.unit.test_telemetry import Clock, value
from worker.plugins.contract import Placement
from worker.telemetry.device import DeviceMonitor
from worker.telemetry.learner import BOARD_INTERVAL_S, LearnerTelemetry
from worker.telemetry.metrics import MetricsEndpoint
from worker.telemetry.tensorboard import ScalarLog


class FakeGPU(DeviceMonitor):
    """A GPU's figures without a GPU: what :meth:`DeviceMonitor.sample` gives on one."""

    def __init__(self) -> None:
        super().__init__(Placement("cuda:0"))

    def sample(self) -> dict[str, float]:
        return {"utilization": 0.75, "memory_allocated": 2e9, "memory_reserved": 3e9, "memory_total": 1.4e11}


def test_the_learners_busy_share_and_its_gpus_figures_are_reported_each_interval(tmp_path: Path) -> None:
    clock = Clock()
    endpoint = MetricsEndpoint("learner")
    telemetry = LearnerTelemetry(endpoint=endpoint, board=ScalarLog(tmp_path / "learner"), clock=clock)
    telemetry.device = FakeGPU()
    try:
        # When the learner spends 0.6 s of a second in two updates
        for step in (1, 2):
            telemetry.train_step(0.3)
            telemetry.record({"loss": 1.0}, step=step)
        clock.now += BOARD_INTERVAL_S
        telemetry.record({"loss": 1.0}, step=3)
        # Then /metrics shows its busy share and the GPU's figures
        assert value(endpoint, "warren_learner_busy_ratio") == pytest.approx(0.6)
        assert value(endpoint, "warren_learner_device_utilization_ratio") == 0.75
        assert value(endpoint, "warren_learner_device_memory_bytes", kind="allocated") == 2e9
        assert value(endpoint, "warren_learner_device_memory_bytes", kind="total") == 1.4e11
    finally:
        telemetry.close()
    board = scalars(tmp_path / "learner")
    assert board["learner/busy"][0] == pytest.approx((3, 0.6))
    assert board["learner/device_utilization"][0] == (3, 0.75)
    assert board["learner/device_memory_reserved"][0] == (3, 3e9)


def test_on_the_cpu_there_are_no_device_figures() -> None:
    assert DeviceMonitor(Placement("cpu")).sample() == {}
    endpoint = MetricsEndpoint("learner")
    telemetry = LearnerTelemetry(endpoint=endpoint)
    try:
        telemetry.record({"loss": 1.0}, step=1)
        assert value(endpoint, "warren_learner_busy_ratio") == 0.0
        with pytest.raises(AssertionError):
            value(endpoint, "warren_learner_device_utilization_ratio")
    finally:
        telemetry.close()
