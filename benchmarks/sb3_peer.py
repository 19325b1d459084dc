"""``python -m benchmarks.sb3_peer``: Stable-Baselines3 on one job, timed the way warren's benchmark times warren.

Single process, the rl-baselines3-zoo hyperparameters for the env (:data:`ZOO`; ``--algo ppo_lstm`` is
sb3-contrib's RecurrentPPO with the zoo's ppo_lstm.yml, observations and rewards normalised as there), torch
and BLAS limited to ``--threads``. Every ``--eval-interval-s`` seconds of wall time (as
warren's coordinator does) it runs ``--eval-envs x --eval-episodes`` episodes with the
deterministic policy on a separate env and prints a JSON line; it stops at the first
evaluation whose mean return reaches ``--stop-value`` with a policy that trained, confirmed
as warren's coordinator confirms it (``--confirm-episodes`` other episodes of the same
policy, their mean at the stop value too; its own line), or at a budget. Each line carries
``time.time()``, so the caller measures from the moment it started the process, imports
included. Needs the ``sb3`` extra (``pip install -e '.[sb3]'``: stable-baselines3 and sb3-contrib).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

#: rl-baselines3-zoo's hyperparameters (hyperparams/{ppo,sac,dqn}.yml) for the shipped jobs'
#: envs; ``linear`` marks the zoo's ``lin_<value>`` schedules (linear decay to 0).
ZOO: dict[tuple[str, str], dict[str, Any]] = {
    ("ppo", "CartPole-v1"): {
        "n_envs": 8, "n_timesteps": 100_000,
        "kwargs": {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                   "ent_coef": 0.0, "learning_rate": ("linear", 0.001), "clip_range": ("linear", 0.2)},
    },
    ("ppo", "LunarLander-v3"): {
        "n_envs": 16, "n_timesteps": 1_000_000,
        "kwargs": {"n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4,
                   "ent_coef": 0.01},
    },
    ("dqn", "CartPole-v1"): {
        "n_envs": 1, "n_timesteps": 50_000,
        "kwargs": {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "learning_starts": 1000,
                   "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
                   "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
                   "policy_kwargs": {"net_arch": [256, 256]}},
    },
    ("dqn", "Acrobot-v1"): {
        "n_envs": 1, "n_timesteps": 100_000,
        "kwargs": {"learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000, "learning_starts": 0,
                   "gamma": 0.99, "target_update_interval": 250, "train_freq": 4, "gradient_steps": -1,
                   "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
                   "policy_kwargs": {"net_arch": [256, 256]}},
    },
    ("sac", "Pendulum-v1"): {
        "n_envs": 1, "n_timesteps": 20_000,
        "kwargs": {"learning_rate": 1e-3},
    },
    ("sac", "LunarLanderContinuous-v3"): {
        "n_envs": 1, "n_timesteps": 500_000,
        "kwargs": {"batch_size": 256, "learning_rate": ("linear", 7.3e-4), "buffer_size": 1_000_000,
                   "gamma": 0.99, "tau": 0.01, "learning_starts": 10_000,
                   "policy_kwargs": {"net_arch": [400, 300]}},
    },
    ("sac", "HalfCheetah-v5"): {
        "n_envs": 1, "n_timesteps": 1_000_000,
        "kwargs": {"learning_starts": 10_000},
    },
    # sb3-contrib's RecurrentPPO, rl-baselines3-zoo's hyperparams/ppo_lstm.yml ("normalize": VecNormalize of
    # observations and rewards; LSTM_POLICY is the policy_kwargs both use).
    ("ppo_lstm", "CartPoleNoVel-v1"): {
        "n_envs": 8, "n_timesteps": 100_000, "normalize": True,
        "kwargs": {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                   "ent_coef": 0.0, "learning_rate": ("linear", 0.001), "clip_range": ("linear", 0.2)},
    },
    ("ppo_lstm", "PendulumNoVel-v1"): {
        "n_envs": 4, "n_timesteps": 100_000, "normalize": True,
        "kwargs": {"n_steps": 1024, "gae_lambda": 0.95, "gamma": 0.9, "n_epochs": 10, "ent_coef": 0.0,
                   "learning_rate": 1e-3, "clip_range": 0.2, "use_sde": True, "sde_sample_freq": 4},
    },
}  # fmt: skip
#: The zoo's ``policy_kwargs`` of its ppo_lstm jobs: ReLU, separate 64-unit LSTMs for actor and critic, then a
#: 64-unit layer each; built where torch is imported (``activation_fn`` is a class).
LSTM_POLICY = {
    "ortho_init": False, "lstm_hidden_size": 64, "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]},
}  # fmt: skip


def _schedules(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    for key, value in kwargs.items():
        if isinstance(value, tuple) and value[0] == "linear":
            start = float(value[1])
            out[key] = lambda progress, start=start: progress * start  # SB3 passes the remaining fraction
    return out


def emit(**fields: Any) -> None:
    print(json.dumps({"t": time.time(), **fields}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sb3_peer", description=__doc__)
    parser.add_argument("--algo", required=True, choices=["ppo", "sac", "dqn", "ppo_lstm"])
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch and BLAS threads; 0 (default): SB3 as a user runs it, untouched"
    )
    parser.add_argument("--stop-value", type=float, required=True)
    parser.add_argument("--eval-envs", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=1, help="per eval env")
    parser.add_argument("--eval-interval-s", type=float, default=2.0)
    parser.add_argument(
        "--confirm-episodes",
        type=int,
        default=0,
        help="as warren's confirm_episodes: an eval at the stop value ends the run only if this many other "
        "episodes of the same policy reach it too (0: the eval alone)",
    )
    parser.add_argument("--max-time-s", type=float, default=600.0)
    parser.add_argument("--max-steps", type=int, help="default: the zoo's n_timesteps")
    args = parser.parse_args(argv)
    if args.threads > 0:
        for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(args.threads)
    started = time.time()
    emit(event="start")

    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DQN, PPO, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from worker.envs.partial import register_partial_envs

    register_partial_envs()  # CartPoleNoVel-v1, PendulumNoVel-v1: warren's, the zoo's envs
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    zoo = ZOO[(args.algo, args.env_id)]
    kwargs = _schedules(zoo["kwargs"])
    envs = make_vec_env(args.env_id, n_envs=zoo["n_envs"], seed=args.seed)
    if zoo.get("normalize"):
        envs = VecNormalize(envs)
    recurrent = args.algo == "ppo_lstm"
    if recurrent:
        from sb3_contrib import RecurrentPPO

        policy_kwargs = {**LSTM_POLICY, "activation_fn": torch.nn.ReLU}
        model: Any = RecurrentPPO(
            "MlpLstmPolicy", envs, seed=args.seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs, **kwargs
        )
    else:
        algo_cls = {"ppo": PPO, "sac": SAC, "dqn": DQN}[args.algo]
        model = algo_cls("MlpPolicy", envs, seed=args.seed, device="cpu", verbose=0, **kwargs)
    eval_env = gym.make_vec(args.env_id, num_envs=args.eval_envs, vectorization_mode="sync")
    confirm_env = (
        gym.make_vec(args.env_id, num_envs=args.confirm_episodes, vectorization_mode="sync")
        if args.confirm_episodes
        else None
    )
    max_steps = args.max_steps or int(zoo["n_timesteps"])

    def evaluate(seed: int, env: Any = eval_env, episodes: int = args.eval_episodes) -> float:
        """Mean return of ``episodes`` greedy episodes on each env of ``env``."""
        returns: list[float] = []
        obs, _ = env.reset(seed=seed)
        n_envs = env.num_envs
        done_counts = np.zeros(n_envs, dtype=int)
        running = np.zeros(n_envs)
        after_end = np.zeros(n_envs, dtype=bool)
        state, starts = None, np.ones(n_envs, dtype=bool)  # a recurrent policy's state, reset where episodes begin
        while (done_counts < episodes).any():
            seen = envs.normalize_obs(obs) if isinstance(envs, VecNormalize) else obs
            if recurrent:
                action, state = model.predict(seen, state=state, episode_start=starts, deterministic=True)
            else:
                action, _ = model.predict(seen, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            starts = after_end.copy()  # after a reset step (gymnasium's next-step autoreset) an episode begins
            live = ~after_end
            running += np.where(live, reward, 0.0)
            ended = (terminated | truncated) & live
            for i in np.flatnonzero(ended):
                if done_counts[i] < episodes:
                    returns.append(float(running[i]))
                done_counts[i] += 1
                running[i] = 0.0
            after_end = ended
        return float(np.mean(returns))

    class Stopper(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = time.monotonic() + args.eval_interval_s
            self.evals = 0
            self.reached = False

        def _on_step(self) -> bool:
            if time.time() - started > args.max_time_s:
                return False
            if time.monotonic() < self.next_eval:
                return True
            self.evals += 1
            value = evaluate(10_000 + self.evals)
            # As warren's coordinator: only a policy that trained, and (with a confirmation) whose other
            # episodes reach the stop value too, ends the run; "success" marks the eval that does.
            trained = int(getattr(self.model, "_n_updates", 1)) >= 1
            passed = value >= args.stop_value and trained
            final = passed and confirm_env is None
            emit(event="eval", steps=int(self.num_timesteps), value=value, success=final)
            if passed and confirm_env is not None:
                confirmed = evaluate(20_000 + self.evals, confirm_env, 1)
                final = confirmed >= args.stop_value
                emit(event="eval", steps=int(self.num_timesteps), value=confirmed, confirms=True, success=final)
            self.next_eval = time.monotonic() + args.eval_interval_s
            if final:
                self.reached = True
                return False
            return True

    stopper = Stopper()
    model.learn(total_timesteps=max_steps, callback=stopper)
    emit(event="done", reached=stopper.reached, steps=int(model.num_timesteps), evals=stopper.evals)
    return 0 if stopper.reached else 3


if __name__ == "__main__":
    sys.exit(main())
