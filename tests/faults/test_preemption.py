"""SIGTERM / SIGUSR1 (SLURM's preemption and ``--signal``) inside an accumulation group, on one of two
ranks, or during validation: the run saves the position where every rank stopped, exits with
PREEMPTED_EXIT_CODE, and TRAIN.AUTO_RESUME then ends bit for bit where an uninterrupted run ends.
A second signal exits at once, without a checkpoint.
"""
import os
import signal
import subprocess
import sys

import pytest

from common.runtime.preemption import PREEMPTED_EXIT_CODE
from tests.conftest import ROOT
from tests.faults import harness, tiny_task

# The paper configs save no mid-epoch checkpoints: the one the stop writes is the only one.
NO_STEP_FILES = ("TRAIN.CHECKPOINT_STEPS", 0)


def resume_to_end(tiny_cfg, work, clean_state, nprocs=1):
    rc, out, err = harness.run(tiny_cfg, work, opts=NO_STEP_FILES, nprocs=nprocs)
    assert rc == 0, err[-3000:]
    assert "Resumed from" in out
    final = os.path.join(harness.out_dir(work), harness.FINAL)
    harness.assert_same(harness.training_state(final), clean_state)


@pytest.mark.slow
@pytest.mark.parametrize("sig, batch, saved", [
    # 16 micro-batches per epoch, k = 2. Micro-batch 19 (1-based) is the first of a group in epoch 1:
    # the step ends after micro-batch 20, 4 micro-batches into epoch 1.
    ("TERM", 19, ["tiny-0000.model", "tiny-0001-b0000004.model", "tiny-best.model"]),
    # micro-batch 1 of the run, the first of the first group: saved after 2 micro-batches of epoch 0
    ("USR1", 1, ["tiny-0000-b0000002.model"]),
])
def test_signal_mid_group_saves_the_step_and_resumes_exactly(tiny_cfg, clean_state, tmp_path, sig, batch, saved):
    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, opts=NO_STEP_FILES,
                               faults={"FAULT_SIGNAL_AT_BATCH": "{}:{}".format(batch, sig)})
    assert rc == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "SIG{} received: stopping at the end of this optimizer step".format(sig) in out
    step_file = [name for name in saved if "-b" in name][0]
    assert "preempted: stopped at epoch {}, batch {}".format(int(step_file[5:9]), int(step_file[11:18])) in out
    assert harness.checkpoint_names(work) == saved
    resume_to_end(tiny_cfg, work, clean_state)


def test_second_signal_exits_at_once_without_checkpoint(tiny_cfg, tmp_path):
    # SIGUSR1 at the first micro-batch of a group, SIGTERM at the second, before the step ends
    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, opts=NO_STEP_FILES, faults={"FAULT_SIGNAL_AT_BATCH": "3:USR1,4:TERM"})
    assert rc == 128 + signal.SIGTERM, err[-3000:]
    assert "second stop signal (SIGTERM): exiting at once with code 143, without a checkpoint" in out
    assert harness.checkpoint_names(work) == []


@pytest.mark.slow
def test_signal_during_validation_lets_it_end_then_stops(tiny_cfg, clean_state, tmp_path):
    # the first validation batch of epoch 0's validation: validation ends, the epoch file is written, then the stop
    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, opts=NO_STEP_FILES, faults={"FAULT_SIGNAL_AT_VAL_BATCH": "1:TERM"})
    assert rc == PREEMPTED_EXIT_CODE, err[-3000:]
    assert "Epoch[0] \tVal-Acc=" in out
    assert "preempted: stopped at epoch 1, batch 0" in out
    assert harness.checkpoint_names(work) == ["tiny-0000.model", "tiny-best.model"]
    resume_to_end(tiny_cfg, work, clean_state)


@pytest.mark.slow
def test_signal_on_one_of_two_ranks_stops_both_at_one_step(tiny_cfg, tmp_path):
    clean = tmp_path / "clean"
    rc, out, err = harness.run(tiny_cfg, clean, nprocs=2, opts=NO_STEP_FILES, timeout=300)
    assert rc == 0, err[-3000:]
    clean_state = harness.training_state(os.path.join(harness.out_dir(clean), harness.FINAL))

    # 2 ranks: 8 micro-batches per epoch and rank; rank 1 only gets SIGUSR1 at its micro-batch 5 (a group's first)
    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, nprocs=2, opts=NO_STEP_FILES, timeout=300,
                               faults={"FAULT_DIE_RANK": 1, "FAULT_SIGNAL_AT_BATCH": "5:USR1"})
    log = out + err
    assert rc != 0, log[-3000:]
    assert "exitcode  : {}".format(PREEMPTED_EXIT_CODE) in log, log[-3000:]
    assert "preempted: stopped at epoch 0, batch 6" in log
    assert harness.checkpoint_names(work) == ["tiny-0000-b0000006.model"]
    resume_to_end(tiny_cfg, work, clean_state, nprocs=2)


@pytest.mark.slow
def test_slurm_launcher_requeues_a_preempted_job(tiny_cfg, tmp_path):
    bin_dir = harness.fake_slurm(tmp_path)  # srun with SLURM's variables, scontrol recording a requeue
    env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), SLURM_JOB_ID="4242",
               FAULT_SIGNAL_AT_BATCH="3:USR1")
    proc = subprocess.run([os.path.join(ROOT, "scripts", "dist_run_slurm.sh"), "part", "job", tiny_task.SCRIPT,
                           tiny_cfg, str(tmp_path / "w"), "1", "--opts"] + [str(o) for o in NO_STEP_FILES],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == PREEMPTED_EXIT_CODE, (proc.stdout + proc.stderr)[-3000:]
    assert "preempted: checkpoint saved; requeueing job 4242" in proc.stderr
    assert (bin_dir / "requeued").read_text().strip() == "requeue 4242"
    assert harness.checkpoint_names(tmp_path / "w") == ["tiny-0000-b0000004.model"]


# Run in a process of its own: the DataLoader's SIGCHLD handler of a pytest worker also checks the workers of
# loaders that earlier test files left registered there, and a dead one of those fails this test.
WORKERS_OUTLIVE_SIGNALS = """
import multiprocessing, os, signal, subprocess, sys, time
import torch
from common.runtime.preemption import worker_ignore_stop_signals
loader = torch.utils.data.DataLoader(list(range(8)), num_workers=2, persistent_workers=True,
                                     worker_init_fn=worker_ignore_stop_signals)
it = iter(loader)
# two items: batches go round-robin, so the second comes from worker 1, which has then run its init fn (a
# signal before that would find PyTorch's own handlers, as at any worker's start)
seen = [int(next(it)), int(next(it))]
workers = multiprocessing.active_children()
assert len(workers) == 2, workers
for sig in ("TERM", "USR1"):  # kill(1): another process, as SLURM's step daemon
    subprocess.run(["kill", "-s", sig] + [str(w.pid) for w in workers], check=True)
time.sleep(0.5)
seen += [int(x) for x in it]
assert seen == list(range(8)) and all(w.is_alive() for w in workers), seen
os.kill(workers[0].pid, signal.SIGTERM)  # from the parent (multiprocessing's terminate at exit): gone
workers[0].join(10)
assert workers[0].exitcode == 0, workers[0].exitcode
print("workers served", seen)
"""


def test_dataloader_workers_outlive_a_stop_signal_from_anyone_but_their_parent():
    # SLURM signals every process of the step: the workers must keep serving their rank
    proc = subprocess.run([sys.executable, "-c", WORKERS_OUTLIVE_SIGNALS], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0 and "workers served [0, 1, 2, 3, 4, 5, 6, 7]" in proc.stdout, proc.stderr[-3000:]
