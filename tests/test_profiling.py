"""TRAIN.PROFILE and the data-wait warning (common/diagnostics/profiling.py) through the tiny task's real entry
point."""
import json
import os
import re
import time

import torch

from tests.faults import harness, tiny_task


def test_profile_writes_trace_of_the_chosen_steps(tmp_path, capfd):
    """TRAIN.PROFILE [3, 2] in fp32 (every step applied): one Chrome trace holding the SGD steps 3 and 4 only,
    named by the log line. On the CPU, the profiler library prints nothing of its own (capfd: it writes to the
    process's stderr, not through Python)."""
    cfg = tiny_task.write_config(tmp_path)
    assert harness.run_here(cfg, tmp_path, opts=["TRAIN.PROFILE", "[3, 2]", "TRAIN.FP16", False,
                                                 "TRAIN.END_EPOCH", 1]) == 0
    out, err = capfd.readouterr()
    if not torch.cuda.is_available():  # (training runs on cuda:0 where there is one)
        assert "gpuGetDeviceCount" not in err and "profiler_start" not in err, err
    folder = os.path.join(harness.out_dir(tmp_path), "profile")
    assert os.listdir(folder) == ["rank0_steps3-4.pt.trace.json"]
    path = os.path.join(folder, "rank0_steps3-4.pt.trace.json")
    assert "profiler trace of optimizer steps 3-4 written: {} (".format(path) in out + err
    events = json.load(open(path))["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("Optimizer.step#SGD.step")]
    assert len(steps) == 2, sorted({e.get("name") for e in events})


def test_data_wait_warns_once_per_epoch(tmp_path, monkeypatch, capsys):
    """A loader 10 ms per sample behind a fast model: one warning in each of the 3 epochs, naming
    NUM_WORKERS_PER_GPU and the storage options; a slow model (FAULT_SLOW_BATCH_S) on fast data: none."""
    real = tiny_task.TinyData.__getitem__

    def slow(self, key):
        time.sleep(0.01)
        return real(self, key)
    monkeypatch.setattr(tiny_task.TinyData, "__getitem__", slow)
    cfg = tiny_task.write_config(tmp_path)
    assert harness.run_here(cfg, tmp_path / "slow_data", opts=["LOG_FREQUENT", 4]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in (out + err).splitlines() if "waiting for data took" in line]
    assert [re.search(r"epoch (\d)", w).group(1) for w in warnings] == ["0", "1", "2"], warnings
    assert "Raise NUM_WORKERS_PER_GPU (now 0)" in warnings[0] and "DATASET.ZIP_MODE" in warnings[0] \
        and "docs/data.md" in warnings[0]
    monkeypatch.undo()
    assert harness.run_here(cfg, tmp_path / "slow_model", monkeypatch,
                            faults={"FAULT_SLOW_BATCH_S": 0.05}, opts=["LOG_FREQUENT", 4, "TRAIN.END_EPOCH", 1]) == 0
    out, err = capsys.readouterr()
    assert "waiting for data took" not in out + err
