"""Task bodies and protocol loops shared by the tests that drive collector workers."""

from __future__ import annotations

from typing import Any

from messaging import RpcClient


def start_task(task_id: str, collector_cfg: dict[str, Any], *, buffer_id: str = "main") -> dict[str, Any]:
    """A ``collector_start_task`` body."""
    return {
        "name": "collector_start_task",
        "task_info": {"task_id": task_id, "buffer_id": buffer_id, "collector_cfg": collector_cfg},
    }


def random_policy_cfg(env_num: int, **extra: Any) -> dict[str, Any]:
    """``collector_cfg`` of a CartPole task with a random policy (no policy file needed)."""
    return {"env": {"id": "CartPole-v1", "env_num": env_num}, "policy": {"type": "random"}, **extra}


def drain_data_tasks(client: RpcClient, control: str, limit: int = 500) -> list[dict[str, Any]]:
    """``collector_data_task`` until the item with ``collector_done``; all items, in order."""
    items = []
    for _ in range(limit):
        item = client.call(control, {"name": "collector_data_task"})
        items.append(item)
        if "data_id" not in item and item["collector_done"]:
            return items
    raise AssertionError(f"no collector_done within {limit} items")
