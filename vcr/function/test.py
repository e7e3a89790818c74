"""VCR evaluation on val (per-item correctness) and test (answer probabilities), in fp32 like epoch-end
validation (the project's one evaluation rule, see ``common.engine.run_validation``)."""
import torch
import torch.nn.functional as F

from common.engine import build_loader, inference_device, load_for_inference, run_validation
from common.trainer import to_device

# Position of the (conditioned) question and its align matrix in a VCR batch (data_names order).
QUESTION, QUESTION_ALIGN = 3, 4


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


def val_correct(task, cfg, ckpt_path):
    """Which val items the checkpoint answers right (Q->A or QA->R by DATASET.TASK), through the
    epoch-end validation loop (``common.engine.run_validation``, fp32).

    Returns:
        Tensor bool (N,), in annotation-file order, so two models' results can be combined
        into Q->AR accuracy (both right).
    """
    model = load_for_inference(task, cfg, ckpt_path, inference_device())
    correct = CorrectItems()
    run_validation(model, build_loader(task, cfg, "val"), correct, cfg.DATASET.LABEL_INDEX_IN_BATCH)
    return correct.items


@torch.no_grad()
def test_probabilities(model, loader, task, autocast):
    """Softmax probabilities of every test item, in loader order.

    Args:
        task: DATASET.TASK, 'Q2A' or 'QA2R'.
        autocast: zero-argument callable giving the forward's context.
    Returns:
        Tensor float32 (N, 4) for 'Q2A'; (N, 16) for 'QA2R', the 4 rationale probabilities
        conditioned on answer 0, then on answer 1, ... (the test items carry one question per
        answer in ``question[:, i]``).
    """
    device = next(model.parameters()).device
    rows = []
    for batch in loader:
        batch = to_device(list(batch), device)
        with autocast():
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
