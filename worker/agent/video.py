"""Videos of episodes: frames from an env that renders (or from its pixel observations), written as mp4.

The encoder is PyAV (``pip install 'warren[video]'``): its wheel carries ffmpeg's libraries
with libx264, so nothing is downloaded at run time and no ffmpeg process is started. It was
chosen over the two usual routes by size, measured with ``pip download`` and ``pip install``
here: PyAV 36 MB to download, 103 MB installed; imageio with imageio-ffmpeg (the ffmpeg
binary in a wheel) 68 MB and 165 MB; gymnasium's ``RecordVideo`` needs moviepy, which pulls
imageio-ffmpeg too and pins an older Pillow. Encoding a 600x400 CartPole frame took about
the same with PyAV and imageio-ffmpeg (2.6 and 3.1 ms).

An episode's video has one frame per step: the frame the policy acted on (so the
observation after the last step, which no action follows, is not in it).

Frames come from the env made with ``render_mode="rgb_array"`` (gymnasium's ids, MuJoCo's
included: where there is no display, MuJoCo renders through EGL, ``MUJOCO_GL=egl``, unless
``MUJOCO_GL`` says otherwise). An env that cannot render but observes pixels (ale-py's
vector env, which the Atari jobs run, takes no ``render_mode``) is filmed through its
observations: the newest frame of each observation, what the policy sees. Any other env
that cannot render is refused with a :class:`~worker.errors.ConfigurationError`.
"""

from __future__ import annotations

import logging
import os
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from worker.errors import ConfigurationError, TaskError
from worker.plugins.contract import EnvContext, EnvPlugin
from worker.rl.envs import VecEnvBatch

logger = logging.getLogger(__name__)

#: Frames per second of an env whose metadata gives none (ale-py's: 60 Hz with a frame skip of 4).
DEFAULT_FPS: Final = 15
#: The codec of the mp4 files, and the one used where PyAV's ffmpeg lacks it.
CODEC: Final = "libx264"
FALLBACK_CODEC: Final = "mpeg4"
#: What ``pip`` installs for videos.
VIDEO_EXTRA: Final = "pip install 'warren[video]'"


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise ConfigurationError(f"videos need PyAV, which is not installed: {VIDEO_EXTRA}") from None
    return av


def headless_rendering() -> None:
    """Without a display: MuJoCo renders through EGL and pygame (classic control, Box2D) to no window.

    Either unless ``MUJOCO_GL`` or ``SDL_VIDEODRIVER`` says otherwise; call before the first env renders.
    """
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


class Mp4Writer:
    """Frames (``[H, W, 3]`` uint8, all of one size) into an mp4 file, encoded as they come.

    Odd sizes are padded by one row or column (the encoder's colour format wants even ones).
    """

    def __init__(self, path: Path, fps: float) -> None:
        self.path = Path(path)
        self.fps = fps
        self.frames = 0
        self._container: Any = None
        self._stream: Any = None
        self._size: tuple[int, int] | None = None

    def add(self, frame: npt.NDArray[np.uint8]) -> None:
        av = _av()
        if self._container is None:
            self._open(av, frame)
        assert self._size is not None
        if frame.shape[:2] != self._size:
            raise ConfigurationError(f"video frames changed size: {list(frame.shape[:2])} after {list(self._size)}")
        padded = _even(frame)
        for packet in self._stream.encode(av.VideoFrame.from_ndarray(padded, format="rgb24")):
            self._container.mux(packet)
        self.frames += 1

    def _open(self, av: Any, frame: npt.NDArray[np.uint8]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.path), "w")
        codec = CODEC if CODEC in av.codecs_available else FALLBACK_CODEC
        self._stream = self._container.add_stream(codec, rate=Fraction(self.fps).limit_denominator(1000))
        padded = _even(frame)
        self._stream.height, self._stream.width = padded.shape[:2]
        self._stream.pix_fmt = "yuv420p"
        self._size = (int(frame.shape[0]), int(frame.shape[1]))

    def close(self) -> None:
        """Flush the encoder and close the file (idempotent; a writer that got no frame writes no file)."""
        container, self._container = self._container, None
        if container is None:
            return
        for packet in self._stream.encode():
            container.mux(packet)
        container.close()


def _even(frame: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    height, width = frame.shape[:2]
    if height % 2 == 0 and width % 2 == 0:
        return np.ascontiguousarray(frame)
    return np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def count_frames(path: Path) -> int:
    """How many frames the video at ``path`` decodes to (its readers' view of it)."""
    av = _av()
    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def read_frames(path: Path) -> list[npt.NDArray[np.uint8]]:
    """The decoded frames of the video at ``path``, ``[H, W, 3]`` uint8 each."""
    av = _av()
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def gif_bytes(frames: list[npt.NDArray[np.uint8]], fps: float) -> bytes:
    """The frames as an animated GIF (what TensorBoard's image dashboard plays)."""
    import io

    av = _av()
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="gif") as container:
        stream = container.add_stream("gif", rate=Fraction(fps).limit_denominator(1000))
        padded = [_even(frame) for frame in frames]
        stream.height, stream.width = padded[0].shape[:2]
        stream.pix_fmt = "rgb8"
        for frame in padded:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


#: A video in TensorBoard (an animated GIF) keeps at most this many frames, and frames at most this wide.
TENSORBOARD_FRAMES: Final = 200
TENSORBOARD_WIDTH: Final = 320


def to_tensorboard(logdir: Path, tag: str, video: Path, step: int, fps: float) -> None:
    """Add the mp4 ``video`` to TensorBoard's event files in ``logdir`` as an animated image (``tag``, ``step``).

    TensorBoard plays animated GIFs in its image dashboard (what ``torch``'s ``add_video``
    writes, through moviepy); here PyAV encodes it. Long or wide videos are thinned to
    :data:`TENSORBOARD_FRAMES` frames (at a lower rate) and :data:`TENSORBOARD_WIDTH` pixels.
    """
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    frames = read_frames(video)
    if not frames:
        return
    every = max(1, -(-len(frames) // TENSORBOARD_FRAMES))
    shrink = max(1, -(-frames[0].shape[1] // TENSORBOARD_WIDTH))
    thinned = [np.ascontiguousarray(frame[::shrink, ::shrink]) for frame in frames[::every]]
    image = Summary.Image(
        height=int(thinned[0].shape[0]),
        width=int(thinned[0].shape[1]),
        colorspace=3,
        encoded_image_string=gif_bytes(thinned, fps / every),
    )
    writer = EventFileWriter(str(logdir))
    try:
        writer.add_event(Event(step=int(step), summary=Summary(value=[Summary.Value(tag=tag, image=image)])))
    finally:
        writer.close()


class FilmedEnvs:
    """A one-env batch whose frames can be taken at every step: rendered, or its pixel observations.

    Raises:
        ConfigurationError: the env neither renders nor observes pixels (or PyAV is missing).
        TaskError: the env cannot be made at all.
    """

    def __init__(self, plugin: EnvPlugin, ctx: EnvContext) -> None:
        _av()  # said before the episodes are played, not after
        headless_rendering()
        self.env_id = ctx.env_id
        self.seed = ctx.seed
        """The first filmed episode's seed (episode ``k``: ``seed + k``)."""
        self.source = "render"
        rendering = EnvContext(ctx.env_id, 1, {**ctx.kwargs, "render_mode": "rgb_array"}, ctx.seed, ctx.threads)
        problem: str | None = None
        try:
            self.envs = VecEnvBatch(plugin, rendering)
        except TaskError as exc:
            problem = exc.message
            self.envs = VecEnvBatch(plugin, EnvContext(ctx.env_id, 1, ctx.kwargs, ctx.seed, ctx.threads))
        else:
            problem = self._try_render()
        if problem is not None:
            if not observes_pixels(self.envs.spaces.observation):
                self.envs.close()
                raise ConfigurationError(
                    f"env {ctx.env_id!r} cannot render (render_mode='rgb_array': {problem}) and does not observe "
                    "pixels: no video can be made of it"
                )
            self.source = "observation"
            logger.info("env %s does not render (%s): the video shows its observations", ctx.env_id, problem)
        self.fps = _fps(self.envs)

    def _try_render(self) -> str | None:
        """Why the env's frames cannot be used (``None``: they can)."""
        self.envs.reset()
        try:
            frame = self._rendered()
        except Exception as exc:  # a plug-in's render can raise anything
            return f"render() raised {type(exc).__name__}: {exc}"
        if frame is None:
            return "render() gave no frame"
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            return f"render() gave {frame.dtype} {list(frame.shape)}, not an RGB image"
        return None

    def _rendered(self) -> npt.NDArray[np.uint8] | None:
        frames = self.envs.vector_env.render()
        if frames is None:
            return None
        frame = frames[0] if isinstance(frames, list | tuple) else np.asarray(frames)
        if frame is not None and np.asarray(frame).ndim == 4:  # a batch as one array
            frame = np.asarray(frame)[0]
        return None if frame is None else np.asarray(frame)

    def frame(self) -> npt.NDArray[np.uint8]:
        """The picture of env 0 now: what the next action is chosen on."""
        if self.source == "render":
            frame = self._rendered()
            if frame is None:
                raise ConfigurationError(f"env {self.env_id!r} stopped rendering")
            return frame
        obs = self.envs.obs
        assert isinstance(obs, np.ndarray)
        return pixels(obs[0])

    def close(self) -> None:
        self.envs.close()


def observes_pixels(space: gym.Space[Any]) -> bool:
    """A uint8 image: ``[H, W]``, ``[H, W, 1 or 3]``, or a stack of frames ``[K, H, W]``."""
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    shape = space.shape
    if len(shape) == 2:
        return min(shape) >= 8
    if len(shape) == 3:
        return (shape[2] in (1, 3) and min(shape[:2]) >= 8) or (shape[0] <= 16 and min(shape[1:]) >= 8)
    return False


def pixels(obs: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """One observation of a pixel space as an RGB frame (the newest frame of a stack; grey as grey)."""
    image = np.asarray(obs, dtype=np.uint8)
    if image.ndim == 3 and image.shape[2] not in (1, 3):
        image = image[-1]  # [K, H, W]: the newest frame
    if image.ndim == 3 and image.shape[2] == 3:
        return np.ascontiguousarray(image)
    grey = image.reshape(image.shape[0], image.shape[1])
    return np.repeat(grey[:, :, None], 3, axis=2)


def _fps(envs: VecEnvBatch) -> float:
    metadata = getattr(envs.vector_env, "metadata", None) or {}
    fps = metadata.get("render_fps")
    try:
        value = float(fps) if fps else float(DEFAULT_FPS)
    except (TypeError, ValueError):
        value = float(DEFAULT_FPS)
    return value if value > 0 else float(DEFAULT_FPS)
