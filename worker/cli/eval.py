"""``warren eval RUN_DIR|POLICY_FILE``: play a trained policy's episodes, say how it does, film some.

The policy is the run's best (the policy of its best eval, ``policy/<name>.best``), or its
latest with ``--latest`` (or when no eval of a trained policy finished), or the file
given. It acts through the collectors' own actor (:func:`worker.agent.policy.load_policy`),
greedily unless ``--stochastic``, in the env its job trained on unless ``--env-id`` or
``--config`` names another with the same spaces. No broker is needed.

Prints ``return <mean> ± <std>, length <mean> ± <std> over <N> episodes`` and writes the
episodes as JSON (``--json``; by default ``eval.json`` in the run directory, or
``<policy file>.eval.json``). ``--video DIR`` films the first ``--video-episodes`` episodes
as mp4 files, one frame per step (``warren[video]``).

Bad input (not a warren policy, spaces that differ from the env's, a plug-in the file
names that is not installed here, ``--video`` of an env that cannot be filmed) is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from worker import json_text
from worker.cli.exit_codes import ExitCode
from worker.cli.flags import add_output_flags, log_level, positive_int
from worker.logs import setup_logging

logger = logging.getLogger(__name__)

#: Episodes played unless ``--episodes`` says otherwise.
DEFAULT_EPISODES = 10


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "eval",
        help="play a trained policy's episodes: mean and spread of return and length, videos",
        description=(
            "Load a run's best policy (or --latest, or a policy file), play --episodes whole episodes with the "
            "collectors' own actor in its job's env (or --env-id / --config), print the mean and standard "
            "deviation of return and length, write them as JSON, and with --video film the first episodes "
            "as mp4 (pip install 'warren[video]'). No broker needed. Exit codes: 0 done, 1 the env or the "
            "policy failed while playing, 2 bad input (not a warren policy, other spaces than the env's, a "
            "plug-in that is not installed, an env that cannot be filmed)."
        ),
    )
    parser.add_argument("target", type=Path, help="a run directory (runs/<id>) or a policy file")
    parser.add_argument("--episodes", type=positive_int, default=DEFAULT_EPISODES, help=f"(default {DEFAULT_EPISODES})")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--deterministic",
        dest="deterministic",
        action="store_true",
        default=True,
        help="greedy actions, as the run's evals (the default)",
    )
    how.add_argument(
        "--stochastic",
        dest="deterministic",
        action="store_false",
        help="act as collect tasks do: sampled (PPO, SAC), or at the exploration rate of the best eval (DQN)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the envs' first resets (env i: seed + i)")
    parser.add_argument("--latest", action="store_true", help="the run's latest policy, not its best")
    parser.add_argument("--envs", type=positive_int, help="envs stepped together (default: episodes, up to 10)")
    parser.add_argument("--env-id", help="play in this env instead (same spaces as the policy's)")
    parser.add_argument("--config", type=Path, help="play in the [env] of this job file instead")
    parser.add_argument("--video", type=Path, metavar="DIR", help="film the first --video-episodes episodes here")
    parser.add_argument("--video-episodes", type=positive_int, default=1, help="episodes --video films (default 1)")
    parser.add_argument("--video-name", default="episode", help="the videos' files: NAME-000.mp4... (default episode)")
    parser.add_argument("--tensorboard-dir", type=Path, help="also add the first video to TensorBoard events here")
    parser.add_argument("--tensorboard-step", type=int, default=0, help="the TensorBoard step of that video")
    parser.add_argument(
        "--max-episode-steps",
        type=positive_int,
        default=100_000,
        help="an episode this long is taken for one that never ends: an error (default 100000)",
    )
    parser.add_argument("--json", type=Path, help="where the JSON goes (default: eval.json of the run directory)")
    add_output_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from worker.errors import WarrenError

    setup_logging("eval", log_level(args))
    if args.video is not None:
        from worker.agent.video import headless_rendering

        headless_rendering()  # before any env is made: MuJoCo reads it when it first renders
    try:
        policy, target = _prepare(args)
    except WarrenError as exc:
        return _fail(exc.message, ExitCode.USAGE)
    try:
        report = _play(args, policy, target)
    except WarrenError as exc:
        return _fail(exc.message, ExitCode.USAGE if _is_usage(exc) else ExitCode.FAILED)
    except Exception as exc:  # an env's or a plug-in's own error: one line, not a traceback
        logger.debug("while playing", exc_info=True)
        return _fail(f"playing {target.id} failed: {type(exc).__name__}: {exc}", ExitCode.FAILED)
    out = args.json or _default_json(args.target)
    try:
        out.write_text(json_text.dumps(report, indent=2) + "\n")
    except OSError as exc:
        logger.warning("cannot write %s: %s", out, exc)
        out = None
    print(_line(report))
    if out is not None:
        print(f"episodes written to {out}", file=sys.stderr)
    return ExitCode.OK


def _prepare(args: argparse.Namespace) -> tuple[Any, Any]:
    """The policy and the env to play it in, both checked (every bad input is found here, before playing)."""
    from worker.agent.episodes import EnvTarget
    from worker.agent.policy import load_policy
    from worker.config import import_env_packages_of
    from worker.errors import ConfigurationError

    import_env_packages_of()  # WARREN_ENV_PACKAGES, as the run's collectors import them: their env ids
    policy = load_policy(args.target, which="latest" if args.latest else "best", seed=args.seed)
    env = dict(policy.header.section("env"))
    if args.config is not None:
        from worker.job import JobConfig

        job_env = JobConfig.load(args.config).env
        env = {"id": job_env.id, "plugin": job_env.plugin, "plugin_version": job_env.plugin_version}
        env["kwargs"] = dict(job_env.kwargs)
    if args.env_id is not None:
        env = {**env, "id": args.env_id}
    if not env:
        raise ConfigurationError(f"{policy.describe()} names no env: give --env-id or --config")
    target = EnvTarget.of_job(env)
    probe = target.batch(1, args.seed)
    try:
        policy.check_spaces(probe.spaces, f"env {target.id}")
    finally:
        probe.close()
    return policy, target


def _play(args: argparse.Namespace, policy: Any, target: Any) -> dict[str, Any]:
    from worker.agent.episodes import Episodes, default_envs, film, play

    stop = args.stop.is_set
    episodes = Episodes()
    filmed_count = min(args.video_episodes, args.episodes) if args.video is not None else 0
    if filmed_count:
        filmed = target.filmed(args.seed)
        try:
            episodes.add(
                film(
                    policy,
                    filmed,
                    filmed_count,
                    args.video,
                    deterministic=args.deterministic,
                    max_episode_steps=args.max_episode_steps,
                    name=args.video_name,
                    stop=stop,
                )
            )
        finally:
            filmed.close()
        if args.tensorboard_dir is not None and episodes.videos:
            from worker.agent.video import to_tensorboard

            first = Path(episodes.videos[0])
            to_tensorboard(args.tensorboard_dir, "eval/video", first, args.tensorboard_step, filmed.fps)
    left = args.episodes - filmed_count
    if left > 0 and not stop():
        envs = target.batch(min(args.envs or default_envs(left), left), args.seed + filmed_count)
        try:
            episodes.add(
                play(
                    policy,
                    envs,
                    left,
                    deterministic=args.deterministic,
                    max_episode_steps=args.max_episode_steps,
                    stop=stop,
                )
            )
        finally:
            envs.close()
    header = policy.header
    return {
        "policy": str(policy.path),
        "policy_which": policy.asked,
        "policy_version": policy.version,
        "algorithm": header.algorithm,
        "best_eval_return": header.eval_return,
        "best_eval_env_steps": header.env_steps,
        "env_id": target.id,
        "deterministic": bool(args.deterministic),
        "seed": args.seed,
        **episodes.summary(),
    }


def _line(report: dict[str, Any]) -> str:
    how = "deterministic" if report["deterministic"] else "stochastic"
    if not report["episodes"]:
        return f"no episode finished ({report['env_id']}, policy version {report['policy_version']})"
    return (
        f"return {report['return_mean']:.2f} ± {report['return_std']:.2f}, length {report['length_mean']:.1f} ± "
        f"{report['length_std']:.1f} over {report['episodes']} episodes of {report['env_id']} "
        f"(policy {Path(report['policy']).name}, version {report['policy_version']}, {how})"
    )


def _default_json(target: Path) -> Path:
    return target / "eval.json" if target.is_dir() else target.with_name(target.name + ".eval.json")


def _is_usage(exc: Exception) -> bool:
    from worker.errors import ConfigurationError, PolicyMismatch

    return isinstance(exc, ConfigurationError | PolicyMismatch)


def _fail(message: str, code: int) -> int:
    print(f"warren eval: {message}", file=sys.stderr)
    return code
