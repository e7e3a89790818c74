"""Early stopping (TRAIN.EARLY_STOP_*) through the tiny task's real entry point: it stops after the right
epoch, and a SIGKILL before that epoch ends, then TRAIN.AUTO_RESUME, stops at the same epoch (the
stopping state travels in the checkpoint); a run started again after the stop trains nothing."""
import os
import signal

import pytest

from tests.faults import harness

# TRAIN.LR 1e-12: the weights stay put, so the validation accuracy is the same every epoch and never
# improves after epoch 0: with patience 2 the run stops after epoch 2 of 6.
OPTS = ["TRAIN.END_EPOCH", 6, "TRAIN.LR", 1e-12, "TRAIN.EARLY_STOP_METRIC", "Acc", "TRAIN.EARLY_STOP_MODE", "max",
        "TRAIN.EARLY_STOP_PATIENCE", 2]
STOP_LINE = "early stopping after epoch 2: Val-Acc has not improved for 2 validations"


@pytest.mark.slow
def test_early_stopping_stops_after_the_right_epoch_and_survives_a_kill(tiny_cfg, tmp_path):
    rc, out, err = harness.run(tiny_cfg, tmp_path / "clean", opts=OPTS)
    assert rc == 0, err[-2000:]
    assert STOP_LINE in out + err
    epochs = [n for n in harness.checkpoint_names(tmp_path / "clean") if n[-10:-6].isdigit() and "-b" not in n]
    assert epochs == ["tiny-0000.model", "tiny-0001.model", "tiny-0002.model"]
    assert "tiny-best.model" in harness.checkpoint_names(tmp_path / "clean")

    # Killed in epoch 2 (16 micro-batches per epoch) after its mid-epoch checkpoint at 4 micro-batches.
    work = tmp_path / "killed"
    rc, out, err = harness.run(tiny_cfg, work, opts=OPTS, faults={"FAULT_KILL_AT_BATCH": 2 * 16 + 7})
    assert rc == -signal.SIGKILL, err[-2000:]
    assert "tiny-0003.model" not in harness.checkpoint_names(work)
    rc, out, err = harness.run(tiny_cfg, work, opts=OPTS)
    assert rc == 0, err[-2000:]
    assert "Resumed from" in out + err and STOP_LINE in out + err
    assert "tiny-0003.model" not in harness.checkpoint_names(work)
    final = harness.training_state(os.path.join(harness.out_dir(work), "tiny-0002.model"))
    assert final["early_stopping"]["best_epoch"] == 0 and final["early_stopping"]["bad_validations"] == 2

    # Started again: it resumes the stopped state and ends at once.
    rc, out, err = harness.run(tiny_cfg, work, opts=OPTS)
    assert rc == 0, err[-2000:]
    assert "not training further: this run had stopped early (" + STOP_LINE in out + err
    assert "tiny-0003.model" not in harness.checkpoint_names(work)
