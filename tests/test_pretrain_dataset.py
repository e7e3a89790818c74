"""Conceptual Captions pretraining samples (pretrain/data/caption_dataset.py) on the demo captions, the
pretraining metrics (pretrain/function/metrics.py), and the demo caption script."""
import json
import os

import pytest
import torch

from common.data.samplers import SampleKey
from common.data.skips import TooManySkipsError
from pretrain.data.caption_dataset import ConceptualCaptionsDataset
from pretrain.data.conceptual_captions import load_detections
from pretrain.data.masking import IGNORE
from pretrain.task import TASK as PRETRAIN_TASK
from pretrain.function.metrics import MLMAccuracyAUX, MLMAccuracyWVC, MVRCAccuracy, RelationshipAccuracy
from pretrain.task import TASK
from tests import tiny_pretrain as tp


def dataset(inputs, name="base_prec_4x16G_fp32.yaml", *opts):
    cfg = PRETRAIN_TASK.load_config(tp.cfg_path(name), tp.opts(name, inputs) + list(opts))
    cfg_one = cfg.clone()
    cfg_one.defrost()
    cfg_one.DATASET = cfg.DATASET[0] if isinstance(cfg.DATASET, list) else cfg.DATASET
    return TASK.build_dataset(cfg_one, "train")


def masked_items(ds, count=40):
    """Items of several keys, until one has a replaced region (op 1)."""
    items = []
    for epoch in range(count):
        item = ds[SampleKey(11, epoch, 0)]  # a generated scene: 4 regions
        items.append(item)
        if item[6].sum() > 0:
            break
    return items


def test_precomputed_item_fields_targets_and_whole_image_feature(tiny_pretrain):
    ds = dataset(tiny_pretrain)
    assert ds.data_names == ["image", "boxes", "im_info", "text", "relationship_label", "mlm_labels", "mvrc_ops",
                             "mvrc_labels"]
    image, boxes, im_info, text, rel, mlm_labels, ops, labels = masked_items(ds)[-1]
    det = load_detections(ds.records[11].frcnn, with_features=True)
    assert image is None and rel.item() == 1  # base configs: no relationship task, the own caption
    assert boxes.shape == (5, 4 + 2048) and ops.shape == (5,) and labels.shape == (5, 1601)
    assert boxes[0, :4].tolist() == [0.0, 0.0, 95.0, 95.0]  # the whole image first
    assert torch.equal(boxes[1:, :4], det.boxes) and torch.equal(boxes[1:, 4:], det.features)
    assert ops[0] == 0 and labels[0].abs().sum() == 0 and ops.sum() >= 1
    kept = ops[1:] == 0
    assert torch.allclose(boxes[0, 4:], det.features[kept].mean(0))  # recomputed without the replaced regions
    chosen = labels[1:].sum(1) > 0
    assert torch.equal(labels[1:][chosen], det.cls_scores[chosen]) and (labels[1:][~chosen] == 0).all()
    assert (ops[1:].bool() <= chosen).all()  # a replaced region is always predicted
    assert text[0] == ds.masker.cls_id and text[-1] == ds.masker.sep_id
    assert mlm_labels[0] == IGNORE and mlm_labels[-1] == IGNORE and im_info[:2].tolist() == [96.0, 96.0]


def test_e2e_item_zeroes_the_pixels_of_replaced_regions(tiny_pretrain):
    ds = dataset(tiny_pretrain, "base_e2e_16x16G_fp16.yaml", "TRAIN.FLIP_PROB", "0")
    image, boxes, im_info, _, _, _, ops, _ = masked_items(ds)[-1]
    assert image.shape[0] == 3 and boxes.shape[1] == 4 and im_info[:2].tolist() == [32.0, 32.0]  # SCALES (32, 48)
    zero = torch.zeros(image.shape[1:], dtype=torch.bool)
    for box in boxes[ops == 1]:
        x1, y1, x2, y2 = box.long().tolist()
        zero[y1:y2 + 1, x1:x2 + 1] = True
    assert zero.any()
    assert (image[:, zero] == 0).all()
    assert (image[:, ~zero] != 0).any(0).float().mean() > 0.99  # elsewhere untouched (normalised pixels)


def test_relationship_task_pairs_half_the_images_with_another_caption(tiny_pretrain):
    ds = dataset(tiny_pretrain, "base_prec_4x16G_fp32.yaml", "NETWORK.WITH_REL_LOSS", "true",
                 "NETWORK.WITH_MLM_LOSS", "false")
    own = {i: ds.masker.caption(ds.masker.words(" ".join(r.caption)))[0].tolist() for i, r in enumerate(ds.records)}
    labels = []
    for epoch in range(20):
        for i in range(len(ds)):
            _, _, _, text, rel, mlm_labels, _, _ = ds[SampleKey(i, epoch, 0)]
            assert (mlm_labels == IGNORE).all()
            labels.append(rel.item())
            if rel == 1:
                assert text.tolist() == own[i]
            else:
                assert text.tolist() in [own[j] for j in own if j != i] or text.tolist() == own[i]  # equal captions
    assert 0.4 < sum(labels) / len(labels) < 0.6


def test_items_depend_only_on_the_key_and_truncate_text_with_regions(tiny_pretrain):
    ds = dataset(tiny_pretrain)
    a, b = ds[SampleKey(3, 5, 7)], ds[SampleKey(3, 5, 7)]
    assert all(torch.equal(x, y) for x, y in zip(a[1:], b[1:]))
    short = dataset(tiny_pretrain, "base_prec_4x16G_fp32.yaml", "DATASET", json.dumps(
        [dict(tp.datasets("base_prec_4x16G_fp32.yaml", tiny_pretrain)[0], SEQ_LEN=12)]),
        "TRAIN.BATCH_IMAGES", "2", "VAL.BATCH_IMAGES", "2", "TEST.BATCH_IMAGES", "2")
    _, boxes, _, text, _, mlm_labels, ops, labels = short[SampleKey(11, 0, 0)]
    # caption of 30+ pieces and 5 regions into 12: the text is cut first, then both in turn
    assert len(text) + len(boxes) == 12 and len(boxes) == 5 and len(mlm_labels) == len(text)
    assert len(ops) == len(labels) == 5 and text[-1] == short.masker.sep_id


def test_unreadable_images_are_skipped_counted_and_stop_past_the_share(tiny_pretrain, tmp_path, caplog):
    import shutil
    data = tmp_path / "cc"
    shutil.copytree(tiny_pretrain.captions, data)
    (data / "train_image" / "real_coffee.jpg").write_bytes(b"\xff\xd8 truncated")
    inputs = tp.Inputs(str(data), tiny_pretrain.corpus, tiny_pretrain.bert, tiny_pretrain.resnet,
                       tiny_pretrain.vocab_size)
    name = "base_e2e_16x16G_fp16.yaml"
    ds = dataset(inputs, name, "DATASET", json.dumps([dict(tp.datasets(name, inputs)[0], MAX_SKIPPED_SHARE=0.1)]),
                 "TRAIN.BATCH_IMAGES", "2", "VAL.BATCH_IMAGES", "2", "TEST.BATCH_IMAGES", "2")
    bad = [i for i, r in enumerate(ds.records) if r.image.endswith("real_coffee.jpg")][0]
    item = ds[SampleKey(bad, 0, 0)]
    assert item[2][4].item() == bad + 1  # im_info's index: the next record stood in
    assert (ds.skips.seen, ds.skips.skipped) == (2, 1)
    assert "real_coffee.jpg" in caplog.text
    strict = dataset(inputs, name)  # the default share, 1%, of the 15 images: the first skip stops
    with pytest.raises(TooManySkipsError, match=r"1 of 1 images could not be read.*DATASET.MAX_SKIPPED_SHARE.*"
                                                r"real_coffee\.jpg"):
        strict[SampleKey(bad, 0, 0)]


def test_metrics_count_only_predicted_positions():
    logits = torch.zeros(2, 3, 5)
    logits[0, 0, 1] = logits[0, 2, 4] = logits[1, 1, 2] = 1.0
    label = torch.tensor([[1, -1, 3], [-1, 2, -1]])
    wvc = MLMAccuracyWVC(allreduce=False)
    wvc.update({"mlm_logits_wvc": logits, "mlm_label_wvc": label})
    assert wvc.get() == ("MLMAccWVC", 2 / 3)
    aux = MLMAccuracyAUX(allreduce=False)
    aux.update({"mlm_logits_aux": None})  # the task is off: nothing counted
    aux.update({"mlm_logits_aux": logits, "mlm_label_aux": torch.full((2, 3), -1)})
    assert aux.get()[0] == "MLMAccAUX" and aux.get()[1] != aux.get()[1]  # nan: no predicted piece
    mvrc = MVRCAccuracy(allreduce=False)
    target = torch.zeros(1, 3, 4)
    target[0, 0] = torch.tensor([0.1, 0.7, 0.2, 0.0])
    target[0, 2] = torch.tensor([0.0, 0.0, 0.1, 0.9])
    mvrc.update({"mvrc_logits": torch.tensor([[[0, 5, 0, 0], [9, 0, 0, 0], [0, 0, 5, 0.]]]), "mvrc_label": target})
    assert mvrc.get() == ("MVRCAccuracy", 0.5)
    rel = RelationshipAccuracy(allreduce=False)
    rel.update({"relationship_logits": torch.tensor([[0, 1.], [1, 0], [1, 0]]),
                "relationship_label": torch.tensor([1, 1, 0])})
    assert rel.get() == ("RelAcc", 2 / 3)


def test_demo_captions_name_colours_shapes_and_positions(tiny_pretrain):
    with open(os.path.join(tiny_pretrain.captions, "train_frcnn.json")) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == tp.TRAIN_CAPTIONS
    scene = lines[11]
    det = load_detections(os.path.join(tiny_pretrain.captions, scene["frcnn"].replace(".zip@", "")))
    text = " ".join(scene["caption"])
    assert text.count(" at the ") == 4 and det.cls_scores.shape == (4, 1601)
    assert torch.allclose(det.cls_scores.sum(1), torch.ones(4)) and (det.cls_scores.argmax(1) <= 16).all()
    assert lines[0]["caption"][:4] == ["a", "photo", "of", "a"]
