"""Persistent inf/nan: the divergence guard (TRAIN.MAX_CONSECUTIVE_SKIPS) stops the run with its message,
and no non-finite update reached the parameters or the optimizer state."""
import os

import pytest
import torch

from common.trainer import TrainingDivergedError
from tests.faults import harness, tiny_task


def test_nan_loss_stops_run_and_leaves_last_finite_weights(tiny_cfg, tmp_path, monkeypatch):
    models, real_init = [], tiny_task.TinyNet.__init__

    def init(self, config):
        real_init(self, config)
        models.append(self)
    monkeypatch.setattr(tiny_task.TinyNet, "__init__", init)
    folder = harness.out_dir(tmp_path)
    # NaN from micro-batch 9 on: groups (9, 10), (11, 12), (13, 14) are skipped; the third skip stops.
    with pytest.raises(TrainingDivergedError, match=r"training diverged: 3 optimizer steps in a row had inf/nan "
                                                    r"gradients \(epoch 0, batch 13, .*loss scale 8192"):
        harness.run_here(tiny_cfg, tmp_path, monkeypatch, faults={"FAULT_NAN_FROM_BATCH": 9},
                         opts=["TRAIN.MAX_CONSECUTIVE_SKIPS", 3, "TRAIN.CHECKPOINT_STEPS", 1,
                               "TRAIN.CHECKPOINT_KEEP", 100])
    last_good = harness.training_state(os.path.join(folder, "tiny-0000-b0000008.model"))
    skipped = [harness.training_state(os.path.join(folder, "tiny-0000-b00000{}.model".format(b))) for b in (10, 12)]
    assert last_good["train_state"]["consecutive_skips"] == 0
    assert [s["train_state"]["consecutive_skips"] for s in skipped] == [1, 2]
    for state in skipped:  # skipped steps changed neither the weights nor the optimizer's moments
        harness.assert_same(state["state_dict"], last_good["state_dict"])
        harness.assert_same(state["optimizer"], last_good["optimizer"])
        assert state["train_state"]["global_step"] == last_good["train_state"]["global_step"]
    (model,) = models  # after the third skip too
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, last_good["state_dict"][name]), name
