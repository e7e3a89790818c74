"""scripts/dist_run_slurm.sh under SLURM's ways of stopping a job, on a stand-in srun (tests/fake_slurm)
that signals and kills as the real one does: 2 tasks of the tiny task with 2 DataLoader workers each.

SLURM signals every process of the step, workers included; srun --kill-on-bad-exit kills the other
ranks once one exits 75; ``--signal=B:USR1`` signals the batch shell alone; ``scontrol requeue``
requeues the job itself. Each run must save the step it stopped at, exit 75, be requeued exactly once,
and resume to the uninterrupted run's final state, bit for bit.
(tests/test_slurm_cluster.py does the same on a real one-node SLURM, with --runslow.)
"""
import os
import signal
import socket
import subprocess
import time

import pytest

from common.runtime.preemption import PREEMPTED_EXIT_CODE
from tests.conftest import ROOT
from tests.faults import harness, tiny_task
from tests.test_distributed import free_port

LAUNCHER = os.path.join(ROOT, "scripts", "dist_run_slurm.sh")
# 2 DataLoader workers per rank (the default configs use workers; the other fault tests use none).
OPTS = ("NUM_WORKERS_PER_GPU", 2, "TRAIN.CHECKPOINT_STEPS", 0)
JOB_ID = "4242"


def launch(tmp_path, work, env=None):
    """dist_run_slurm.sh with 2 tasks of the tiny task on the fake srun, as job JOB_ID; its output goes to a
    file (read by :func:`finish`). Returns the Popen."""
    bin_dir = os.path.join(str(tmp_path), "bin")
    if not os.path.isdir(bin_dir):
        harness.fake_slurm(tmp_path)
    full_env = dict(os.environ, PATH="{}:{}".format(bin_dir, os.environ["PATH"]), SLURM_JOB_ID=JOB_ID,
                    MASTER_PORT=str(free_port()), **(env or {}))
    cmd = [LAUNCHER, "part", "tiny", tiny_task.SCRIPT, str(tmp_path / "tiny.yaml"), str(work), "2",
           "--opts"] + [str(o) for o in OPTS]
    with open(str(tmp_path / "launcher.log"), "w") as log:
        proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = str(tmp_path / "launcher.log")
    return proc


def finish(proc, timeout=300):
    """Wait for ``proc`` (from :func:`launch`): ``(returncode, its output)``."""
    proc.wait(timeout=timeout)
    with open(proc.log) as f:
        return proc.returncode, f.read()


@pytest.fixture(scope="module")
def clean2(tmp_path_factory):
    """The final state of an uninterrupted 2-task run through the launcher (workers on)."""
    tmp = tmp_path_factory.mktemp("clean2")
    tiny_task.write_config(tmp)
    rc, log = finish(launch(tmp, tmp / "work"))
    assert rc == 0, log[-3000:]
    return harness.training_state(os.path.join(harness.out_dir(tmp / "work"), harness.FINAL))


def requeues(tmp_path):
    path = tmp_path / "bin" / "requeued"
    return path.read_text().splitlines() if path.exists() else []


def resume_matches(tmp_path, work, clean2):
    rc, log = finish(launch(tmp_path, work))
    assert rc == 0, log[-3000:]
    assert "Resumed from" in log
    harness.assert_same(harness.training_state(os.path.join(harness.out_dir(work), harness.FINAL)), clean2)


@pytest.fixture
def cfg_dir(tmp_path):
    tiny_task.write_config(tmp_path)
    return tmp_path


def test_sigterm_to_every_process_of_the_step_with_workers(cfg_dir, clean2):
    # rank 0, at its micro-batch 5, sends SIGTERM to both ranks and their 4 workers, as scancel --signal=TERM does
    work, pids = cfg_dir / "work", cfg_dir / "pids"
    pids.mkdir()
    rc, log = finish(launch(cfg_dir, work, env={"FAULT_PID_DIR": str(pids), "FAULT_DIE_RANK": "0",
                                                "FAULT_SIGNAL_STEP_AT_BATCH": "5:TERM"}))
    assert rc == PREEMPTED_EXIT_CODE, log[-3000:]
    assert "is killed by signal" not in log
    assert "SIGTERM received: stopping at the end of this optimizer step" in log
    assert "preempted: checkpoint saved; requeueing job {}".format(JOB_ID) in log
    assert requeues(cfg_dir) == ["requeue " + JOB_ID]
    assert harness.checkpoint_names(work) == ["tiny-0000-b0000006.model"]
    resume_matches(cfg_dir, work, clean2)


def test_rank_0_slow_to_close_is_not_killed_by_a_rank_that_exits_first(cfg_dir):
    # rank 0 takes 3 s more to close its TensorBoard writer; srun --kill-on-bad-exit would kill it
    # (exit 137) as soon as rank 1 exits 75
    work = cfg_dir / "work"
    rc, log = finish(launch(cfg_dir, work, env={"FAULT_SIGNAL_AT_BATCH": "3:USR1", "FAULT_CLOSE_DELAY_S": "3"}))
    assert rc == PREEMPTED_EXIT_CODE, log[-3000:]
    assert requeues(cfg_dir) == ["requeue " + JOB_ID]
    assert harness.checkpoint_names(work) == ["tiny-0000-b0000004.model"]


@pytest.mark.slow  # the SIGTERM test above covers a signal reaching every task in the default suite
def test_usr1_to_the_batch_shell_reaches_the_tasks(cfg_dir):
    # sbatch --signal=B:USR1@90 signals the batch shell (the launcher) alone
    work = cfg_dir / "work"
    proc = launch(cfg_dir, work, env={"FAULT_SLOW_BATCH_S": "0.3"})  # 7 s of training: time to signal it
    deadline = time.time() + 120
    while "Epoch[0] Batch [" not in open(proc.log).read():  # the loaders and their workers are up
        assert time.time() < deadline and proc.poll() is None, "training did not start"
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    rc, log = finish(proc)
    assert rc == PREEMPTED_EXIT_CODE, log[-3000:]
    assert "SIGUSR1: passed on to the tasks" in log
    assert "SIGUSR1 received: stopping at the end of this optimizer step" in log
    assert requeues(cfg_dir) == ["requeue " + JOB_ID]
    assert len(harness.checkpoint_names(work)) == 1


@pytest.mark.parametrize("job, message", [
    # scontrol requeue (or preemption): SLURM has counted the restart (Restarts=1) before the tasks exit 75
    pytest.param({"FAKE_RESTARTS": "1"}, "preempted: checkpoint saved; SLURM has requeued job 4242 already",
                 marks=pytest.mark.slow),
    # scancel JOBID: the job is ending without a reason (a time limit would give Reason=TimeLimit)
    ({"FAKE_JOB_STATE": "COMPLETING"}, "stopped: checkpoint saved; job 4242 was cancelled (scancel), so it is not "
                                       "requeued"),
], ids=["requeued", "cancelled"])  # requeued: slow (the real cluster's requeue test, and cancelled here, stay)
def test_a_job_that_slurm_requeued_or_cancelled_is_not_requeued(cfg_dir, job, message):
    work = cfg_dir / "work"
    rc, log = finish(launch(cfg_dir, work, env=dict(job, FAULT_SIGNAL_AT_BATCH="3:TERM")))
    assert rc == PREEMPTED_EXIT_CODE, log[-3000:]
    assert message in log
    assert requeues(cfg_dir) == []
    assert harness.checkpoint_names(work) == ["tiny-0000-b0000004.model"]


def test_a_step_that_srun_cannot_end_is_ended_after_step_end_s(cfg_dir):
    # rank 1 dies; srun, as when the dead rank's node is cut off, never learns the step ended: the launcher
    # kills it STEP_END_S s after the first failed task. Rank 0 names the lost rank before that (~10 s).
    tic = time.time()
    rc, log = finish(launch(cfg_dir, cfg_dir / "work", env={
        "FAKE_SRUN_CUT_OFF": "1", "STEP_END_S": "15", "FAULT_DIE_RANK": "1", "FAULT_KILL_AT_BATCH": "3"}))
    elapsed = time.time() - tic
    assert rc == 128 + signal.SIGKILL, log[-3000:]  # rank 1's code, the first failed task's
    assert "error: srun has not ended the step 15 s after a task failed (a node cut off?): ending it" in log
    assert elapsed < 90, elapsed
    host = socket.gethostname()
    lost = [line for line in log.splitlines() if "error: lost peer:" in line]
    assert len(lost) == 1 and "error: lost peer: rank 1 on {}; rank 0 on {} stops: the collective failed: ".format(
        host, host) in lost[0], log[-3000:]


def test_step_end_s_must_be_whole_seconds(cfg_dir):
    rc, log = finish(launch(cfg_dir, cfg_dir / "work", env={"STEP_END_S": "1m"}))
    assert rc == 2 and "error: STEP_END_S must be a whole number of seconds, got '1m'" in log, log
