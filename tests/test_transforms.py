import numpy as np
import pytest
import torch
from PIL import Image
from yacs.config import CfgNode as CN

from common.data import transforms as T
from common.data.loading import load_image, load_json
from common.data.samplers import SampleKey


def _sample(w=8, h=4, boxes=((1.0, 0.0, 2.0, 3.0),), texts=None):
    arr = np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3)
    boxes = torch.tensor(boxes, dtype=torch.float32)
    masks = torch.arange(len(boxes) * 4, dtype=torch.float32).view(len(boxes), 2, 2)
    return {"image": Image.fromarray(arr), "boxes": boxes, "masks": masks,
            "im_info": torch.tensor([w, h, 1.0, 1.0, 0.0]), "texts": texts}


@pytest.mark.parametrize("size,scales,expected", [
    ((640, 480), (600, 1000), (800, 600)),    # short side to 600
    ((480, 640), (600, 1000), (600, 800)),    # portrait
    ((2000, 500), (600, 1000), (1000, 250)),  # long side capped: short = int(1000 * 500 / 2000)
    ((800, 600), (600, 1200), (800, 600)),    # already the right size
    ((451, 300), (600, 1200), (902, 600)),    # int() truncation of 600 * 451 / 300 = 902.0
])
def test_resized_size(size, scales, expected):
    assert T.resized_size(size[0], size[1], *scales) == expected


def test_resize_moves_boxes_and_info():
    s = T.Resize(8, 100)(_sample(w=8, h=4, boxes=((2.0, 1.0, 6.0, 3.0),)))
    assert s["image"].size == (16, 8)
    assert s["boxes"].tolist() == [[4.0, 2.0, 12.0, 6.0]]
    assert s["im_info"].tolist() == [16.0, 8.0, 2.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="short side 10 is larger than max long side 5"):
        T.Resize(10, 5)


def test_swap_left_right():
    tokens = ["Left", "of", [0, 1], "is", "the", "rightmost", "LEFT", "bright", "right-hand", "left."]
    assert T.swap_left_right(tokens) == ["Right", "of", [0, 1], "is", "the", "leftmost", "RIGHT", "bright",
                                         "left-hand", "right."]


def test_flip_mirrors_image_boxes_masks_and_text():
    s = _sample(w=8, h=4, boxes=((1.0, 0.0, 2.0, 3.0), (0.0, 0.0, 7.0, 3.0)),
                texts=[["is", [0], "left", "of", [1], "?"], ["right"]])
    image = np.asarray(s["image"]).copy()
    masks = s["masks"].clone()
    out = T.RandomHorizontalFlip(1.0)(s)
    assert out["flipped"]
    assert np.array_equal(np.asarray(out["image"]), image[:, ::-1])
    # x1' = w - 1 - x2, x2' = w - 1 - x1; the whole-image box maps onto itself
    assert out["boxes"].tolist() == [[5.0, 0.0, 6.0, 3.0], [0.0, 0.0, 7.0, 3.0]]
    assert torch.equal(out["masks"], masks.flip(-1))
    assert out["texts"] == [["is", [0], "right", "of", [1], "?"], ["left"]]
    # a box's pixels are the mirrored pixels
    assert np.array_equal(np.asarray(out["image"])[:, 5:7], image[:, 1:3][:, ::-1])


def test_flip_prob_zero_is_identity():
    s = _sample(texts=[["left"]])
    out = T.RandomHorizontalFlip(0.0)(s)
    assert not out["flipped"] and out["texts"] == [["left"]] and out["boxes"].tolist() == [[1.0, 0.0, 2.0, 3.0]]


def test_flip_rate_follows_prob():
    torch.manual_seed(0)
    flips = sum(T.RandomHorizontalFlip(0.5)(_sample())["flipped"] for _ in range(400))
    assert 160 < flips < 240


def test_flip_draws_from_the_sample_generator():
    flip = T.RandomHorizontalFlip(0.3)

    def coin(key):
        return flip(dict(_sample(), generator=SampleKey(key, 1, 0).generator()))["flipped"]
    expected = [torch.rand((), generator=SampleKey(i, 1, 0).generator()).item() < 0.3 for i in range(400)]
    torch.manual_seed(0)
    first = [coin(i) for i in range(400)]
    torch.manual_seed(1)  # the global RNG plays no part
    assert first == [coin(i) for i in range(400)] == expected
    assert 80 < sum(first) < 160


def test_normalize_is_bgr_255():
    arr = np.zeros((1, 1, 3), dtype=np.uint8)
    arr[0, 0] = (10, 20, 30)  # R, G, B
    s = T.ToTensor()({"image": Image.fromarray(arr)})
    out = T.Normalize([102.9801, 115.9465, 122.7717], [1.0, 2.0, 1.0])(s)["image"]
    assert torch.allclose(out[:, 0, 0], torch.tensor([30 - 102.9801, (20 - 115.9465) / 2, 10 - 122.7717]), atol=1e-4)


def test_clip_boxes():
    boxes = torch.tensor([[-5.0, -1.0, 20.0, 3.0, 0.9]])
    T.clip_boxes_(boxes, 10, 4)
    assert boxes.tolist() == [[0.0, 0.0, 9.0, 3.0, pytest.approx(0.9)]]


def test_build_transforms_from_cfg():
    cfg = CN({"SCALES": (8, 100), "NETWORK": CN({"PIXEL_MEANS": (1.0, 2.0, 3.0), "PIXEL_STDS": (1.0, 1.0, 1.0)}),
              "TRAIN": CN({"FLIP_PROB": 1.0}), "VAL": CN({"FLIP_PROB": 0.0}), "TEST": CN({"FLIP_PROB": 0.0})})
    out = T.build_transforms(cfg, "train")(_sample(w=8, h=4))
    assert out["image"].shape == (3, 8, 16) and out["flipped"]
    assert not T.build_transforms(cfg, "val")(_sample())["flipped"]
    with pytest.raises(ValueError, match="mode must be"):
        T.build_transforms(cfg, "eval")
    cfg.SCALES = ()
    assert T.build_transforms(cfg, "val")(_sample(w=8, h=4))["image"].shape == (3, 4, 8)
    cfg.SCALES = (600,)
    with pytest.raises(ValueError, match="SCALES must be"):
        T.build_transforms(cfg, "val")


def test_load_image_rgb_and_exif(tmp_path):
    grey = tmp_path / "g.png"
    Image.fromarray(np.full((3, 5), 7, dtype=np.uint8)).save(grey)
    im = load_image(str(grey))
    assert im.mode == "RGB" and im.size == (5, 3) and np.asarray(im)[0, 0].tolist() == [7, 7, 7]
    rgba = tmp_path / "a.png"
    Image.new("RGBA", (2, 2), (1, 2, 3, 4)).save(rgba)
    assert load_image(str(rgba)).mode == "RGB"
    # EXIF orientation 6: stored 4 wide x 2 high, displayed rotated 90 degrees -> 2 wide x 4 high
    rotated = tmp_path / "r.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (4, 2), (200, 10, 10)).save(rotated, exif=exif)
    assert load_image(str(rotated)).size == (2, 4)


def test_load_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot decode image '.*bad.jpg'"):
        load_image(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.jpg"):
        load_image(str(tmp_path / "missing.jpg"))
    js = tmp_path / "m.json"
    js.write_text('{"boxes": [1, 2,')
    with pytest.raises(ValueError, match="invalid JSON in '.*m.json'"):
        load_json(str(js))
