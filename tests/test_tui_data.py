"""The TUI's file readers, over files written by the project's own code: the lazy rollout index
(incremental, torn lines, filters, search), run discovery, tails, variance, comparison, GEPA."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.tui_data import (
    REWARD_FAILED,
    SERVER_FAILED,
    VariedClient,
    make_eval,
    make_gepa_run,
    make_train_run,
    write_results,
)
from workbench.inference.echo import EchoClient
from workbench.store.checkpoints import list_checkpoint_infos
from workbench.store.results import read_groups
from workbench.tui.data.compare import compare_groups
from workbench.tui.data.gepa import load_gepa_run
from workbench.tui.data.rollout_index import RolloutFilter, RolloutIndex, parse_reward_range
from workbench.tui.data.runs import RunCatalog, filter_runs
from workbench.tui.data.tail import JsonlTail, TextTail
from workbench.tui.data.training import eta_seconds, series, step_rollout_files
from workbench.tui.data.variance import bucket_labels, difficulty, index_variance_report, variance_report
from workbench.tui.launcher import config_spec


@pytest.fixture
def varied_run(workspace: Path) -> Path:
    return make_eval("reverse-words", VariedClient(), 12, 4, "run-a")


def test_index_matches_read_groups_and_loads_full_rollouts(varied_run: Path):
    index = RolloutIndex(varied_run / "results.jsonl")
    assert index.refresh() and not index.refresh()  # second call: nothing new
    reference = {g.example_id: g for g in read_groups(varied_run)}
    groups = index.groups()
    assert [g.example_id for g in groups] == sorted(reference)
    for group in groups:
        ref = reference[group.example_id]
        assert group.mean == pytest.approx(ref.mean) and group.std == pytest.approx(ref.std)
        assert group.size == len(ref.rollouts) and not hasattr(group, "rollouts")  # numbers only, no rollouts
        loaded = index.load_group(group.example_id)  # read back from disk on demand
        assert [r.to_record() for r in loaded.rollouts] == [r.to_record() for r in ref.rollouts]
    full = index.load(3, 2)
    assert full.completion == reference[3].rollouts[2].completion and full.prompt


def test_index_reads_appended_lines_and_skips_a_torn_one(tmp_path: Path, varied_run: Path):
    lines = (varied_run / "results.jsonl").read_bytes().splitlines(keepends=True)
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(lines[:8]))
    index = RolloutIndex(path)
    index.refresh()
    assert len(index) == 8
    with path.open("ab") as f:
        f.write(b"".join(lines[8:12]) + lines[12][:40])  # a writer caught mid-line
    index.refresh()
    assert len(index) == 12
    with path.open("ab") as f:
        f.write(lines[12][40:])
    index.refresh()
    assert len(index) == 13 and index.load(*_key(lines[12])).example_id == json.loads(lines[12])["example_id"]
    path.write_bytes(b"".join(lines[:4]))  # compacted on resume: shorter than what was read
    index.refresh()
    assert len(index) == 4


def _key(line: bytes) -> tuple[int, int]:
    record = json.loads(line)
    return record["example_id"], record["rollout_index"]


def test_filters_and_search(varied_run: Path):
    index = RolloutIndex(varied_run / "results.jsonl")
    index.refresh()
    groups = index.groups()
    errors = index.filtered(RolloutFilter(errors=True))
    full = {g.example_id: index.load_group(g.example_id) for g in groups}
    assert errors and all(any(r.error for r in full[g.example_id].rollouts) for g in errors)
    assert len(errors) == sum(any(r.error for r in g.rollouts) for g in full.values())
    truncated = index.filtered(RolloutFilter(truncated=True))
    assert truncated and all(any(r.is_truncated for r in full[g.example_id].rollouts) for g in truncated)
    zero = index.filtered(RolloutFilter(zero_variance=True))
    assert zero and all(g.std == 0 for g in zero)
    ranged = index.filtered(RolloutFilter(reward_min=0.5, reward_max=0.9))
    assert ranged and all(0.5 <= g.mean <= 0.9 for g in ranged)
    full = index.load(groups[0].example_id, 0)
    word = full.prompt[-1]["content"]
    found = index.filtered(RolloutFilter(search=word.upper()))
    assert groups[0].example_id in {g.example_id for g in found} and len(found) < len(groups)
    assert index.filtered(RolloutFilter(search="no such text anywhere")) == []


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0.2..0.8", (0.2, 0.8)),
        ("0.5..", (0.5, None)),
        ("..0.1", (None, 0.1)),
        ("0.3-0.6", (0.3, 0.6)),
        ("1", (1.0, 1.0)),
        ("", (None, None)),
        ("-0.5..0.5", (-0.5, 0.5)),
    ],
)
def test_reward_range_parsing(text: str, expected: tuple):
    assert parse_reward_range(text) == expected


def test_reward_range_rejects_nonsense():
    with pytest.raises(ValueError):
        parse_reward_range("0.9..0.1")
    with pytest.raises(ValueError):
        parse_reward_range("high")


def test_variance_report_uses_eval_summary_buckets(varied_run: Path):
    groups = read_groups(varied_run)
    report = variance_report(groups)
    assert [label for label, _ in report.histogram] == bucket_labels()
    assert sum(count for _, count in report.histogram) == len(groups) == report.num_groups
    assert sum(report.counts.values()) == len(groups)
    assert report.shares["too easy"] == pytest.approx(report.counts["too easy"] / len(groups))
    stds = [g.std for g in report.by_variance]
    assert stds == sorted(stds, reverse=True)
    saved = json.loads((varied_run / "metadata.json").read_text())["summary"]
    assert report.summary["verdict"] == saved["verdict"]
    assert dict(report.histogram)["0"] == saved["group_std_histogram"].get("0", 0)


def test_index_variance_report_equals_the_loaded_groups_report(tmp_path: Path):
    """Built from the index's rows (no record parsed), the report shows exactly what the report of
    the loaded groups shows: histogram, difficulty counts and shares, the table's order and
    numbers, and summarize's mean reward / zero-variance share / verdict, which leave out the
    group a server failure spoiled."""
    path = write_results(
        tmp_path,
        {
            7: [1.0, 1.0, 1.0, 1.0],  # zero variance, too easy
            3: [0.0, 0.0, 0.0, 0.0],  # zero variance, too hard
            5: [0.1, 0.2, 0.3, 0.7],  # in range (floats whose sum rounds: the mean must be summarize's)
            2: [0.9, 0.2, 0.6, 1],  # in range, an int reward and a truncated rollout
            4: [0.5, 0.52, 0.5, 0.52],  # std under 0.05: no signal
            9: [0.9, 0.0, 0.4, 0.3],  # a reward function raised (reward 0): still a result
            6: [0.95, 0.05, 1.0, 0.0],  # a server failure: not a result, left out of summarize
            8: [0.25, 0.25, 0.75, 0.75],  # the same std as example 1: the table puts 1 first
            1: [0.75, 0.25, 0.75, 0.25],
        },
        {(9, 1): REWARD_FAILED, (6, 2): SERVER_FAILED},
    )
    index = RolloutIndex(path)
    index.refresh()
    old = variance_report(index.load_groups())
    assert old.summary["incomplete_groups"] == 1 and old.summary["num_groups"] == 8  # the case is there

    def load_group(*_):
        raise AssertionError("the index report read a record")

    index.load_group = load_group  # type: ignore[method-assign]
    new = index_variance_report(index)
    assert new.histogram == old.histogram and new.counts == old.counts and new.shares == old.shares
    assert new.num_groups == old.num_groups == 9
    table = [(g.example_id, g.mean, g.std, difficulty(g)) for g in new.by_variance]
    assert table == [(g.example_id, g.mean, g.std, difficulty(g)) for g in old.by_variance]
    order = [g.example_id for g in new.by_variance]
    assert order[-2:] == [3, 7] and order.index(8) == order.index(1) + 1  # std ties: by example id
    assert {"reward_mean", "zero_variance_frac", "verdict", "infrastructure_failures"} <= new.summary.keys()
    assert new.summary == {key: old.summary[key] for key in new.summary}  # exactly equal, float for float
    assert new.summary["reward_mean"] != pytest.approx(index.reward_mean)  # the failed group is left out


def test_index_variance_report_when_every_group_failed(tmp_path: Path):
    path = write_results(
        tmp_path,
        {0: [0.0, 1.0], 1: [0.5, 0.5]},
        {(0, 0): SERVER_FAILED, (1, 1): SERVER_FAILED, (1, 0): SERVER_FAILED},
    )
    index = RolloutIndex(path)
    index.refresh()
    old, new = variance_report(index.load_groups()), index_variance_report(index)
    assert old.summary.pop("server_errors") == [{"message": "503 after retries", "count": 3}]  # not indexed
    assert (
        new.summary
        == old.summary
        == {"num_groups": 0, "num_rollouts": 0, "infrastructure_failures": 3, "incomplete_groups": 2}
    )
    assert new.histogram == old.histogram and new.counts == old.counts
    assert [g.example_id for g in new.by_variance] == [g.example_id for g in old.by_variance] == [0, 1]


def test_compare_counts_flips(workspace: Path):
    good = make_eval("reverse-words", VariedClient(), 12, 4, "good")
    bad = make_eval("reverse-words", EchoClient(mode="echo"), 12, 4, "bad")
    comparison = compare_groups(read_groups(bad), read_groups(good))
    assert comparison.shared == 12 and comparison.mean_a == 0.0
    assert comparison.count("fixed") == sum(g.mean >= 0.5 for g in read_groups(good))
    assert comparison.count("broke") == 0 and comparison.worse == 0


def test_catalog_finds_all_kinds_and_marks_dead_runs(workspace: Path, varied_run: Path):
    make_train_run(workspace, "alive")
    make_train_run(workspace, "dead", pid=_dead_pid())
    make_gepa_run(workspace)
    runs = RunCatalog(workspace).scan()
    by_id = {r.run_id: r for r in runs}
    assert {r.kind for r in runs} == {"eval", "train", "gepa"}
    assert by_id["alive"].status == "running" and by_id["alive"].progress == "6/10"
    assert by_id["dead"].status == "died"
    assert by_id["run-a"].progress == "48/48" and by_id["run-a"].reward == pytest.approx(
        json.loads((varied_run / "metadata.json").read_text())["reward_mean"]
    )
    assert {r.run_id for r in filter_runs(runs, "train", None, "")} == {"alive", "dead"}
    assert {r.run_id for r in filter_runs(runs, None, "died", "")} == {"dead"}
    assert [r.kind for r in filter_runs(runs, None, None, "gepa echo")] == ["gepa"]


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_tails_read_only_what_was_appended(tmp_path: Path):
    log = tmp_path / "run.log"
    log.write_text("one\ntwo\nthr")
    tail = TextTail(log)
    assert tail.poll() == ["one", "two"]
    with log.open("a") as f:
        f.write("ee\nfour\n")
    assert tail.poll() == ["three", "four"] and tail.poll() == []
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2')
    jtail = JsonlTail(metrics)
    assert jtail.poll() and [r["step"] for r in jtail.records] == [1]
    with metrics.open("a") as f:
        f.write(', "reward/mean": 0.2}\n')
    assert jtail.poll() and series(jtail.records, "reward/mean") == ([1.0, 2.0], [0.1, 0.2])
    metrics.write_text('{"step": 1, "reward/mean": 0.3}\n')  # truncated on resume
    assert jtail.poll() and series(jtail.records, "reward/mean") == ([1.0], [0.3])


def test_training_readers(workspace: Path, varied_run: Path):
    run = make_train_run(workspace, rollouts_from=varied_run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert eta_seconds(records, 6, 10) == pytest.approx(8.0)  # 4 steps left x 2 s
    assert [step for step, _ in step_rollout_files(run)] == [1, 2, 3, 4, 5, 6]
    checkpoints = list_checkpoint_infos(run)
    assert [c.step for c in checkpoints] == [3, 6]
    assert checkpoints[1].reward == pytest.approx(0.5) and checkpoints[0].size_bytes > 4096


def test_gepa_reader_and_missing_keys(workspace: Path):
    run = load_gepa_run(make_gepa_run(workspace))
    assert [c.score for c in run.candidates] == [0.42, 0.55, 0.71] and run.best_index == 2
    assert run.metric_calls == 72 and len(run.frontier) == 4 and run.frontier[0].candidates == ["#0", "#2"]
    assert any(line.startswith("+Keep spaces") for line in run.prompt_diff())
    bare = workspace / "bare"
    bare.mkdir()
    (bare / "metadata.json").write_text('{"kind": "gepa", "candidates": [{"prompt": "x"}, "y"]}')
    empty = load_gepa_run(bare)
    assert empty.seed_score is None and empty.best_score is None and empty.metric_calls is None
    assert empty.seed_prompt == "x" and empty.frontier == [] and empty.status == "-"


def test_config_spec_reads_the_first_line(tmp_path: Path):
    folder = tmp_path / "configs" / "rl"
    folder.mkdir(parents=True)
    config = folder / "reverse-text.toml"
    config.write_text(
        '# workbench train configs/rl/reverse-text.toml --set max_steps=5\nmodel = "tiny"\n'
        '[[env]]\nid = "reverse-text"\n'
    )
    spec = config_spec(config, tmp_path)
    assert spec.kind == "train" and spec.args == [
        "train",
        "configs/rl/reverse-text.toml",
        "--set",
        "max_steps=5",
    ]
    assert (spec.env, spec.model) == ("reverse-text", "tiny")
    plain = tmp_path / "configs" / "eval" / "x.toml"
    plain.parent.mkdir(parents=True)
    plain.write_text('env_id = "alphabet-sort"\nmodel = "tiny"\n')
    assert config_spec(plain, tmp_path).args == ["eval", "run", "configs/eval/x.toml"]


def test_tui_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, workbench.tui.app, workbench.tui.screens.monitor, workbench.tui.screens.checkpoints, "
        "workbench.tui.screens.rollouts, workbench.tui.screens.gepa, workbench.tui.screens.launch;"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert result.returncode == 0, result.stderr


def test_index_reads_in_chunks_smaller_than_a_line(varied_run: Path, monkeypatch: pytest.MonkeyPatch):
    """Memory stays bounded by reading a chunk at a time; a line longer than a chunk is still read whole."""
    import workbench.tui.data.rollout_index as rollout_index

    monkeypatch.setattr(rollout_index, "CHUNK", 100)  # far shorter than one record
    index = RolloutIndex(varied_run / "results.jsonl")
    assert index.refresh()
    reference = {g.example_id: g for g in read_groups(varied_run)}
    assert len(index) == sum(len(g.rollouts) for g in reference.values())
    assert [g.mean for g in index.groups()] == pytest.approx([reference[i].mean for i in sorted(reference)])
    word = index.load(5, 0).prompt[-1]["content"]
    assert 5 in index.search(word.upper())
