"""Resume guarantees of TRAIN.STRATEGY 'fsdp' (sharded DCP checkpoint folders) on the tiny task, 2 gloo ranks through
scripts/dist_run_single.sh: fp16 with a dynamic loss scale, k = 2, clipping, a checkpoint every 2 optimizer steps.
(Resume on another world size: tests/faults/test_world_size_change.py, parametrized by strategy.)
"""
import os
import shutil

import pytest

from common.checkpoint.checkpointer import load_checkpoint_file
from common.errors import CheckpointError
from tests.faults import harness

FSDP = ["TRAIN.STRATEGY", "fsdp"]
KILL_AT = 14  # micro-batch 6 of epoch 1 on each rank (8 per epoch): the last checkpoint is mid-epoch (batch 4)
TOL = 1e-5  # DDP and FSDP sum the gradients in another order


def _final(work):
    return harness.training_state(os.path.join(harness.out_dir(work), harness.FINAL))


@pytest.fixture(scope="module")
def clean_runs(tiny_cfg, tmp_path_factory):
    """The final states of uninterrupted 2-rank runs, ``{strategy: state}``."""
    out = {}
    for strategy in ("ddp", "fsdp"):
        work = tmp_path_factory.mktemp("clean_" + strategy)
        rc, _, err = harness.run(tiny_cfg, work, nprocs=2, opts=["TRAIN.STRATEGY", strategy], timeout=300)
        assert rc == 0, err[-3000:]
        out[strategy] = _final(work)
    return out


def _assert_close(a, b):
    """Same steps applied and skipped, weights within TOL."""
    for key in ("epoch", "global_step", "skipped_steps", "epoch_batch"):
        assert a["train_state"][key] == b["train_state"][key], key
    assert a["amp"] == b["amp"]
    worst = max(float((a["state_dict"][k] - v).abs().max()) for k, v in b["state_dict"].items())
    assert worst < TOL, worst


@pytest.mark.slow
def test_fsdp_fp16_run_skips_the_steps_ddp_skips(clean_runs):
    assert clean_runs["fsdp"]["train_state"]["skipped_steps"] > 0  # the dynamic scale starts too high
    _assert_close(clean_runs["fsdp"], clean_runs["ddp"])


@pytest.mark.slow
@pytest.mark.parametrize("save", ["sync", "async"])
def test_sigkill_mid_epoch_then_auto_resume_is_bit_identical(tiny_cfg, clean_runs, tmp_path, save):
    """``async`` (TRAIN.ASYNC_CHECKPOINT): the kill comes once the background save of batch 4 has its name, two
    micro-batches after it and before any later save or the run's end could have waited for it."""
    work = tmp_path / "work"
    folder = harness.out_dir(work)
    opts = FSDP + ["TRAIN.ASYNC_CHECKPOINT", save == "async"]
    faults = {"FAULT_KILL_AT_BATCH": KILL_AT, "FAULT_KILL_WHEN_NAMED": os.path.join(folder, "tiny-0001-b0000004.model")}
    rc, _, err = harness.run(tiny_cfg, work, nprocs=2, opts=opts, timeout=300, faults=faults)
    assert rc != 0, err[-2000:]
    names = harness.checkpoint_names(work)
    assert "tiny-0001-b0000004.model" in names, names
    assert all(os.path.isdir(os.path.join(folder, n)) for n in names)  # sharded folders, no torn one named
    torn = tmp_path / "torn.model"  # a copy of the newest with rank 1's shard lost: refused by name
    shutil.copytree(os.path.join(folder, "tiny-0001-b0000004.model"), torn)
    os.remove(torn / "__1_0.distcp")
    with pytest.raises(CheckpointError, match="torn.model is not a readable sharded checkpoint"):
        load_checkpoint_file(str(torn))
    rc, out, err = harness.run(tiny_cfg, work, nprocs=2, opts=opts, timeout=300)
    assert rc == 0, err[-3000:]
    assert "Resumed from" in out + err and "tiny-0001-b0000004.model" in out + err
    assert "tiny-0001-b0000004.model: each rank its shards" in out + err  # read shard by shard, not whole
    # the same process count, strategy and order of sums: exact (bit for bit); of async saves, each holds the
    # state at its own step, not a later one's
    harness.assert_same(_final(work), clean_runs["fsdp"])


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_checkpoint_of_one_strategy_resumes_under_the_other(tiny_cfg, clean_runs, tmp_path, first, second):
    work = tmp_path / "work"
    rc, _, err = harness.run(tiny_cfg, work, nprocs=2, opts=["TRAIN.STRATEGY", first], timeout=300,
                             faults={"FAULT_KILL_AT_BATCH": KILL_AT})
    assert rc != 0, err[-2000:]
    assert "tiny-0001-b0000004.model" in harness.checkpoint_names(work)
    rc, out, err = harness.run(tiny_cfg, work, nprocs=2, opts=["TRAIN.STRATEGY", second], timeout=300)
    assert rc == 0, err[-3000:]
    assert "tiny-0001-b0000004.model" in out + err
    final = _final(work)
    assert os.path.isdir(os.path.join(harness.out_dir(work), harness.FINAL)) == (second == "fsdp")
    _assert_close(final, clean_runs[second])
    _assert_close(final, clean_runs[first])


@pytest.mark.slow
def test_a_head_without_gradients_and_the_ema_resume_bit_identical(tiny_cfg, tmp_path):
    """A head that no forward uses (registered first): its parameters never get a gradient, so the optimizer has
    no state for its first two parameters; with an EMA copy (sharded as the model, read into its shards too).
    SIGKILL mid-epoch, then AUTO_RESUME (shard by shard) ends as the uninterrupted run of the same model."""
    unused = {"FAULT_UNUSED_HEAD": 1}
    opts = FSDP + ["TRAIN.EMA_DECAY", 0.9]
    rc, _, err = harness.run(tiny_cfg, tmp_path / "clean", nprocs=2, opts=opts, timeout=300, faults=unused)
    assert rc == 0, err[-3000:]
    work = tmp_path / "work"
    rc, _, err = harness.run(tiny_cfg, work, nprocs=2, opts=opts, timeout=300,
                             faults=dict(unused, FAULT_KILL_AT_BATCH=KILL_AT))
    assert rc != 0, err[-2000:]
    rc, out, err = harness.run(tiny_cfg, work, nprocs=2, opts=opts, timeout=300, faults=unused)
    assert rc == 0, err[-3000:]
    assert "tiny-0001-b0000004.model: each rank its shards" in out + err
    final = _final(work)
    assert [k for k in final["state_dict"] if k.startswith("unused_head.")] == ["unused_head.weight",
                                                                                 "unused_head.bias"]
    assert sorted(final["optimizer"]["state"]) == [2, 3, 4, 5]
    assert sorted(final["ema"]) == sorted(final["state_dict"])
    # the same process count, strategy and order of sums: exact (bit for bit)
    harness.assert_same(final, _final(tmp_path / "clean"))
