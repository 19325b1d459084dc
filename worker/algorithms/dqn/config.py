"""DQN's hyperparameters and the exploration schedule of its collect tasks (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.protocol.checks import MAX_COUNT, check_bool, check_float, check_int, check_warmup_fits


@dataclass(frozen=True)
class DQNConfig:
    """DQN hyperparameters, with defaults tuned to solve CartPole-v1 quickly in wall-clock time.

    The learner's train step, not collection, bounds a run's speed (collectors make ~100k
    env steps/s; the learner ~500-700 numpy train steps/s on one core), and the coordinator
    paces collection to it. So the defaults take few, large steps (batch 256, one train
    step per 32 samples: every collected transition is sampled ~8 times) with a learning
    rate and target sync that stay stable.
    """

    batch_size: int = 256
    lr: float = 1e-3
    """Adam learning rate."""
    discount: float = 0.99
    replay_capacity: int = 50_000
    """Transitions kept in the replay ring buffer."""
    replay_max_gib: float = 8.0
    """Refuse a job whose replay buffer would take more memory than this (capacity x bytes a
    transition, both observations of it stacked: 56.5 KB for Atari's 4 x 84 x 84)."""
    learning_starts: int = 1000
    """No train step before the replay buffer holds this many transitions."""
    target_update_interval: int = 100
    """Train steps between target network updates."""
    tau: float = 1.0
    """Target update weight: 1.0 copies the online net, smaller values do Polyak averaging."""
    double_dqn: bool = True
    """Pick the bootstrap action with the online net, evaluate it with the target net."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip, against the occasional huge TD error."""
    train_steps_per_sample: float = 1 / 32
    """Replay ratio: train steps to run per collected transition."""
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_steps: int = 10_000
    """Env steps over which epsilon decays linearly from ``eps_start`` to ``eps_end``."""
    backend: Literal["auto", "torch", "numpy"] = "auto"
    """The train step's implementation: ``numpy`` (the same math written out, ~3x faster on
    small MLPs, where torch's per-op dispatch dominates; only for the ``mlp`` model with
    ReLU on flat float observations), ``torch`` (any model), or ``auto`` (numpy where it can).
    It picks the collectors' actor too: ``torch`` gives them the torch actor (and torch to
    import), otherwise ReLU MLP jobs act in numpy, without torch."""

    def __post_init__(self) -> None:
        p = "algorithm"
        for name, lo, hi in (
            ("batch_size", 1, 65_536),
            ("replay_capacity", 1, 10**8),
            ("learning_starts", 0, MAX_COUNT),
            ("target_update_interval", 1, MAX_COUNT),
            ("eps_decay_steps", 1, MAX_COUNT),
        ):
            object.__setattr__(self, name, check_int(getattr(self, name), f"{p}.{name}", lo, hi))
        check_warmup_fits(self.learning_starts, self.replay_capacity, p)
        for name, flo, fhi, lo_open in (
            ("lr", 0.0, 1.0, True),
            ("discount", 0.0, 1.0, False),
            ("tau", 0.0, 1.0, True),
            ("max_grad_norm", 0.0, 1e6, True),
            ("replay_max_gib", 0.0, 1e6, True),
            ("train_steps_per_sample", 0.0, 1024.0, True),
            ("eps_start", 0.0, 1.0, False),
            ("eps_end", 0.0, 1.0, False),
        ):
            value = check_float(getattr(self, name), f"{p}.{name}", flo, fhi, lo_open=lo_open)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "double_dqn", check_bool(self.double_dqn, f"{p}.double_dqn"))
        if self.backend not in ("auto", "torch", "numpy"):
            raise ValueError(f"{p}.backend must be auto, torch or numpy, got {self.backend!r}")

    def epsilon(self, env_steps: int) -> float:
        """Exploration rate for collect tasks started after ``env_steps`` env steps."""
        return epsilon_at(env_steps, self.eps_start, self.eps_end, self.eps_decay_steps)


def epsilon_at(env_steps: int, start: float, end: float, decay_steps: int) -> float:
    """Linearly decayed exploration rate: ``start`` at step 0, ``end`` from ``decay_steps`` on.

    Linear (rather than exponential) decay keeps exploration high for a known budget,
    which is what a fixed-size task schedule wants.
    """
    if env_steps >= decay_steps:
        return float(end)
    frac = max(env_steps, 0) / decay_steps
    return float(start + frac * (end - start))
