"""SAC's hyperparameters (no torch here: the coordinator reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.protocol.checks import MAX_COUNT, check_bool, check_float, check_int, check_warmup_fits


@dataclass(frozen=True)
class SACConfig:
    """Soft actor-critic: twin Q networks, target networks, automatic entropy temperature, replay."""

    lr: float = 3e-4
    """Adam learning rate of the actor, the critics and the temperature."""
    discount: float = 0.99
    tau: float = 0.005
    """Polyak weight of the target critics' update after every train step."""
    batch_size: int = 256
    replay_capacity: int = 1_000_000
    learning_starts: int = 100
    """No train step before the replay buffer holds this many transitions."""
    train_steps_per_sample: float = 1.0
    """Replay ratio: train steps per collected transition (SB3: one per env step)."""
    init_alpha: float = 1.0
    """Initial entropy temperature."""
    auto_alpha: bool = True
    """Tune the temperature so the policy's entropy stays near ``target_entropy``."""
    target_entropy: float = 0.0
    """The entropy the temperature aims at; 0 means the usual ``-action_dim``."""
    max_grad_norm: float = 0.0
    """Global gradient-norm clip of each network (0: none)."""
    critic_input: Literal["auto", "joint", "features"] = "auto"
    """Where a critic takes the action: ``joint`` with the observation, at its first layer (as
    Stable-Baselines3's, cleanrl's and TD3's critics do; the observation must be one flat
    float ``Box``), ``features`` beside the model body's output, one layer later (any
    observation: images, dicts); ``auto`` is ``joint`` where it can be. Joint input gives the
    action two hidden layers to act through instead of one: on LunarLanderContinuous it
    solved more seeds in fewer steps (docs/performance.md)."""
    backend: Literal["auto", "torch", "numpy"] = "auto"
    """The train step's implementation: ``numpy`` (the same math written out, several times
    faster on small MLPs, where torch's per-op dispatch dominates; only for the ``mlp`` model
    with ReLU on one flat float ``Box``), ``torch`` (any model), or ``auto`` (numpy where it can).
    It picks the collectors' actor too: ``torch`` gives them the torch actor (and torch to
    import), otherwise ReLU MLP jobs act in numpy, without torch."""

    def __post_init__(self) -> None:
        p = "algorithm"
        for name, lo, hi in (
            ("batch_size", 1, 65_536),
            ("replay_capacity", 1, 10**8),
            ("learning_starts", 0, MAX_COUNT),
        ):
            object.__setattr__(self, name, check_int(getattr(self, name), f"{p}.{name}", lo, hi))
        check_warmup_fits(self.learning_starts, self.replay_capacity, p)
        for name, flo, fhi, lo_open in (
            ("lr", 0.0, 1.0, True),
            ("discount", 0.0, 1.0, False),
            ("tau", 0.0, 1.0, True),
            ("train_steps_per_sample", 0.0, 1024.0, True),
            ("init_alpha", 0.0, 1e6, True),
            ("target_entropy", -1e6, 1e6, False),
            ("max_grad_norm", 0.0, 1e6, False),
        ):
            value = check_float(getattr(self, name), f"{p}.{name}", flo, fhi, lo_open=lo_open)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "auto_alpha", check_bool(self.auto_alpha, f"{p}.auto_alpha"))
        if self.critic_input not in ("auto", "joint", "features"):
            raise ValueError(f"{p}.critic_input must be auto, joint or features, got {self.critic_input!r}")
        if self.backend not in ("auto", "torch", "numpy"):
            raise ValueError(f"{p}.backend must be auto, torch or numpy, got {self.backend!r}")
