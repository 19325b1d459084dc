"""The plug-in contract: what an env, a model and an algorithm give warren, and what warren gives them.

Three kinds of plug-in, each a class found by name (:mod:`worker.plugins.registry`):

* an **env** (:class:`EnvPlugin`) makes a gymnasium vector env; any id in gymnasium's
  registry works without one;
* a **model** (:class:`ModelPlugin`) makes the network body ("encoder") an algorithm
  puts its heads on: observations in, a ``[B, out_dim]`` float tensor out;
* an **algorithm** (:class:`Algorithm`) says which spaces it takes, which extra columns
  its actor writes into chunks, how stale a chunk may be, what collect tasks are told
  (an exploration schedule), and builds the two halves that run apart: the
  :class:`Actor` on collectors, the :class:`Learner` on the learner.

What runs where: collectors build the actor from the task (spaces, plug-in names and
plain-data configs) and load tensors from the policy file; the learner builds the learner
from the job; the coordinator only asks the algorithm for ``collect_settings``. Nothing
crosses a process boundary but plain data (msgpack maps), arrays (chunks) and tensors
(safetensors): no pickling, so no "can't pickle" and no code from the wire.

Every piece of actor state that is not a parameter (observation statistics, action
scales) must be a tensor in :meth:`Learner.actor_weights`, so it travels with the weights;
schedules travel in the task, from :meth:`Algorithm.collect_settings`.

It is one piece, over 400 lines: it is the contract a plug-in's author reads, all of it
and in one place (docs/plugins.md sums it up), and its parts name each other (an
algorithm takes a model, makes an actor and a learner, which pass chunks).
"""

from __future__ import annotations

import dataclasses
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from worker.errors import PluginFailed, TaskError, short_repr
from worker.plugins.faults import PluginRef, exception_problem, fault_line
from worker.plugins.spaces import Spaces, UnsupportedSpace

if TYPE_CHECKING:
    import gymnasium as gym
    import torch
    from torch import nn

__all__ = [
    "Actor",
    "Algorithm",
    "Chunk",
    "Column",
    "EnvContext",
    "EnvPlugin",
    "Learner",
    "Model",
    "ModelPlugin",
    "NoConfig",
    "Obs",
    "Placement",
    "UnsupportedSpace",
    "config_from_dict",
    "config_to_dict",
]

#: A batch of observations, batch dimensions first: one array, or one per key of a ``Dict`` space.
Obs = npt.NDArray[Any] | dict[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class NoConfig:
    """The settings of a plug-in that has none."""


# -- configs: plain data in, frozen dataclass out --------------------------------------


def config_from_dict(cls: type[Any], data: Mapping[str, Any] | None, where: str) -> Any:
    """Build a plug-in's frozen config dataclass from plain data (a TOML table, a task's map).

    Unknown keys are errors naming the key (a typo never falls back to a default); lists
    become tuples where the field is a tuple; ``int`` is accepted where a ``float`` is due.
    The dataclass's own ``__post_init__`` checks ranges.

    Raises:
        TaskError: an unknown key, a value of the wrong type, or the dataclass refused it.
    """
    data = dict(data or {})
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise TaskError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    hints = typing.get_type_hints(cls)
    values = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**values)
    except TaskError as exc:
        raise TaskError(f"{where}: {exc.message}") from None
    except (TypeError, ValueError) as exc:
        raise TaskError(f"{where}: {exc}") from None


def _coerce(value: Any, kind: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float, str, bool):
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            raise TaskError(f"{where} must be a {kind.__name__}, got {short_repr(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise TaskError(f"{where} must be a list, got {short_repr(value)}")
        args = typing.get_args(kind)
        item = args[0] if args else Any
        return tuple(_coerce(v, item, where) for v in value)
    if origin is Literal:
        if value not in typing.get_args(kind):
            raise TaskError(f"{where} must be one of {list(typing.get_args(kind))}, got {short_repr(value)}")
        return value
    return value


def config_to_dict(config: Any) -> dict[str, Any]:
    """A config dataclass as plain data (tuples as lists): what tasks and ``job.json`` carry."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    return {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


# -- envs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvContext:
    """What an env plug-in is asked to make."""

    env_id: str
    """Which env (a plug-in may offer several); for gymnasium, the registered id."""
    num_envs: int
    """Copies stepped together as one vector env."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Plain-data keyword arguments from the job (``[env.kwargs]``)."""
    seed: int | None = None
    """Seed of the first reset (env ``i`` gets ``seed + i``); warren passes it to ``reset``."""
    threads: int = 1
    """CPU threads the vector env may use (native vector envs: ale-py, EnvPool)."""


class EnvPlugin(ABC):
    """Makes the envs of one family. Subclass it and register the class as a ``warren.envs`` entry point.

    The vector env must autoreset in gymnasium's ``NEXT_STEP`` mode (its default): the
    step that ends an episode returns the true final observation, and the env's next step
    is a reset step whose action is ignored. warren's chunks rely on it.
    """

    @abstractmethod
    def make_env(self, ctx: EnvContext) -> gym.Env[Any, Any]:
        """One env (``warren check`` runs gymnasium's env checker on it)."""

    def reward_threshold(self, env_id: str) -> float | None:
        """The return at which ``env_id`` counts as solved: a job's stop value when it gives none."""
        return None

    def make_vector_env(self, ctx: EnvContext) -> gym.vector.VectorEnv[Any, Any, Any]:
        """``ctx.num_envs`` envs as one vector env; by default gymnasium's ``SyncVectorEnv`` of :meth:`make_env`."""
        import gymnasium as gym

        return gym.vector.SyncVectorEnv(
            [lambda: self.make_env(ctx) for _ in range(ctx.num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
        )


# -- models ----------------------------------------------------------------------------


class ModelPlugin(ABC):
    """Makes the network body an algorithm puts its heads on. Register as a ``warren.models`` entry point.

    The encoder is an ``nn.Module`` with an integer attribute ``out_dim``; its ``forward``
    takes a batch of observations as torch tensors in the space's own dtype (uint8 images
    stay uint8: convert inside the module) — one tensor, or a dict of tensors for a
    ``Dict`` space — and returns ``[B, out_dim]`` float32.

    **Memory.** A model whose :meth:`state_shapes` names a state is recurrent: its encoder's
    ``forward(obs, state, first)`` takes time-major observations ``[T, B, ...]``, the state
    before step 0 (a dict of float32 ``[B, *shape]`` tensors, one per name) and ``first``
    (bool ``[T, B]``: an episode starts at step ``t`` of env ``b``, so the state is zeros
    before it), and returns ``([T, B, out_dim], the state after step T - 1)``. Every
    state starts at zeros. Actors keep one state per env and reset it where an episode
    ends; chunks carry it at their first step (:attr:`Chunk.state`).
    """

    Config: ClassVar[type[Any]] = NoConfig
    """Frozen dataclass of the model's settings (``[model]`` keys other than ``name``)."""

    def check_space(self, observation_space: gym.Space[Any], config: Any) -> None:  # noqa: B027  (optional hook)
        """Refuse an observation space the encoder cannot take (raise :class:`UnsupportedSpace`)."""

    @abstractmethod
    def make_encoder(self, observation_space: gym.Space[Any], config: Any) -> nn.Module:
        """A fresh encoder (weights from torch's current RNG) for ``observation_space``."""

    def state_shapes(self, observation_space: gym.Space[Any], config: Any) -> Mapping[str, tuple[int, ...]]:
        """The recurrent state its encoder keeps per env, a float32 shape per name; empty (the default): none.

        Declared here, without building the encoder, because chunk layouts follow from it
        in processes that never build one.
        """
        return {}


@dataclass(frozen=True)
class Model:
    """A model plug-in bound to its config: what an algorithm gets to build networks with."""

    plugin: ModelPlugin
    config: Any
    name: str = "mlp"
    ref: PluginRef | None = field(default=None, compare=False)
    """The plug-in's name, version and package, for the errors that blame it."""

    def state_shapes(self, observation_space: gym.Space[Any]) -> dict[str, tuple[int, ...]]:
        """The model's recurrent state per env (empty: feed-forward), checked to be shapes.

        Raises:
            PluginFailed: ``state_shapes`` raised or returned something that is not a map of names to shapes.
        """
        ref = self.ref or PluginRef("model", self.name)
        try:
            shapes = self.plugin.state_shapes(observation_space, self.config)
        except Exception as exc:
            raise PluginFailed(fault_line(ref, "state_shapes", exception_problem(exc, ref))) from exc
        out: dict[str, tuple[int, ...]] = {}
        for name, shape in dict(shapes or {}).items():
            dims = tuple(shape) if isinstance(shape, tuple | list) else None
            if (
                not isinstance(name, str)
                or not name
                or dims is None
                or not all(isinstance(d, int) and d > 0 for d in dims)
            ):
                raise PluginFailed(
                    fault_line(ref, "state_shapes", f"returned {short_repr(dict(shapes))}; a map of names to shapes")
                )
            out[name] = dims
        return out

    def encoder(self, observation_space: gym.Space[Any]) -> nn.Module:
        """A fresh encoder, tried once on two sampled observations.

        The try makes a model that breaks the contract fail where it is built, naming it,
        instead of failing later in an algorithm's head (torch's "mat1 and mat2 shapes
        cannot be multiplied") or in the learner's first update (NaN).

        Raises:
            UnsupportedSpace: a space the model cannot take.
            PluginFailed: ``make_encoder`` raised; the encoder has no integer ``out_dim``; or,
                in eval mode and without gradients, its ``forward`` raised, or returned
                something other than ``[2, out_dim]`` finite floats.
        """
        self.plugin.check_space(observation_space, self.config)
        ref = self.ref or PluginRef("model", self.name)
        try:
            module = self.plugin.make_encoder(observation_space, self.config)
        except TaskError:
            raise
        except Exception as exc:
            raise PluginFailed(fault_line(ref, "make_encoder", exception_problem(exc, ref))) from exc
        if not isinstance(getattr(module, "out_dim", None), int):
            raise PluginFailed(fault_line(ref, "make_encoder", "its encoder has no integer out_dim"))
        _try_encoder(module, observation_space, ref, self.state_shapes(observation_space))
        return module


#: Observations the encoder is tried on when it is built.
_TRY_BATCH = 2


def _try_encoder(
    module: nn.Module, observation_space: gym.Space[Any], ref: PluginRef, state_shapes: Mapping[str, tuple[int, ...]]
) -> None:
    import gymnasium as gym
    import torch

    batch = gym.vector.utils.batch_space(observation_space, _TRY_BATCH).sample()
    lead = (1,) if state_shapes else ()  # a recurrent encoder takes [T, B, ...]: one step here
    if isinstance(batch, Mapping):
        inputs: Any = {
            key: torch.as_tensor(np.asarray(value)).reshape(*lead, *value.shape) for key, value in batch.items()
        }
    else:
        inputs = torch.as_tensor(np.asarray(batch)).reshape(*lead, *np.shape(batch))
    state = {name: torch.zeros(_TRY_BATCH, *shape) for name, shape in state_shapes.items()}
    training = module.training
    module.eval()  # no dropout draws, no running statistics updated
    try:
        with torch.no_grad():
            if state_shapes:
                out, after = module(inputs, state, torch.ones(1, _TRY_BATCH, dtype=torch.bool))
            else:
                out = module(inputs)
    except Exception as exc:
        raise PluginFailed(fault_line(ref, "forward", exception_problem(exc, ref))) from exc
    finally:
        module.train(training)
    out_dim = int(module.out_dim)  # type: ignore[arg-type]  # an int: checked by the caller
    if not isinstance(out, torch.Tensor):
        raise PluginFailed(fault_line(ref, "forward", f"returned a {type(out).__name__}, not a tensor"))
    if tuple(out.shape) != (*lead, _TRY_BATCH, out_dim):
        raise PluginFailed(
            fault_line(
                ref,
                "forward",
                f"returned {list(out.shape)} for {_TRY_BATCH} observations; its out_dim says "
                f"{[*lead, _TRY_BATCH, out_dim]}",
            )
        )
    if state_shapes:
        _check_state(after, {name: (_TRY_BATCH, *shape) for name, shape in state_shapes.items()}, ref)
    if not out.dtype.is_floating_point:
        raise PluginFailed(fault_line(ref, "forward", f"returned {out.dtype}, not floats"))
    if not bool(torch.isfinite(out).all()):
        raise PluginFailed(fault_line(ref, "forward", "returned NaN or infinite values for sampled observations"))


def _check_state(state: Any, want: Mapping[str, tuple[int, ...]], ref: PluginRef) -> None:
    import torch

    got = {n: tuple(t.shape) for n, t in state.items()} if isinstance(state, Mapping) else None
    if got != dict(want) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in state.values()):
        raise PluginFailed(
            fault_line(ref, "forward", f"returned the state {short_repr(got)}; its state_shapes make it {dict(want)}")
        )


# -- what flows: chunks -----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """An extra per-step column an actor writes into chunks (a log-prob, a value estimate)."""

    shape: tuple[int, ...]
    """Per env and step: ``()`` for a scalar."""
    dtype: str = "float32"


@dataclass(frozen=True)
class Chunk:
    """``T`` steps of ``N`` envs as the learner receives them (read-only arrays).

    ``obs`` has ``T + 1`` rows: row ``t`` is what the actor saw before acting at step
    ``t``, row ``t + 1`` what followed. Because envs autoreset in ``NEXT_STEP`` mode, that
    holds at episode ends too (row ``t + 1`` is then the true final observation, and step
    ``t + 1`` is a reset step with ``valid`` false). So ``next_obs`` is just ``obs[1:]``.
    """

    obs: Obs
    """``[T + 1, N, ...]`` (one array per key of a ``Dict`` space)."""
    action: npt.NDArray[Any]
    """``[T, N, ...]``: int64 for discrete spaces, float32 for ``Box``."""
    reward: npt.NDArray[np.float32]
    terminated: npt.NDArray[np.bool_]
    """The episode ended in a terminal state: do not bootstrap."""
    truncated: npt.NDArray[np.bool_]
    """The episode was cut (time limit): the next observation is still a state to bootstrap from."""
    valid: npt.NDArray[np.bool_]
    """A real transition; false for an env's reset step."""
    extras: Mapping[str, npt.NDArray[Any]]
    """The algorithm's :meth:`Algorithm.columns`, ``[T, N, ...]`` each."""
    policy_version: int
    """The version of the policy that acted in every step of the chunk."""
    state: Mapping[str, npt.NDArray[np.float32]] = field(default_factory=dict)
    """An actor with memory: its state before the chunk's first step, ``[N, ...]`` per name
    (:meth:`Algorithm.memory_columns`); empty otherwise. Within the chunk it was reset where
    an episode began: before step ``t + 1`` wherever step ``t`` was a reset step (not ``valid``)."""

    @property
    def steps(self) -> int:
        return int(self.reward.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.reward.shape[1])

    def obs_rows(self, start: int, stop: int) -> Obs:
        """Rows ``start:stop`` of ``obs`` (per key for ``Dict`` observations)."""
        if isinstance(self.obs, dict):
            return {key: value[start:stop] for key, value in self.obs.items()}
        return self.obs[start:stop]


# -- where a learner runs ----------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where a learner's networks live and how they compute, as the learner process resolved it.

    Given to :meth:`Algorithm.make_learner` of an algorithm whose :attr:`Algorithm.devices`
    name more than the CPU (the built-ins do); others run on the CPU. Plain strings, so the
    coordinator and collectors read it without torch.
    """

    device: str = "cpu"
    """A torch device: ``cpu``, or ``cuda:N`` (``learner.device``, resolved)."""
    autocast: str = "off"
    """``bf16``: the forward and backward passes of the updates under bf16 autocast (CUDA only)."""
    device_replay: bool = False
    """Keep image replay (frame stacks) in the device's memory, where it gathers and restacks its batches."""

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"


# -- the two halves of an algorithm -----------------------------------------------------


class Actor(ABC):
    """Acts for a batch of envs on a collector, numpy in and out; weights come from the learner."""

    @abstractmethod
    def act(
        self, obs: Obs, *, explore: bool, settings: Mapping[str, float]
    ) -> tuple[npt.NDArray[Any], dict[str, npt.NDArray[Any]]]:
        """Actions for ``obs`` (``[N, ...]``), and the algorithm's extra columns (``[N, ...]`` each).

        Args:
            obs: one observation per env, in the space's dtype.
            explore: collect tasks explore; eval tasks act greedily (deterministically).
            settings: the task's ``collect_setting`` (from :meth:`Algorithm.collect_settings`).
        """

    def memory(self) -> dict[str, npt.NDArray[np.float32]] | None:
        """The recurrent state the next :meth:`act` starts from, ``[N, ...]`` per name; ``None``: no memory."""
        return None

    def set_memory(self, memory: Mapping[str, npt.NDArray[np.float32]]) -> None:  # noqa: B027  (optional hook)
        """Take the state the next :meth:`act` starts from (:meth:`memory`'s form); ``ValueError`` if it does not fit.

        An actor with memory is given one before its first act (zeros, or what the envs'
        previous task left); an actor without memory ignores it.
        """

    def forget(self, envs: npt.NDArray[np.bool_]) -> None:  # noqa: B027  (optional hook)
        """The envs marked ``True`` (``[N]``) begin a new episode at the next :meth:`act`: their state goes to zeros."""

    @abstractmethod
    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Take new weights, strictly: raise ``ValueError`` naming the first tensor that does not fit.

        The arrays are torch tensors, or numpy arrays where the algorithm's
        :attr:`Algorithm.weights_format` says ``numpy``.
        """


class Learner(ABC):
    """Trains on chunks on the learner; what the learner process drives.

    The learner process hands it chunks while :meth:`wants_data` says so, runs
    :meth:`update` while :meth:`can_update` does, and every so often writes
    :meth:`actor_weights` for the collectors (tagged with :attr:`version`) and
    :meth:`state_dict` as a checkpoint.
    """

    version: int = 0
    """Policy version: how many updates produced the current weights. Chunks carry it back."""

    @abstractmethod
    def add(self, chunk: Chunk) -> int:
        """Take one chunk's valid transitions (validated against the spaces by the caller); returns how many."""

    @abstractmethod
    def wants_data(self) -> bool:
        """Take more chunks before the next update (False: train first, keeping the replay ratio)."""

    @abstractmethod
    def can_update(self) -> bool:
        """An update can run now."""

    @abstractmethod
    def update(self) -> dict[str, float]:
        """One update; returns metrics (losses, statistics) for logs and TensorBoard. Increments :attr:`version`."""

    @abstractmethod
    def actor_weights(self) -> dict[str, torch.Tensor]:
        """Every tensor the actor needs (parameters and buffers), as CPU copies."""

    @abstractmethod
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything to resume training (targets, optimizer moments), tensors only."""

    @abstractmethod
    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], version: int) -> None:
        """Resume from :meth:`state_dict`'s tensors; raise ``ValueError`` if they do not fit."""


class Algorithm(ABC):
    """An RL algorithm. Subclass it and register the class as a ``warren.algorithms`` entry point.

    Keep the module that defines it light (no torch import at module level): the
    coordinator builds it to validate the job and to compute ``collect_settings``, and
    does not need torch. :meth:`make_actor` and :meth:`make_learner` import what they need.

    Args:
        config: an instance of :attr:`Config` (built from the job's ``[algorithm]`` keys).
        spaces: the env's spaces, already accepted by :meth:`check_spaces`.
        model: the model plug-in to build networks with.
    """

    Config: ClassVar[type[Any]] = NoConfig
    """Frozen dataclass of the hyperparameters; unknown keys in a job are errors."""
    kind: ClassVar[Literal["on_policy", "off_policy", "none"]] = "off_policy"
    """How it learns; ``none``: acts without weights (``random``): its learner never updates, and the
    learner process writes no policy file or checkpoint for it."""
    default_model: ClassVar[str] = "mlp"
    """The model plug-in used when the job names none."""
    default_model_config: ClassVar[Mapping[str, Any]] = {}
    """Settings of the default model that differ from the model's own defaults (a job's ``[model]`` keys win)."""
    recurrent_models: ClassVar[bool] = False
    """Whether it can use a model with memory (:meth:`ModelPlugin.state_shapes`); a job that gives one to an
    algorithm that cannot is refused before any process starts."""
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    """Where its learner can run: ``("cpu",)``, or ``("cpu", "cuda")`` for one whose :meth:`make_learner`
    takes ``placement`` (a :class:`Placement`). ``learner.device = "cuda"`` is refused for the others,
    and ``auto`` runs them on the CPU."""

    def __init__(self, config: Any, spaces: Spaces, model: Model) -> None:
        self.config = config
        self.spaces = spaces
        self.model = model

    @classmethod  # noqa: B027  (an optional hook)
    def check_spaces(cls, spaces: Spaces) -> None:
        """Refuse spaces this algorithm cannot use: raise :class:`UnsupportedSpace` saying why."""

    def columns(self) -> Mapping[str, Column]:
        """Extra columns the actor writes into every chunk (none by default)."""
        return {}

    def memory_columns(self) -> Mapping[str, Column]:
        """The actor's recurrent state per env (:meth:`Actor.memory`), which every chunk carries at its first
        step as ``state.<name>`` (``[N, ...]``); none by default."""
        return {}

    @property
    def max_policy_lag(self) -> int | None:
        """Chunks made by a policy more than this many versions old are dropped (and counted); None: any."""
        return None

    @property
    def weights_format(self) -> Literal["torch", "numpy"]:
        """What the actor's ``load_weights`` takes: torch tensors, or numpy arrays.

        ``numpy``: collectors read policy files as numpy arrays, and a collector whose
        actor (and env) import no torch never imports it (~2.5 s of CPU less at start).
        """
        return "torch"

    def collect_settings(self, env_steps: int) -> dict[str, float]:
        """What collect tasks started after ``env_steps`` env steps are told (an exploration rate...)."""
        return {}

    def check_collect_settings(self, settings: Mapping[str, float]) -> None:  # noqa: B027  (optional hook)
        """Refuse a task's ``collect_setting`` the actor cannot use (raise ``TaskError`` naming the key)."""

    @property
    def replay_ratio(self) -> float | None:
        """Configured updates per collected sample, when the algorithm paces itself by one (for reports)."""
        return None

    @abstractmethod
    def make_actor(self, seed: int | None) -> Actor:
        """The collector side; ``seed`` seeds its exploration."""

    @abstractmethod
    def make_learner(self, seed: int) -> Learner:
        """The learner side; ``seed`` seeds its initial weights and sampling.

        An algorithm whose :attr:`devices` include ``cuda`` is called with ``placement=`` too,
        and its learner keeps its networks, optimizer state and batches there; its
        :meth:`Learner.actor_weights` and :meth:`Learner.state_dict` are CPU tensors whatever
        the device, and :meth:`Learner.load_state_dict` takes CPU tensors.
        """
