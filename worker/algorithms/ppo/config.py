"""PPO's hyperparameters (no torch here: the coordinator reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.protocol.checks import MAX_COUNT, check_bool, check_float, check_int


@dataclass(frozen=True)
class PPOConfig:
    """PPO with a clipped objective, GAE, minibatch epochs; defaults are Stable-Baselines3's."""

    lr: float = 3e-4
    """Adam learning rate."""
    lr_anneal_samples: int = 0
    """Decay the learning rate linearly to 0 over this many samples learned from (0: constant)."""
    discount: float = 0.99
    gae_lambda: float = 0.95
    batch_steps: int = 2048
    """Valid steps gathered per update (PPO's ``n_steps x n_envs``)."""
    epochs: int = 10
    """Passes over each batch."""
    minibatch_size: int = 64
    clip_range: float = 0.2
    """PPO's epsilon: the policy ratio is clipped to [1 - clip_range, 1 + clip_range]."""
    clip_range_vf: float = 0.0
    """Clip the value function's change per update likewise (0: no clipping)."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_advantage: bool = True
    """Normalise advantages per minibatch."""
    normalize_reward: bool = False
    """Divide rewards by the running standard deviation of their discounted sums (SB3's ``VecNormalize``)."""
    normalize_obs: bool = False
    """Normalise float observations by running mean and variance (statistics travel to the actors with the weights)."""
    shared_body: bool = False
    """One body for the policy and the value heads (Atari's usual setting: the CNN runs once a step, not twice)."""
    ortho_init: bool = True
    """Orthogonal initial weights (gain sqrt(2) hidden, 0.01 policy head, 1 value head), as SB3 and cleanrl."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian (Box) actions."""
    target_kl: float = 0.0
    """Stop an update's epochs early once the approximate KL passes 1.5 x this (0: never)."""
    max_lag: int = 1
    """Chunks made by a policy more than this many versions old are dropped and counted."""
    correction: Literal["none", "vtrace"] = "none"
    """``vtrace``: advantages and value targets by V-trace, which corrects for the lag with
    truncated importance weights (then ``max_lag`` can be larger)."""
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0
    seq_len: int = 32
    """A recurrent model (``lstm``): steps per training sequence, through which gradients flow (truncated
    backpropagation through time). Each chunk is cut into sequences of this many steps per env, the last
    one shorter; a chunk's first sequence starts from the state its actor had (the chunk carries it), the
    others from the state the learner unrolls to. Feed-forward models ignore it."""
    recompute_states: bool = False
    """A recurrent model: unroll the chunks again before every epoch, so each sequence starts from the state
    the current weights reach (false: once per update, with the weights it starts from)."""
    backend: Literal["auto", "torch", "numpy"] = "auto"
    """The minibatch step's implementation: ``numpy`` (the same math written out, ~3x faster
    on small MLPs, where torch's per-op dispatch dominates; the ``mlp`` model on one float
    ``Box`` of observations, ``Discrete`` or ``Box`` actions), ``torch`` (any model), or
    ``auto`` (numpy where it can). It picks the collectors' actor too: ``torch`` gives them
    the torch actor (and torch to import), otherwise MLP jobs act in numpy, without torch."""

    def __post_init__(self) -> None:
        p = "algorithm"
        for name, lo, hi in (
            ("batch_steps", 1, 10**7),
            ("epochs", 1, 1000),
            ("minibatch_size", 1, 10**6),
            ("max_lag", 0, MAX_COUNT),
            ("lr_anneal_samples", 0, 10**12),
            ("seq_len", 1, 10**5),
        ):
            object.__setattr__(self, name, check_int(getattr(self, name), f"{p}.{name}", lo, hi))
        for name, flo, fhi, lo_open in (
            ("lr", 0.0, 1.0, True),
            ("discount", 0.0, 1.0, False),
            ("gae_lambda", 0.0, 1.0, False),
            ("clip_range", 0.0, 10.0, True),
            ("clip_range_vf", 0.0, 1e6, False),
            ("ent_coef", 0.0, 10.0, False),
            ("vf_coef", 0.0, 100.0, False),
            ("max_grad_norm", 0.0, 1e6, True),
            ("log_std_init", -20.0, 5.0, False),
            ("target_kl", 0.0, 100.0, False),
            ("vtrace_rho_bar", 0.0, 1e6, True),
            ("vtrace_c_bar", 0.0, 1e6, True),
        ):
            value = check_float(getattr(self, name), f"{p}.{name}", flo, fhi, lo_open=lo_open)
            object.__setattr__(self, name, value)
        for name in (
            "normalize_advantage", "normalize_reward", "normalize_obs", "shared_body", "ortho_init", "recompute_states"
        ):  # fmt: skip
            object.__setattr__(self, name, check_bool(getattr(self, name), f"{p}.{name}"))
        if self.backend not in ("auto", "torch", "numpy"):
            raise ValueError(f"{p}.backend must be auto, torch or numpy, got {self.backend!r}")
        if self.correction not in ("none", "vtrace"):
            raise ValueError(f"{p}.correction must be none or vtrace, got {self.correction!r}")
