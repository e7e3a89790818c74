import json
import os
import re
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from common.data import transforms as T
from common.data.loading import ImageOrientationWarning, ImageSizeWarning
from common.data.tokenizer import build_tokenizer
from common.data.zipreader import ZipReader
from vcr.data.vcr import VCRDataError, VCRDataset, align_matrix, keep_only_relevant, polygon_mask

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "why", "is", "casey", "riley", "and", "left", "right", "?",
         "dog", "car", "the", "sun", "##flower", "of", "it", "yes", "no", "because", "sits", "runs", "red", "."]

# objects 0 person, 1 dog, 2 person, 3 car
LINE = {
    "annot_id": "val-0", "movie": "m", "img_fn": "m/a.jpg", "metadata_fn": "m/a.json",
    "objects": ["person", "dog", "person", "car"],
    "question": ["why", "is", [0, 2], "left", "of", [1], "?"],
    "answer_choices": [["because", "sunflower"], ["yes"], [[3], "runs"], ["no", "."]],
    "answer_label": 2,
    "rationale_choices": [["it", "sits"], [[1], "is", "red"], ["the", "car"], ["no"]],
    "rationale_label": 1,
}
META = {"boxes": [[10, 5, 29, 24, 0.9], [40, 10, 59, 39, 0.8], [60, 0, 79, 19, 0.7], [0, 30, 79, 39, 0.6]],
        "segms": [[[[10, 5], [29, 5], [29, 24], [10, 24]]]] * 4, "width": 80, "height": 40, "names": []}


def write_vcr(root, lines=(LINE,), meta=META, image_size=(80, 40), name="val.jsonl", zip_images=False):
    """A tiny VCR folder: {root}/{name}, {root}/vcr1images/m/a.jpg + a.json (or vcr1images.zip)."""
    os.makedirs(os.path.join(root, "vcr1images", "m"), exist_ok=True)
    rng = np.random.RandomState(0)
    Image.fromarray(rng.randint(0, 255, (image_size[1], image_size[0], 3), dtype=np.uint8)).save(
        os.path.join(root, "vcr1images", "m", "a.jpg"))
    with open(os.path.join(root, "vcr1images", "m", "a.json"), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(root, name), "w") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    if zip_images:
        with zipfile.ZipFile(os.path.join(root, "vcr1images.zip"), "w") as z:
            for fn in ("a.jpg", "a.json"):
                z.write(os.path.join(root, "vcr1images", "m", fn), "vcr1images/m/" + fn)
    with open(os.path.join(root, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return root


def transform(flip=0.0, scales=(40, 1000)):
    return T.Compose([T.Resize(*scales), T.RandomHorizontalFlip(flip), T.ToTensor(),
                      T.Normalize([102.9801, 115.9465, 122.7717], [1.0, 1.0, 1.0])])


def make_dataset(root, **kw):
    args = dict(ann_file="val.jsonl", image_set="vcr1images", data_path=str(root),
                tokenizer=build_tokenizer(str(root)), transform=transform(), task="Q2A", add_image_as_a_box=True)
    args.update(kw)
    return VCRDataset(**args)


def ids(*words):
    return [VOCAB.index(w) for w in words]


@pytest.fixture
def root(tmp_path):
    yield write_vcr(str(tmp_path))
    ZipReader.close_all()


def test_q2a_item_token_box_alignment(root):
    ds = make_dataset(root)
    assert ds.data_names == ["image", "boxes", "masks", "question", "question_align_matrix",
                             "answer_choices", "answer_align_matrix", "answer_label", "im_info"]
    item = dict(zip(ds.data_names, ds[0]))
    q = item["question"]
    # [0, 2] -> "casey and riley"; word tags 0 (image box), objects tagged with box index o + 1
    assert q[:, 0].tolist() == ids("why", "is", "casey", "and", "riley", "left", "of", "dog", "?")
    assert q[:, 1].tolist() == [0, 0, 1, 0, 3, 0, 0, 2, 0]
    assert q[:, 2].tolist() == list(range(9))
    a0 = item["answer_choices"][0]
    assert a0.tolist() == [[ids("because")[0], 0, 0], [ids("sun")[0], 0, 1], [ids("##flower")[0], 0, 1]]
    assert torch.equal(item["answer_align_matrix"][0], torch.tensor([[1.0, 0, 0], [0, 0.5, 0.5]]))
    assert item["answer_choices"][2][:, 1].tolist() == [4, 0]  # the car is box 4
    assert item["answer_label"].item() == 2
    # boxes: image box first, resized by 40 / 40 = 1, class column = COCO index
    boxes = item["boxes"]
    assert boxes.shape == (5, 6)
    assert boxes[0].tolist() == [0, 0, 79, 39, 1.0, 0]
    assert boxes[1].tolist() == pytest.approx([10, 5, 29, 24, 0.9, 1])
    assert boxes[:, 5].tolist() == [0, 1, 17, 1, 3]  # person 1, dog 17, car 3
    assert item["masks"].shape == (5, 14, 14) and item["masks"][1].min() == 1.0
    assert item["image"].shape == (3, 40, 80)
    assert item["im_info"].tolist() == [80, 40, 1, 1, 0]


def test_without_image_box_words_are_tagged_minus_one(root):
    ds = make_dataset(root, add_image_as_a_box=False)
    item = dict(zip(ds.data_names, ds[0]))
    assert item["question"][:, 1].tolist() == [-1, -1, 0, -1, 2, -1, -1, 1, -1]
    assert item["boxes"].shape == (4, 6)


def test_resize_scales_boxes_and_clips(root):
    item = make_dataset(root, transform=transform(scales=(80, 1000)))[0]
    assert item[0].shape == (3, 80, 160)
    assert item[1][1, :4].tolist() == [20, 10, 58, 48]
    assert item[-1].tolist() == [160, 80, 2, 2, 0]
    # the whole-image box (79, 39) * 2 = (158, 78) stays inside the image after clipping
    assert item[1][0, :4].tolist() == [0, 0, 158, 78]


def test_person_names_restart_per_item(root):
    ds = make_dataset(root)
    first, second = ds[0][3], ds[0][3]  # a counter kept across calls would name them Jessie and Jackie
    assert torch.equal(first, second) and first[2, 0].item() == ids("casey")[0]


def test_only_use_relevant_dets(root):
    ds = make_dataset(root, only_use_relevant_dets=True)
    item = dict(zip(ds.data_names, ds[0]))
    # mentioned in order: 0, 2, 1 (question), 3 (answer 2) -> all kept, renumbered 0, 1, 2, 3
    assert item["boxes"][1:, :4].tolist() == [[10, 5, 29, 24], [60, 0, 79, 19], [40, 10, 59, 39], [0, 30, 79, 39]]
    assert item["question"][:, 1].tolist() == [0, 0, 1, 0, 2, 0, 0, 3, 0]
    kept, texts = keep_only_relevant([["a", [3]], [[1, 3]]])
    assert kept == [3, 1] and texts == [["a", [0]], [[1, 0]]]


def test_flip_swaps_left_right_and_mirrors_boxes(root):
    ds = make_dataset(root, transform=transform(flip=1.0))
    item = dict(zip(ds.data_names, ds[0]))
    assert item["question"][:, 0].tolist() == ids("why", "is", "casey", "and", "riley", "right", "of", "dog", "?")
    assert item["boxes"][1, :4].tolist() == [79 - 29, 5, 79 - 10, 24]
    plain = make_dataset(root)[0]
    assert torch.equal(item["image"], plain[0].flip(-1))


def test_zip_mode_equals_folder_mode(tmp_path):
    root = write_vcr(str(tmp_path), zip_images=True)
    zipped = make_dataset(root, storage="zip")
    os.rename(os.path.join(root, "vcr1images"), os.path.join(root, "unzipped"))  # only the zip is left
    assert zipped.annotations[0]["img_fn"].endswith("vcr1images.zip@/vcr1images/m/a.jpg")
    z_item = zipped[0]
    os.rename(os.path.join(root, "unzipped"), os.path.join(root, "vcr1images"))
    f_item = make_dataset(root)[0]
    for a, b in zip(z_item, f_item):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        else:
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    ZipReader.close_all()


def test_qa2r_query_is_question_plus_right_answer(root):
    ds = make_dataset(root, task="QA2R")
    assert ds.data_names == ["image", "boxes", "masks", "question", "question_align_matrix",
                             "rationale_choices", "rationale_align_matrix", "rationale_label", "im_info"]
    item = dict(zip(ds.data_names, ds[0]))
    q = item["question"]
    assert q[:, 0].tolist() == ids("why", "is", "casey", "and", "riley", "left", "of", "dog", "?", "car", "runs")
    m = item["question_align_matrix"]
    assert m.shape == (11, 11) and torch.equal(m, torch.eye(11))  # block diagonal of two identities
    assert item["rationale_choices"][1][:, 1].tolist() == [2, 0, 0]
    assert item["rationale_label"].item() == 1
    noq = dict(zip(ds.data_names, make_dataset(root, task="QA2R", qa2r_noq=True)[0]))
    assert noq["question"][:, 0].tolist() == ids("car", "runs")


def test_qa2r_test_mode_gives_one_query_per_answer(tmp_path):
    line = {k: v for k, v in LINE.items() if not k.endswith("_label")}
    root = write_vcr(str(tmp_path), lines=[line], name="test.jsonl")
    ds = make_dataset(root, ann_file="test.jsonl", task="QA2R", test_mode=True)
    assert ds.data_names == ["image", "boxes", "masks", "question", "question_align_matrix",
                             "rationale_choices", "rationale_align_matrix", "im_info"]
    item = dict(zip(ds.data_names, ds[0]))
    assert len(item["question"]) == 4
    assert item["question"][1][:, 0].tolist() == ids("why", "is", "casey", "and", "riley", "left", "of", "dog",
                                                     "?", "yes")


def test_q2ar_has_both(root):
    ds = make_dataset(root, task="Q2AR")
    assert ds.data_names == ["image", "boxes", "masks", "question", "question_align_matrix",
                             "answer_choices", "answer_align_matrix", "answer_label",
                             "rationale_choices", "rationale_align_matrix", "rationale_label", "im_info"]
    item = dict(zip(ds.data_names, ds[0]))
    assert len(item["answer_choices"]) == 4 and len(item["rationale_choices"]) == 4


def test_truncation_to_seq_len(root):
    ds = make_dataset(root, seq_len=10)
    item = dict(zip(ds.data_names, ds[0]))
    q = item["question"]
    for a in item["answer_choices"]:
        assert len(q) + len(a) <= 10
    # the question (9 pieces) loses its end until it fits with the 3-piece answer: 7 + 3
    assert len(q) == 7 and item["question_align_matrix"].shape == (7, 7)


def test_align_matrix_and_polygon_mask():
    assert torch.equal(align_matrix([0, 0, 1]), torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]))
    assert align_matrix([]).shape == (0, 0)
    # the left half of the box is covered
    m = polygon_mask([[[0, 0], [9, 0], [9, 19], [0, 19]]], [0, 0, 19, 19], (4, 4))
    assert m[:, :2].sum() == 8 and m[:, 3].sum() == 0


def skimage_mask(polygons, box, m):
    """The reference's rule, written out: vertices in float32 box-relative mask cells ((x - x1) * m / box
    width in pixels, inclusive), clamped into [0, m - 1], filled by skimage.draw.polygon; parts are OR-ed."""
    from skimage.draw import polygon
    mask = np.zeros((m, m), np.float32)
    for poly in polygons:
        xy = np.asarray(poly, np.float32)
        x = (xy[:, 0] - np.float32(box[0])) * np.float32(m / (box[2] - box[0] + 1))
        y = (xy[:, 1] - np.float32(box[1])) * np.float32(m / (box[3] - box[1] + 1))
        rr, cc = polygon(np.clip(y, 0, m - 1), np.clip(x, 0, m - 1))
        mask[rr, cc] = 1
    return mask


# Per object of LINE (boxes of META): concave, tiny (inside a cell), out of the box and the image, two parts.
CRAFTED_SEGMS = [
    [[[10, 5], [29, 5], [29, 24], [20.3, 11.7], [10, 24]]],  # a V: concave
    [[[45.1, 20.2], [45.6, 20.3], [45.3, 20.9]]],  # 0.5 x 0.7 pixels, under one 1.4 x 2.1 pixel cell
    [[[55.5, -6.2], [92.4, -3], [84, 13.6], [66.7, 25.1]]],  # beyond the box's left and bottom, the image's top/right
    [[[0, 30], [13.7, 31.2], [6.2, 38.9]], [[50.4, 33.3], [79, 30], [79, 39], [61.8, 36.6]]],  # two parts
]


def test_masks_are_the_references_skimage_polygons(tmp_path):
    root = write_vcr(str(tmp_path), meta=dict(META, segms=CRAFTED_SEGMS))
    ds = make_dataset(root)
    masks = dict(zip(ds.data_names, ds[0]))["masks"].numpy()
    assert masks.shape == (5, 14, 14) and masks[0].min() == 1.0  # the image box
    for o, segms in enumerate(CRAFTED_SEGMS):
        np.testing.assert_array_equal(masks[o + 1], skimage_mask(segms, META["boxes"][o], 14), err_msg=str(o))
    # the tiny polygon covers no cell centre: an empty mask (an outline drawing would mark a cell)
    assert masks[1:].sum((1, 2)).tolist() == [136, 0, 136, 50]


# ---------------------------------------------------------------- bad data
def _error(tmp_path, exc=VCRDataError, get=False, **kw):
    root = write_vcr(str(tmp_path), **kw)
    with pytest.raises(exc) as info:
        ds = make_dataset(root)
        if get:
            ds[0]
    return str(info.value)


def test_error_missing_annotation_file(tmp_path):
    write_vcr(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="annotation file '.*nope.jsonl' not found.*PREPARE_DATA.md"):
        make_dataset(str(tmp_path), ann_file="nope.jsonl")


def test_error_invalid_json_line(tmp_path):
    msg = _error(tmp_path, lines=[LINE, '{"annot_id": "x", '])
    assert "val.jsonl line 2: not valid JSON" in msg


def test_error_missing_field(tmp_path):
    line = {k: v for k, v in LINE.items() if k != "answer_label"}
    msg = _error(tmp_path, lines=[line])
    assert "val.jsonl line 1: missing field(s) answer_label" in msg


def test_error_object_index_out_of_range(tmp_path):
    line = dict(LINE, answer_choices=[["yes"], ["no"], [[7]], ["it"]])
    msg = _error(tmp_path, lines=[line])
    assert "val.jsonl line 1: answer_choices refers to object 7 but the line lists 4 objects" in msg


def test_error_missing_image(tmp_path):
    line = dict(LINE, img_fn="m/missing.jpg")
    msg = _error(tmp_path, exc=FileNotFoundError, get=True, lines=[line])
    assert "val.jsonl line 1 (annot_id val-0)" in msg and "missing.jpg" in msg


def test_error_missing_metadata(tmp_path):
    line = dict(LINE, metadata_fn="m/missing.json")
    msg = _error(tmp_path, exc=FileNotFoundError, get=True, lines=[line])
    assert "val.jsonl line 1 (annot_id val-0)" in msg and "missing.json" in msg


def test_error_undecodable_image(tmp_path):
    root = write_vcr(str(tmp_path))
    with open(os.path.join(root, "vcr1images", "m", "a.jpg"), "wb") as f:
        f.write(b"\x00garbage")
    with pytest.raises(ValueError, match=r"val.jsonl line 1 \(annot_id val-0\): cannot decode image '.*a.jpg'"):
        make_dataset(root)[0]


def test_error_box_count_mismatch(tmp_path):
    meta = dict(META, boxes=META["boxes"][:2])
    msg = _error(tmp_path, get=True, meta=meta)
    assert "a.json (for" in msg and "one box per object (4 objects), got 2 boxes" in msg


def test_error_malformed_polygon(tmp_path):
    meta = dict(META, segms=META["segms"][:3] + [[[[0, 30], [79, 30, 1], [79, 39]]]])
    msg = _error(tmp_path, get=True, meta=meta)
    assert "a.json (for" in msg and "'segms' of object 3: a polygon must be a list of [x, y] points" in msg


def rotate_by_exif(root):
    """Re-save a.jpg (80 x 40 stored) with EXIF orientation 6: decoded 40 wide x 80 high."""
    path = os.path.join(root, "vcr1images", "m", "a.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(path).save(path, exif=exif)


def test_exif_rotated_image_with_metadata_of_its_stored_pixels_is_used_as_stored(tmp_path):
    """Metadata 80x40 (the stored pixels), EXIF orientation 6 (40x80 upright): the stored orientation, one warning."""
    root = write_vcr(str(tmp_path))
    rotate_by_exif(root)
    ds = make_dataset(root)
    with pytest.warns(ImageOrientationWarning) as warned:
        item = dict(zip(ds.data_names, ds[0]))
        again = dict(zip(ds.data_names, ds[0]))
    assert len(warned) == 1
    assert re.search(r"m/a\.jpg has EXIF orientation 6: 40x80 pixels upright, 80x40 as stored, the size in "
                     r".*m/a\.json \(for .*val\.jsonl line 1\); it is used as stored", str(warned[0].message))
    assert item["im_info"][:2].tolist() == again["im_info"][:2].tolist() == [80, 40]
    assert item["boxes"][1:, :4].tolist() == [b[:4] for b in META["boxes"]]


def test_image_of_neither_orientation_with_boxes_beyond_it_is_an_error(tmp_path):
    """Metadata 100x50: neither 80x40 (stored) nor 40x80 (upright); a box reaches beyond the image."""
    root = write_vcr(str(tmp_path), meta=dict(META, width=100, height=50,
                                              boxes=META["boxes"][:3] + [[0, 30, 99, 39, 0.6]]))
    rotate_by_exif(root)
    with pytest.raises(VCRDataError) as info:
        make_dataset(root)[0]
    msg = str(info.value)
    assert re.search(r"m/a\.jpg is 40x80 pixels as decoded \(in either orientation\) but 100x50 in .*m/a\.json "
                     r"\(for .*val\.jsonl line 1\), and the box \[40\.0, 10\.0, 59\.0, 39\.0\] reaches beyond "
                     r"the decoded image", msg), msg


def test_image_of_neither_orientation_with_boxes_inside_it_warns(tmp_path):
    boxes = [[10, 5, 29, 24, 0.9], [0, 40, 39, 79, 0.8], [5, 5, 6, 6, 0.7], [0, 0, 40, 80, 0.6]]
    root = write_vcr(str(tmp_path), meta=dict(META, boxes=boxes, width=100, height=50))
    rotate_by_exif(root)
    ds = make_dataset(root)
    with pytest.warns(ImageSizeWarning, match=r"m/a\.jpg is 40x80 pixels as decoded .* but 100x50 in .*a\.json .*; its "
                                              r"boxes fit the decoded image and are used as they are"):
        item = dict(zip(ds.data_names, ds[0]))
    assert item["im_info"][:2].tolist() == [40, 80]
    assert item["boxes"][1:, :4].tolist() == [b[:4] for b in boxes[:3]] + [[0, 0, 39, 79]]


def test_error_missing_vocab(tmp_path):
    with pytest.raises(FileNotFoundError, match="BERT folder '.*nobert' has no vocab.txt.*PREPARE_PRETRAINED"):
        build_tokenizer(str(tmp_path / "nobert"))
    with pytest.raises(FileNotFoundError, match="NETWORK.BERT_MODEL_NAME is empty: the text is tokenised with"):
        build_tokenizer("")


# ---------------------------------------------------------------- config -> loader
def _cfg(root, **over):
    from vcr.task import TASK as VCR_TASK
    opts = {"DATASET.DATASET": "vcr", "DATASET.DATASET_PATH": str(root), "DATASET.TASK": "Q2A",
            "DATASET.TRAIN_ANNOTATION_FILE": "val.jsonl", "DATASET.VAL_ANNOTATION_FILE": "val.jsonl",
            "DATASET.TRAIN_IMAGE_SET": "vcr1images", "DATASET.VAL_IMAGE_SET": "vcr1images",
            "NETWORK.BERT_MODEL_NAME": str(root), "NETWORK.PIXEL_MEANS": [102.9801, 115.9465, 122.7717],
            "NETWORK.PIXEL_STDS": [1.0, 1.0, 1.0], "SCALES": [40, 1000], "NUM_WORKERS_PER_GPU": 0,
            "TRAIN.BATCH_IMAGES": 2, "TRAIN.ASPECT_GROUPING": False, "TRAIN.FLIP_PROB": 0.0}
    opts.update(over)
    return VCR_TASK.load_config(None, [x for kv in opts.items() for x in kv])


def test_make_dataloader_from_config(tmp_path):
    import vcr.data  # noqa: F401  registers 'vcr'
    from common.data.build import make_dataloader
    line2 = dict(LINE, annot_id="val-1")
    root = write_vcr(str(tmp_path), lines=[LINE, line2, dict(LINE, annot_id="val-2")])
    loader = make_dataloader(_cfg(root), "train")
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [2, 1]
    assert batches[0][5].shape == (2, 4, 3, 3)
    # aspect grouping reads width/height from the metadata; evaluation shards without padding
    grouped = make_dataloader(_cfg(root, **{"TRAIN.ASPECT_GROUPING": True}), "train")
    assert grouped.dataset.group_ids == [0, 0, 0]
    val = make_dataloader(_cfg(root, **{"VAL.BATCH_IMAGES": 2}), "val", world_size=2, rank=1)
    assert [b[-1][:, 4].tolist() for b in val] == [[1.0, 2.0]]


def test_missing_data_is_one_clear_message(tmp_path):
    import vcr.data  # noqa: F401
    from common.data.build import make_dataloader
    root = write_vcr(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing DATASET.DATASET_PATH '.*nowhere'.*PREPARE_DATA.md"):
        make_dataloader(_cfg(str(tmp_path / "nowhere")), "train")
    with pytest.raises(FileNotFoundError, match="missing .*train.jsonl, .*imgs.zip. See data/PREPARE_DATA.md"):
        make_dataloader(_cfg(root, **{"DATASET.TRAIN_ANNOTATION_FILE": "train.jsonl",
                                      "DATASET.TRAIN_IMAGE_SET": "imgs", "DATASET.ZIP_MODE": True}), "train")
    with pytest.raises(KeyError, match="'vqa2' is not a registered dataset; known: .*vcr"):
        make_dataloader(_cfg(root, **{"DATASET.DATASET": "vqa2"}), "train")


# ---------------------------------------------------------------- reproducible augmentation
def _flips(loader, epoch, skip=0):
    """Batches of (dataset index, flipped) for one pass; box 1 (object 0, x1 = 10) moves iff flipped."""
    loader.batch_sampler.set_epoch(epoch)
    loader.batch_sampler.skip(skip)
    return [[(int(info[4]), bool(boxes[1, 0] != 10)) for info, boxes in zip(b[-1], b[1])] for b in loader]


@pytest.fixture
def flip_root(tmp_path):
    lines = [dict(LINE, annot_id="val-{}".format(i)) for i in range(12)]
    yield write_vcr(str(tmp_path), lines=lines)
    ZipReader.close_all()


def _flip_loader(root, workers=0, seed=3, world_size=1, rank=0):
    import vcr.data  # noqa: F401  registers 'vcr'
    from common.data.build import make_dataloader
    cfg = _cfg(root, **{"TRAIN.FLIP_PROB": 0.5, "NUM_WORKERS_PER_GPU": workers, "RNG_SEED": seed})
    return make_dataloader(cfg, "train", world_size=world_size, rank=rank)


def test_flips_independent_of_workers_skip_and_ranks(flip_root):
    full = _flips(_flip_loader(flip_root), epoch=1)
    assert len(full) == 6 and 0 < sum(f for b in full for _, f in b) < 12
    two_workers = _flip_loader(flip_root, workers=2)
    assert _flips(two_workers, epoch=0) != full  # the persistent workers also serve another epoch first
    assert _flips(two_workers, epoch=1) == full
    # a resumed run: fresh workers, first 3 batches skipped, so batch m goes to another worker
    assert _flips(_flip_loader(flip_root, workers=2), epoch=1, skip=3) == full[3:]
    ranks = [_flips(_flip_loader(flip_root, world_size=2, rank=r), epoch=1) for r in range(2)]
    assert sorted(x for part in ranks for b in part for x in b) == sorted(x for b in full for x in b)


def test_flips_change_with_epoch_and_seed(flip_root):
    loader = _flip_loader(flip_root)
    by_index = [dict(x for b in _flips(loader, epoch=e) for x in b) for e in (1, 2)]
    assert by_index[0] != by_index[1]
    other_seed = dict(x for b in _flips(_flip_loader(flip_root, seed=4), epoch=1) for x in b)
    assert other_seed != by_index[0]
    # evaluation loaders are keyed too but do not flip (VAL.FLIP_PROB 0)
    from common.data.build import make_dataloader
    val = make_dataloader(_cfg(flip_root, **{"TRAIN.FLIP_PROB": 0.5}), "val")
    assert not any(f for b in _flips(val, epoch=0) for _, f in b)
