"""SIGKILL at random points -- inside an accumulation group, while a checkpoint is written, during
validation -- then TRAIN.AUTO_RESUME: the run ends with the uninterrupted run's parameters, optimizer,
loss scaler, LR scheduler, RNG states and validation record, bit for bit.

The points are drawn from a seed that changes every run (FAULT_SEED=n repeats one); failures print it.
"""
import os
import random
import signal
import time

import pytest

from tests.faults import harness

SEED = int(os.environ.get("FAULT_SEED", time.time_ns() % 10 ** 6))


def test_random_kills_then_auto_resume_match_uninterrupted_run(tiny_cfg, clean_state, tmp_path):
    rng = random.Random(SEED)
    work = tmp_path / "work"
    folder = harness.out_dir(work)
    note = "FAULT_SEED={}".format(SEED)

    # 1) after the first micro-batch of a group (k = 2): gradients of half a group exist, no step yet.
    #    64 samples / 4 = 16 micro-batches per epoch; the kill lands in epoch 0 or 1.
    kill_batch = rng.randrange(2, 32, 2)
    rc, out, err = harness.run(tiny_cfg, work, faults={"FAULT_KILL_AT_BATCH": kill_batch})
    assert rc == -signal.SIGKILL, (note, err[-2000:])
    saved = harness.checkpoint_names(work)

    # 2) resumed, then killed halfway through writing its n-th checkpoint file: a torn temporary file
    #    remains, every complete .model file is intact.
    save = rng.randint(1, 4)
    rc, out, err = harness.run(tiny_cfg, work, faults={"FAULT_KILL_IN_SAVE": save})
    assert rc == -signal.SIGKILL, (note, err[-2000:])
    assert "Resumed from" in out if saved else "Resumed from" not in out, note
    assert any(f.endswith(".tmp") for f in os.listdir(folder)), (note, os.listdir(folder))
    saved = harness.checkpoint_names(work)  # none when 1) stopped before the first and 2) in the first
    for name in saved:
        harness.training_state(os.path.join(folder, name))  # reads: no torn .model file

    # 3) resumed (the stale temporary file is removed), then killed during its first validation.
    rc, out, err = harness.run(tiny_cfg, work, faults={"FAULT_KILL_AT_VAL_BATCH": rng.randint(1, 2)})
    assert rc == -signal.SIGKILL, (note, err[-2000:])
    assert ("Resumed from" in out) == bool(saved) and "Val-Acc" not in out, note
    assert not any(f.endswith(".tmp") for f in os.listdir(folder)), note

    # 4) resumed to the end.
    rc, out, err = harness.run(tiny_cfg, work)
    assert rc == 0, (note, err[-2000:])
    assert "Resumed from" in out, note
    harness.assert_same(harness.training_state(os.path.join(folder, harness.FINAL)), clean_state, note)


@pytest.mark.slow  # 3 four-rank runs; the default suite resumes bit for bit on 2 ranks (the test above)
def test_a_rank_killed_on_4_ranks_then_auto_resume_matches_the_uninterrupted_run(tiny_cfg, tmp_path):
    """4 ranks (a ring all-reduce sums each element in an order set by its place in DDP's gradient buckets, which
    DDP would rebuild after a run's first step: the resumed run's first step would sum otherwise). Rank 2 dies
    in epoch 1; the resumed run starts at its epoch-0 checkpoint and ends bit for bit where the clean run ends
    (one computation reproducing itself)."""
    rc, out, err = harness.run(tiny_cfg, tmp_path / "clean", nprocs=4, timeout=300)
    assert rc == 0, err[-3000:]
    work = tmp_path / "work"
    rc, out, err = harness.run(tiny_cfg, work, nprocs=4, timeout=300,
                               faults={"FAULT_DIE_RANK": 2, "FAULT_KILL_AT_BATCH": 7})
    assert rc != 0, err[-3000:]
    rc, out, err = harness.run(tiny_cfg, work, nprocs=4, timeout=300)
    assert rc == 0 and "Resumed from" in err + out, err[-3000:]
    harness.assert_same(harness.training_state(os.path.join(harness.out_dir(work), harness.FINAL)),
                        harness.training_state(os.path.join(harness.out_dir(tmp_path / "clean"), harness.FINAL)))
