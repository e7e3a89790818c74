"""VCR evaluation on val (per-item correctness) and test (answer probabilities)."""
import torch
import torch.nn.functional as F

from common.engine import build_loader, inference_device, load_for_inference
from common.trainer import to_device

# Position of the (conditioned) question and its align matrix in a VCR batch (data_names order).
QUESTION, QUESTION_ALIGN = 3, 4


@torch.no_grad()
def val_correct(task, cfg, ckpt_path):
    """Which val items the checkpoint answers right (Q->A or QA->R by DATASET.TASK).

    Returns:
        Tensor bool (N,), in annotation-file order, so two models' results can be combined
        into Q->AR accuracy (both right).
    """
    device = inference_device()
    model = load_for_inference(task, cfg, ckpt_path, device)
    correct = []
    for batch in build_loader(task, cfg, "val"):
        batch = to_device(list(batch), device)
        label = batch.pop(cfg.DATASET.LABEL_INDEX_IN_BATCH)
        correct.append((model(*batch)["label_logits"].argmax(1) == label.view(-1)).cpu())
    return torch.cat(correct)


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
