"""VQA evaluators: the top answer of every question, gathered over ranks, for the EvalAI result JSON and
for the official evaluation of ``vqa/val.py``; both run through the one inference loop
(:func:`common.inference.evaluation.inference_on_dataset`, fp32)."""
import json
import os

from common.fileio.safe_write import atomic_write
from common.inference.evaluation import IndexedPredictions
from common.runtime import distributed as cdist


class Answers(IndexedPredictions):
    """The top answer of every question of ``dataset`` (a :class:`vqa.data.vqa.VQADataset`, test mode or not),
    from every rank's share, each question once (a padding sampler's repeats dropped).

    ``evaluate()`` returns a list of ``{"question_id": int, "answer": str}`` in dataset order (the EvalAI
    format) on every rank, and raises RuntimeError when the ranks together did not predict every question.
    The model's outputs hold ``label_logits`` float (B, A).
    """

    def __init__(self, dataset):
        self.dataset = dataset
        self.reset()

    def predict(self, inputs, outputs):
        return outputs["label_logits"].float().argmax(1)

    def evaluate(self):
        answer = self.predictions(len(self.dataset))
        qids, vocab = self.dataset.question_ids, self.dataset.answer_vocab.answers
        return [{"question_id": int(qids[i]), "answer": vocab[a]} for i, a in enumerate(answer.tolist())]


class ResultJSON(Answers):
    """:class:`Answers` written as JSON to ``path`` (:func:`write_result_json`); ``evaluate()`` returns ``path``."""

    def __init__(self, dataset, path):
        super().__init__(dataset)
        self.path = path

    def evaluate(self):
        return write_result_json(super().evaluate(), self.path)


def result_json_path(save_path, save_name, image_set):
    """``{save_path}/{save_name}_vqa2_{image_set}.json``, the reference's name."""
    return os.path.join(save_path, "{}_vqa2_{}.json".format(save_name, image_set))


def write_result_json(results, path):
    """Write ``results`` (see :class:`Answers`) as JSON on rank 0 (atomically), then wait for it
    on every rank. Returns ``path``."""
    if cdist.is_main_process():
        text = json.dumps(results)
        atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))
        print("result json saved to {}".format(path))
    cdist.barrier()
    return path
