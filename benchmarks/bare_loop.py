"""The bare env loop, the baseline of collection: one vector env stepped with random actions, nothing else.

``python -m benchmarks.bare_loop ENV_ID --envs 8 --seconds 10 --start-at T`` makes the env
batch exactly as warren's collectors make it (the gymnasium env plug-in's vector env),
waits for the wall-clock time ``T`` (so that N loops in N processes run over the same
window), steps it for ``--seconds``, and prints one JSON line: env steps, seconds, and the
process's CPU seconds in the loop. ``--env-package`` imports a module that registers the
env first (as ``WARREN_ENV_PACKAGES`` does for warren's processes), ``--kwargs`` (JSON) go to
the env. With ``--wait-go`` it prints ``{"ready": true}`` once the envs are made and starts
when a line arrives on stdin, instead of at ``--start-at``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import numpy as np

from worker.envs.gymnasium import GymnasiumEnvs
from worker.plugins.binding import make_env_context


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("env_id")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--start-at", type=float, default=0.0, help="wall-clock time (time.time()) to start at")
    parser.add_argument("--env-package", action="append", default=[])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kwargs", type=json.loads, default={}, help="the env's keyword arguments, as JSON")
    parser.add_argument("--wait-go", action="store_true", help="start when a line arrives on stdin")
    args = parser.parse_args()
    for module in args.env_package:
        importlib.import_module(module)  # a benchmark's own env module, named on its command line
    envs = GymnasiumEnvs().make_vector_env(make_env_context(args.env_id, args.envs, kwargs=args.kwargs, seed=args.seed))
    envs.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    n_actions = int(envs.single_action_space.n)  # type: ignore[attr-defined]  # Discrete: the case's envs
    if args.wait_go:
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
    elif (delay := args.start_at - time.time()) > 0:
        time.sleep(delay)
    cpu0, start = time.process_time(), time.monotonic()
    end = start + args.seconds
    steps = 0
    while time.monotonic() < end:
        envs.step(rng.integers(0, n_actions, size=args.envs))
        steps += args.envs
    seconds = time.monotonic() - start
    print(json.dumps({"env_steps": steps, "seconds": seconds, "cpu_s": time.process_time() - cpu0}), flush=True)
    envs.close()


if __name__ == "__main__":
    main()
