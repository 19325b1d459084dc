"""The learner's device, on a machine without a GPU: the settings, the refusals, the CPU path kept, device-free files.

What needs a CUDA GPU (training there, checkpoints across devices, bf16) is in tests/gpu/.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.rl_builders import bound, chunk_fields, flat_spaces
from worker.algorithms.dqn.numpy_step import NumpyDQNStep
from worker.algorithms.numpy_twin.step import pick_step
from worker.cli import build_parser
from worker.cli.flags import read_environment
from worker.cli.run_plan import plan_run
from worker.config import LearnerConfig, role_config
from worker.devices import device_refusal, run_device_refusal
from worker.errors import ConfigurationError, DeviceOutOfMemory
from worker.job import JobConfig, LearnerSection
from worker.learner.device import resolve_placement
from worker.learner.service import Learner
from worker.plugins.contract import Chunk, Placement
from worker.rl.chunks import ChunkLayout, read_chunk
from worker.rl.placement import to_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine whose torch sees no CUDA GPU")


def make_learner(tmp_path: Path, device: str = "", **job: Any) -> Learner:
    config = LearnerConfig(
        path_data=tmp_path / "data",
        path_policy=tmp_path / "policy",
        device=device,
        job=JobConfig.load(None, **job),
    )
    return Learner(config)


# -- the settings ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "CUDA", "cuda:0,1", ""])
def test_a_device_that_is_not_auto_cpu_cuda_or_cuda_n_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"\[learner\]: learner\.device must be auto, cpu, cuda or cuda:N"):
        JobConfig.load(None, **{"learner.device": value})
    if value:
        with pytest.raises(ConfigurationError, match=r"WARREN_DEVICE/--device must be auto, cpu, cuda or cuda:N"):
            role_config(LearnerConfig, {"WARREN_DEVICE": value})


def test_autocast_is_off_or_bf16_and_read_ahead_a_small_count() -> None:
    with pytest.raises(ValueError, match=r"learner\.autocast must be off or bf16, got 'fp16'"):
        LearnerSection(autocast="fp16")
    with pytest.raises(ValueError, match=r"learner\.read_ahead must be -1 \(auto\), 0 or up to 64"):
        LearnerSection(read_ahead=-2)
    assert LearnerSection().device == "auto" and LearnerSection().autocast == "off"


def test_the_learner_process_device_wins_over_the_jobs_as_its_torch_threads_do() -> None:
    job = JobConfig.load(None, **{"learner.device": "cuda:1"})
    assert LearnerConfig(job=job).device_setting == ("cuda:1", "learner.device")
    assert role_config(LearnerConfig, {"WARREN_DEVICE": "cpu"}, job=job).device_setting == (
        "cpu",
        "WARREN_DEVICE/--device",
    )
    assert role_config(LearnerConfig, {"WARREN_DEVICE": "cpu"}, job=job, device="cuda").device == "cuda"  # the flag


# -- refused before anything starts ---------------------------------------------------------


def test_cuda_on_a_machine_without_an_nvidia_gpu_is_refused_without_torch_naming_the_setting(tmp_path: Path) -> None:
    no_gpus = tmp_path / "dev"
    no_gpus.mkdir()
    refusal = device_refusal("cuda", "learner.device", dev=no_gpus)
    assert refusal is not None
    assert refusal.startswith("learner.device = 'cuda' asks for a CUDA GPU, and this machine shows no NVIDIA GPU")
    assert "set learner.device to 'auto'" in refusal
    assert device_refusal("auto", "learner.device", dev=no_gpus) is None
    assert device_refusal("cpu", "learner.device", dev=no_gpus) is None


def test_cuda_n_past_the_gpus_there_are_is_refused_and_one_there_is_allowed(tmp_path: Path) -> None:
    two = tmp_path / "dev"
    two.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (two / name).touch()
    assert device_refusal("cuda:1", "WARREN_DEVICE", dev=two) is None
    refusal = device_refusal("cuda:2", "WARREN_DEVICE", dev=two)
    assert refusal is not None and "shows 2 NVIDIA GPUs (cuda:0 to cuda:1)" in refusal


def test_warren_run_refuses_a_cuda_learner_here_before_it_starts_anything(tmp_path: Path) -> None:
    if device_refusal("cuda", "learner.device") is None:
        pytest.skip("this machine shows an NVIDIA GPU")
    args = build_parser().parse_args(["run", "--set", "learner.device=cuda", "--workdir", str(tmp_path / "w")])
    read_environment(args, {})
    with pytest.raises(ConfigurationError, match=r"^learner\.device = 'cuda' asks for a CUDA GPU"):
        plan_run(args, {})
    assert not (tmp_path / "w").exists()  # nothing made, nothing started
    # the learner's own variable, which warren run hands its learner, is checked the same way
    assert run_device_refusal("auto", {"WARREN_DEVICE": "cuda"}) is not None
    with pytest.raises(ConfigurationError, match="WARREN_DEVICE must be"):
        run_device_refusal("auto", {"WARREN_DEVICE": "tpu"})


@no_cuda
@pytest.mark.parametrize(
    ("device", "job_device", "named"), [("cuda", "auto", "WARREN_DEVICE/--device"), ("", "cuda:0", "learner.device")]
)
def test_a_learner_asked_for_cuda_where_torch_has_none_refuses_to_start_naming_the_setting(
    tmp_path: Path, device: str, job_device: str, named: str
) -> None:
    with pytest.raises(
        ConfigurationError,
        match=rf"^{named} = '(cuda|cuda:0)', and (this torch is built without CUDA|torch finds no usable CUDA GPU)",
    ):
        make_learner(tmp_path, device, **{"learner.device": job_device})


# -- the CPU path, as before ---------------------------------------------------------------


@no_cuda
def test_auto_without_cuda_is_the_cpu_with_the_numpy_step_and_no_read_ahead(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    assert learner.placement == Placement("cpu", "off", device_replay=False)
    assert isinstance(getattr(learner.learner, "step", None), NumpyDQNStep)  # what the job ran before devices
    assert learner.reader.depth == 0 and learner.telemetry.device is None
    weights = learner.learner.actor_weights()
    assert all(t.device.type == "cpu" for t in weights.values())


def test_an_explicit_cpu_runs_on_the_cpu_and_bf16_there_is_refused(tmp_path: Path) -> None:
    assert make_learner(tmp_path, "cpu").placement.device == "cpu"
    with pytest.raises(ConfigurationError, match=r"learner\.autocast = 'bf16' computes on a CUDA GPU"):
        make_learner(tmp_path, "cpu", **{"learner.autocast": "bf16"})


@no_cuda
def test_bf16_with_auto_on_a_machine_without_cuda_trains_in_fp32_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        placement = resolve_placement("auto", "learner.device", autocast="bf16", device_replay=True)
    assert placement == Placement("cpu", "off", device_replay=False)
    assert "applies on a CUDA GPU only" in caplog.text


def test_an_algorithm_that_names_no_gpu_runs_on_the_cpu_with_auto_and_refuses_cuda() -> None:
    assert resolve_placement("auto", "learner.device", supported=False).device == "cpu"
    with pytest.raises(ConfigurationError, match="runs its learner on the CPU only"):
        resolve_placement("cuda", "learner.device", supported=False)


def test_on_a_gpu_the_torch_step_runs_and_the_numpy_backend_is_refused() -> None:
    class Config:
        def __init__(self, backend: str) -> None:
            self.backend = backend

    def numpy(config: Any, nets: Any) -> str:
        return "numpy"

    def torch_step(config: Any, nets: Any) -> str:
        return "torch"

    assert pick_step(Config("auto"), None, None, numpy, torch_step) == "numpy"
    assert pick_step(Config("auto"), None, None, numpy, torch_step, device="cuda:0") == "torch"
    with pytest.raises(
        ValueError, match=r"algorithm\.backend = 'numpy' trains on the CPU, and this learner runs on cuda:0"
    ):
        pick_step(Config("numpy"), None, None, numpy, torch_step, device="cuda:0")


def test_a_batch_goes_to_the_cpu_without_a_copy_unless_it_is_read_only() -> None:
    array = np.arange(6, dtype=np.float32)
    assert np.shares_memory(to_device(array, torch.device("cpu")).numpy(), array)
    frozen = np.arange(6, dtype=np.uint8)
    frozen.flags.writeable = False
    moved = to_device({"obs": frozen}, torch.device("cpu"))["obs"]
    assert moved.dtype == torch.uint8 and not np.shares_memory(moved.numpy(), frozen)


# -- checkpoints and policy files are the device's business, not the files' ------------------


def trained(algorithm: str, **config: Any) -> Any:
    spaces = flat_spaces()
    algo = bound(algorithm, spaces, model={"hidden_sizes": [8]}, backend="torch", **config)
    learner = algo.make_learner(seed=0)
    layout = ChunkLayout.of(spaces, algo.columns())
    for i in range(2):
        learner.add(read_chunk(chunk_fields(layout, spaces, 32, 2, seed=i), layout, spaces, 0))
    while learner.can_update():
        learner.update()
    return algo, learner


@pytest.mark.filterwarnings("ignore:.*copying from a non-meta parameter:UserWarning")
@pytest.mark.parametrize(
    ("algorithm", "config"),
    [
        ("dqn", {"learning_starts": 32, "batch_size": 16}),
        ("ppo", {"batch_steps": 64, "minibatch_size": 32, "epochs": 1}),
    ],
)
def test_a_checkpoint_made_on_one_device_puts_adams_state_where_the_networks_of_the_next_are(
    algorithm: str, config: dict[str, Any]
) -> None:
    # Given a checkpoint of a learner that trained (on the CPU: its tensors are CPU tensors)
    algo, producer = trained(algorithm, **config)
    state = producer.state_dict()
    assert all(t.device.type == "cpu" for t in state.values())
    # When a learner whose networks live on another device resumes from it ("meta": a device
    # every machine has, holding shapes only)
    elsewhere = algo.make_learner(seed=1, placement=Placement("meta"))
    elsewhere.load_state_dict(state, 7)
    # Then Adam's moments sit with their parameters, and its step count where the fused kernels read it
    optimizer = elsewhere.nets.optimizer
    assert optimizer.state, "no Adam state was loaded"
    for group in optimizer.param_groups:
        for param in group["params"]:
            moments = optimizer.state[param]
            assert param.device.type == "meta"
            assert moments["exp_avg"].device == param.device and moments["exp_avg_sq"].device == param.device
            assert moments["step"].device == param.device  # fused Adam
    assert elsewhere.version == 7


def test_a_learner_on_a_device_keeps_its_step_count_on_the_cpu_where_adam_is_not_fused() -> None:
    from worker.rl.placement import adam_state

    param = torch.nn.Parameter(torch.zeros(3, device="meta"))
    plain = torch.optim.Adam([param], foreach=False)
    state = adam_state(plain, param, torch.tensor(5.0), torch.ones(3), torch.ones(3))
    assert state["step"].device.type == "cpu" and state["exp_avg"].device.type == "meta"


# -- out of memory ----------------------------------------------------------------------------


def oom() -> BaseException:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.2 GiB total)")


def test_an_update_that_runs_out_of_gpu_memory_stops_the_learner_naming_the_batch_and_keeps_the_policy(
    tmp_path: Path,
) -> None:
    learner = make_learner(tmp_path, "", **{"algorithm.learning_starts": 32})
    learner._resume_or_start()  # version 0 on the volume
    before = learner.policies.read(learner._policy_name)
    assert before is not None

    def out_of_memory() -> dict[str, float]:
        raise oom()

    learner.learner.can_update = lambda: True  # type: ignore[method-assign]
    learner.learner.update = out_of_memory  # type: ignore[method-assign]
    with pytest.raises(DeviceOutOfMemory) as raised:
        learner._train_some()
    message = raised.value.message
    assert message.startswith("the learner ran out of memory on cpu in update (CUDA out of memory. Tried to allocate")
    assert "lower algorithm.batch_size (256)" in message
    assert message.endswith("the run stops; policy_main keeps the weights of version 0")
    after = learner.policies.read(learner._policy_name)
    assert after is not None and after.iter == 0
    assert all(torch.equal(after.state_dict[k], before.state_dict[k]) for k in before.state_dict)


def test_replay_that_runs_out_of_gpu_memory_names_its_capacity(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)

    def out_of_memory(chunk: Chunk) -> int:
        raise oom()

    learner.learner.add = out_of_memory  # type: ignore[method-assign]
    learner.steps.write("d0", chunk_fields(learner.layout, learner.spaces, 32, 1))
    from tests.unit.test_learner_service import Settled, data_item

    with pytest.raises(
        DeviceOutOfMemory, match=r"in add \(CUDA out of memory.*lower algorithm\.replay_capacity \(50000\)"
    ):
        learner._ingest(Settled().item(data_item("d0")))
