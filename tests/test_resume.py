"""TRAIN.AUTO_RESUME and TensorBoard after a crash, through the launch script and vcr/train_end2end.py.

A tiny run (tests/tiny_vcr.py: 2 epochs of 4 optimizer steps, a mid-epoch checkpoint every 3 steps,
dropout on) is SIGKILLed while writing a checkpoint and after a step (tests/fault_injection.py),
auto-resumes, and must end with the state of an uninterrupted run, bit for bit, and with one
TensorBoard point per step.
"""
import os
import random
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch

from tests.tiny_vcr import (LAUNCH_ENV, PREFIX, ROOT, checkpoint, launch_command, log_text, output_folder,
                            tensorboard_scalars, train_in_process)

SCRIPT = os.path.join(ROOT, "tests", "fault_injection.py")
RESUME_OPTS = {"TRAIN__END_EPOCH": 2, "TRAIN__CHECKPOINT_STEPS": 3}
# Scalars of one step or one validation (the Train-<metric> scalars are running means over the
# epoch, which restart at a mid-epoch resume; Speed and Memory depend on the process).
EXACT_TAGS = ("Train-Loss", "LR/Group_0", "Loss-Scale", "grad-para/Total-Norm", "Skipped-Steps", "Val-Acc")


def launch(model_dir, opts, nprocs=1, env=None, **popen):
    cmd = launch_command(SCRIPT, model_dir, opts, nprocs)
    return subprocess.Popen(cmd, env=dict(os.environ, **LAUNCH_ENV, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def run(model_dir, opts, **kwargs):
    proc = launch(model_dir, opts, **kwargs)
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def files(model_dir):
    return sorted(os.listdir(output_folder(model_dir)))


def assert_same_training_state(a, b):
    """Model, optimizer, loss scaler, schedule, progress and validation of two checkpoints, bit for bit (exact:
    a resumed run must reproduce the uninterrupted one, the same computation in one process)."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for k in a["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["momentum_buffer"], sb[i]["momentum_buffer"]) for i in sa)
    for key in ("amp", "lr_scheduler", "train_state", "validation_monitor"):
        assert a[key] == b[key], key


@pytest.fixture(scope="module")
def opts(tiny_vcr):
    return tiny_vcr.opts(**RESUME_OPTS)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, opts):
    """An uninterrupted run."""
    model_dir = tmp_path_factory.mktemp("clean")
    rc, out = run(model_dir, opts)
    assert rc == 0, out[-3000:]
    return model_dir


@pytest.fixture(scope="module")
def killed(tmp_path_factory, opts):
    """The same run killed twice and resumed; returns (model dir, output of each start)."""
    model_dir = tmp_path_factory.mktemp("killed")
    outs = []
    # 1) killed while writing its 2nd checkpoint file, the epoch-0 file (after step 4); the mid-epoch
    #    file of step 3 (epoch 0, 6 micro-batches done) is complete
    rc, out = run(model_dir, opts, env={"FAULT_KILL_IN_SAVE": "2"})
    assert rc == -signal.SIGKILL, out[-3000:]
    names = files(model_dir)
    assert PREFIX + "-0000-b0000006.model" in names and PREFIX + "-0000.model" not in names, names
    assert any(n.startswith("." + PREFIX + "-0000.model.") and n.endswith(".tmp") for n in names), names
    outs.append(out)
    # 2) resumes at step 3, redoes step 4 and the epoch end; killed after step 7 (last checkpoint: step 6)
    rc, out = run(model_dir, opts, env={"FAULT_KILL_AFTER_STEP": "7"})
    assert rc == -signal.SIGKILL, out[-3000:]
    assert not any(n.endswith(".tmp") for n in files(model_dir))
    outs.append(out)
    # 3) resumes at step 6 (epoch 1, 4 micro-batches done) and finishes
    rc, out = run(model_dir, opts)
    assert rc == 0, out[-3000:]
    outs.append(out)
    return model_dir, outs


def test_sigkill_during_save_and_after_step_resumes_exactly(clean, killed):
    model_dir, outs = killed
    assert "Resumed from {}: epoch 0, batch 6, optimizer step 3".format(
        os.path.join(output_folder(model_dir), PREFIX + "-0000-b0000006.model")) in outs[1]
    assert "Resumed from {}: epoch 1, batch 4, optimizer step 6".format(
        os.path.join(output_folder(model_dir), PREFIX + "-0001-b0000004.model")) in outs[2]
    final = checkpoint(model_dir, 1)
    assert final["train_state"]["global_step"] == 8
    assert_same_training_state(final, checkpoint(clean, 1))
    assert len([n for n in files(model_dir) if re.search(r"-b\d{7}\.model$", n)]) == 2  # TRAIN.CHECKPOINT_KEEP


def test_tensorboard_after_kill_and_resume_has_one_point_per_step(clean, killed):
    """The run killed after step 7 had written (and flushed) the points of steps 5-7; the resumed run
    starts at x = 12 (epoch 1, batch 4) and writes step 7 again: TensorBoard must show each x once,
    with the values of the uninterrupted run."""
    got, expected = tensorboard_scalars(killed[0]), tensorboard_scalars(clean)
    assert got.keys() == expected.keys() and "Train-Loss" in got
    steps = [2 * i + 1 for i in range(8)]  # the micro-batch ending each of the 8 steps
    for tag, points in got.items():
        xs = [x for x, _ in points]
        assert xs == ([7, 15] if tag.startswith("Val-") else steps), tag
        if tag in EXACT_TAGS:
            assert points == expected[tag], tag


def test_auto_resume_of_finished_run_trains_nothing(clean, opts):
    before = os.path.getmtime(os.path.join(output_folder(clean), PREFIX + "-0001.model"))
    rc, out = run(clean, opts)
    assert rc == 0, out[-3000:]
    assert "epoch 2, batch 0, optimizer step 8" in out and "Epoch[1] Batch" not in out
    assert os.path.getmtime(os.path.join(output_folder(clean), PREFIX + "-0001.model")) == before


def test_without_auto_resume_a_run_starts_over(tmp_path, clean, tiny_vcr):
    """AUTO_RESUME false in a folder with checkpoints: epoch 0 again, to the same weights."""
    model_dir = tmp_path / "again"
    shutil.copytree(clean, model_dir)
    for name in files(model_dir):
        if name.endswith(".log"):  # (the clean run's lines)
            os.remove(os.path.join(output_folder(model_dir), name))
    opts = tiny_vcr.opts(TRAIN__END_EPOCH=1, TRAIN__AUTO_RESUME=False)
    assert train_in_process(model_dir, opts) == 0
    log = log_text(model_dir)
    assert "Resumed from" not in log and "Epoch[0] Batch [7]" in log
    a, b = checkpoint(model_dir, 0), checkpoint(clean, 0)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def _run_with_random_kills(work, opts, nprocs, max_kills, rng):
    """Relaunch until the run completes, killing the whole process group at a random moment
    shortly after a checkpoint file or temporary file appears."""
    kills = 0
    folder = output_folder(work)
    while True:
        proc = launch(work, opts, nprocs=nprocs, start_new_session=True)
        seen = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        killed = False
        while proc.poll() is None and kills < max_kills:
            now = set(os.listdir(folder)) if os.path.isdir(folder) else set()
            if any(f.endswith((".model", ".tmp")) for f in now - seen):
                time.sleep(rng.uniform(0, 0.05))
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.002)
        out, _ = proc.communicate(timeout=600)
        if killed:
            kills += 1
            continue
        assert proc.returncode == 0, out[-3000:]
        return kills


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_random_sigkills_resume_exactly(tmp_path, tiny_vcr, nprocs):
    opts = tiny_vcr.opts(TRAIN__END_EPOCH=3, TRAIN__CHECKPOINT_STEPS=1)
    rc, out = run(tmp_path / "clean", opts, nprocs=nprocs)
    assert rc == 0, out[-3000:]
    kills = _run_with_random_kills(tmp_path / "killed", opts, nprocs, max_kills=4, rng=random.Random(nprocs))
    assert kills >= 1
    assert_same_training_state(checkpoint(tmp_path / "killed", 2), checkpoint(tmp_path / "clean", 2))
