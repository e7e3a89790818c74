"""A tiny RefCOCO+ data folder with hand-checkable boxes, for the refcoco tests.

Images (COCO train2014 names): 1 is 40x30 (landscape), 2 is 20x50 (portrait).

    annotation  image  bbox [x, y, w, h]   xyxy
    11          1      [2, 3, 10, 8]       [2, 3, 12, 11]
    12          1      [20, 5, 15, 20]     [20, 5, 35, 25]
    21          2      [0, 0, 10, 10]      [0, 0, 10, 10]

    ref  ann  split  sentences
    1    11   train  "the left box", "small red one"
    2    12   val    "right box"
    3    21   testA  "the tall one"
    4    12   testB  "big box on the right"

MAttNet detections: image 1 -> [3, 3, 10, 8] (xyxy [3, 3, 13, 11], IoU 90/108 with annotation 11) and
[0, 0, 5, 5]; image 2 has none. VG boxes: image 1 -> [[1, 1, 20, 20]], image 2 -> [[0, 0, 5, 5], [1, 1, 9, 9]].
"""
import base64
import json
import os
import pickle
import zipfile

import numpy as np
from PIL import Image

from tests.tiny_vcr import HIDDEN

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "left", "right", "box", "small", "red", "one",
         "tall", "big", "on"]
IMAGES = {1: (40, 30), 2: (20, 50)}
ANNOTATIONS = [(11, 1, [2, 3, 10, 8]), (12, 1, [20, 5, 15, 20]), (21, 2, [0, 0, 10, 10])]
REFS = [(1, 11, "train", ["the left box", "small red one"]), (2, 12, "val", ["right box"]),
        (3, 21, "testA", ["the tall one"]), (4, 12, "testB", ["big box on the right"])]
DETECTIONS = [(1, [3, 3, 10, 8]), (1, [0, 0, 5, 5])]
VG = {1: [[1, 1, 20, 20]], 2: [[0, 0, 5, 5], [1, 1, 9, 9]]}
# Image sets of the tiny runs: training on 4 expressions (train 2, testA 1, testB 1), validation on all 5.
TRAIN_SET, VAL_SET = "train+testA+testB", "train+val+test"


def refs_list():
    """The refs as the REFER toolkit stores them."""
    refs, sent_id = [], 0
    for ref_id, ann_id, split, sentences in REFS:
        image_id = next(a[1] for a in ANNOTATIONS if a[0] == ann_id)
        sents = []
        for s in sentences:
            sents.append({"tokens": s.split(), "raw": s.upper(), "sent_id": sent_id, "sent": s})
            sent_id += 1
        refs.append({"ref_id": ref_id, "ann_id": ann_id, "image_id": image_id, "split": split, "category_id": 1,
                     "sentences": sents, "sent_ids": [s["sent_id"] for s in sents],
                     "file_name": "COCO_train2014_{:012d}_{}.jpg".format(image_id, ann_id)})
    return refs


def image_name(image_id):
    return "COCO_train2014_{:012d}.jpg".format(image_id)


def write_refcoco(root, refs=None):
    """Write the folder under ``root`` (a ``DATASET.DATASET_PATH``); ``refs`` replaces the refs list."""
    folder = os.path.join(root, "refcoco+")
    os.makedirs(os.path.join(folder, "proposal"), exist_ok=True)
    with open(os.path.join(folder, "refs(unc).p"), "wb") as f:
        pickle.dump(refs_list() if refs is None else refs, f, protocol=2)
    instances = {
        "images": [{"id": i, "width": w, "height": h, "file_name": image_name(i)} for i, (w, h) in IMAGES.items()],
        "annotations": [{"id": a, "image_id": i, "bbox": b, "category_id": 1, "area": b[2] * b[3], "iscrowd": 0}
                        for a, i, b in ANNOTATIONS],
        "categories": [{"id": 1, "name": "box", "supercategory": "thing"}]}
    with open(os.path.join(folder, "instances.json"), "w") as f:
        json.dump(instances, f)
    with open(os.path.join(folder, "proposal", "res101_coco_minus_refer_notime_dets.json"), "w") as f:
        json.dump([{"det_id": k, "image_id": i, "box": b, "category_id": 1, "category_name": "box", "score": 0.9}
                   for k, (i, b) in enumerate(DETECTIONS)], f)
    images = os.path.join(root, "train2014")
    os.makedirs(images, exist_ok=True)
    for i, (w, h) in IMAGES.items():
        pixels = np.zeros((h, w, 3), np.uint8)
        pixels[:, : w // 2] = (200, 30, 30)  # left half red, right half blue: a flip is visible
        pixels[:, w // 2:] = (30, 30, 200)
        Image.fromarray(pixels).save(os.path.join(images, image_name(i)))
    with zipfile.ZipFile(os.path.join(root, "train2014.zip"), "w") as z:
        for i in IMAGES:
            z.write(os.path.join(images, image_name(i)), "train2014/" + image_name(i))
    vg = "trainval2014_resnet101_faster_rcnn_genome"
    os.makedirs(os.path.join(root, "vgbua_res101_precomputed"), exist_ok=True)
    with zipfile.ZipFile(os.path.join(root, "vgbua_res101_precomputed", vg + ".zip"), "w") as z:
        for i, boxes in VG.items():
            data = {"image_id": i, "image_w": IMAGES[i][0], "image_h": IMAGES[i][1], "num_boxes": len(boxes),
                    "boxes": base64.b64encode(np.array(boxes, np.float32).tobytes()).decode()}
            z.writestr("{}/{}.json".format(vg, i), json.dumps(data))
    bert = os.path.join(root, "bert")
    os.makedirs(bert, exist_ok=True)
    with open(os.path.join(bert, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return root


def ids(text):
    """Word-piece ids of ``text`` in :data:`VOCAB` (every word is one piece)."""
    return [VOCAB.index(w) for w in text.split()]


def tiny_opts(tiny_vcr, data, pretrain, **changes):
    """``--opts`` of a paper config made tiny: the tiny VCR runs' BERT and ResNet-18, the pretraining checkpoint
    ``pretrain``,
    2 epochs of 1-image micro-batches, the fixture's splits; ``changes`` (``TRAIN__END_EPOCH=1``) override."""
    values = {
        "DATASET.DATASET_PATH": data, "DATASET.TRAIN_IMAGE_SET": TRAIN_SET, "DATASET.VAL_IMAGE_SET": VAL_SET,
        "NETWORK.BERT_MODEL_NAME": tiny_vcr.bert, "NETWORK.IMAGE_PRETRAINED": tiny_vcr.resnet,
        "NETWORK.PARTIAL_PRETRAIN": pretrain, "SCALES": [32, 48], "NUM_WORKERS_PER_GPU": 0,
        "LOG_FREQUENT": 1, "NETWORK.IMAGE_NUM_LAYERS": 18, "NETWORK.IMAGE_C5_DILATED": False,
        "NETWORK.IMAGE_ROI_POOLED_SIZE": 4, "NETWORK.IMAGE_FINAL_DIM": HIDDEN, "NETWORK.VLBERT.hidden_size": HIDDEN,
        "NETWORK.VLBERT.visual_size": HIDDEN, "NETWORK.VLBERT.num_hidden_layers": 2,
        "NETWORK.VLBERT.num_attention_heads": 2, "NETWORK.VLBERT.intermediate_size": 64,
        "NETWORK.VLBERT.max_position_embeddings": 128, "NETWORK.VLBERT.vocab_size": tiny_vcr.vocab_size,
        "TRAIN.BATCH_IMAGES": 1, "TRAIN.END_EPOCH": 2, "TRAIN.WARMUP_STEPS": 2, "VAL.BATCH_IMAGES": 2,
        "TEST.BATCH_IMAGES": 2}
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    out = []
    for key, value in values.items():
        out += [key, value if isinstance(value, str) else json.dumps(value)]
    return out
