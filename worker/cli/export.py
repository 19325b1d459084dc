"""``warren export RUN_DIR|POLICY_FILE --onnx out.onnx``: a built-in actor as an ONNX graph, checked.

The graph maps a batch of observations to the deterministic actions of DQN (greedy),
PPO (the most likely action, a ``Box``'s mean) or SAC (the mean action scaled into the
box): see :mod:`worker.agent.onnx_export`. It is run at once in onnxruntime on random
observations of the job's space and compared with warren's own actor; an export that
disagrees by more than 1e-5 is an error (exit code 1). Needs ``warren[export]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from worker.cli.exit_codes import ExitCode
from worker.cli.flags import add_output_flags, log_level, positive_int
from worker.logs import setup_logging


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="write a trained built-in actor (dqn, ppo, sac) as an ONNX graph, checked against warren's",
        description=(
            "Write the deterministic actor of a run's best policy (or --latest, or a policy file) as an ONNX graph "
            "(input obs [batch, ...], output action [batch, ...]), then run it in onnxruntime on --check-samples "
            "random observations and compare with warren's actor (tolerance 1e-5). Needs "
            "pip install 'warren[export]'. Exit codes: 0 written and checked, 1 the check failed, 2 bad input."
        ),
    )
    parser.add_argument("target", type=Path, help="a run directory (runs/<id>) or a policy file")
    parser.add_argument("--onnx", type=Path, required=True, metavar="OUT", help="the ONNX file to write")
    parser.add_argument("--latest", action="store_true", help="the run's latest policy, not its best")
    parser.add_argument(
        "--check-samples", type=positive_int, default=256, help="random observations of the check (default 256)"
    )
    add_output_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from worker.agent.onnx_export import check_export, export_onnx
    from worker.agent.policy import load_policy
    from worker.errors import WarrenError

    setup_logging("export", log_level(args))
    try:
        policy = load_policy(args.target, which="latest" if args.latest else "best")
        out = export_onnx(policy, args.onnx)
    except WarrenError as exc:
        print(f"warren export: {exc.message}", file=sys.stderr)
        return ExitCode.USAGE
    except Exception as exc:  # torch's exporter on a model it cannot trace: one line, not a traceback
        print(f"warren export: exporting {args.target} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    check = check_export(policy, out, samples=args.check_samples)
    print(f"{out}: {policy.describe()}; {check.describe()}")
    return ExitCode.OK if check.agrees else ExitCode.FAILED
