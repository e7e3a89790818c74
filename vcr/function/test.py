"""VCR evaluation on val (accuracies) and test (leaderboard CSV), in fp32 like epoch-end validation
(the project's one evaluation rule, see ``common.engine.run_validation``)."""
import os

import torch
import torch.nn.functional as F

from common.data.build import make_dataloader
from common.engine import load_for_inference, run_validation
from common.trainer import to_device
from vcr.function.result_csv import write_result_csv
from vcr.function.train import VCR_TASK

# Position of the (conditioned) question and its align matrix in a VCR batch (data_names order).
QUESTION, QUESTION_ALIGN = 3, 4


def _device():
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class CorrectItems:
    """Metric for :func:`common.engine.run_validation` that keeps, per item, whether the highest
    ``label_logits`` is the label: ``items`` bool (N,), in loader order, after the run."""

    def __init__(self):
        self.reset()

    def reset(self):
        self._rows = []

    def update(self, outputs):
        self._rows.append((outputs["label_logits"].argmax(1) == outputs["label"].view(-1)).cpu())

    @property
    def items(self):
        return torch.cat(self._rows) if self._rows else torch.zeros(0, dtype=torch.bool)


def val_correct(cfg, ckpt_path):
    """Which val items the checkpoint answers right (Q->A or QA->R by DATASET.TASK), through the
    epoch-end validation loop (``common.engine.run_validation``, fp32).

    Returns:
        Tensor bool (N,), in annotation-file order, so two models' results can be combined
        into Q->AR accuracy (both right).
    """
    model = load_for_inference(VCR_TASK, cfg, ckpt_path, _device())
    correct = CorrectItems()
    run_validation(model, make_dataloader(cfg, "val"), correct, cfg.DATASET.LABEL_INDEX_IN_BATCH)
    return correct.items


@torch.no_grad()
def test_probabilities(model, loader, task):
    """Softmax probabilities of every test item, in loader order, computed in fp32.

    Returns:
        Tensor float32 (N, 4) for 'Q2A'; (N, 16) for 'QA2R', the 4 rationale probabilities
        conditioned on answer 0, then on answer 1, ... (the test items carry one question per
        answer in ``question[:, i]``).
    """
    device = next(model.parameters()).device
    rows = []
    for batch in loader:
        batch = to_device(list(batch), device)
        if task == "Q2A":
            probs = F.softmax(model(*batch)["label_logits"].float(), dim=1)
        else:
            conditioned = []
            for i in range(batch[QUESTION].shape[1]):
                inputs = list(batch)
                inputs[QUESTION], inputs[QUESTION_ALIGN] = batch[QUESTION][:, i], batch[QUESTION_ALIGN][:, i]
                conditioned.append(F.softmax(model(*inputs)["label_logits"].float(), dim=1))
            probs = torch.cat(conditioned, dim=1)
        rows.append(probs.cpu())
    return torch.cat(rows)


def test_net(cfg, ckpt_path, save_path, save_name):
    """Write ``{save_path}/{save_name}_test_result_{TASK}.csv`` for the test split; returns its path.

    Raises:
        ValueError: DATASET.TASK is not 'Q2A' or 'QA2R' (a Q2AR leaderboard file merges the two).
    """
    task = cfg.DATASET.TASK
    if task not in ("Q2A", "QA2R"):
        raise ValueError("DATASET.TASK: the test CSV is written per task, 'Q2A' or 'QA2R', got {!r}".format(task))
    model = load_for_inference(VCR_TASK, cfg, ckpt_path, _device())
    loader = make_dataloader(cfg, "test")
    probs = test_probabilities(model, loader, task)
    path = os.path.join(save_path, "{}_test_result_{}.csv".format(save_name, task))
    write_result_csv(path, task, loader.dataset.annot_ids, probs.tolist())
    print("result csv saved to {}".format(path))
    return path
