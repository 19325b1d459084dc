"""``python -m benchmarks.learner_device``: the learner alone on synthetic Pong batches, on a device.

What it reports is learned env steps/s: the env steps whose data one update (or train step) consumes, per second.

No broker, no collectors, no files: each case builds the job's learner with
``--device`` (``cpu``, ``cuda``...), gives it chunks shaped as Pong's collectors make them
(8 envs x 128 steps of 84x84 uint8 frame stacks, each frame a shift of the last stack),
and times its updates the way the learner process runs them (``learner.update()``):

* ``ppo``: the Pong PPO job's update (``--jobs``, default configs/pong_ppo.toml; each further
  job is the case ``ppo[<its name>]``, e.g. configs/pong_ppo_gpu.toml's larger batches): a batch of
  ``batch_steps`` env steps, its values and advantages, ``epochs`` passes of minibatches.
  Learned env steps/s = ``batch_steps`` / the update's wall time.
* ``dqn``: Atari DQN (Nature CNN, batches of 32, one train step per 4 env steps, frame
  replay): learned env steps/s = train steps/s x 4. On a GPU also with the frame ring in
  its memory (``device_replay``).
* ``sac``: the HalfCheetah SAC job's train step (an MLP: where a GPU may not pay), learned
  env steps/s = train steps/s / ``train_steps_per_sample``.

With ``--autocast bf16`` the CNN cases run under bf16 autocast too, beside fp32, and the
report says how far the bf16 updates land from the fp32 ones (same start, same batches).

Each figure is the median over ``--repeats`` timed blocks after a warm-up (the GPU is
synchronised before each clock read). It prints a table and writes JSON to ``--out``.
``--quick`` is a smoke run (small batches, one repeat) that any CPU finishes in seconds.
"""

from __future__ import annotations

from worker.lifecycle import single_threaded_math

single_threaded_math()  # one BLAS thread, as warren's learner runs its numpy steps: before numpy loads

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tomllib  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PONG_JOB = ROOT / "configs" / "pong_ppo.toml"
SAC_JOB = ROOT / "configs" / "halfcheetah_sac.toml"
PONG = ((4, 84, 84), 6)
HALFCHEETAH = (17, 6)
#: Atari DQN (Mnih et al. 2015, as cleanrl's dqn_atari): one train step per 4 env steps.
DQN_SETTINGS = {
    "lr": 1e-4, "batch_size": 32, "train_steps_per_sample": 0.25, "learning_starts": 0, "replay_capacity": 100_000,
    "target_update_interval": 1000, "max_grad_norm": 10.0,
}  # fmt: skip
ENVS, STEPS = 8, 128


def sections(path: Path) -> tuple[dict[str, Any], str, dict[str, Any], int]:
    """A job file's ``[algorithm]`` settings, its model's name and settings, and its frames per observation.

    The frames are ale-py's ``stack_num`` (4 unless the job's ``env.kwargs`` say otherwise:
    ``pong_ppo_lstm`` sees one frame a step).
    """
    data = tomllib.loads(path.read_text())
    algorithm = {k: v for k, v in data.get("algorithm", {}).items() if k != "name"}
    model = {k: v for k, v in data.get("model", {}).items() if k != "name"}
    stack = int(data.get("env", {}).get("kwargs", {}).get("stack_num", PONG[0][0]))
    return algorithm, str(data.get("model", {}).get("name", "nature_cnn")), model, stack


def algorithm(name: str, spaces: Any, model: str, model_config: dict[str, Any], config: dict[str, Any]) -> Any:
    from warren.plugins import installed
    from worker.plugins.binding import build_algorithm

    return build_algorithm(installed(), spaces, algorithm=name, config=config, model=model, model_config=model_config)


def pong_spaces(stack: int = PONG[0][0]) -> Any:
    from worker.plugins.spaces import Spaces

    (_, height, width), actions = PONG
    return Spaces(gym.spaces.Box(0, 255, (stack, height, width), np.uint8), gym.spaces.Discrete(actions))


def pong_chunks(algo: Any, count: int, steps: int = STEPS, envs: int = ENVS, seed: int = 0) -> list[Any]:
    """Chunks as Pong's collectors make them: stacks of frames, each row's the last row's shifted by one new frame;
    with a recurrent model, a zero state at each chunk's first step (as an episode's start)."""
    from worker.plugins.contract import Chunk

    rng = np.random.default_rng(seed)
    stack, height, width = algo.spaces.observation.shape
    out = []
    frames = rng.integers(0, 256, (envs, stack, height, width), dtype=np.uint8)
    for _ in range(count):
        obs = np.empty((steps + 1, envs, stack, height, width), np.uint8)
        obs[0] = frames
        for t in range(steps):
            frames = np.concatenate([frames[:, 1:], rng.integers(0, 256, (envs, 1, height, width), np.uint8)], 1)
            obs[t + 1] = frames
        extras = {
            name: rng.normal(-1.8, 0.1, (steps, envs)).astype(column.dtype) for name, column in algo.columns().items()
        }
        for array in (obs, *extras.values()):
            array.flags.writeable = False  # as read_chunk hands them over
        out.append(
            Chunk(
                obs,
                rng.integers(0, PONG[1], (steps, envs)),
                rng.choice([-1.0, 0.0, 1.0], (steps, envs)).astype(np.float32),
                rng.random((steps, envs)) < 0.001,
                np.zeros((steps, envs), bool),
                np.ones((steps, envs), bool),
                extras,
                0,
                state={
                    name: np.zeros((envs, *column.shape), np.float32) for name, column in algo.memory_columns().items()
                },
            )
        )
    return out


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def timed_blocks(run: Callable[[], None], device: str, repeats: int, warmup: int, per_block: int) -> list[float]:
    """Seconds per call of ``run``: the mean over ``per_block`` calls, once per repeat, after ``warmup`` calls."""
    for _ in range(warmup):
        run()
    synchronize(device)
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(per_block):
            run()
        synchronize(device)
        out.append((time.perf_counter() - started) / per_block)
    return out


def placement(device: str, autocast: str = "off", device_replay: bool = False) -> Any:
    from worker.plugins.contract import Placement

    if device.startswith("cuda") and ":" not in device:
        device = "cuda:0"
    return Placement(device, autocast if device != "cpu" else "off", device_replay and device != "cpu")


def ppo_case(args: argparse.Namespace, job: Path, autocast: str) -> dict[str, Any]:
    config, model_name, model, stack = sections(job)
    if args.quick:
        config.update(batch_steps=256, minibatch_size=128, epochs=1)
    algo = algorithm("ppo", pong_spaces(stack), model_name, model, {**config, "backend": "torch"})
    learner = algo.make_learner(seed=0, placement=placement(args.device, autocast))
    steps = STEPS if not args.quick else 32
    per_batch = -(-algo.config.batch_steps // (steps * ENVS))
    chunks = pong_chunks(algo, per_batch * 2, steps=steps)

    def update() -> None:
        for chunk in chunks[:per_batch] if learner.version % 2 == 0 else chunks[per_batch:]:
            learner.add(chunk)
        assert learner.can_update()
        learner.update()

    times = timed_blocks(update, args.device, args.repeats, warmup=1, per_block=1)
    batch = per_batch * steps * ENVS
    return {
        "what": f"PPO update, {job.name}: batch {batch}, {algo.config.epochs} epochs of {algo.config.minibatch_size}",
        "seconds_per_update": times,
        "learned_env_steps_per_s": batch / statistics.median(times),
        "weights": learner.actor_weights(),
    }


def dqn_case(args: argparse.Namespace, autocast: str, device_replay: bool) -> dict[str, Any]:
    settings = dict(DQN_SETTINGS)
    if args.quick:
        settings["replay_capacity"] = 5000
    algo = algorithm("dqn", pong_spaces(), "nature_cnn", {}, {**settings, "backend": "torch"})
    learner = algo.make_learner(seed=0, placement=placement(args.device, autocast, device_replay))
    for chunk in pong_chunks(algo, 2 if args.quick else 16, steps=32 if args.quick else STEPS):
        learner.add(chunk)
    learner.feed.credit = float("inf")  # the updates alone: the feed's pace is not what is timed
    block = 4 if args.quick else 50

    def step() -> None:
        learner.update()

    times = timed_blocks(step, args.device, args.repeats, warmup=block, per_block=block)
    frames = learner.feed.device_frames
    replay = (
        "frame ring in GPU memory" if frames is not None and frames.ring is not None else "frame ring in host memory"
    )
    return {
        "what": f"DQN train step, Nature CNN, batch 32, 1 per 4 env steps ({replay})",
        "seconds_per_train_step": times,
        "learned_env_steps_per_s": 1 / statistics.median(times) / settings["train_steps_per_sample"],
        "weights": learner.actor_weights(),
    }


def sac_case(args: argparse.Namespace) -> dict[str, Any]:
    from worker.plugins.contract import Chunk
    from worker.plugins.spaces import Spaces

    config, _, model, _ = sections(SAC_JOB)
    obs_dim, act_dim = HALFCHEETAH
    spaces = Spaces(
        gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32), gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
    )
    config = {**config, "learning_starts": 0}
    backend = "auto" if args.device == "cpu" else "torch"  # the numpy step on the CPU, as warren runs this job
    algo = algorithm("sac", spaces, "mlp", model, {**config, "backend": backend})
    learner = algo.make_learner(seed=0, placement=placement(args.device))
    rng = np.random.default_rng(0)
    steps, envs = 256, 8
    learner.add(
        Chunk(
            rng.normal(size=(steps + 1, envs, obs_dim)).astype(np.float32),
            rng.uniform(-1, 1, (steps, envs, act_dim)).astype(np.float32),
            rng.normal(size=(steps, envs)).astype(np.float32),
            np.zeros((steps, envs), bool),
            np.zeros((steps, envs), bool),
            np.ones((steps, envs), bool),
            {},
            0,
        )
    )
    learner.feed.credit = float("inf")
    block = 20 if args.quick else 200
    times = timed_blocks(learner.update, args.device, args.repeats, warmup=block, per_block=block)
    return {
        "what": f"SAC train step, {SAC_JOB.name} (MLP {model.get('hidden_sizes')}, batch {algo.config.batch_size}, "
        f"{type(learner.step).__name__})",
        "seconds_per_train_step": times,
        "learned_env_steps_per_s": 1 / statistics.median(times) / algo.config.train_steps_per_sample,
    }


def job_path(text: str) -> Path:
    """A job file named on the command line: as given, else under the repository."""
    path = Path(text.strip())
    return path if path.exists() or path.is_absolute() else ROOT / path


def drift(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest relative difference between two learners' weights (bf16 against fp32, from the same start)."""
    worst = 0.0
    for name, weight in a.items():
        scale = float(weight.abs().max()) or 1.0
        worst = max(worst, float((weight.float() - b[name].float()).abs().max()) / scale)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learner_device", description=__doc__)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    parser.add_argument("--cases", default="ppo,dqn,sac", help="comma-separated: ppo, dqn, sac")
    parser.add_argument(
        "--jobs", default=str(PONG_JOB.relative_to(ROOT)), help="the PPO case's job files, comma-separated"
    )
    parser.add_argument("--autocast", choices=["off", "bf16"], default="off", help="also time bf16 autocast (GPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: every CPU this process has)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small batches, one repeat")
    parser.add_argument("--out", type=Path, help="JSON file of the results")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
    from benchmarks.sysinfo import machine, versions
    from worker.config import cpu_budget
    from worker.lifecycle import limit_torch_threads

    limit_torch_threads(args.threads or cpu_budget())
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    if set(wanted) - {"ppo", "dqn", "sac"}:
        parser.error(f"unknown cases {sorted(set(wanted) - {'ppo', 'dqn', 'sac'})}")
    variants = ["off", "bf16"] if args.autocast == "bf16" and args.device != "cpu" else ["off"]
    results: dict[str, Any] = {}
    for case in wanted:
        runs: list[tuple[str, Callable[[], dict[str, Any]]]] = []
        for autocast in variants if case != "sac" else ["off"]:
            tag = case if autocast == "off" else f"{case}-bf16"
            if case == "ppo":
                for i, job in enumerate(job_path(j) for j in args.jobs.split(",") if j.strip()):
                    named = tag if i == 0 else tag.replace("ppo", f"ppo[{job.stem}]", 1)
                    runs.append((named, functools.partial(ppo_case, args, job, autocast)))
            elif case == "dqn":
                runs.append((tag, functools.partial(dqn_case, args, autocast, False)))
                if args.device != "cpu" and autocast == "off":
                    runs.append((f"{tag}-device-replay", functools.partial(dqn_case, args, autocast, True)))
            else:
                runs.append((tag, functools.partial(sac_case, args)))
        for tag, run in runs:
            try:
                result = run()
            except Exception as exc:
                # One case that fails (a kernel the device lacks) costs its row, not the others' figures.
                results[tag] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"{tag:<24} failed: {results[tag]['error']}", flush=True)
                continue
            results[tag] = result
            rate = result["learned_env_steps_per_s"]
            print(f"{tag:<24} {rate:>12,.0f} env steps/s learned   {result['what']}", flush=True)
    timed = {tag: result for tag, result in results.items() if "error" not in result}
    for tag, result in timed.items():  # the same updates from the same start, in bf16 and in fp32
        if tag.endswith("-bf16") and tag.removesuffix("-bf16") in timed:
            result["weight_drift_from_fp32"] = drift(timed[tag.removesuffix("-bf16")]["weights"], result["weights"])
            print(f"{tag:<24} weights {result['weight_drift_from_fp32']:.2e} from fp32's (largest relative difference)")
    for result in results.values():
        result.pop("weights", None)
    import torch

    report = {
        "command": "python -m benchmarks.learner_device " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
        "torch_threads": torch.get_num_threads(),
        "results": results,
        "versions": versions(),
        "machine": machine(),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if len(timed) < len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
