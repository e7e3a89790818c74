"""Conceptual Captions index and detector files (pretrain/data/conceptual_captions.py) and skipping
unreadable images (common/data/skips.py)."""
import base64
import io
import json
import logging
import os
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from common.data.loading import load_image
from common.data.skips import SkipCounter, TooManySkipsError, read_or_skip
from common.data.zipreader import ZipReader
from common.errors import UserInputError
from pretrain.data.conceptual_captions import (INDEX_FILE, CaptionDataError, decode_floats, load_detections,
                                               local_path, read_caption_index)

NUM_BOXES = 5


def b64(array):
    return base64.b64encode(np.ascontiguousarray(array, dtype=np.float32).tobytes()).decode("ascii")


def detector_arrays(seed=0):
    rng = np.random.RandomState(seed)
    boxes = rng.uniform(0, 60, (NUM_BOXES, 4)).astype(np.float32)
    logits = rng.randn(NUM_BOXES, 1601).astype(np.float32) * 3
    classes = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
    features = rng.rand(NUM_BOXES, 2048).astype(np.float32)
    return boxes, classes, features


def detector_json(seed=0, **override):
    boxes, classes, features = detector_arrays(seed)
    meta = {"image_id": seed, "image_w": 64, "image_h": 48, "num_boxes": NUM_BOXES, "boxes": b64(boxes),
            "classes": b64(classes), "features": b64(features), "attrs": b64(np.zeros((NUM_BOXES, 401)))}
    meta.update(override)
    return meta


def jpeg_bytes():
    buf = io.BytesIO()
    rng = np.random.RandomState(0)
    Image.fromarray(rng.randint(0, 255, (48, 64, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture
def cc_root(tmp_path):
    """Reference layout: train_frcnn.json, train_image/ + train_image.zip, train_frcnn/ + train_frcnn.0.zip.
    Image 0 is fine, 1 truncated, 2 not an image, 3 missing."""
    root = tmp_path / "conceptual-captions"
    (root / "train_image").mkdir(parents=True)
    (root / "train_frcnn").mkdir()
    images = {"00000000.jpg": jpeg_bytes(), "00000001.jpg": jpeg_bytes()[:400], "00000002.jpg": b"<html>gone</html>"}
    with zipfile.ZipFile(root / "train_image.zip", "w") as zi, zipfile.ZipFile(root / "train_frcnn.0.zip", "w") as zf:
        for name, data in images.items():
            (root / "train_image" / name).write_bytes(data)
            zi.writestr(name, data)
        for i in range(4):
            text = json.dumps(detector_json(i))
            (root / "train_frcnn" / "{:08d}.json".format(i)).write_text(text)
            zf.writestr("{:08d}.json".format(i), text)
    captions = [["a", "dog", "on", "a", "mat"], ["Red", "bus", "station"], ["cafe"], ["blue", "sky"]]
    with open(root / INDEX_FILE.format("train"), "w") as f:
        for i, caption in enumerate(captions):
            f.write(json.dumps({"image": "train_image.zip@/{:08d}.jpg".format(i), "caption": caption,
                                "frcnn": "train_frcnn.0.zip@/{:08d}.json".format(i)}) + "\n")
        f.write("\n")
    yield str(root)
    ZipReader.close_all()


def test_index_in_folder_and_zip_mode(cc_root):
    index = os.path.join(cc_root, "train_frcnn.json")
    folder = read_caption_index(index, cc_root, storage="folder")
    zipped = read_caption_index(index, cc_root, storage="zip")
    assert len(folder) == len(zipped) == 4
    assert folder[1].caption == ["Red", "bus", "station"] and folder[1].line == 2
    assert folder[1].image == os.path.join(cc_root, "train_image/00000001.jpg")
    assert folder[1].frcnn == os.path.join(cc_root, "train_frcnn/00000001.json")
    assert zipped[1].image == os.path.join(cc_root, "train_image.zip@/00000001.jpg")
    assert zipped[1].frcnn == os.path.join(cc_root, "train_frcnn.0.zip@/00000001.json")
    a, b = load_image(folder[0].image), load_image(zipped[0].image)
    assert a.size == b.size == (64, 48) and np.array_equal(np.asarray(a), np.asarray(b))
    for f, z in zip(folder, zipped):
        df, dz = load_detections(f.frcnn, with_features=True), load_detections(z.frcnn, with_features=True)
        assert torch.equal(df.features, dz.features) and torch.equal(df.boxes, dz.boxes)


def test_local_path_rules():
    assert local_path("d", "train_image.zip@/x.jpg", "folder") == os.path.join("d", "train_image/x.jpg")
    assert local_path("d", "train_frcnn.12.zip@/x.json", "folder") == os.path.join("d", "train_frcnn/x.json")
    assert local_path("d", "images/x.jpg", "folder") == os.path.join("d", "images/x.jpg")
    assert local_path("d", "train_image.zip@/x.jpg", "zip") == os.path.join("d", "train_image.zip@/x.jpg")
    assert local_path("d", "train_frcnn.12.zip@/x.json", "lmdb") == os.path.join("d", "train_frcnn.lmdb@/x.json")


def test_detections_decode_and_sort_by_best_class_score(cc_root):
    boxes, classes, features = detector_arrays(2)
    det = load_detections(os.path.join(cc_root, "train_frcnn", "00000002.json"), with_features=True)
    order = np.argsort(-classes.max(1), kind="stable")
    assert det.width == 64 and det.height == 48
    assert det.boxes.dtype == det.cls_scores.dtype == det.features.dtype == torch.float32
    assert np.array_equal(det.boxes.numpy(), boxes[order])
    assert np.array_equal(det.cls_scores.numpy(), classes[order])
    assert np.array_equal(det.features.numpy(), features[order])
    assert det.cls_scores.shape == (NUM_BOXES, 1601) and det.features.shape == (NUM_BOXES, 2048)
    assert (det.cls_scores.max(1).values[:-1] >= det.cls_scores.max(1).values[1:]).all()
    assert load_detections(os.path.join(cc_root, "train_frcnn", "00000002.json")).features is None


def test_base64_with_line_breaks_decodes():
    values = np.arange(12, dtype=np.float32)
    text = base64.encodebytes(values.tobytes()).decode()  # 76-character lines, as Python 2 writers made
    assert decode_floats(text, 3, "x").tolist() == values.reshape(3, 4).tolist()


@pytest.mark.parametrize("override, message", [
    ({"classes": 3}, "field 'classes': expected a base64 string, got int"),
    ({"boxes": "@@not base64@@"}, "field 'boxes': "),
    ({"boxes": b64(np.zeros((NUM_BOXES, 5)))}, "'boxes' has 5 numbers per box, expected 4"),
    ({"classes": b64(np.zeros(7))}, "field 'classes': 28 bytes are not 5 rows of float32"),
    ({"num_boxes": 0}, "'num_boxes' must be an int >= 1"),
])
def test_bad_detector_files_name_file_and_field(tmp_path, override, message):
    path = tmp_path / "00000009.json"
    path.write_text(json.dumps(detector_json(0, **override)))
    with pytest.raises(CaptionDataError, match=message) as e:
        load_detections(str(path))
    assert "00000009.json" in str(e.value)


def test_missing_features_name_the_config(tmp_path):
    path = tmp_path / "d.json"
    meta = detector_json(0)
    del meta["features"]
    path.write_text(json.dumps(meta))
    assert load_detections(str(path)).boxes.shape == (NUM_BOXES, 4)
    with pytest.raises(CaptionDataError, match="missing field\\(s\\) features \\(the precomputed-feature"):
        load_detections(str(path), with_features=True)


@pytest.mark.parametrize("line, message", [
    ("not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    ('{"image": "a.jpg", "caption": ["a"]}', "line 2: missing field\\(s\\) frcnn"),
    ('{"image": "a.jpg", "caption": "a dog", "frcnn": "a.json"}', "line 2: 'caption' must be a list of token"),
    ('{"image": 3, "caption": ["a"], "frcnn": "a.json"}', "line 2: 'image' must be a path"),
])
def test_bad_index_lines_name_file_and_line(tmp_path, line, message):
    index = tmp_path / "train_frcnn.json"
    index.write_text('{"image": "a.jpg", "caption": ["a"], "frcnn": "a.json"}\n' + line + "\n")
    with pytest.raises(CaptionDataError, match=message):
        read_caption_index(str(index), str(tmp_path))


def test_missing_index_points_to_the_docs(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_frcnn.json' not found .*PREPARE_DATA.md"):
        read_caption_index(str(tmp_path / "train_frcnn.json"), str(tmp_path))


# ---------------------------------------------------------------- skipping unreadable images
@pytest.mark.parametrize("storage", ["folder", "zip"])
def test_unreadable_images_are_skipped_counted_and_logged(cc_root, storage, caplog):
    records = read_caption_index(os.path.join(cc_root, "train_frcnn.json"), cc_root, storage=storage)
    counter = SkipCounter(max_share=1.0, log_first=2)
    with caplog.at_level(logging.WARNING, logger="common.data.skips"):
        images = [read_or_skip(load_image, r.image, counter) for r in records]
    assert images[0].size == (64, 48)
    assert images[1:] == [None, None, None]  # truncated, not an image, missing
    assert (counter.seen, counter.skipped) == (4, 3)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2  # only the first log_first are logged
    assert "00000001.jpg" in logged[0] and "00000002.jpg" in logged[1]


def test_skips_past_the_share_stop_with_the_first_file_names():
    counter = SkipCounter(max_share=0.01, min_seen=100, log_first=3, setting="DATASET.SKIP_SHARE")
    counter.skip("a.jpg", "missing")  # 1 of 1 seen: within 1% of min_seen = 100
    with pytest.raises(TooManySkipsError) as e:
        counter.skip("b.jpg", "truncated")
    message = str(e.value)
    assert "2 of 2 images could not be read (100.00%), more than the 1.00% allowed by DATASET.SKIP_SHARE" in message
    assert "a.jpg (missing); b.jpg (truncated)" in message
    assert isinstance(e.value, UserInputError)

    counter = SkipCounter(max_share=0.01, min_seen=100)
    for _ in range(298):
        counter.ok()
    counter.skip("a.jpg", "x")
    counter.skip("b.jpg", "x")
    counter.skip("c.jpg", "x")  # 3 of 301 <= 3.01
    with pytest.raises(TooManySkipsError, match="4 of 302 images"):
        counter.skip("d.jpg", "x")  # 4 of 302 > 3.02


def test_zero_share_is_strict_and_bad_settings_are_refused():
    with pytest.raises(TooManySkipsError, match="1 of 1 images"):
        SkipCounter(max_share=0.0).skip("a.jpg", "missing")
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        SkipCounter(max_share=2)
    with pytest.raises(ValueError, match="min_seen"):
        SkipCounter(min_seen=0)
