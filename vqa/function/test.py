"""VQA predictions on a split, gathered over ranks: the EvalAI result JSON and the answers that
``vqa/val.py`` scores with the official evaluation. Forward in fp32, like epoch-end validation."""
import json
import os

import torch

from common import distributed as cdist
from common.safe_write import atomic_write
from common.trainer import to_device

# Position of im_info in a VQA batch; its column 4 is the item's dataset index.
IM_INFO, INDEX_COLUMN = 2, 4


@torch.no_grad()
def predict_answers(model, loader, autocast):
    """The top answer of every question of ``loader``'s dataset, from every rank's share.

    Each rank predicts its shard; the shards are gathered and repeated items (a padding sampler)
    kept once, so every rank returns the single-process result.

    Args:
        model: the VQA model in eval mode (``model(*batch)['label_logits']`` float (B, A)).
        loader: loader over a :class:`vqa.data.vqa.VQADataset` (test mode or not; a label, last
            in the batch, is dropped).
        autocast: zero-argument callable giving the forward's context.
    Returns:
        list of ``{"question_id": int, "answer": str}`` in dataset order (the EvalAI format).
    Raises:
        RuntimeError: the ranks together did not predict every item of the dataset.
    """
    dataset = loader.dataset
    device = next(model.parameters()).device
    indices, answers = [], []
    for batch in loader:
        batch = to_device(list(batch)[:4], device)  # image, boxes, im_info, question
        with autocast():
            logits = model(*batch)["label_logits"]
        indices.append(batch[IM_INFO][:, INDEX_COLUMN].round().long().cpu())
        answers.append(logits.float().argmax(1).cpu())
    empty = torch.zeros(0, dtype=torch.long)
    index, answer = cdist.gather_predictions(torch.cat(indices) if indices else empty,
                                             torch.cat(answers) if answers else empty)
    if not torch.equal(index, torch.arange(len(dataset))):
        raise RuntimeError("predictions cover {} of the {} questions".format(len(index), len(dataset)))
    qids, vocab = dataset.question_ids, dataset.answer_vocab.answers
    return [{"question_id": int(qids[i]), "answer": vocab[a]} for i, a in enumerate(answer.tolist())]


def result_json_path(save_path, save_name, image_set):
    """``{save_path}/{save_name}_vqa2_{image_set}.json``, the reference's name."""
    return os.path.join(save_path, "{}_vqa2_{}.json".format(save_name, image_set))


def write_result_json(results, path):
    """Write ``results`` (see :func:`predict_answers`) as JSON on rank 0 (atomically), then wait for it
    on every rank. Returns ``path``."""
    if cdist.is_main_process():
        text = json.dumps(results)
        atomic_write(path, lambda f: f.write(text), binary=False, size_hint=len(text))
        print("result json saved to {}".format(path))
    cdist.barrier()
    return path
