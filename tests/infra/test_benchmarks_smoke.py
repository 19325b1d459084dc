"""The benchmark suite imports, and its statistics and table behave (no broker, no timing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import runner
from benchmarks.case_collection import CpuSamples, measured
from benchmarks.case_collector import CONTROLLER, bench_job, controller_weights, random_weights
from benchmarks.case_scaling import collect_cfg
from benchmarks.case_stream import TARGET_BYTES, metadata_message
from benchmarks.common import alternate
from benchmarks.stats import Row, Series, fmt_number, format_table, largest_gap, percentile
from messaging import codec


def test_every_case_is_registered_with_a_name_and_title() -> None:
    assert list(runner.CASES) == [
        "steps", "rpc", "stream", "queue-type", "node-loss", "collector", "pixels", "metrics", "scaling",
        "collection", "e2e", "first-run", "sb3",
    ]  # fmt: skip
    for name, module in runner.CASES.items():
        assert name == module.NAME
        assert module.TITLE


def test_case_selection_refuses_unknown_names() -> None:
    assert runner.select_cases("rpc, steps") == ["rpc", "steps"]
    assert runner.select_cases(None) == list(runner.CASES)
    with pytest.raises(SystemExit, match="unknown cases"):
        runner.select_cases("rpc,nope")


def test_series_summarises_median_spread_and_quartiles() -> None:
    series = Series.of([3, 1, 2, 10])
    assert series.median == 2.5
    assert (series.low, series.high) == (1.0, 10.0)
    q1, q3 = series.quartiles()
    assert q1 <= series.median <= q3
    assert math.isnan(Series.of([]).median)


def test_ratio_and_slowdown_follow_the_direction_of_the_metric() -> None:
    rate = Row("c", "rate", "calls/s", "higher", Series.of([50.0]), Series.of([100.0]))
    latency = Row("c", "p50", "ms", "lower", Series.of([2.0]), Series.of([0.5]))
    assert rate.ratio == 0.5 and rate.slowdown == 2.0
    assert latency.ratio == 4.0 and latency.slowdown == 4.0
    assert largest_gap([rate, latency]) is latency
    assert Row("c", "alone", "s", "lower", Series.of([1.0])).ratio is None
    # a comparison of two warren configurations is no gap behind a baseline
    versus = Row("q", "rate", "items/s", "higher", Series.of([1.0]), Series.of([100.0]), notes={"versus": "queue type"})
    assert largest_gap([rate, latency, versus]) is latency


def test_table_has_one_line_per_row_and_aligned_columns() -> None:
    rows = [
        Row("task round trip", "1 client p50", "ms", "lower", Series.of([1.5, 1.6]), Series.of([0.4, 0.5]), "raw"),
        Row("end to end", "time", "s", "lower", Series.of([20.0])),
    ]
    lines = format_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert len({len(line) for line in lines}) == 1
    assert "1.55 (1.50-1.60)" in lines[2] and "3.44x" in lines[2]


def test_number_formatting_keeps_three_significant_figures() -> None:
    assert fmt_number(0.4312) == "0.431"
    assert fmt_number(12.34) == "12.3"
    assert fmt_number(2270.4) == "2,270"


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 99))


def test_alternate_rotates_the_order_of_variants() -> None:
    order: list[str] = []

    def variant(name: str):
        def measure() -> dict[str, float]:
            order.append(name)
            return {"x": 1.0}

        return measure

    trials = alternate(3, {"a": variant("a"), "b": variant("b")})
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert trials.series("a", "x").n == 3
    assert set(trials.cpu["a"][0]) >= {"ours", "broker", "foreign", "machine_busy"}


def test_stream_messages_are_metadata_sized() -> None:
    assert abs(len(codec.encode(metadata_message(7))) - TARGET_BYTES) <= 4


def test_controller_weights_fit_the_jobs_q_network_and_push_the_way_the_pole_leans() -> None:
    # Given the benchmark's hand-made weights, loaded strictly into an actor of the shipped job
    weights = controller_weights()
    assert all(not t.requires_grad for t in weights.values())
    actor = bench_job().bound.make_actor(seed=0)
    actor.load_weights(weights)
    # Then it pushes right exactly when CONTROLLER . s > 0 (away from where the pole falls)
    obs = np.random.default_rng(0).normal(size=(200, 4)).astype(np.float32)
    actions, _ = actor.act(obs, explore=False, settings={})
    np.testing.assert_array_equal(actions, (obs @ np.array(CONTROLLER, np.float32) > 0).astype(np.int64))
    assert set(random_weights()) == set(weights)
    assert not torch.equal(random_weights()["head.weight"], weights["head.weight"])


def test_the_scaling_case_sends_the_jobs_collect_task() -> None:
    from worker.protocol import CollectorSpec

    spec = CollectorSpec.from_wire(collect_cfg(1000))
    assert (spec.n_sample, spec.env.env_num, spec.traj_len, spec.collect_setting) == (1000, 64, 64, {"eps": 1.0})
    assert spec.policy == bench_job().policy_spec() and spec.spaces == bench_job().spaces


def test_results_go_only_to_out_when_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    monkeypatch.setattr(runner, "RESULTS_DIR", results)
    out = tmp_path / "trial" / "mine.json"
    runner._write({"cases": {}}, out)
    assert json.loads(out.read_text()) == {"cases": {}}
    assert not (results / "last.json").exists()  # the committed last run stays as it was


def test_without_out_results_go_to_a_timestamped_file_and_last_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "RESULTS_DIR", tmp_path)
    written = runner._write({"cases": {}}, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)
    assert "last.json" in [p.name for p in written] and len(written) == 2


def test_the_metrics_case_leaves_out_pairs_that_ran_beside_other_work() -> None:
    from benchmarks.case_metrics import _quiet
    from benchmarks.common import Trials

    quiet, busy = {"foreign": 0.05}, {"foreign": 0.9}
    trials = Trials(
        {
            "on": [{"x": 1.0}, {"x": 2.0}, {"x": 3.0}, {"x": 9.0}],
            "off": [{"x": 4.0}, {"x": 5.0}, {"x": 6.0}, {"x": 0.0}],
        },
        {"on": [quiet, quiet, quiet, quiet], "off": [quiet, quiet, quiet, busy]},
    )
    on, off, said = _quiet(trials, "x")
    assert (on.values, off.values, said) == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0), "3 of 4 pairs quiet")
    trials.cpu["on"] = [busy, busy, quiet, quiet]
    on, _, said = _quiet(trials, "x")
    assert on.n == 4 and said == "only 1 of 4 pairs quiet: all kept"


def test_a_run_against_sb3_that_missed_the_stop_value_keeps_its_stderr_and_one_that_reached_it_does_not() -> None:
    import subprocess

    from benchmarks.case_sb3 import Eval, outcome

    done = subprocess.CompletedProcess(["x"], 3, stdout="", stderr="boom")
    evals = [Eval(2.0, 100, -300.0), Eval(4.5, 900, 500.0), Eval(6.0, 1200, 480.0)]
    missed = outcome("sb3", 1, done, evals[:1], stop_value=475.0)
    reached = outcome("warren", 1, done, evals, stop_value=475.0)

    assert (missed["reached"], missed["stderr"], missed["exit_code"], missed["env_steps"]) == (False, "boom", 3, 100)
    assert (reached["reached"], reached["stderr"], reached["seconds"], reached["env_steps"]) == (True, "", 4.5, 900)
    assert reached["best"] == 500.0


def test_a_fixed_budget_run_is_judged_by_its_last_evaluation_within_the_budget() -> None:
    import subprocess

    from benchmarks.case_sb3 import Eval, outcome

    done = subprocess.CompletedProcess(["x"], 3, stdout="", stderr="late")
    evals = [Eval(30.0, 1_000, -5.0), Eval(60.0, 5_000, 900.0), Eval(95.0, 9_000, 1500.0)]
    within = outcome("warren", 0, done, evals, stop_value=4800.0, within_s=90.0)
    none_within = outcome("sb3", 0, done, evals, stop_value=4800.0, within_s=20.0)

    assert (within["ok"], within["return_at_budget"], within["env_steps_at_budget"]) == (True, 900.0, 5_000)
    assert within["stderr"] == "" and within["reached"] is False
    assert (none_within["ok"], none_within["return_at_budget"], none_within["stderr"]) == (False, None, "late")


def test_a_fixed_budget_run_that_crashed_or_whose_evaluations_predate_it_is_a_failure() -> None:
    import subprocess

    from benchmarks.case_sb3 import Eval, outcome

    crashed = subprocess.CompletedProcess(["x"], 1, stdout="", stderr="Traceback: boom")
    finished = subprocess.CompletedProcess(["x"], 3, stdout="", stderr="")
    one_eval = [Eval(30.0, 1_000, 250.0)]
    # an earlier run's log: its evaluations are timed before this run started
    stale = [Eval(-600.0, 9_000, 3000.0), Eval(-30.0, 12_000, 3500.0)]

    assert outcome("warren", 0, crashed, one_eval, stop_value=4800.0, within_s=90.0)["ok"] is False
    assert outcome("warren", 0, finished, one_eval, stop_value=4800.0, within_s=90.0)["ok"] is True
    left = outcome("warren", 0, finished, stale, stop_value=3000.0, within_s=90.0)
    assert (left["ok"], left["reached"], left["best"]) == (False, False, None)


def test_a_fixed_budget_job_reports_the_return_at_the_budget_and_the_time_of_the_runs_that_reached_the_stop() -> None:
    from benchmarks.case_sb3 import JOBS, job_rows

    def run(seconds: float | None, value: float, ok: bool = True) -> dict[str, object]:
        return {"ok": ok, "reached": seconds is not None, "seconds": seconds, "return_at_budget": value,
                "env_steps_at_budget": 1_000}  # fmt: skip

    results = {
        "warren": [run(250.0, 4805.0), run(410.0, 4866.0), run(None, 4100.0)],
        "sb3": [run(990.0, 5255.0), run(None, 3434.0), run(None, 0.0, ok=False)],
    }
    ret, _, to_stop = job_rows("halfcheetah_sac", JOBS["halfcheetah_sac"], {"stop_value": 4800.0}, results)

    assert ret.warren.values == (4805.0, 4866.0, 4100.0) and ret.baseline is not None
    assert ret.baseline.values == (5255.0, 3434.0)
    assert to_stop.warren.values == (250.0, 410.0) and to_stop.baseline is not None
    assert to_stop.baseline.values == (990.0,) and to_stop.notes == {"reached": {"warren": 2, "sb3": 1}}
    assert "warren 2/3, sb3 1/3 reached it" in to_stop.reference


def test_a_run_still_going_past_its_budget_is_killed_and_reported_not_raised() -> None:
    import sys

    from benchmarks.case_sb3 import run_bounded

    # a budget of -179.5 s leaves it half a second (runs get 180 s past their budget)
    done = run_bounded([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"], {}, -179.5)
    assert done.returncode == -9 and "killed" in done.stderr


def test_the_pong_return_curve_is_averaged_per_window_weighted_by_episodes() -> None:
    from benchmarks.pixel_train import windows

    # tasks ending at 10k (2 episodes of -21), 40k (1 of -18) and 60k (3 of -19)
    rows = windows([(10_000, -21.0, 2), (40_000, -18.0, 1), (60_000, -19.0, 3)], 50_000)
    assert [(r["from"], r["episodes"]) for r in rows] == [(0, 3), (50_000, 3)]
    assert rows[0]["mean_return"] == -20.0 and rows[1]["mean_return"] == -19.0


def test_an_eval_at_the_stop_value_that_did_not_end_the_run_is_no_time_to_solve() -> None:
    import subprocess

    from benchmarks.case_sb3 import outcome, warren_evals

    # Given a run log: an untrained policy's eval at 500, then a pass whose confirmation ended the run
    records = [
        {"kind": "eval", "time": 101.0, "env_steps": 1_028, "reward_mean": 500.0, "train_iter": 0},
        {"kind": "eval", "time": 104.0, "env_steps": 9_000, "reward_mean": 490.0, "train_iter": 40},
        {"kind": "eval", "time": 104.5, "env_steps": 9_500, "reward_mean": 481.0, "train_iter": 40, "success": True},
    ]
    evals = warren_evals(records, started=100.0)
    done = subprocess.CompletedProcess(["x"], 0, stdout="", stderr="")
    result = outcome("warren", 0, done, evals, stop_value=475.0)
    # Then its time to solve is the confirmation's, not the untrained policy's eval
    assert (result["reached"], result["seconds"], result["env_steps"]) == (True, 4.5, 9_500)
    # And a run none of whose evals ended it did not reach the stop value, whatever they returned
    missed = outcome("warren", 1, done, evals[:2], stop_value=475.0)
    assert not missed["reached"] and missed["best"] == 500.0


def test_the_first_run_case_counts_every_run_and_spreads_only_the_ones_that_reached_the_stop_value() -> None:
    from benchmarks.case_first_run import rows

    def run(seconds: float | None, kept: bool = True) -> dict[str, object]:
        reached = seconds is not None
        return {"success": reached, "seconds": seconds, "env_steps": 40_000, "command_s": 9.0,
                "policy_evaluated": 800 if reached else None, "policy_file_version": 800 if kept else 950,
                "policy_left_return": 260.0}  # fmt: skip

    reached, seconds, _, steps, left = rows([run(4.0), run(6.0, kept=False), run(None)], None, 100)
    assert reached.warren.values == (2.0,) and "2 of 3" in reached.reference
    assert seconds.warren.values == (4.0, 6.0) and steps.warren.n == 2
    assert "policy file = policy evaluated in 1 of 2" in left.reference


def test_the_train_step_benchmark_times_the_numpy_the_torch_and_the_raw_step_of_a_job(tmp_path: Path) -> None:
    from benchmarks import train_step

    out = tmp_path / "steps.json"
    assert train_step.main(["--cases", "dqn-cartpole", "--repeats", "1", "--block-s", "0.001", "--out", str(out)]) == 0
    times = json.loads(out.read_text())["results"]["dqn-cartpole"]["ms_per_step"]
    assert set(times) == {"numpy", "torch", "raw torch"}
    assert all(len(t["cpu"]) == len(t["wall"]) == 1 for t in times.values())


def test_the_collection_case_measures_the_steady_window_the_busy_share_and_cpu_per_env_step(tmp_path: Path) -> None:
    # Given a run log of two collectors: tasks of 1 s with 0.25 s between them, 1,000 env steps each
    records = []
    for worker in ("a", "b"):
        for i in range(4):
            end = 100.0 + 1.25 * i + 1.0
            records.append({"kind": "task", "worker_id": worker, "time": end + 0.01, "finish_time": end,
                            "duration": 1.0, "step_count": 1000})  # fmt: skip
    records.sort(key=lambda r: r["time"])
    steps = 0
    for record in records:
        steps += 1000
        record["env_steps"] = steps
    (tmp_path / "run.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    # and CPU samples of one role that used 0.5 CPU-seconds a second
    cpu = CpuSamples({"collectors": []})
    cpu.samples = [(100.0 + t, {"collectors": 0.5 * t}) for t in range(10)]
    # When measured with N = 2
    got = measured(tmp_path / "run.jsonl", cpu, 2)
    # Then the rate is over the window from the 2nd finished task to the last: 6,000 steps in 3.75 s
    assert got["steps_s"] == pytest.approx(6000 / 3.75)
    # the busy share is each collector's time in tasks over its span (4 s of 4.75 s)
    assert got["busy_share"] == pytest.approx(4 / 4.75)
    assert got["in_task_steps_s"] == pytest.approx(1000.0)
    # and CPU per env step is the role's CPU over the window per step counted in it
    assert got["cpu_us_collectors"] == pytest.approx(0.5 * 3.75 / 6000 * 1e6)


def test_a_variant_of_a_shipped_job_is_run_with_each_changed_setting_given_to_warren_as_set() -> None:
    from benchmarks.case_sb3 import JOBS, warren_argv

    argv = warren_argv(
        JOBS["cartpole_novel_ppo_lstm"], 1, Path("/tmp/x"), "p", ("algorithm.recompute_states=true", "env.seed=3")
    )
    assert argv[argv.index("--config") + 1].endswith("configs/cartpole_novel_ppo_lstm.toml")
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    assert sets == ["algorithm.recompute_states=true", "env.seed=3"]
    assert "--set" not in warren_argv(JOBS["cartpole_novel_ppo_lstm"], 1, Path("/tmp/x"), "p")


def test_the_sb3_case_refuses_sides_it_does_not_know() -> None:
    from benchmarks.case_sb3 import main

    with pytest.raises(SystemExit) as refused:
        main(["--jobs", "cartpole_novel_ppo_lstm", "--sides", "warren,sb2"])
    assert refused.value.code == 2
