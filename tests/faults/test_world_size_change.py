"""A mid-epoch checkpoint resumed on another number of processes: the two segments train each
sample of the interrupted epoch once (the tiny task through nondist_run.sh / dist_run_single.sh, gloo on CPU).

Layout: 64 samples, micro-batches of 2, k = 1, a checkpoint every 3 steps, one epoch; every rank is
killed at the start of its 5th micro-batch, so the last checkpoint holds 3 micro-batches of every rank.
"""
import collections
import math
import os

import pytest

from common.checkpoint.checkpointer import load_checkpoint_file
from tests.faults import harness, tiny_task

BATCH, DONE = 2, 3  # micro-batch size; micro-batches per rank in the checkpoint
OPTS = ["TRAIN.END_EPOCH", 1, "TRAIN.BATCH_IMAGES", BATCH, "TRAIN.GRAD_ACCUMULATE_STEPS", 1,
        "TRAIN.CHECKPOINT_STEPS", DONE]


def _loaded(log, nprocs, first=None):
    """Indices of epoch 0 each rank loaded (``first``: only its first ``first``), all ranks together."""
    out = []
    for rank in range(nprocs):
        with open("{}.{}".format(log, rank)) as f:
            indices = [int(line.split()[1]) for line in f if line.split()[0] == "0"]
        out += indices[:first]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("before,after", [(4, 2), (1, 2), (2, 1), (2, 3)])
def test_resume_on_another_world_size_trains_each_sample_once(tiny_cfg, tmp_path, before, after, strategy):
    """fsdp: sharded checkpoint folders (one rank too: launched with a process group), resharded on resume."""
    work, log = tmp_path / "work", str(tmp_path / "samples")
    opts, dist = OPTS + ["TRAIN.STRATEGY", strategy], strategy == "fsdp"
    rc, out, err = harness.run(tiny_cfg, work, nprocs=before, opts=opts, timeout=300, dist=dist,
                               faults={"FAULT_KILL_AT_BATCH": DONE + 2, "FAULT_SAMPLE_LOG": log + "1"})
    assert rc != 0, err[-2000:]
    names = harness.checkpoint_names(work)
    assert names == ["tiny-0000-b{:07d}.model".format(DONE)], names
    state = load_checkpoint_file(os.path.join(harness.out_dir(work), names[0]))["train_state"]
    assert (state["world_size"], state["epoch_units"]) == (before, before * DONE * BATCH)

    assert os.path.isdir(os.path.join(harness.out_dir(work), names[0])) == dist  # sharded: a folder
    rc, out, err = harness.run(tiny_cfg, work, nprocs=after, opts=opts, timeout=300, dist=dist,
                               faults={"FAULT_SAMPLE_LOG": log + "2"})
    assert rc == 0, err[-3000:]
    trained = _loaded(log + "1", before, DONE * BATCH) + _loaded(log + "2", after)
    counts = collections.Counter(trained)
    # each sample once; when the rest of the epoch does not divide by the new ranks (2 -> 3: 52 samples), the
    # sampler pads it with its first samples so that every rank runs as many steps (the collectives pair), as an
    # uninterrupted run on that many ranks pads its epoch: those few come twice
    pad = -(tiny_task.SIZES["train"] - before * DONE * BATCH) % after
    assert sorted(counts) == list(range(tiny_task.SIZES["train"])), counts
    assert sum(counts.values()) - len(counts) == pad and set(counts.values()) <= {1, 2}, (pad, counts)
    final = load_checkpoint_file(os.path.join(harness.out_dir(work), "tiny-0000.model"))["train_state"]
    assert (final["world_size"], final["epoch"], final["epoch_units"]) == (after, 1, 0)
    # one optimizer step (applied or skipped by the fp16 scaler) per micro-batch of a rank, counted on from
    # the checkpoint's: the rest of the epoch in batches of 2 on each new rank
    per_rank = math.ceil((tiny_task.SIZES["train"] - before * DONE * BATCH) / after)
    assert final["global_step"] + final["skipped_steps"] == DONE + math.ceil(per_rank / BATCH)
