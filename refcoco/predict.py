"""The RefCOCO+ predictor: an image, an expression and candidate boxes -> the box the expression refers to, in
image pixels, and a score per candidate.

Items are built by the data set's own code (:class:`refcoco.data.refcoco.RefCOCOItems`); the candidates are the
input's ``boxes`` or the box source's (:class:`common.data.box_sources.BoxSource`), after the whole image when
``DATASET.ADD_IMAGE_AS_A_BOX``.
"""
import torch

from common.data.tokenizer import build_tokenizer
from common.data.transforms import build_transforms
from common.inference.predictor import TaskPredictor
from refcoco.data.refcoco import RefCOCO, RefCOCOItems


class RefCOCOPredictor(TaskPredictor):
    """Input ``{"image", "expression", "boxes" (candidates ``[[x1, y1, x2, y2], ...]`` in pixels; default: the
    box source's)}``; output ``predictions``: the candidates by the sigmoid of their logit (as trained), each
    ``{"label": "box N", "index": N, "score", "box"}``, and ``box``, the best candidate in image pixels."""
    fields = {"expression": True, "boxes": False}
    dataset_class = RefCOCO

    def __init__(self, cfg, device, box_source=None):
        super().__init__(cfg, device, box_source)
        self.items = RefCOCOItems(build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME), build_transforms(cfg, "test"),
                                  test_mode=True, add_image_as_a_box=cfg.DATASET.ADD_IMAGE_AS_A_BOX)

    @property
    def data_names(self):
        return self.items.data_names

    def item(self, image, inputs, index, name):
        boxes = self.boxes_of(inputs, image, name)
        item = self.items(image, boxes, inputs["expression"].split(), index)
        im_info = item[self.data_names.index("im_info")]
        candidates = item[self.data_names.index("boxes")] / im_info[[2, 3, 2, 3]]  # back to image pixels
        return item, {"_candidates": candidates.tolist()}

    def decode(self, outputs, contexts, topk):
        results = []
        for logits, box, context in zip(outputs["label_logits"].float(), outputs["pred_boxes"].float(), contexts):
            candidates = context["_candidates"]
            scores = torch.sigmoid(logits[:len(candidates)])
            order = torch.sort(scores, descending=True, stable=True).indices[:topk].tolist()
            predictions = [{"label": "box {}".format(i), "index": i, "score": float(scores[i]),
                            "box": candidates[i]} for i in order]
            results.append(dict(context, predictions=predictions, box=box.tolist()))
        return results
