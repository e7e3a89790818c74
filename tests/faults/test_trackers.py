"""REPORT_TO (common/trackers): the key's check, a default run that imports no tracker, and W&B offline through
the tiny task's real entry point: TensorBoard's figures at TensorBoard's steps, the config and run.json's tags,
and one W&B run across a resume. MLflow (a SQLite store, a server, SIGKILL): tests/faults/test_trackers.py."""
import glob
import json
import os
import sys

import pytest

from common.tb_events import read_scalars
from tests.faults import harness
from tests.golden import close
from tests.wandb_records import history, records

WANDB = ["REPORT_TO", "['tensorboard','wandb']"]


def _error_lines(capsys):
    out, err = capsys.readouterr()
    return [line for line in (out + err).splitlines() if "error:" in line], out + err


def test_an_unknown_tracker_is_one_error_line_naming_the_known_ones(tiny_cfg, tmp_path, capsys):
    assert harness.run_here(tiny_cfg, tmp_path, opts=["REPORT_TO", "['tensorboard','comet']"]) == 2
    errors, text = _error_lines(capsys)
    assert errors == ["error: --opts: REPORT_TO: expected a list of distinct names out of tensorboard, mlflow, "
                      "wandb, got ['tensorboard', 'comet']"] and "Traceback" not in text, text


def test_a_default_run_reports_to_tensorboard_only_and_imports_no_tracker(tiny_cfg, tmp_path, monkeypatch):
    """The default ['tensorboard'] imports neither mlflow nor our tracker modules (each is made unimportable
    here), so start-up stays as fast; it writes no tracker files, no ``trackers`` in run.json or the checkpoint.
    (timm imports wandb by itself where it is installed.)"""
    for name in ("mlflow", "common.trackers.mlflow_run", "common.trackers.wandb_run"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError
    assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.END_EPOCH", 1]) == 0
    folder = harness.out_dir(tmp_path)
    assert os.path.isdir(os.path.join(folder, "tensorboard_logs"))
    assert not os.path.exists(os.path.join(folder, "mlflow.db")) and not os.path.exists(os.path.join(folder, "wandb"))
    with open(os.path.join(folder, "run.json")) as f:
        assert "trackers" not in json.load(f)
    assert "trackers" not in harness.training_state(os.path.join(folder, "tiny-0000.model"))


def _wandb_rows(folder):
    """``{step: {figure: value}}`` over the offline W&B run files of ``folder``, launch after launch (a later
    launch's value of a step replaces an earlier one's, as the resumed run's does), and the run ids."""
    rows, ids = {}, []
    for run in sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*"))):
        (path,) = glob.glob(os.path.join(run, "run-*.wandb"))
        ids.append(os.path.basename(path)[len("run-"):-len(".wandb")])
        for row in history(path):
            rows.setdefault(row["trainer/step"], {}).update(
                {k: v for k, v in row.items() if not k.startswith("_") and k != "trainer/step"})
    return rows, ids


def _assert_tensorboards_points_in(rows, folder, epochs=3):
    """Every TensorBoard point of the run in ``folder``, training and validation, is the value of its figure at
    the same step in ``rows`` (``{step: {figure: value}}``)."""
    scalars = read_scalars(os.path.join(folder, "tensorboard_logs"))
    assert {"Train-Loss", "LR/Group_0", "Loss-Scale", "Skipped-Steps", "Speed/samples_per_s", "Time/data_s",
            "Memory/peak_MiB", "Val-Acc"} <= set(scalars), sorted(scalars)
    points = [(tag, step, value) for tag, series in scalars.items() for step, value in series]
    assert len(points) > 70 * epochs
    for tag, step, value in points:  # TensorBoard keeps float32 of the same figure (inf: a skipped step's norm)
        assert rows[step][tag] == value or close(rows[step][tag], value), (tag, step, rows[step][tag], value)
    assert sorted(step for step, row in rows.items() if "Val-Acc" in row) == [15, 31, 47][:epochs]


def test_wandb_offline_reports_tensorboards_figures_config_and_tags(tiny_cfg, tmp_path, capsys):
    """One epoch, one offline W&B run (its id in run.json and the checkpoint): every TensorBoard point at its step, the
    flattened config and run.json's tags as its config, config.yaml, run.json and curves.png in its files."""
    assert harness.run_here(tiny_cfg, tmp_path, opts=WANDB + ["TRAIN.END_EPOCH", 1]) == 0
    assert "does not answer" not in capsys.readouterr().out
    folder = harness.out_dir(tmp_path)
    rows, ids = _wandb_rows(folder)
    with open(os.path.join(folder, "run.json")) as f:
        record = json.load(f)
    assert ids == [record["trackers"]["wandb"]["run_id"]]
    assert harness.training_state(os.path.join(folder, "tiny-0000.model"))["trackers"] == {"wandb": ids[0]}
    _assert_tensorboards_points_in(rows, folder, epochs=1)
    (run,) = glob.glob(os.path.join(folder, "wandb", "offline-run-*"))
    config = {}
    for record_ in records(glob.glob(os.path.join(run, "run-*.wandb"))[0]):
        if record_.WhichOneof("record_type") == "config":
            config.update({item.key: json.loads(item.value_json) for item in record_.config.update})
    assert config["TRAIN.LR"] == "0.05" and config["LOG_FREQUENT"] == "1", sorted(config)[:20]
    assert config["run/git_commit"] == str(record["git"]["commit"])
    assert config["run/config_sha256"] == record["config_sha256"]
    assert {"config.yaml", "curves.png", "run.json"} <= set(os.listdir(os.path.join(run, "files")))


@pytest.mark.slow
def test_wandb_resumed_run_continues_its_run(tiny_cfg, tmp_path, capsys):
    """Epoch 0, then a resumed launch to the end (TRAIN.AUTO_RESUME from the epoch-0 checkpoint): one W&B run id
    (the checkpoint's, also in run.json), and every TensorBoard point is the last W&B value logged at its step."""
    assert harness.run_here(tiny_cfg, tmp_path, opts=WANDB + ["TRAIN.END_EPOCH", 1]) == 0
    assert harness.run_here(tiny_cfg, tmp_path, opts=WANDB) == 0
    out = capsys.readouterr().out
    assert "Resumed from" in out and "does not answer" not in out, out[-3000:]
    folder = harness.out_dir(tmp_path)
    rows, ids = _wandb_rows(folder)
    with open(os.path.join(folder, "run.json")) as f:
        record = json.load(f)
    assert len(ids) == 2 and ids[0] == ids[1] == record["trackers"]["wandb"]["run_id"], (ids, record.get("trackers"))
    _assert_tensorboards_points_in(rows, folder)
