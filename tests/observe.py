"""Reading what a run shows, as its users' tools read it: ``/metrics`` scrapes and TensorBoard event files.

Scrapes are parsed with prometheus_client's own parser; event files are read with
tensorboard's ``EventAccumulator``, the loader TensorBoard itself uses.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def free_port() -> int:
    """A port nothing listens on now on 127.0.0.1 (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free ports on 127.0.0.1."""
    for _ in range(50):
        first = free_port()
        if first + count > 65536:
            continue
        socks = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports found")


def scrape(port: int, host: str = "127.0.0.1") -> list[Sample] | None:
    """Every sample ``http://host:port/metrics`` returns now; ``None`` when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def total(found: list[Sample] | None, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels`` (0 when there are none)."""
    if found is None:
        return 0.0
    return sum(s.value for s in found if s.name == name and labels.items() <= s.labels.items())


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value)...]}`` of the event files in ``logdir``, as TensorBoard reads them."""
    events = EventAccumulator(str(logdir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
