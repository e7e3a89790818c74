"""Persistent inf/nan: the divergence guard (TRAIN.MAX_CONSECUTIVE_SKIPS) stops the run with its message,
and no non-finite update reached the parameters or the optimizer state."""
import glob
import os
import re

import torch

from common.trainer import DIVERGED_EXIT_CODE
from tests.faults import harness, tiny_task


def test_nan_loss_stops_run_and_leaves_last_finite_weights(tiny_cfg, tmp_path, monkeypatch, capsys):
    """One ``error:`` line (skips in a row, last finite loss and its step, loss scale, what to try), exit code
    DIVERGED_EXIT_CODE, in the log file too; the checkpoints written before stay loadable and unchanged."""
    models, real_init = [], tiny_task.TinyNet.__init__

    def init(self, config):
        real_init(self, config)
        models.append(self)
    monkeypatch.setattr(tiny_task.TinyNet, "__init__", init)
    folder = harness.out_dir(tmp_path)
    # NaN from micro-batch 9 on: groups (9, 10), (11, 12), (13, 14) are skipped; the third skip stops.
    code = harness.run_here(tiny_cfg, tmp_path, monkeypatch, faults={"FAULT_NAN_FROM_BATCH": 9},
                            opts=["TRAIN.MAX_CONSECUTIVE_SKIPS", 3, "TRAIN.CHECKPOINT_STEPS", 1,
                                  "TRAIN.CHECKPOINT_KEEP", 100])
    assert code == DIVERGED_EXIT_CODE == 3
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in out + err
    assert re.search(r"error: training diverged: 3 optimizer steps in a row were skipped for inf/nan gradients "
                     r"\(epoch 0, batch 13; step 7, 4 applied\); the last finite loss was [0-9.e+-]+, at optimizer "
                     r"step 4; loss scale 8192\. The checkpoints written so far are intact\. Try a lower TRAIN\.LR, "
                     r"TRAIN\.FP16_DTYPE bfloat16 \(fp32's range\) or a lower TRAIN\.CLIP_GRAD_NORM \(now 10\), and check "
                     r"the data",
                     errors[0]), errors[0]  # the config clips at 10 already: a lower value, not "e.g. 1.0"
    log = "".join(open(p).read() for p in glob.glob(os.path.join(folder, "*.log")))
    assert errors[0].split("error: ", 1)[1] in log
    last_good = harness.training_state(os.path.join(folder, "tiny-0000-b0000008.model"))
    skipped = [harness.training_state(os.path.join(folder, "tiny-0000-b00000{}.model".format(b))) for b in (10, 12)]
    assert last_good["train_state"]["consecutive_skips"] == 0
    assert last_good["train_state"]["last_finite_step"] == 4
    assert [s["train_state"]["consecutive_skips"] for s in skipped] == [1, 2]
    for state in skipped:  # skipped steps changed neither the weights nor the optimizer's moments
        harness.assert_same(state["state_dict"], last_good["state_dict"])
        harness.assert_same(state["optimizer"], last_good["optimizer"])
        assert state["train_state"]["global_step"] == last_good["train_state"]["global_step"]
    (model,) = models  # after the third skip too
    for name, value in model.state_dict().items():
        assert torch.isfinite(value).all(), name
        assert torch.equal(value, last_good["state_dict"][name]), name


def test_divergence_advice_fits_the_config(tiny_cfg, tmp_path, monkeypatch, capsys):
    """fp32 without clipping: neither bfloat16 nor a lower clipping norm is offered, clipping is. The NaN losses
    logged to TensorBoard print nothing."""
    code = harness.run_here(tiny_cfg, tmp_path, monkeypatch, faults={"FAULT_NAN_FROM_BATCH": 1},
                            opts=["TRAIN.MAX_CONSECUTIVE_SKIPS", 2, "TRAIN.FP16", False, "TRAIN.CLIP_GRAD_NORM", 0])
    assert code == DIVERGED_EXIT_CODE
    out, err = capsys.readouterr()
    (error,) = [line for line in (out + err).splitlines() if "error:" in line]
    assert "Try a lower TRAIN.LR or TRAIN.CLIP_GRAD_NORM (e.g. 1.0), and check the data;" in error, error
    assert "NaN or Inf" not in out + err  # tensorboardX's bare line for each non-finite value it writes
