"""Exact resume: a real child process trains, is SIGKILLed (also in the middle of writing a
checkpoint), auto-resumes, and must end with the parameters of an uninterrupted run, bit for bit."""
import os
import random
import signal
import subprocess
import time

import pytest
import torch

from tests.tiny_train import SCRIPT, write_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def out_dir(model_dir):
    return os.path.join(str(model_dir), "output", "tiny", "train_train")


def launch(cfg, model_dir, nprocs=1, env=None, opts=(), **popen):
    """Start the tiny run through the launch scripts (nondist_run.sh or dist_run_single.sh)."""
    if nprocs == 1:
        cmd = [os.path.join(ROOT, "scripts", "nondist_run.sh"), SCRIPT, cfg, str(model_dir)]
    else:
        cmd = [os.path.join(ROOT, "scripts", "dist_run_single.sh"), str(nprocs), SCRIPT, cfg, str(model_dir)]
    if opts:
        cmd += ["--opts"] + list(opts)
    return subprocess.Popen(cmd, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def run(cfg, model_dir, **kwargs):
    proc = launch(cfg, model_dir, **kwargs)
    out, _ = proc.communicate(timeout=240)
    return proc.returncode, out


def final_params(model_dir):
    return torch.load(os.path.join(out_dir(model_dir), "final.pt"), weights_only=True)


def assert_bit_identical(a, b):
    assert a["global_step"] == b["global_step"]
    assert a["params"].keys() == b["params"].keys()
    for k in a["params"]:
        assert torch.equal(a["params"][k], b["params"][k]), k


def test_sigkill_during_save_and_after_step_resumes_exactly(tmp_path):
    cfg = write_config(tmp_path)
    rc, out = run(cfg, tmp_path / "clean")
    assert rc == 0, out
    reference = final_params(tmp_path / "clean")
    assert reference["global_step"] == 15  # 3 epochs x 5 steps

    # 1) killed while writing its 3rd checkpoint (the epoch-0 file, after step 5)
    work = tmp_path / "killed"
    rc, out = run(cfg, work, env={"TINY_KILL_IN_SAVE": "3"})
    assert rc == -signal.SIGKILL, out
    files = sorted(os.listdir(out_dir(work)))
    assert "tiny-0000-b0000008.model" in files and "tiny-0000.model" not in files
    assert any(f.startswith(".tiny-0000.model.") and f.endswith(".tmp") for f in files)

    # 2) resumes from the newest complete file (step 4), redoes step 5; killed after step 7
    rc, out = run(cfg, work, env={"TINY_KILL_AFTER_STEP": "7"})
    assert rc == -signal.SIGKILL, out
    assert "RESUMED tiny-0000-b0000008.model epoch 0 batch 8" in out
    assert not any(f.endswith(".tmp") for f in os.listdir(out_dir(work)))

    # 3) resumes mid-epoch 1 (step 6) and finishes
    rc, out = run(cfg, work)
    assert rc == 0, out
    assert "RESUMED tiny-0001-b0000002.model epoch 1 batch 2" in out
    assert_bit_identical(final_params(work), reference)
    kept = [f for f in os.listdir(out_dir(work)) if "-b" in f]
    assert len(kept) == 2  # TRAIN.CHECKPOINT_KEEP


def test_auto_resume_of_finished_run_trains_nothing(tmp_path):
    cfg = write_config(tmp_path)
    assert run(cfg, tmp_path / "m")[0] == 0
    first = final_params(tmp_path / "m")
    rc, out = run(cfg, tmp_path / "m")
    assert rc == 0 and "RESUMED tiny-0002.model epoch 3 batch 0" in out
    assert_bit_identical(final_params(tmp_path / "m"), first)


def _run_with_random_kills(cfg, work, nprocs, opts, max_kills, rng):
    """Relaunch until the run completes, killing the whole process group at a random moment
    shortly after a checkpoint file or temporary file appears."""
    kills = 0
    while True:
        proc = launch(cfg, work, nprocs=nprocs, opts=opts, start_new_session=True)
        seen = set(os.listdir(out_dir(work))) if os.path.isdir(out_dir(work)) else set()
        killed = False
        while proc.poll() is None and kills < max_kills:
            now = set(os.listdir(out_dir(work))) if os.path.isdir(out_dir(work)) else set()
            if any(f.endswith((".model", ".tmp")) for f in now - seen):
                time.sleep(rng.uniform(0, 0.05))
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.002)
        out, _ = proc.communicate(timeout=240)
        if killed:
            kills += 1
            continue
        assert proc.returncode == 0, out
        return kills


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [1, 2])
def test_random_sigkills_resume_exactly(tmp_path, nprocs):
    cfg = write_config(tmp_path)
    opts = ["TRAIN.END_EPOCH", "6"]
    rc, out = run(cfg, tmp_path / "clean", nprocs=nprocs, opts=opts)
    assert rc == 0, out
    kills = _run_with_random_kills(cfg, tmp_path / "killed", nprocs, opts, max_kills=4, rng=random.Random(nprocs))
    assert kills >= 1
    assert_bit_identical(final_params(tmp_path / "killed"), final_params(tmp_path / "clean"))
