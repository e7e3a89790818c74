"""RefCOCO+ dataset: items, candidate boxes of every BOXES / PROPOSAL_SOURCE value, labels, transforms, loader."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

import common.data.transforms as T
from common.data.build import build_dataset, make_dataloader
from common.data.samplers import SampleKey
from common.data.tokenizer import build_tokenizer
from refcoco.data import RefCOCO
from refcoco.data.refer import RefCOCODataError
from refcoco.task import TASK as REFCOCO_TASK
from tests.refcoco_fixture import ids, write_refcoco

CFG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cfgs", "refcoco",
                   "base_gt_boxes_4x16G.yaml")


@pytest.fixture
def root(tmp_path):
    return write_refcoco(str(tmp_path))


def dataset(root, image_set="train", **kwargs):
    return RefCOCO(image_set, root, build_tokenizer(os.path.join(root, "bert")), **kwargs)


def test_gt_item_without_transform(root):
    ds = dataset(root)
    assert len(ds) == 2 and ds.data_names == ["image", "boxes", "im_info", "expression", "label"]
    assert ds.ref_ids == [1, 1]
    image, boxes, im_info, expression, label = ds[1]
    assert isinstance(image, Image.Image) and image.size == (40, 30)
    assert boxes.tolist() == [[2, 3, 12, 11], [20, 5, 35, 25]]
    assert im_info.tolist() == [40, 30, 1, 1, 1]
    assert expression.tolist() == ids("small red one") and expression.dtype == torch.int64
    assert label.tolist() == [1.0, 0.0] and label.dtype == torch.float32
    assert ds.referred_boxes.tolist() == [[2, 3, 12, 11], [2, 3, 12, 11]]


def test_splits_and_test_mode(root):
    assert [len(dataset(root, s)) for s in ("train", "val", "testA", "testB", "test", "train+val")] == [2, 1, 1, 1, 2, 3]
    test = dataset(root, "testA+testB", test_mode=True)
    assert test.data_names == ["image", "boxes", "im_info", "expression"]
    image, boxes, im_info, expression = test[0]
    assert boxes.tolist() == [[0, 0, 10, 10]] and expression.tolist() == ids("the tall one")
    # the referred boxes stay known (RefCOCO+ test labels are public): accuracy needs them
    assert test.referred_boxes.tolist() == [[0, 0, 10, 10], [20, 5, 35, 25]]
    assert test.group_ids == [1, 0]  # image 2 is portrait, image 1 landscape


@pytest.mark.parametrize("boxes, source, expected, labels", [
    ("gt", "official", [[2, 3, 12, 11], [20, 5, 35, 25]], [1, 0]),
    ("proposal", "official", [[3, 3, 13, 11], [0, 0, 5, 5]], [1, 0]),  # IoU 90/108 with the referred box
    ("proposal+gt", "official", [[3, 3, 13, 11], [0, 0, 5, 5], [2, 3, 12, 11], [20, 5, 35, 25]], [1, 0, 1, 0]),
    ("gt+proposal", "official", [[3, 3, 13, 11], [0, 0, 5, 5], [2, 3, 12, 11], [20, 5, 35, 25]], [1, 0, 1, 0]),
    ("proposal", "vg", [[1, 1, 20, 20]], [0]),  # 110 / 400 px: IoU 0.275
    ("proposal+gt", "vg", [[1, 1, 20, 20], [2, 3, 12, 11], [20, 5, 35, 25]], [0, 1, 0]),
])
def test_candidate_boxes_and_labels(root, boxes, source, expected, labels):
    ds = dataset(root, boxes=boxes, proposal_source=source, add_image_as_a_box=True)
    _, got, _, _, label = ds[0]
    # box 0 is the whole 40x30 image, IoU 99/1200 with the referred box: negative
    assert got.tolist() == [[0, 0, 39, 29]] + expected
    assert label.tolist() == [0.0] + [float(v) for v in labels]


def test_image_without_detections(root):
    with_image_box = dataset(root, "testA", boxes="proposal", add_image_as_a_box=True)
    assert with_image_box[0][1].tolist() == [[0, 0, 19, 49]]
    with pytest.raises(RefCOCODataError, match=r"image_id 2 .*COCO_train2014_000000000002.jpg\) has no candidate box"):
        dataset(root, "testA", boxes="proposal")[0]


def test_bad_arguments(root):
    with pytest.raises(ValueError, match="BOXES must be one of gt, proposal, proposal\\+gt, gt\\+proposal, got 'dets'"):
        dataset(root, boxes="dets")
    with pytest.raises(ValueError, match="PROPOSAL_SOURCE must be one of official, vg, got 'mattnet'"):
        dataset(root, proposal_source="mattnet")


def test_resize_and_flip_move_boxes_and_swap_left_right(root):
    flip = T.Compose([T.Resize(60, 1000), T.RandomHorizontalFlip(1.0), T.ToTensor()])
    ds = dataset(root, transform=flip, boxes="proposal+gt")
    image, boxes, im_info, expression, label = ds[0]
    assert image.shape == (3, 60, 80) and im_info.tolist() == [80, 60, 2, 2, 0]
    # x -> 79 - 2x (mirror of the doubled box), y -> 2y
    assert boxes.tolist() == [[53, 6, 73, 22], [69, 0, 79, 10], [55, 6, 75, 22], [9, 10, 39, 50]]
    assert expression.tolist() == ids("the right box")  # "the left box" mirrored
    assert label.tolist() == [1, 0, 1, 0]
    assert image[0, 0, 0] < 0.5 < image[2, 0, 0]  # the blue right half is now on the left


def test_labels_are_computed_on_the_transformed_boxes(root):
    # The +1 pixel of the IoU weighs more on a smaller image: [2, 3, 6.5, 11] against the referred
    # [2, 3, 12, 11] has IoU 49.5 / 99 = 0.5 (negative) at full size and 16.25 / 30 (positive) at half
    # size; labels follow the image the model sees, as in the reference.
    for short_side, expected in ((30, 0.0), (15, 1.0)):
        ds = dataset(root, transform=T.Compose([T.Resize(short_side, 1000), T.ToTensor()]), boxes="proposal")
        ds.proposals[1] = torch.tensor([[2, 3, 6.5, 11]])
        _, _, im_info, _, label = ds[0]
        assert im_info[2].item() == short_side / 30
        assert label.tolist() == [expected]


def test_sample_key_draws_the_flip_from_its_generator(root):
    ds = dataset(root, transform=T.Compose([T.RandomHorizontalFlip(0.5), T.ToTensor()]))
    keys = [SampleKey(0, epoch, 7) for epoch in range(8)]
    first = [ds[k][1][0, 0].item() for k in keys]
    assert first == [ds[k][1][0, 0].item() for k in keys]  # same key, same flip
    assert set(first) == {2.0, 27.0}  # both outcomes over 8 epochs: x1 = 2 or 39 - 12


def test_zip_mode_reads_train2014_zip(root):
    plain, zipped = dataset(root), dataset(root, storage="zip")
    assert zipped.items[0]["image_fn"].endswith("train2014.zip@/train2014/COCO_train2014_000000000001.jpg")
    assert (np.asarray(zipped[0][0]) == np.asarray(plain[0][0])).all()


def test_image_size_must_match_instances(root):
    Image.new("RGB", (30, 40)).save(os.path.join(root, "train2014", "COCO_train2014_000000000001.jpg"))
    with pytest.raises(RefCOCODataError, match=r"000000000001.jpg: the image is 30x40 pixels but .*instances.json "
                                               r"says 40x30"):
        dataset(root)[0]


def test_exif_rotated_image_is_read_in_the_orientation_of_instances(root):
    """Stored 40x30 as instances.json says, with EXIF orientation 6 (30x40 upright): read as stored, one warning."""
    from common.data.loading import ImageOrientationWarning

    path = os.path.join(root, "train2014", "COCO_train2014_000000000001.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(path).save(path, exif=exif)
    ds = dataset(root)
    with pytest.warns(ImageOrientationWarning, match=r"000000000001\.jpg has EXIF orientation 6: 30x40 pixels "
                                                     r"upright, 40x30 as stored, the size in .*instances\.json "
                                                     r"\(image_id 1\); it is used as stored"):
        image = ds[0][0]
    assert image.size == (40, 30)


def config(root, *opts):
    return REFCOCO_TASK.load_config(CFG, ["DATASET.DATASET_PATH", root, "NETWORK.BERT_MODEL_NAME", os.path.join(root, "bert"),
                             "NUM_WORKERS_PER_GPU", 0, "SCALES", [60, 100]] + list(opts))


def test_from_config_through_the_shared_builder(root):
    cfg = config(root)
    train, val = build_dataset(cfg, "train"), build_dataset(cfg, "val")
    assert isinstance(train, RefCOCO) and (len(train), len(val)) == (2, 1)
    assert train.add_image_as_a_box and train.boxes == "gt"
    test = build_dataset(config(root, "DATASET.TEST_BOXES", "proposal"), "test")
    assert test.test_mode and len(test) == 2 and test.proposals is not None


def test_from_config_lists_every_missing_path(root, tmp_path):
    os.remove(os.path.join(root, "refcoco+", "instances.json"))
    os.remove(os.path.join(root, "refcoco+", "proposal", "res101_coco_minus_refer_notime_dets.json"))
    cfg = config(root, "DATASET.TRAIN_BOXES", "proposal+gt", "DATASET.ZIP_MODE", True)
    os.remove(os.path.join(root, "train2014.zip"))
    with pytest.raises(FileNotFoundError) as error:
        build_dataset(cfg, "train")
    message = str(error.value)
    for missing in ("refcoco+/instances.json", "train2014.zip", "res101_coco_minus_refer_notime_dets.json",
                    "data/PREPARE_DATA.md"):
        assert missing in message
    assert "refs(unc).p" not in message
    with pytest.raises(FileNotFoundError, match="DATASET.DATASET_PATH '.*nowhere' \\(folder\\)"):
        build_dataset(config(str(tmp_path / "nowhere")), "val")
    with pytest.raises(ValueError, match="CACHE_MODE is not supported"):
        build_dataset(config(root, "DATASET.CACHE_MODE", True), "val")


def test_loader_batches_pad_boxes_labels_and_text(root):
    # per-batch image padding: this test is about the other fields (the fixed canvas: tests/test_collate.py)
    cfg = config(root, "TRAIN.BATCH_IMAGES", 3, "TRAIN.SHUFFLE", False, "TRAIN.ASPECT_GROUPING", False,
                 "DATASET.TRAIN_IMAGE_SET", "train+testA", "TRAIN.FLIP_PROB", 0.0, "DATASET.PAD_TO_BATCH_MAX", True)
    loader = make_dataloader(cfg, "train")
    image, boxes, im_info, expression, label = next(iter(loader))
    # items: "the left box" and "small red one" on image 1 (3 boxes), "the tall one" on image 2 (2 boxes)
    assert image.shape == (3, 3, 100, 80)  # 40x30 -> 80x60, 20x50 -> 40x100 (SCALES 60, 100): padded
    assert boxes.shape == (3, 3, 4) and (boxes[2, 2] == -1).all() and (boxes[:2] >= 0).all()
    assert label.tolist() == [[0, 1, 0], [0, 1, 0], [0, 1, 0]]
    assert expression.tolist() == [ids("the left box"), ids("small red one"), ids("the tall one")]
    assert im_info[:, 4].tolist() == [0, 1, 2]
