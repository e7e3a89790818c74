"""REPORT_TO (common/trackers), through the tiny task's real entry point: the key's check; a default run imports
no tracker; W&B offline and MLflow (its SQLite store in the run folder; a real ``mlflow server`` on 127.0.0.1)
hold TensorBoard's figures at TensorBoard's steps, the config and run.json's tags; one tracker run across a
resume (SIGKILL + TRAIN.AUTO_RESUME); a server that is down at start or killed mid-run never stops training.
On the SLURM cluster: tests/faults/test_slurm_cluster.py."""
import glob
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from common.diagnostics.tb_events import read_scalars
from tests.conftest import ROOT
from tests.faults import harness
from tests.faults.tracker_stores import default_store, mlflow_rows, mlflow_runs
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


def test_a_tracker_whose_package_is_missing_is_one_error_line(tiny_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec gives None
    assert harness.run_here(tiny_cfg, tmp_path, opts=WANDB) == 2
    errors, text = _error_lines(capsys)
    assert errors == ["error: REPORT_TO names 'wandb', whose package is not installed: pip install -r "
                      "requirements-track.txt"] and "Traceback" not in text, text


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


def test_a_run_without_tensorboard_in_report_to_writes_no_events(tiny_cfg, tmp_path):
    assert harness.run_here(tiny_cfg, tmp_path, opts=["REPORT_TO", "[]", "TRAIN.END_EPOCH", 1]) == 0
    folder = harness.out_dir(tmp_path)
    assert not os.path.exists(os.path.join(folder, "tensorboard_logs"))
    assert os.path.exists(os.path.join(folder, "tiny-0000.model")) and os.path.exists(os.path.join(folder, "run.json"))


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
    assert "reports to it no more" not in capsys.readouterr().out
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
    assert "Resumed from" in out and "reports to it no more" not in out, out[-3000:]
    folder = harness.out_dir(tmp_path)
    rows, ids = _wandb_rows(folder)
    with open(os.path.join(folder, "run.json")) as f:
        record = json.load(f)
    assert len(ids) == 2 and ids[0] == ids[1] == record["trackers"]["wandb"]["run_id"], (ids, record.get("trackers"))
    _assert_tensorboards_points_in(rows, folder)


# ------------------------------------------------------------------------------------------------ MLflow (slow:
# importing mlflow and creating a SQLite store take 10-20 s on a busy 2-core machine)
MLFLOW = ["REPORT_TO", "['tensorboard','mlflow']"]
TIMING = ("Speed/", "Time/", "Memory/")  # figures of the clock and the machine: a resumed run measures its own


@pytest.mark.slow
def test_mlflow_run_holds_tensorboards_figures_params_tags_artifacts_and_tabled(tiny_cfg, tmp_path, capsys):
    """The default store in the run folder: experiment = the config's name, run = the folder's; every
    TensorBoard point at its step; the flattened config as params; run.json's tags; config.yaml, run.json and
    curves.png as artifacts; tools/results_table.py --mlflow gives the row it gives from the folder."""
    assert harness.run_here(tiny_cfg, tmp_path, opts=MLFLOW) == 0
    assert "reports to it no more" not in capsys.readouterr().out
    folder = harness.out_dir(tmp_path)
    (run,), store = mlflow_runs(default_store(folder))
    with open(os.path.join(folder, "run.json")) as f:
        record = json.load(f)
    assert record["trackers"]["mlflow"]["run_id"] == run.info.run_id and run.info.status == "FINISHED"
    assert harness.training_state(os.path.join(folder, harness.FINAL))["trackers"] == {"mlflow": run.info.run_id}
    assert store.get_experiment(run.info.experiment_id).name == "tiny" and run.info.run_name == "train_train"
    _assert_tensorboards_points_in(mlflow_rows(store, run.info.run_id), folder)
    params = run.data.params
    assert params["TRAIN.LR"] == "0.05" and params["LOG_FREQUENT"] == "1" and params["REPORT_TO"] == \
        "['tensorboard', 'mlflow']" and len(params) > 60
    tags = run.data.tags
    assert (tags["git_commit"], tags["git_dirty"], tags["world_size"], tags["strategy"], tags["config_sha256"]) == (
        str(record["git"]["commit"]), str(record["git"]["dirty"]), "1", "single", record["config_sha256"])
    assert sorted(a.path for a in store.list_artifacts(run.info.run_id)) == ["config.yaml", "curves.png", "run.json"]
    tool = __import__("runpy").run_path(os.path.join(ROOT, "tools", "results_table.py"))
    capsys.readouterr()
    assert tool["main"]([folder]) == 0
    from_folder = capsys.readouterr().out.splitlines()
    assert tool["main"](["--mlflow", default_store(folder), "--experiment", "tiny"]) == 0
    assert capsys.readouterr().out.splitlines() == from_folder and len(from_folder) == 3


@pytest.mark.slow
def test_sigkill_then_auto_resume_continues_one_mlflow_run_with_every_step(tiny_cfg, tmp_path):
    """SIGKILL in epoch 1 (after the dead run logged steps past its checkpoint), then TRAIN.AUTO_RESUME: one
    MLflow run (the checkpoint's id) whose history holds every step of an uninterrupted run, and every point of
    the resumed run's TensorBoard, as the last value logged at its step; the loss, LR, loss scale, skipped steps,
    gradient norm and validation metrics are the uninterrupted run's, exactly (resume reproduces the computation
    bit for bit); the steps the dead run logged past its checkpoint show twice."""
    assert harness.run_here(tiny_cfg, tmp_path / "clean", opts=MLFLOW) == 0
    (clean,), clean_store = mlflow_runs(default_store(harness.out_dir(tmp_path / "clean")))
    expected = mlflow_rows(clean_store, clean.info.run_id)

    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, faults={"FAULT_KILL_AT_BATCH": 23}, opts=MLFLOW, timeout=300)
    assert rc == -signal.SIGKILL, err[-3000:]
    rc, out, err = harness.run(tiny_cfg, work, opts=MLFLOW, timeout=300)
    assert rc == 0 and "Resumed from" in out + err and "reports to it no more" not in out + err, err[-3000:]
    folder = harness.out_dir(work)
    (run,), store = mlflow_runs(default_store(folder))
    with open(os.path.join(folder, "run.json")) as f:
        assert json.load(f)["trackers"]["mlflow"]["run_id"] == run.info.run_id
    got = mlflow_rows(store, run.info.run_id)
    _assert_tensorboards_points_in(got, folder)
    assert sorted(got) == sorted(expected)
    for step, figures in expected.items():
        assert sorted(got[step]) == sorted(figures), step
        for key, value in figures.items():
            if key.startswith(TIMING) or key.startswith("Train-") and key != "Train-Loss":
                continue  # the clock's figures; an epoch's running training metric restarts at a mid-epoch resume
            assert got[step][key] == value or math.isnan(value) and math.isnan(got[step][key]), (
                step, key, got[step][key], value)
    twice = [m.step for m in store.get_metric_history(run.info.run_id, "Train-Loss")]
    assert len(twice) > len(set(twice)), "the dead run logged no step past its checkpoint: kill later"


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` (SQLite backend, artifacts proxied) on a free 127.0.0.1 port, in its own process
    group: ``(uri, stop)``; ``stop(sig)`` sends ``sig`` to the group (the server and its workers): SIGKILL ends
    it, SIGSTOP freezes it (connections are accepted, never answered); the group is killed afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = "http://127.0.0.1:{}".format(port)
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1", "--port",
         str(port), "--workers", "1", "--backend-store-uri", "sqlite:///" + str(tmp_path / "server.db"),
         "--artifacts-destination", str(tmp_path / "server_artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(sig=signal.SIGKILL):
        if server.poll() is None:
            os.killpg(server.pid, sig)
            if sig == signal.SIGKILL:
                server.wait()
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2):
                break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "mlflow server did not start"
            time.sleep(1)
    yield uri, stop
    stop()


def _warnings_naming(text, uri):
    return [line for line in text.splitlines() if "reports to it no more" in line and uri in line]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_an_mlflow_server_killed_mid_run_never_stops_training(tiny_cfg, clean_state, mlflow_server, tmp_path, sig):
    """MLFLOW_TRACKING_URI names a real server; once it holds the run's first figures it is SIGKILLed, or frozen
    (SIGSTOP: each call then waits for its timeout): one warning line naming the URI, training goes on to the
    uninterrupted run's end, bit for bit, TensorBoard complete."""
    uri, stop = mlflow_server
    proc = harness.launch(tiny_cfg, tmp_path, opts=MLFLOW, faults={"FAULT_SLOW_BATCH_S": 0.3,
                                                                  "MLFLOW_TRACKING_URI": uri})
    folder = harness.out_dir(tmp_path)
    deadline = time.time() + 300
    while True:  # the run's first figures are on the server
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        runs, store = mlflow_runs(uri)
        if runs and store.get_metric_history(runs[0].info.run_id, "Train-Loss"):
            break
        time.sleep(1)
    stop(sig)
    stopped = time.time()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert len(_warnings_naming(out + err, uri)) == 1, (out + err)[-3000:]
    print("the run went on {:.0f} s after the server got {}".format(time.time() - stopped, sig.name))
    state = harness.training_state(os.path.join(folder, harness.FINAL))
    assert state.pop("trackers") == {"mlflow": runs[0].info.run_id}
    harness.assert_same(state, clean_state)
    scalars = read_scalars(os.path.join(folder, "tensorboard_logs"))
    assert len(scalars["Train-Loss"]) == 24 and len(scalars["Val-Acc"]) == 3


@pytest.mark.slow
def test_an_mlflow_server_down_at_start_is_one_warning(tiny_cfg, tmp_path):
    """MLFLOW_TRACKING_URI names a port nothing listens on: one warning line naming it, the run ends well with
    TensorBoard complete, and its start costs a few seconds at most."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        uri = "http://127.0.0.1:{}".format(s.getsockname()[1])  # closed when the run starts
    started = time.time()
    rc, out, err = harness.run(tiny_cfg, tmp_path, opts=MLFLOW, faults={"MLFLOW_TRACKING_URI": uri}, timeout=300)
    assert rc == 0 and len(_warnings_naming(out + err, uri)) == 1, (out + err)[-3000:]
    print("run with the server down: {:.0f} s".format(time.time() - started))
    scalars = read_scalars(os.path.join(harness.out_dir(tmp_path), "tensorboard_logs"))
    assert len(scalars["Train-Loss"]) == 24 and len(scalars["Val-Acc"]) == 3
