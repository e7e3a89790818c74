import math

import torch

from common.metrics.loss_logger import LossLogger
from vcr.function.metrics import Accuracy, JointAccuracy


def test_accuracy_ignores_minus_one_and_accumulates():
    m = Accuracy()
    assert m.get()[0] == "Acc" and math.isnan(m.get()[1])
    m.update({"label_logits": torch.tensor([[0., 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1]]),
              "label": torch.tensor([1, 2, -1])})
    assert m.get() == ("Acc", 0.5)
    # per-candidate layout: logits (N * 4,), one-hot labels
    m.update({"label_logits": torch.tensor([0., 1, 0, 0, 1, 0, 0, 0]),
              "label": torch.tensor([0, 1, 0, 0, 0, 0, 1, 0])})
    assert m.get() == ("Acc", 2 / 4)
    m.reset()
    assert math.isnan(m.get()[1])


def test_joint_accuracy():
    m = JointAccuracy()
    m.update({"answer_label_logits": torch.eye(4), "answer_label": torch.tensor([0, 1, 2, 0]),
              "rationale_label_logits": torch.eye(4), "rationale_label": torch.tensor([0, 0, 2, 3])})
    assert m.get() == ("JointAcc", 0.5)


def test_loss_logger_skips_batches_without_the_output():
    m = LossLogger("ans_loss", "AnsLoss")
    m.update({"ans_loss": torch.tensor([1., 3.])})
    m.update({})
    m.update({"ans_loss": torch.tensor(4.)})
    assert m.get() == ("AnsLoss", 3.0)
