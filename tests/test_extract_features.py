"""tools/extract_features.py with boxes from a grid, a file and a detector, on the scikit-image
photographs: the per-image JSON read back by the VQA feature reader and the caption index by the
pretraining dataset; undecodable images, bad grids and bad detector weights."""
import json
import os

import numpy as np
import pytest
import timm
import torch
import torchvision
from PIL import Image
from skimage import data
from torchvision.models import resnet18

from common.data.box_sources import DetectorBoxes, grid_boxes, select_regions
from common.data.region_features import read_feature_json
from common.data.skips import TooManySkipsError
from common.errors import UserInputError
from pretrain.data.caption_dataset import ConceptualCaptionsDataset
from pretrain.data.conceptual_captions import CaptionDataError, read_caption_index
from tests.pretrain_fixtures import tokenizer
from tests.test_vqa_features import load_script

# Photographs shrunk so that a random ResNet-18 encodes them in a blink; two sizes (two batches).
PHOTOS = {"astronaut.jpg": (64, 64), "coffee.jpg": (60, 40), "chelsea.png": (60, 40)}
TINY = ["--device", "cpu", "--opts", "NETWORK.IMAGE_NUM_LAYERS", "18", "SCALES", "[48, 64]"]
DETECTOR = "fasterrcnn_mobilenet_v3_large_320_fpn"
DETECTOR_CLASSES = 5


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of the photographs (plus a text file that is no image), a random ResNet-18 and a random
    small detector (5 classes), each saved to a file."""
    root = tmp_path_factory.mktemp("own")
    folder = root / "photos"
    folder.mkdir()
    for name, size in PHOTOS.items():
        Image.fromarray(getattr(data, name.split(".")[0])()).convert("RGB").resize(size).save(str(folder / name))
    (folder / "notes.txt").write_text("not an image, not counted")
    torch.manual_seed(0)
    torch.save(resnet18().state_dict(), str(root / "resnet18.pth"))
    detector = torchvision.models.get_model(DETECTOR, weights=None, weights_backbone=None,
                                            num_classes=DETECTOR_CLASSES)
    torch.save(detector.state_dict(), str(root / "detector.pth"))
    return root, load_script("extract_features")


def run(script, root, *args):
    return script.main(["--image-root", str(root / "photos"), "--weights", str(root / "resnet18.pth")]
                       + list(args) + TINY)


def caption_dataset(index, folder, **kwargs):
    return ConceptualCaptionsDataset(read_caption_index(str(index), str(folder)), tokenizer(folder), seq_len=64,
                                     **kwargs)


def test_grid_boxes_every_photo_and_the_caption_index_feeds_pretraining(photos, tmp_path, capsys):
    root, script = photos
    (tmp_path / "captions.json").write_text(json.dumps({"astronaut.jpg": "a man in a suit",
                                                        "coffee.jpg": ["a cup", "a red cup on a table"]}))
    run(script, root, "--box-source", "grid", "--grid", "2x3", "--out", str(tmp_path / "features"),
        "--captions", str(tmp_path / "captions.json"))
    assert "features of 3 images (json format, boxes from grid); 0 skipped" in capsys.readouterr().out
    for name, (w, h) in PHOTOS.items():
        r = read_feature_json(str(tmp_path / "features" / (name.split(".")[0] + ".json")))
        assert (r.image_id, r.image_w, r.image_h) == (name.split(".")[0], w, h)
        np.testing.assert_array_equal(r.boxes, grid_boxes(w, h, 2, 3).numpy())  # whole image, then 6 cells
        assert r.features.shape == (7, 512) and r.image_box_feature.shape == (512,)
        np.testing.assert_allclose(r.features[0], r.image_box_feature, rtol=1e-5, atol=1e-6)
        assert "classes" not in json.loads((tmp_path / "features" / (name.split(".")[0] + ".json")).read_text())

    lines = [json.loads(x) for x in (tmp_path / "train_frcnn.json").read_text().splitlines()]
    assert [x["caption"] for x in lines] == [["a", "man", "in", "a", "suit"], ["a", "cup"],
                                            ["a", "red", "cup", "on", "a", "table"]]
    assert lines[0]["frcnn"] == "features/astronaut.json" and lines[0]["image"].endswith("photos/astronaut.jpg")
    ds = caption_dataset(tmp_path / "train_frcnn.json", tmp_path, precomputed=True, with_mvrc=False)
    image, boxes, im_info, text, _, _, ops, mvrc_labels = ds[0]
    assert image is None and boxes.shape == (8, 4 + 512) and mvrc_labels.shape == (8, 1601)
    assert ops.sum() == 0 and mvrc_labels.sum() == 0
    # MVRC needs a detector's class distributions: the message says which file and why.
    with pytest.raises(CaptionDataError, match=r"astronaut\.json.*missing field\(s\) classes.*WITH_MVRC_LOSS"):
        caption_dataset(tmp_path / "train_frcnn.json", tmp_path, precomputed=True)[0]


def test_undecodable_images_are_named_skipped_and_counted(photos, tmp_path, capsys, caplog):
    root, script = photos
    (root / "photos" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    try:
        out = str(tmp_path / "f")
        run(script, root, "--box-source", "grid", "--grid", "1x1", "--out", out, "--max-skipped-share", "0.5")
        assert "features of 3 images (json format, boxes from grid); 1 skipped (could not be decoded): " \
               in capsys.readouterr().out
        assert "broken.jpg" in caplog.text and sorted(os.listdir(out)) == ["astronaut.json", "chelsea.json",
                                                                            "coffee.json"]
        # The default share (1%, pretraining's) stops the run and names the file.
        with pytest.raises(TooManySkipsError, match=r"1 of 2 images .*--max-skipped-share.*broken\.jpg"):
            run(script, root, "--box-source", "grid", "--out", str(tmp_path / "g"))
    finally:
        (root / "photos" / "broken.jpg").unlink()


def test_a_grid_larger_than_a_photo_is_refused_with_both_sizes(photos, tmp_path):
    root, script = photos
    with pytest.raises(UserInputError, match=r"astronaut\.jpg: a 65x2 .*grid does not fit an image of 64x64"):
        run(script, root, "--box-source", "grid", "--grid", "65x2", "--out", str(tmp_path / "f"))
    with pytest.raises(UserInputError, match=r"--grid: expected ROWSxCOLS such as '4x4', got '4by4'"):
        run(script, root, "--box-source", "grid", "--grid", "4by4", "--out", str(tmp_path / "f"))
    with pytest.raises(UserInputError, match=r"--min-boxes 20 / --max-boxes 10: expected 1 <= min <= max"):
        run(script, root, "--box-source", "grid", "--min-boxes", "20", "--max-boxes", "10", "--out", "x")
    with pytest.raises(UserInputError, match=r"--conf-thresh: expected a number in \[0, 1\], got 2.0"):
        run(script, root, "--box-source", "grid", "--conf-thresh", "2", "--out", "x")


def test_file_source_and_a_list_of_images(photos, tmp_path, capsys):
    root, script = photos
    (tmp_path / "boxes.json").write_text(json.dumps([{"image_id": 7, "image": "coffee.jpg",
                                                      "boxes": [[1, 2, 30, 20], [10, 10, 50, 35, 0.9]]}]))
    (tmp_path / "captions.json").write_text(json.dumps({"coffee.jpg": "a cup"}))
    run(script, root, "--box-source", "file", "--boxes", str(tmp_path / "boxes.json"), "--out",
        str(tmp_path / "f"), "--captions", str(tmp_path / "captions.json"), "--index", str(tmp_path / "cc.json"))
    r = read_feature_json(str(tmp_path / "f" / "7.json"))
    np.testing.assert_array_equal(r.boxes, [[1, 2, 30, 20], [10, 10, 50, 35]])
    assert caption_dataset(tmp_path / "cc.json", tmp_path, precomputed=True, with_mvrc=False)[0][1].shape == (3, 516)
    (tmp_path / "list.txt").write_text("chelsea.png\n")
    run(script, root, "--box-source", "grid", "--grid", "1x1", "--image-list", str(tmp_path / "list.txt"),
        "--out", str(tmp_path / "g"))
    assert os.listdir(str(tmp_path / "g")) == ["chelsea.json"]
    with pytest.raises(UserInputError, match=r"captions\.json: 'tea\.jpg' is none of the images"):
        (tmp_path / "captions.json").write_text(json.dumps({"tea.jpg": "a cup"}))
        run(script, root, "--box-source", "grid", "--out", str(tmp_path / "h"), "--captions",
            str(tmp_path / "captions.json"))
    with pytest.raises(UserInputError, match=r"--boxes goes with --box-source file"):
        run(script, root, "--box-source", "grid", "--boxes", str(tmp_path / "boxes.json"), "--out", "x")


def test_detector_regions_with_class_distributions_feed_mvrc(photos, tmp_path):
    root, script = photos
    (tmp_path / "captions.json").write_text(json.dumps({"chelsea.png": "a cat"}))
    (tmp_path / "list.txt").write_text("chelsea.png\n")  # one photo: the detector is slow on a busy CPU
    run(script, root, "--box-source", "detector", "--image-list", str(tmp_path / "list.txt"), "--detector", DETECTOR,
        "--detector-weights", str(root / "detector.pth"), "--detector-min-size", "64", "--detector-max-size", "96",
        "--out", str(tmp_path / "f"), "--captions", str(tmp_path / "captions.json"))
    stored = json.loads((tmp_path / "f" / "chelsea.json").read_text())
    r = read_feature_json(str(tmp_path / "f" / "chelsea.json"))
    assert 1 <= r.num_boxes <= 100 and r.features.shape == (r.num_boxes, 512)
    assert (r.boxes[:, :2] >= 0).all() and (r.boxes[:, 2] <= 60).all() and (r.boxes[:, 3] <= 40).all()
    ds = caption_dataset(tmp_path / "train_frcnn.json", tmp_path, precomputed=True, num_classes=DETECTOR_CLASSES)
    det_scores = ds[0][7]
    assert det_scores.shape == (r.num_boxes + 1, DETECTOR_CLASSES)  # plus the whole image
    assert stored["num_boxes"] == r.num_boxes and "classes" in stored
    with pytest.raises(CaptionDataError, match=r"'classes' has 5 classes per region, the MVRC head 1601"):
        caption_dataset(tmp_path / "train_frcnn.json", tmp_path, precomputed=True)[0]


def test_detector_weights_that_do_not_fit_name_the_keys(photos, tmp_path):
    root, _ = photos
    state = torch.load(str(root / "detector.pth"), weights_only=True)
    del state["rpn.head.conv.0.0.weight"]
    state["extra.weight"] = torch.zeros(1)
    state["rpn.head.cls_logits.bias"] = torch.zeros(7)
    torch.save(state, str(tmp_path / "bad.pth"))
    with pytest.raises(UserInputError, match=r"bad\.pth: does not fit torchvision's {}: 1 missing key\(s\): "
                       r"rpn\.head\.conv\.0\.0\.weight; 1 unexpected key\(s\): extra\.weight; 1 wrongly shaped "
                       r"key\(s\): rpn\.head\.cls_logits\.bias \(7,\) \(model: \(\d+,\)\)".format(DETECTOR)):
        DetectorBoxes(DETECTOR, str(tmp_path / "bad.pth"))
    with pytest.raises(UserInputError, match=r"--detector ssd300_vgg16: not a torchvision two-stage detector"):
        DetectorBoxes("ssd300_vgg16", str(root / "detector.pth"))


def test_region_selection_keeps_confident_regions_between_the_bounds():
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 11], [20, 20, 30, 30], [40, 0, 50, 9.0]])
    probs = torch.tensor([[0.1, 0.9, 0.0], [0.2, 0.8, 0.0], [0.7, 0.1, 0.2], [0.95, 0.05, 0.0]])
    # Box 1 overlaps box 0 (same class, lower score): suppressed; box 3 scores under 0.2.
    assert select_regions(boxes, probs, min_boxes=1).tolist() == [0, 2]
    assert select_regions(boxes, probs, min_boxes=3).tolist() == [0, 2, 3]  # topped up by best score
    assert select_regions(boxes, probs, min_boxes=1, max_boxes=1).tolist() == [0]


def test_vit_encoder_features_are_the_encoders_own(photos, tmp_path, capsys):
    """--encoder vit: a ViTEncoder with the file's timm weights; the JSON features of grid boxes equal its
    obj_reps_raw for the photo after the test transform."""
    from common.modeling.vit_encoder import ViTEncoder
    from tests.test_vit_encoder import ARCH, KWARGS

    root, script = photos
    torch.manual_seed(0)
    vit = timm.create_model(ARCH, **KWARGS)
    torch.save(vit.state_dict(), str(tmp_path / "vit.pth"))
    argv = ["--image-root", str(root / "photos"), "--image-list", str(_list(tmp_path, "astronaut.jpg")),
            "--encoder", "vit", "--weights", str(tmp_path / "vit.pth"), "--box-source", "grid", "--grid", "2x2",
            "--out", str(tmp_path / "f"), "--device", "cpu", "--opts", "SCALES", "[48, 64]",
            "NETWORK.IMAGE_VIT_ARCH", ARCH, "NETWORK.IMAGE_VIT_ARCH_KWARGS", repr([list(kv) for kv in KWARGS.items()])]
    script.main(argv)
    assert "features of 1 images" in capsys.readouterr().out
    r = read_feature_json(str(tmp_path / "f" / "astronaut.json"))
    assert r.features.shape == (5, KWARGS["embed_dim"])  # the grid's whole-image box and its 4 cells

    encoder, transform = script.build_extractor(script.parse_args(argv))
    assert isinstance(encoder, ViTEncoder)
    torch.testing.assert_close(encoder.vit.patch_embed.proj.weight, vit.patch_embed.proj.weight, rtol=0, atol=0)
    sample = transform({"image": Image.open(root / "photos" / "astronaut.jpg").convert("RGB"),
                        "boxes": torch.cat((torch.tensor([[0.0, 0.0, 63.0, 63.0]]), grid_boxes(64, 64, 2, 2))),
                        "im_info": torch.tensor([64.0, 64.0, 1.0, 1.0, 0.0])})
    assert sample["image"].shape[1] == 48  # resized to the SCALES short side
    with torch.no_grad():
        out = encoder(sample["image"][None], sample["boxes"][None], torch.ones(1, 6, dtype=torch.bool),
                      sample["im_info"][None])["obj_reps_raw"][0]
    np.testing.assert_allclose(r.features, out[1:].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r.image_box_feature, out[0].numpy(), rtol=1e-5, atol=1e-5)


def _list(folder, *names):
    path = folder / "images.txt"
    path.write_text("\n".join(names) + "\n")
    return path
