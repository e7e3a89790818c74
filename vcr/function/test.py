"""VCR evaluators: per-item correctness on val, the leaderboard CSV of answer probabilities on test; both run
through the one inference loop (:func:`common.inference.evaluation.inference_on_dataset`, fp32)."""
import torch
import torch.nn.functional as F

from common.engine import build_loader, inference_device, load_for_inference
from common.inference.evaluation import LABEL, IndexedPredictions, inference_on_dataset
from common.runtime import distributed as cdist
from vcr.function.result_csv import write_result_csv


class CorrectItems(IndexedPredictions):
    """Whether the highest ``label_logits`` of each item is its label; ``evaluate()`` gives bool ``(N,)`` in
    dataset (annotation-file) order, gathered over ranks.

    Args:
        size: number of items of the dataset.
    """

    def __init__(self, size):
        self.size = size
        self.reset()

    def predict(self, inputs, outputs):
        return outputs["label_logits"].argmax(1) == inputs.field(LABEL).view(-1)

    def evaluate(self):
        return self.predictions(self.size)


def val_correct(task, cfg, ckpt_path):
    """Which val items the checkpoint answers right (Q->A or QA->R by DATASET.TASK).

    Returns:
        Tensor bool (N,), in annotation-file order, so two models' results can be combined
        into Q->AR accuracy (both right).
    """
    model = load_for_inference(task, cfg, ckpt_path, inference_device())
    loader = build_loader(task, cfg, "val")
    return inference_on_dataset(model, loader, CorrectItems(len(loader.dataset)), task.label_index_in_batch(cfg))


class TestProbabilities(IndexedPredictions):
    """The leaderboard CSV of a test split (:func:`vcr.function.result_csv.write_result_csv`): softmax
    probabilities of every item, float32 (N, 4) for 'Q2A'; (N, 16) for 'QA2R', the 4 rationale
    probabilities conditioned on answer 0, then on answer 1, ... (the test items carry one question per
    answer in ``question[:, i]``). ``evaluate()`` writes ``path`` on rank 0 and returns it.

    Args:
        task: DATASET.TASK, 'Q2A' or 'QA2R'.
        dataset: the test :class:`vcr.data.VCRDataset` (its ``annot_ids`` name the rows).
        path: the CSV file.
    """

    def __init__(self, task, dataset, path):
        self.task, self.dataset, self.path = task, dataset, path
        self.reset()

    def forward(self, model, inputs):
        if self.task == "Q2A":
            return {"probs": F.softmax(model(*inputs)["label_logits"].float(), dim=1)}
        question, align = inputs.field("question"), inputs.field("question_align_matrix")
        conditioned = [F.softmax(model(*inputs.replace(question=question[:, i], question_align_matrix=align[:, i]))
                                 ["label_logits"].float(), dim=1) for i in range(question.shape[1])]
        return {"probs": torch.cat(conditioned, dim=1)}

    def predict(self, inputs, outputs):
        return outputs["probs"]

    def evaluate(self):
        probs = self.predictions(len(self.dataset))
        if cdist.is_main_process():
            write_result_csv(self.path, self.task, self.dataset.annot_ids, probs.tolist())
            print("result csv saved to {}".format(self.path))
        cdist.barrier()
        return self.path

