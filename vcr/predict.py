"""The VCR predictor: an image, its boxes, a question and 4 answers (Q2A) or 4 rationales (QA2R) -> a probability
per choice and the choice.

Texts are VCR's tokens: a string whose ``[i]`` / ``[i,j]`` words name boxes i (and j), 0-based in the order of
``boxes`` (``"is [0] looking at [1,2] ?"``), or a token list of the VCR jsonl files (words and lists of box
indices). ``objects`` names the boxes (``"person"`` gets VCR's first names in the text; the COCO names give the
box's class); by default every box is an ``"object"``. Items are built by :meth:`vcr.data.vcr.VCRDataset.item`,
the probabilities by the test evaluator's forward (:class:`vcr.function.test.TestProbabilities`).
"""
import re

from common.data.transforms import build_transforms
from common.errors import UserInputError
from common.inference.inputs import top_predictions
from common.inference.predictor import TaskPredictor
from vcr.data.vcr import NUM_CHOICES, VCRDataset
from vcr.function.test import TestProbabilities

_TAG = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
DEFAULT_OBJECT = "object"


def vcr_tokens(text, name, key):
    """VCR tokens of a text: a string split on white space, ``[i]`` / ``[i,j]`` words becoming box index
    lists, or a VCR token list as it is.

    Raises:
        UserInputError: empty text, or a list whose items are neither words nor lists of ints (names ``key``).
    """
    if isinstance(text, str):
        tokens = [[int(i) for i in m.group(1).split(",")] if m else word
                  for word in text.split() for m in [_TAG.fullmatch(word)]]
    elif isinstance(text, (list, tuple)):
        tokens = list(text)
        if not all(isinstance(t, str) or (isinstance(t, list) and t and all(isinstance(i, int) for i in t))
                   for t in tokens):
            raise UserInputError("{}: '{}' as a token list holds words and lists of box indices, got {!r}".format(
                name, key, text))
    else:
        tokens = []
    if not tokens:
        raise UserInputError("{}: '{}' must be non-empty text, got {!r}".format(name, key, text))
    return tokens


def _text(tokens):
    return " ".join(t if isinstance(t, str) else "[{}]".format(",".join(map(str, t))) for t in tokens)


class VCRPredictor(TaskPredictor):
    """Input ``{"image", "question", "answers": 4 texts, "rationales": 4 texts (QA2R), "answer_index" (QA2R: the
    answer the rationales justify, default 0), "boxes" (rows ``x1, y1, x2, y2[, score]`` in pixels; default: the
    box source's), "objects" (a name per box), "segms" (VCR polygons per box, optional)}``.

    Output: Q2A ``predictions`` (the 4 answers by softmax probability, label = the answer text) and ``choice``;
    QA2R ``rationale_predictions`` and ``choice``; both with ``boxes`` (the boxes used, pixels of the image).
    """
    fields = {"question": True, "answers": True, "rationales": False, "answer_index": False, "boxes": False,
              "objects": False, "segms": False}
    dataset_class = VCRDataset

    def __init__(self, cfg, device, box_source=None):
        super().__init__(cfg, device, box_source)
        self.task = cfg.DATASET.TASK
        if self.task not in ("Q2A", "QA2R"):
            raise UserInputError("DATASET.TASK {!r}: the predictor runs a Q2A or a QA2R model".format(self.task))
        self.dataset = VCRDataset.for_items(cfg, build_transforms(cfg, "test"))
        self.probabilities = TestProbabilities(self.task, None, None)

    @property
    def data_names(self):
        return self.dataset.data_names

    def check_input(self, inputs, where):
        unknown = sorted(set(inputs) - set(self.fields) - {"image"})
        if unknown:
            raise UserInputError("{}: unknown key(s) {}; this task takes image, {}".format(
                where, unknown, ", ".join(self.fields)))
        needed = ["question", "answers"] + (["rationales"] if self.task == "QA2R" else [])
        for key in needed:
            if inputs.get(key) is None:
                raise UserInputError("{}: '{}' is missing (a {} model needs {})".format(where, key, self.task,
                                                                                     ", ".join(needed)))
        for key in needed[1:]:
            if not isinstance(inputs[key], (list, tuple)) or len(inputs[key]) != NUM_CHOICES:
                raise UserInputError("{}: '{}' must be a list of {} texts, got {!r}".format(
                    where, key, NUM_CHOICES, inputs[key]))
        if self.task == "QA2R" and inputs.get("answer_index", 0) not in range(NUM_CHOICES):
            raise UserInputError("{}: 'answer_index' must be 0..{}, got {!r}".format(
                where, NUM_CHOICES - 1, inputs["answer_index"]))

    def item(self, image, inputs, index, name):
        if inputs.get("boxes") is not None:
            rows = inputs["boxes"]
            if not (isinstance(rows, list) and all(isinstance(r, (list, tuple)) and len(r) in (4, 5) for r in rows)):
                raise UserInputError("{}: 'boxes' must be [x1, y1, x2, y2(, score)] rows in pixels, got {!r}".format(
                    name, rows))
            rows = [[float(v) for v in r] + [1.0] * (5 - len(r)) for r in rows]
        else:
            rows = [r + [1.0] for r in self.boxes_of(inputs, image, name).tolist()]
        objects = inputs.get("objects") or [DEFAULT_OBJECT] * len(rows)
        if len(objects) != len(rows) or not all(isinstance(o, str) for o in objects):
            raise UserInputError("{}: 'objects' must name each of the {} boxes, got {!r}".format(name, len(rows),
                                                                                              objects))
        ann = {"line": index + 1, "annot_id": name, "img_fn": name, "metadata_fn": name, "objects": list(objects),
               "question": vcr_tokens(inputs["question"], name, "question"),
               "answer_choices": [vcr_tokens(a, name, "answers") for a in inputs["answers"]],
               "rationale_choices": [vcr_tokens(r, name, "rationales") for r in inputs.get("rationales") or []] or None,
               "answer_label": None, "rationale_label": None}
        self.dataset.check_annotation(ann, name)
        w, h = image.size
        meta = {"boxes": rows, "width": w, "height": h}
        if inputs.get("segms") is not None:
            meta["segms"] = inputs["segms"]
        item = self.dataset.item(ann, meta, image, index)
        boxes = item[self.data_names.index("boxes")][:, :4] / item[-1][2:4].repeat(2)  # back to image pixels
        choices = ann["answer_choices"] if self.task == "Q2A" else ann["rationale_choices"]
        return item, {"boxes": boxes.tolist(),
                      "_labels": [_text(c) for c in choices], "_answer": inputs.get("answer_index", 0)}

    def forward(self, model, inputs):
        return self.probabilities.forward(model, inputs)

    def decode(self, outputs, contexts, topk):
        probs = outputs["probs"]
        results = []
        for row, context in zip(probs, contexts):
            if self.task == "QA2R":  # the rationales' probabilities given each answer, in answer order
                row = row.view(NUM_CHOICES, NUM_CHOICES)[context["_answer"]]
            top = top_predictions(row, context["_labels"], NUM_CHOICES)
            key = "predictions" if self.task == "Q2A" else "rationale_predictions"
            results.append(dict(context, **{key: top[:topk], "choice": top[0]["index"]},
                                **({"predictions": []} if self.task == "QA2R" else {})))
        return results

