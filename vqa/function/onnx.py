"""The VQA task's ONNX graph: boxes (with precomputed region features, or pixels), a question, answer logits."""
import torch

from common.inference.onnx_export import NamedOutputs, OnnxGraph
from vqa.data.answers import AnswerVocab

# (batch, boxes, question length, image width, image height) of each example case: case 0 is traced, 1..3 are
# checked.
CASES = ((2, 4, 6, 64, 48), (1, 3, 4, 48, 64), (3, 5, 9, 80, 56), (4, 7, 13, 72, 72))
# Why a ViT image encoder on pixels does not export (vqa.task.VQATask.onnx_export_refusal).
VIT_REFUSAL = ("the ViT image encoder (NETWORK.IMAGE_ENCODER 'vit') on pixels groups the images by size in a Python "
               "loop, which torch.export cannot trace; region features (NETWORK.IMAGE_FEAT_PRECOMPUTED) or the "
               "ResNet encoder export")
# Positions of the sequence besides the question's word pieces: [CLS], [SEP], [MASK], [SEP], the regions' shared
# position and [END] (common.modeling.visual_linguistic_bert).
OTHER_POSITIONS = 6
# Padded box rows hold this value (vqa.modules.resnet_vlbert_for_vqa.box_mask reads rows above -1.5 as boxes).
BOX_PAD = -2.0


def _example(case, feat_dim, vocab_size, pixels):
    """Inputs of one case: random boxes inside the image (x1, y1, x2, y2 pixels, then ``feat_dim`` feature values
    unless ``pixels``), the first row with its last box and its last 2 words padded."""
    batch, boxes, length, width, height = CASES[case]
    g = torch.Generator().manual_seed(case)
    half = torch.tensor([width / 2, height / 2])
    corner = torch.rand(batch, boxes, 2, generator=g) * half
    size = 4 + torch.rand(batch, boxes, 2, generator=g) * (half - 4)
    rows = [corner, corner + size] + ([] if pixels else [torch.randn(batch, boxes, feat_dim, generator=g)])
    box_rows = torch.cat(rows, -1)
    box_rows[0, -1] = BOX_PAD
    im_info = torch.tensor([[width, height, 1.0, 1.0, 0.0]]).repeat(batch, 1)
    question = torch.randint(1, vocab_size, (batch, length), generator=g)
    question[0, -2:] = 0
    if pixels:
        return torch.randn(batch, 3, height, width, generator=g), box_rows, im_info, question
    return box_rows, im_info, question


def vqa_onnx_graph(cfg, model):
    """:class:`common.inference.onnx_export.OnnxGraph` of a :class:`vqa.modules.ResNetVLBERT`.

    Inputs (dynamic axes: ``batch``, ``boxes``, ``text``, and an image's ``height``, ``width``): with
    ``NETWORK.IMAGE_FEAT_PRECOMPUTED``, ``boxes`` float32 ``[batch, boxes, 4 + 2048]`` (x1, y1, x2, y2 in pixels,
    then the region's feature; padded rows -2); else ``image`` float32 ``[batch, 3, height, width]`` (normalised
    pixels) and ``boxes`` ``[batch, boxes, 4]``. Then ``im_info`` float32 ``[batch, 5]`` as the data set's items
    hold it (width, height, x scale, y scale, index; the graph reads the first two, which clip the boxes) and
    ``question`` int64 ``[batch, text]`` (WordPiece ids of ``NETWORK.BERT_MODEL_NAME``'s vocab.txt, 0 after the
    end). Output ``label_logits`` float32 ``[batch, DATASET.ANSWER_VOCAB_SIZE]`` in the answer file's order.
    Metadata: ``label_names`` (the answers, in the logits' order), ``input_names`` and ``max_text_length``
    (:func:`max_text_length`).
    """
    net = cfg.NETWORK
    pixels = not net.IMAGE_FEAT_PRECOMPUTED
    feat_dim = 0 if net.BLIND else model.image_feature_extractor.feat_dim
    names = (["image"] if pixels else []) + ["boxes", "im_info", "question"]
    dynamic = {"boxes": {0: "batch", 1: "boxes"}, "im_info": {0: "batch"}, "question": {0: "batch", 1: "text"}}
    if pixels:
        dynamic["image"] = {0: "batch", 2: "height", 3: "width"}
    module = NamedOutputs(model, ["label_logits"], fixed=None if pixels else {0: None})
    metadata = {"label_names": list(AnswerVocab.from_file(cfg.DATASET.ANSWER_VOCAB_FILE).answers),
                "input_names": names, "max_text_length": max_text_length(net.VLBERT)}
    return OnnxGraph(module, names, ["label_logits"], dynamic,
                     lambda case: _example(case, feat_dim, net.VLBERT.vocab_size, pixels), metadata)


def max_text_length(vlbert):
    """The most word pieces a ``question`` row may hold: the largest position id, the [END]'s, is
    ``length + OTHER_POSITIONS - 1 + position_padding_idx + 1`` and must be below ``max_position_embeddings``
    (``NETWORK.VLBERT``)."""
    return vlbert.max_position_embeddings - OTHER_POSITIONS - vlbert.position_padding_idx - 1
