"""The learner process's training side (no broker): start, resume from its checkpoint, ingest chunks, train, publish."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from messaging import Delivery, Envelope, MetadataItem
from tests.rl_builders import chunk_fields
from worker.algorithms.dqn import DQN
from worker.algorithms.dqn.learner import DQNLearner
from worker.algorithms.dqn.numpy_step import NumpyDQNStep
from worker.algorithms.dqn.torch_step import TorchDQNStep
from worker.config import LearnerConfig
from worker.job import JobConfig
from worker.learner.service import CHECKPOINT_SUFFIX, Learner, LearningDiverged
from worker.protocol import DataItem
from worker.storage import PolicySnapshot


def make_learner(tmp_path: Path, **job: Any) -> Learner:
    config = LearnerConfig(
        path_data=tmp_path / "data", path_policy=tmp_path / "policy", job=JobConfig.load(None, **job)
    )
    return Learner(config)


def published(learner: Learner, name: str | None = None) -> PolicySnapshot:
    snapshot = learner.policies.read(name or learner.job.coordinator.policy_name)
    assert snapshot is not None
    return snapshot


def assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(actual) == set(expected)
    assert all(torch.equal(actual[k], expected[k]) for k in expected)


class Settled:
    """Records how a metadata item was settled."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def item(self, message: dict[str, Any], *, redelivered: bool = False) -> MetadataItem:
        def settle(ack: bool, requeue: bool) -> None:
            self.outcomes.append("ack" if ack else "requeue" if requeue else "dead-letter")

        return MetadataItem(message, Delivery(Envelope(b"", "p.learner.main", redelivered=redelivered), settle))


def data_item(data_id: str, *, policy_iter: int = 0, samples: int = 32) -> dict[str, Any]:
    return DataItem(
        data_id=data_id,
        policy_iter=policy_iter,
        unroll_len=samples,
        env_num=1,
        sample_count=samples,
        cur_episode=0,
        cur_sample=samples,
        cur_step=samples,
        task_id="t1",
        buffer_id="main",
    ).to_wire()


def write_chunk(learner: Learner, data_id: str, steps: int = 32, seed: int = 0) -> None:
    learner.steps.write(data_id, chunk_fields(learner.layout, learner.spaces, steps, 1, seed))


def test_a_fresh_learner_publishes_the_seeded_initial_weights_at_version_0_with_its_header(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    assert isinstance(learner.learner, DQNLearner) and isinstance(learner.learner.step, NumpyDQNStep)

    learner._resume_or_start()

    snapshot = published(learner)
    assert snapshot.iter == 0
    job = learner.job
    assert_same_state(snapshot.state_dict, job.bound.make_learner(job.env.seed).actor_weights())
    # the header is what collectors check before loading: which algorithm, which model, which spaces
    assert snapshot.meta["algorithm"] == "dqn" and snapshot.meta["algorithm_version"] == job.algorithm.version
    assert snapshot.meta["model"] == "mlp" and snapshot.meta["model_version"] == job.model.version
    assert snapshot.meta["spaces_digest"] == job.spaces.digest  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_a_restarted_learner_resumes_from_its_checkpoint_and_trains_on(tmp_path: Path, backend: str) -> None:
    # Given the checkpoint an earlier learner of the run left at version 120
    earlier = make_learner(tmp_path, **{"algorithm.backend": backend, "algorithm.learning_starts": 0})
    producer = earlier.job.bound.make_learner(seed=42)
    producer.load_state_dict(producer.state_dict(), 120)
    earlier.policies.write(earlier._checkpoint_name, producer.state_dict(), 120, earlier.header)

    # When a new learner starts, it continues from those weights and that version, and publishes them
    learner = make_learner(tmp_path, **{"algorithm.backend": backend, "algorithm.learning_starts": 0})
    learner._resume_or_start()
    assert learner.learner.version == 120
    assert_same_state(learner.learner.actor_weights(), producer.actor_weights())
    assert published(learner).iter == 120

    # and trains on the chunks it takes in, publishing the new weights
    for i in range(4):
        write_chunk(learner, f"d{i}", steps=256, seed=i)
        learner._ingest(Settled().item(data_item(f"d{i}", samples=256)))
    learner._last_write = 0.0
    learner._train_some()
    assert learner.stats.train_steps == 32 and learner.learner.version == 152  # 1024 samples / 32 per update
    snapshot = published(learner)
    assert snapshot.iter == 152
    assert not torch.equal(snapshot.state_dict["head.weight"], producer.actor_weights()["head.weight"])


@pytest.mark.parametrize(
    ("header", "job"),
    [
        ({"spaces_digest": "0000000000000000"}, {}),  # another env
        ({"algorithm": "ppo"}, {}),  # another algorithm
        ({}, {"model.hidden_sizes": [64, 64]}),  # same keys, other shapes: another model config
        ({}, {"model.hidden_sizes": [64, 64], "algorithm.backend": "torch"}),
    ],
)
def test_a_checkpoint_the_job_cannot_use_is_left_for_a_fresh_start(
    tmp_path: Path, header: dict[str, str], job: dict[str, Any]
) -> None:
    # Given a checkpoint at version 77 that does not fit the job a new learner runs
    earlier = make_learner(tmp_path)
    state = earlier.job.bound.make_learner(seed=3).state_dict()
    earlier.policies.write(earlier._checkpoint_name, state, 77, {**earlier.header, **header})
    # When the learner starts
    learner = make_learner(tmp_path, **job)
    fresh = learner.learner.actor_weights()
    learner._resume_or_start()
    # Then it starts fresh, whole (nothing of the checkpoint in its weights), and says so in the policy file
    assert learner.learner.version == 0
    assert_same_state(learner.learner.actor_weights(), fresh)
    assert published(learner).iter == 0


def test_ingest_learns_from_good_chunks_and_settles_every_other_message(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    settled = Settled()
    write_chunk(learner, "good")
    learner.steps.write("odd", {"obs": torch.zeros(3).numpy()})  # not the job's layout

    learner._ingest(settled.item(data_item("good")))  # learned from, file deleted
    learner._ingest(settled.item(data_item("good")))  # a redelivery of it
    learner._ingest(settled.item(data_item("absent"), redelivered=True))  # its file never came
    learner._ingest(settled.item(data_item("odd")))  # a file not of the job's spaces
    learner._ingest(settled.item({"collector_done": True, "cur_step": 3}))  # not data metadata at all

    stats = learner.stats
    assert (stats.items, stats.samples, stats.duplicates, stats.missing_files, stats.corrupt_files) == (1, 32, 1, 1, 1)
    assert settled.outcomes == ["ack", "ack", "ack", "ack", "dead-letter"]
    assert not (learner.steps.root / "good").exists() and not (learner.steps.root / "odd").exists()


def test_chunks_older_than_the_algorithm_allows_are_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an algorithm that takes chunks at most 2 policy versions old, at version 10
    monkeypatch.setattr(DQN, "max_policy_lag", property(lambda self: 2))
    learner = make_learner(tmp_path)
    learner.learner.load_state_dict(learner.learner.state_dict(), 10)
    settled = Settled()
    write_chunk(learner, "old")
    write_chunk(learner, "recent", seed=1)
    # When chunks of versions 7 and 8 arrive
    learner._ingest(settled.item(data_item("old", policy_iter=7)))
    learner._ingest(settled.item(data_item("recent", policy_iter=8)))
    # Then the old one is acked, deleted and counted, never learned from; the recent one is
    assert (learner.stats.stale_chunks, learner.stats.items) == (1, 1)
    assert settled.outcomes == ["ack", "ack"]
    assert not (learner.steps.root / "old").exists()


def test_an_update_that_goes_nan_stops_the_learner_before_it_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a learner with data to train on, that published version 0
    learner = make_learner(tmp_path, **{"algorithm.learning_starts": 32})
    learner._resume_or_start()
    write_chunk(learner, "d0", steps=64)  # the 32 after learning_starts earn one update
    learner._ingest(Settled().item(data_item("d0", samples=64)))
    assert learner.learner.can_update()
    # When an update's loss is NaN
    monkeypatch.setattr(learner.learner, "update", lambda: {"loss": math.nan, "q_mean": 1.0})
    with pytest.raises(LearningDiverged, match=r"gave non-finite loss: the run stops; policy_main keeps .* version 0"):
        learner._train_some()
    # Then nothing of it was written: the policy file is still version 0
    assert published(learner).iter == 0 and learner.stats.train_steps == 0


def test_the_checkpoint_goes_next_to_the_policy_file_with_the_full_training_state(tmp_path: Path) -> None:
    learner = make_learner(tmp_path)
    learner._resume_or_start()
    learner._write_checkpoint()
    checkpoint = published(learner, learner.job.coordinator.policy_name + CHECKPOINT_SUFFIX)
    assert {name.split(".")[0] for name in checkpoint.state_dict} == {"online", "target", "adam"}
    assert checkpoint.meta["spaces_digest"] == learner.spaces.digest


def test_the_first_updates_are_checkpointed_at_once_so_an_early_kill_resumes_trained(tmp_path: Path) -> None:
    # Given a learner that just ran its first updates (long before its checkpoint interval is over)
    learner = make_learner(tmp_path, **{"algorithm.learning_starts": 32, "algorithm.train_steps_per_sample": 0.25})
    learner._resume_or_start()
    write_chunk(learner, "d0", steps=64)  # the 32 after learning_starts earn 8 updates
    learner._ingest(Settled().item(data_item("d0", samples=64)))
    learner._train_some()
    assert learner.learner.version == 8
    # When it is killed (no exit checkpoint) and another learner of the run starts
    again = make_learner(tmp_path, **{"algorithm.learning_starts": 32})
    again._resume_or_start()
    # Then that one goes on from the trained weights, not from scratch
    assert again.learner.version == 8
    assert_same_state(again.learner.actor_weights(), learner.learner.actor_weights())
    assert published(again).iter == 8


def test_a_torch_backend_learner_trains_the_same_job() -> None:
    job = JobConfig.load(None, **{"algorithm.backend": "torch"})
    learner = job.bound.make_learner(seed=0)
    assert isinstance(learner, DQNLearner) and isinstance(learner.step, TorchDQNStep)


def test_a_pong_chunk_whose_frames_do_not_fit_is_counted_and_the_next_good_one_learned_from(tmp_path: Path) -> None:
    pytest.importorskip("ale_py")
    learner = make_learner(
        tmp_path,
        **{"env.id": "ALE/Pong-v5", "env.stop_value": 18.0, "algorithm.name": "ppo", "model.name": "nature_cnn"},
    )
    assert learner.layout.frame_fields == ("obs",)
    settled = Settled()
    good = chunk_fields(learner.layout, learner.spaces, 4, 1)
    bad = {**good, "obs": good["obs"][:, :, :80]}  # frames of 80x84 where the job's spaces make 84x84
    learner.steps.write("bad", bad)
    learner.steps.write("short", good)
    learner.steps.write("good", good)
    learner._ingest(settled.item(data_item("bad", samples=4)))
    learner._ingest(settled.item(data_item("short", samples=5)))  # its metadata says 5 steps, the file has 4
    learner._ingest(settled.item(data_item("good", samples=4)))
    assert (learner.stats.corrupt_files, learner.stats.items, learner.stats.samples) == (2, 1, 4)
    assert settled.outcomes == ["ack", "ack", "ack"] and not (learner.steps.root / "bad").exists()


def test_a_learner_whose_run_kept_the_policy_file_stops_updating_until_a_new_run_releases_it(tmp_path: Path) -> None:
    # Given a learner that published version 0 and has data for 8 updates
    job = {"algorithm.learning_starts": 32, "algorithm.train_steps_per_sample": 0.25}
    learner = make_learner(tmp_path, **job, **{"learner.policy_write_interval_s": 0.0})
    learner._resume_or_start()
    write_chunk(learner, "d0", steps=64)
    learner._ingest(Settled().item(data_item("d0", samples=64)))
    # When its run ends keeping version 0 (the policy its eval passed) before the learner writes again
    assert learner.policies.keep("policy_main") == 0
    learner._train_some()
    # Then its write is refused: the file stays version 0, and it trains no further on new data
    assert published(learner).iter == 0 and learner.learner.version == 8
    write_chunk(learner, "d1", steps=64, seed=1)
    learner._ingest(Settled().item(data_item("d1", samples=64)))
    learner._train_some()
    assert learner.learner.version == 8 and learner._still_kept()
    # And the next run's learner releases the file and writes its own policy again
    again = make_learner(tmp_path, **job)
    again._resume_or_start()
    assert published(again).iter == 8 and not again.policies.is_kept("policy_main")
    assert not learner._still_kept() and learner._kept_version is None
