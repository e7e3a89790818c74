import collections
import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest
from PIL import Image

from tests.test_vcr_data import VOCAB

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("make_demo_data", os.path.join(ROOT, "demo", "make_demo_data.py"))
demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo)

SIZES = (400, 120, 40)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("demo"))
    demo.make_demo_data(path, seed=0, sizes=SIZES, with_zip=True)
    return path


def read(out, fn):
    with open(os.path.join(out, fn)) as f:
        return [json.loads(line) for line in f]


def refs(tokens):
    return [o for t in tokens if isinstance(t, list) for o in t]


def test_files_and_counts(out):
    counts = {fn: len(read(out, fn)) for fn in ("train.jsonl", "val.jsonl", "val_shapes.jsonl", "val_real.jsonl",
                                                "test.jsonl")}
    assert counts == {"train.jsonl": 400 + 11, "val.jsonl": 120 + 11, "val_shapes.jsonl": 120,
                      "val_real.jsonl": 11, "test.jsonl": 40 + 11}
    assert all(a["annot_id"].startswith("shapes-val-") for a in read(out, "val_shapes.jsonl"))
    assert all(a["annot_id"].startswith("real-val-") for a in read(out, "val_real.jsonl"))
    assert all("answer_label" not in a and "rationale_label" not in a for a in read(out, "test.jsonl"))
    assert len(set(a["annot_id"] for a in read(out, "train.jsonl"))) == 411


def test_real_part(out):
    items = [a for fn in ("train.jsonl", "val.jsonl", "test.jsonl") for a in read(out, fn)
             if a["annot_id"].startswith("real-")]
    per_image = collections.Counter(a["img_fn"] for a in items)
    assert len(per_image) >= 10 and min(per_image.values()) >= 3
    for a in items:
        meta = json.load(open(os.path.join(out, "vcr1images", a["metadata_fn"])))
        image = Image.open(os.path.join(out, "vcr1images", a["img_fn"]))
        assert image.mode == "RGB" and image.size == (meta["width"], meta["height"])
        assert len(meta["boxes"]) == len(a["objects"])
        for x1, y1, x2, y2, _ in meta["boxes"]:
            assert 0 <= x1 < x2 < meta["width"] and 0 <= y1 < y2 < meta["height"]
        assert len(a["answer_choices"]) == 4 and len(a["rationale_choices"]) == 4
        texts = [a["question"]] + a["answer_choices"] + a["rationale_choices"]
        assert all(0 <= o < len(a["objects"]) for t in texts for o in refs(t))
        assert any(refs(t) for t in texts)  # every item refers to objects somewhere


def test_shapes_labels_are_balanced_and_true(out):
    items = read(out, "train.jsonl")
    shapes = [a for a in items if a["annot_id"].startswith("shapes-")]
    for key in ("answer_label", "rationale_label"):
        counts = collections.Counter(a[key] for a in shapes)
        assert sorted(counts) == [0, 1, 2, 3] and max(counts.values()) - min(counts.values()) <= 1
    for a in shapes:
        meta = json.load(open(os.path.join(out, "vcr1images", a["metadata_fn"])))
        image = np.asarray(Image.open(os.path.join(out, "vcr1images", a["img_fn"]))).astype(int)
        boxes = np.array(meta["boxes"])[:, :4]
        cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
        right = a["answer_choices"][a["answer_label"]]
        expected = {"leftmost": np.argmin(cx), "rightmost": np.argmax(cx), "topmost": np.argmin(cy),
                    "bottommost": np.argmax(cy)}[a["question"][4]]
        assert refs(right) == [expected]
        # the right rationale names the colour of the pixel at the object's centre (nearest palette entry)
        pixel = image[int(cy[expected]), int(cx[expected])]
        nearest = min(demo.COLORS, key=lambda c: np.abs(pixel - demo.COLORS[c]).sum())
        assert a["rationale_choices"][a["rationale_label"]][3] == nearest
        assert len(set(map(json.dumps, a["answer_choices"]))) == 4  # four distinct candidates


def test_text_only_baseline_stays_near_chance(out):
    """A text-only model (best candidate text per question text, learnt on train) is at ~25%."""
    def key(tokens):
        return " ".join(str(t) for t in tokens)

    wins = collections.defaultdict(collections.Counter)
    for a in read(out, "train.jsonl"):
        for k, choice in enumerate(a["answer_choices"]):
            wins[key(a["question"])][key(choice)] += int(k == a["answer_label"])
    val = read(out, "val_shapes.jsonl")
    correct = sum(max(range(4), key=lambda k: wins[key(a["question"])][key(a["answer_choices"][k])])
                  == a["answer_label"] for a in val)
    assert correct / len(val) < 0.35


def _digest(path):
    h = hashlib.sha256()
    for dirpath, _, files in sorted(os.walk(path)):
        for fn in sorted(files):
            if fn.endswith((".jsonl", ".json", ".jpg")):
                with open(os.path.join(dirpath, fn), "rb") as f:
                    h.update(fn.encode() + f.read())
    return h.hexdigest()


def test_deterministic(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for p in (a, b):
        demo.make_demo_data(p, seed=3, sizes=(20, 8, 4))
    assert _digest(a) == _digest(b)


def test_demo_loads_through_vcr_dataset_in_zip_mode(out):
    from common.data import transforms as T
    from common.data.collate import BatchCollator
    from common.data.tokenizer import build_tokenizer
    from vcr.data.vcr import VCRDataset
    with open(os.path.join(out, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    tf = T.Compose([T.Resize(96, 1000), T.ToTensor(), T.Normalize([102.98, 115.95, 122.77], [1.0, 1.0, 1.0])])
    ds = VCRDataset("val.jsonl", "vcr1images", out, build_tokenizer(out), transform=tf, task="Q2A",
                    storage="zip", add_image_as_a_box=True)
    items = [ds[i] for i in (0, len(ds) - 1)]  # a scene and a photograph
    batch = BatchCollator(ds.data_names)(items)
    assert batch[0].shape[:2] == (2, 3) and batch[5].shape[:2] == (2, 4)
