"""The learners on a CUDA GPU: their tensors there, files that do not care, the CPU's results, bf16, out of memory."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tests.rl_builders import bound as bound_algorithm
from tests.rl_builders import chunk_fields, flat_spaces
from tests.unit.test_frame_replay import StackingEnvs
from tests.unit.test_learner_service import Settled, data_item, write_chunk
from worker.algorithms.dqn.torch_step import TorchDQNStep
from worker.config import LearnerConfig
from worker.errors import DeviceOutOfMemory
from worker.job import JobConfig
from worker.learner.service import Learner
from worker.plugins.contract import Placement
from worker.plugins.spaces import Spaces
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.device_frames import DeviceFrames
from worker.storage import PolicyStore

GPU = Placement("cuda:0")
PONG = Spaces(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6))
SETTINGS: dict[str, dict[str, Any]] = {
    "dqn": {"learning_starts": 32, "batch_size": 16},
    "ppo": {"batch_steps": 64, "minibatch_size": 32, "epochs": 2},
    "sac": {"learning_starts": 32, "batch_size": 16},
}


def bound(*args: Any, **kwargs: Any) -> Any:
    """The built-in algorithm, untyped: its learner's ``make_learner`` takes ``placement`` (the contract's does not)."""
    return bound_algorithm(*args, **kwargs)


def spaces_of(algorithm: str) -> Spaces:
    if algorithm == "sac":
        return Spaces(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32))
    return flat_spaces()


def trained(algorithm: str, placement: Placement | None, seed: int = 0, **extra: Any) -> tuple[Any, Any]:
    spaces = spaces_of(algorithm)
    algo = bound(algorithm, spaces, model={"hidden_sizes": [16]}, backend="torch", **SETTINGS[algorithm], **extra)
    learner = algo.make_learner(seed=seed, placement=placement)
    layout = ChunkLayout.of(spaces, algo.columns())
    for i in range(2):
        learner.add(read_chunk(chunk_fields(layout, spaces, 32, 2, seed=i), layout, spaces, 0))
    while learner.can_update():
        metrics = learner.update()
        assert all(np.isfinite(v) for v in metrics.values())
    return algo, learner


def job_learner(tmp_path: Path, **job: Any) -> Learner:
    config = LearnerConfig(
        path_data=tmp_path / "data", path_policy=tmp_path / "policy", job=JobConfig.load(None, **job)
    )
    return Learner(config)


def test_auto_trains_on_the_gpu_with_the_torch_step_reading_files_ahead(tmp_path: Path) -> None:
    learner = job_learner(tmp_path, **{"algorithm.learning_starts": 32})
    assert learner.placement.device.startswith("cuda:")
    assert isinstance(getattr(learner.learner, "step", None), TorchDQNStep)
    assert learner.reader.depth == 4 and learner.telemetry.device is not None
    for i in range(4):
        write_chunk(learner, f"d{i}", steps=64, seed=i)
        learner._ingest(Settled().item(data_item(f"d{i}", samples=64)))
    learner._train_some()
    assert learner.learner.version > 0
    figures = learner.telemetry.device.sample()
    assert figures["memory_allocated"] > 0 and figures["memory_total"] > figures["memory_allocated"]
    learner.reader.close()


@pytest.mark.parametrize("algorithm", ["dqn", "ppo", "sac"])
def test_each_learner_trains_on_the_gpu_and_gives_cpu_weights_and_checkpoints(algorithm: str) -> None:
    _, learner = trained(algorithm, GPU)
    assert learner.version > 0
    nets = learner.nets
    modules = [m for m in vars(nets).values() if isinstance(m, torch.nn.Module)]
    assert modules and all(p.is_cuda for m in modules for p in m.parameters())
    optimizers = [o for o in vars(nets).values() if isinstance(o, torch.optim.Optimizer)]
    for optimizer in optimizers:
        for state in optimizer.state.values():
            assert state["exp_avg"].is_cuda
    assert all(t.device.type == "cpu" for t in learner.actor_weights().values())
    assert all(t.device.type == "cpu" for t in learner.state_dict().values())


@pytest.mark.parametrize("algorithm", ["dqn", "ppo", "sac"])
def test_a_checkpoint_made_on_the_gpu_resumes_on_the_cpu_and_the_other_way_round(algorithm: str) -> None:
    algo, on_gpu = trained(algorithm, GPU)
    state = on_gpu.state_dict()
    on_cpu = algo.make_learner(seed=5, placement=Placement("cpu"))
    on_cpu.load_state_dict(state, on_gpu.version)
    for name, weight in on_gpu.actor_weights().items():
        assert torch.equal(on_cpu.actor_weights()[name], weight), name
    back = algo.make_learner(seed=6, placement=GPU)
    back.load_state_dict(on_cpu.state_dict(), on_cpu.version)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in on_cpu.state_dict().items())


def test_a_policy_file_written_from_the_gpu_is_what_a_cpu_collector_reads(tmp_path: Path) -> None:
    algo, learner = trained("dqn", GPU)
    store = PolicyStore(tmp_path)
    store.write("policy_main", learner.actor_weights(), learner.version, {"algorithm": "dqn"})
    snapshot = store.read("policy_main", numpy=algo.weights_format == "numpy")
    assert snapshot is not None and snapshot.iter == learner.version
    actor = algo.make_actor(seed=0)
    actor.load_weights(snapshot.state_dict)  # the collectors' own reader, unchanged
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    on_cpu = copy.deepcopy(learner.nets.online).cpu()
    with torch.no_grad():
        greedy = on_cpu(torch.as_tensor(obs)).argmax(1).numpy()
    np.testing.assert_array_equal(actor.act(obs, explore=False, settings={})[0], greedy)


def test_a_learner_killed_on_the_gpu_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    first = job_learner(tmp_path, **{"algorithm.learning_starts": 32})
    for i in range(4):
        write_chunk(first, f"d{i}", steps=64, seed=i)
        first._ingest(Settled().item(data_item(f"d{i}", samples=64)))
    first._train_some()  # the first updates are checkpointed at once
    version, weights = first.learner.version, first.learner.actor_weights()
    again = job_learner(tmp_path, **{"algorithm.learning_starts": 32})
    again._resume_or_start()
    assert again.learner.version == version
    assert all(torch.equal(again.learner.actor_weights()[k], v) for k, v in weights.items())


@pytest.mark.parametrize("algorithm", ["dqn", "ppo", "sac"])
def test_a_gpu_update_computes_what_the_cpu_update_computes(algorithm: str) -> None:
    def first_update(placement: Placement) -> dict[str, float]:
        spaces = spaces_of(algorithm)
        algo = bound(algorithm, spaces, model={"hidden_sizes": [16]}, backend="torch", **SETTINGS[algorithm])
        learner = algo.make_learner(seed=0, placement=placement)
        layout = ChunkLayout.of(spaces, algo.columns())
        for i in range(2):
            learner.add(read_chunk(chunk_fields(layout, spaces, 32, 2, seed=i), layout, spaces, 0))
        assert learner.can_update()
        metrics: dict[str, float] = learner.update()
        return metrics

    on_cpu, on_gpu = first_update(Placement("cpu")), first_update(GPU)
    assert set(on_gpu) == set(on_cpu)
    for name, value in on_cpu.items():
        assert on_gpu[name] == pytest.approx(value, rel=1e-3, abs=1e-5), name


@pytest.mark.parametrize("resident", [False, True])
def test_pong_replay_on_the_gpu_restacks_the_frames_there_and_trains(resident: bool) -> None:
    algo = bound(
        "dqn", PONG, model_name="nature_cnn", replay_capacity=2000, learning_starts=0, batch_size=32,
        train_steps_per_sample=1.0,
    )  # fmt: skip
    learner = algo.make_learner(seed=0, placement=dataclasses.replace(GPU, device_replay=resident))
    envs = StackingEnvs(envs=4, episode=50, reset_fill="repeat", side=84)
    for _ in range(4):
        chunk = envs.chunk(steps=32, first_id=0)
        learner.add(dataclasses.replace(chunk, action=chunk.action % 6))
    frames = learner.feed.device_frames
    assert isinstance(frames, DeviceFrames) and (frames.ring is not None) == resident
    batch = learner.feed.sample(32)
    assert batch["obs"].is_cuda and batch["obs"].dtype == torch.uint8
    replay = learner.feed.buffer
    cpu_batch = replay.sample(64, np.random.default_rng(3))
    gpu_batch = frames.batch(replay.sample_slots(64, np.random.default_rng(3)))
    np.testing.assert_array_equal(gpu_batch["next_obs"].cpu().numpy(), cpu_batch["next_obs"])
    learner.feed.credit = 10.0
    for _ in range(5):
        assert np.isfinite(learner.update()["loss"])


def test_bf16_autocast_updates_stay_close_to_fp32_on_pong_frames() -> None:
    def ppo(autocast: str) -> Any:
        algo = bound(
            "ppo", PONG, model_name="nature_cnn", batch_steps=256, minibatch_size=64, epochs=2, shared_body=True
        )
        learner = algo.make_learner(seed=0, placement=dataclasses.replace(GPU, autocast=autocast))
        layout = ChunkLayout.of(PONG, algo.columns())
        for i in range(2):
            learner.add(read_chunk(chunk_fields(layout, PONG, 32, 4, seed=i), layout, PONG, 0))
        return learner.update(), learner.actor_weights()

    (fp32, w32), (bf16, w16) = ppo("off"), ppo("bf16")
    assert all(np.isfinite(v) for v in bf16.values())
    assert bf16["value_loss"] == pytest.approx(fp32["value_loss"], rel=0.05)
    assert bf16["entropy"] == pytest.approx(fp32["entropy"], rel=0.01)
    moved32 = sum(float((w - w16[k]).abs().max()) for k, w in w32.items())
    assert moved32 < 0.05 * len(w32)  # the two updates land near each other


def test_running_out_of_gpu_memory_stops_the_learner_naming_the_settings_and_keeping_the_policy(tmp_path: Path) -> None:
    learner = job_learner(tmp_path, **{"algorithm.learning_starts": 32})
    learner._resume_or_start()

    def huge() -> dict[str, float]:
        torch.empty(2**50, dtype=torch.uint8, device=learner.placement.device)  # a petabyte
        return {}

    learner.learner.can_update = lambda: True  # type: ignore[method-assign]
    learner.learner.update = huge  # type: ignore[method-assign]
    with pytest.raises(
        DeviceOutOfMemory, match=r"ran out of memory on cuda:\d in update .*lower algorithm\.batch_size"
    ):
        learner._train_some()
    kept = learner.policies.read(learner._policy_name)
    assert kept is not None and kept.iter == 0
