"""Region features: per-image JSON and TSV readers, the memory-mapped cache, tools/build_feature_cache.py
and tools/extract_features.py (both formats, read back by both readers)."""
import base64
import copy
import importlib.util
import json
import os
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models import resnet18

from common.data.feature_cache import FeatureCache, FeatureCacheError, write_feature_cache
from common.data.region_features import (FeatureFileError, RegionFeatures, feature_json_dict, iter_feature_folder,
                                         iter_tsv, read_feature_json, write_feature_json, write_tsv)
from common.data.zipreader import ZipReader
from common.errors import UserInputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name, folder="tools"):
    """The module of ``<folder>/<name>.py`` (a tool, or with ``folder="demo"`` a demo generator)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, folder, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_regions(image_id, num_boxes, dim=8, image_box=True, seed=0):
    rng = np.random.default_rng(seed)
    return RegionFeatures(image_id=image_id, image_w=640, image_h=480,
                          boxes=rng.uniform(0, 400, (num_boxes, 4)).astype(np.float32),
                          features=rng.normal(size=(num_boxes, dim)).astype(np.float32),
                          image_box_feature=rng.normal(size=dim).astype(np.float32) if image_box else None)


def assert_same(a, b):
    assert (str(a.image_id), a.image_w, a.image_h) == (str(b.image_id), b.image_w, b.image_h)
    np.testing.assert_array_equal(a.boxes, b.boxes)
    np.testing.assert_array_equal(a.features, b.features)
    if b.image_box_feature is None:
        assert a.image_box_feature is None
    else:
        np.testing.assert_array_equal(a.image_box_feature, b.image_box_feature)
    assert a.boxes.dtype == a.features.dtype == np.float32


def test_json_round_trip_in_folder_and_zip(tmp_path):
    items = [make_regions(9, 3, seed=1), make_regions(12, 0, image_box=False, seed=2)]
    folder = tmp_path / "trainval_36"
    folder.mkdir()
    for r in items:
        write_feature_json(str(folder / "{}.json".format(r.image_id)), r)
    record = json.loads((folder / "9.json").read_text())
    assert (record["num_boxes"], record["image_w"], record["image_h"]) == (3, 640, 480)
    boxes = np.frombuffer(base64.b64decode(record["boxes"]), np.float32).reshape(3, 4)
    np.testing.assert_array_equal(boxes, items[0].boxes)
    read = {str(r.image_id): r for r in iter_feature_folder(str(folder), feature_dim=8)}
    assert sorted(read) == ["12", "9"]
    assert read_feature_json(str(folder / "12.json")).features.shape == (0, 0)  # no boxes: width unknown
    for r in items:
        assert_same(read[str(r.image_id)], r)

    archive = tmp_path / "features.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for r in items:
            z.writestr("trainval_36/{}.json".format(r.image_id), json.dumps(feature_json_dict(r)))
    ZipReader.close_all()
    assert_same(read_feature_json("{}@/trainval_36/9.json".format(archive), feature_dim=8), items[0])
    assert [r.image_id for r in iter_feature_folder("{}@/trainval_36".format(archive))] == [12, 9]


def test_json_without_image_id_takes_it_from_the_file_name(tmp_path):
    record = feature_json_dict(make_regions(5, 2))
    del record["image_id"]
    (tmp_path / "5.json").write_text(json.dumps(record))
    assert read_feature_json(str(tmp_path / "5.json")).image_id == "5"


def test_tsv_round_trip(tmp_path):
    items = [make_regions(9, 3, seed=1), make_regions(1234, 10, seed=2), make_regions(7, 0, seed=3)]
    path = str(tmp_path / "test2015.tsv")
    write_tsv(path, items)
    lines = open(path, newline="").read().split("\r\n")
    assert lines[0].split("\t")[:4] == ["9", "640", "480", "3"]
    read = list(iter_tsv(path, feature_dim=8))
    assert [r.image_id for r in read] == [9, 1234, 7]
    for r, expected in zip(read, items):
        expected.image_box_feature = None  # not part of the TSV format
        assert_same(r, expected)


def test_tsv_fields_above_the_default_csv_limit(tmp_path):
    big = make_regions(1, 100, dim=2048)  # ~1.1 MB of base64 in one field; csv's default limit is 128 kB
    path = str(tmp_path / "big.tsv")
    write_tsv(path, [big])
    np.testing.assert_array_equal(next(iter_tsv(path)).features, big.features)


def test_num_boxes_mismatch_names_the_file_and_the_id(tmp_path):
    record = feature_json_dict(make_regions(42, 3))
    record["num_boxes"] = 4
    (tmp_path / "42.json").write_text(json.dumps(record))
    with pytest.raises(FeatureFileError, match=r"42\.json \(image_id 42\): num_boxes is 4 but 'boxes' holds 12 "
                                               r"values, not 4 x 4") as info:
        read_feature_json(str(tmp_path / "42.json"))
    assert isinstance(info.value, UserInputError)

    good = make_regions(42, 3)
    record = feature_json_dict(good)
    record["features"] = base64.b64encode(good.features[:2].tobytes()).decode()
    (tmp_path / "42.json").write_text(json.dumps(record))
    with pytest.raises(FeatureFileError, match=r"image_id 42\): num_boxes is 3 but 'features' holds 16 values, "
                                               r"not 3 x 8"):
        read_feature_json(str(tmp_path / "42.json"))
    # Without image_box_feature the width is inferred; an expected width still catches the mismatch.
    del record["image_box_feature"]
    record["features"] = base64.b64encode(np.zeros((6, 8), np.float32).tobytes()).decode()
    (tmp_path / "42.json").write_text(json.dumps(record))
    assert read_feature_json(str(tmp_path / "42.json")).features.shape == (3, 16)
    with pytest.raises(FeatureFileError, match="'features' holds 48 values, not 3 x 8"):
        read_feature_json(str(tmp_path / "42.json"), feature_dim=8)

    path = str(tmp_path / "bad.tsv")
    write_tsv(path, [make_regions(1, 2), make_regions(77, 2)])
    text = open(path, newline="").read().replace("77\t640\t480\t2", "77\t640\t480\t5")
    open(path, "w", newline="").write(text)
    with pytest.raises(FeatureFileError, match=r"bad\.tsv line 2 \(image_id 77\): num_boxes is 5"):
        list(iter_tsv(path))


def test_malformed_feature_files(tmp_path):
    record = feature_json_dict(make_regions(3, 2))
    del record["image_w"]
    (tmp_path / "3.json").write_text(json.dumps(record))
    with pytest.raises(FeatureFileError, match=r"3\.json \(image_id 3\): missing 'image_w'"):
        read_feature_json(str(tmp_path / "3.json"))
    record = feature_json_dict(make_regions(3, 2))
    record["boxes"] = "not base64!"
    (tmp_path / "3.json").write_text(json.dumps(record))
    with pytest.raises(FeatureFileError, match="'boxes' is not base64"):
        read_feature_json(str(tmp_path / "3.json"))
    (tmp_path / "short.tsv").write_text("1\t2\t3\n")
    with pytest.raises(FeatureFileError, match=r"short\.tsv line 1: expected 6 tab-separated fields"):
        list(iter_tsv(str(tmp_path / "short.tsv")))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        list(iter_feature_folder(str(tmp_path / "nowhere")))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cache_returns_the_arrays_it_was_given(tmp_path, dtype):
    # An image without boxes nor whole-image feature first: the feature width is not known yet.
    items = [make_regions("COCO_x", 0, image_box=False, seed=2), make_regions(9, 3, seed=1), make_regions(5, 7, seed=3)]
    stats = write_feature_cache(iter(items), str(tmp_path / "cache"), dtype=dtype)
    assert (stats["images"], stats["boxes"], stats["feature_dim"]) == (3, 10, 8)
    assert sorted(os.listdir(tmp_path)) == ["cache"]  # no temporary folder left behind
    cache = FeatureCache(str(tmp_path / "cache"))
    assert (len(cache), cache.ids) == (3, ["COCO_x", "9", "5"])
    assert (9 in cache, "9" in cache, 10 in cache) == (True, True, False)
    for r in items:
        if dtype == "float16":  # features are stored rounded to float16, boxes stay float32
            r.features = r.features.astype(np.float16).astype(np.float32)
            if r.image_box_feature is not None:
                r.image_box_feature = r.image_box_feature.astype(np.float16).astype(np.float32)
        assert_same(cache[r.image_id], r)
    # A copy for the caller; worker processes get the cache without its memory maps.
    cache[9].features[:] = 0
    assert cache[9].features.any()
    # What pickling for a worker keeps (the __getstate__ hook), without unpickling bytes in the test.
    clone = copy.copy(cache)
    clone.__dict__.update(cache.__getstate__())
    assert clone._arrays is None
    assert_same(clone[5], items[2])


def test_cache_errors(tmp_path):
    path = str(tmp_path / "cache")
    write_feature_cache([make_regions(1, 2)], path)
    with pytest.raises(FeatureCacheError, match="already exists"):
        write_feature_cache([make_regions(1, 2)], path)
    write_feature_cache([make_regions(2, 4, dim=8)], path, overwrite=True)
    cache = FeatureCache(path)
    assert cache.ids == ["2"]
    with pytest.raises(FeatureCacheError, match=r"feature cache '.*cache' has no image_id 1$") as info:
        cache[1]
    assert isinstance(info.value, UserInputError)
    with pytest.raises(FeatureCacheError, match="image_id 3 appears twice"):
        write_feature_cache([make_regions(3, 1), make_regions(3, 1)], str(tmp_path / "dup"))
    with pytest.raises(FeatureCacheError, match="image_id 4: features of width 4, earlier images have 8"):
        write_feature_cache([make_regions(3, 1), make_regions(4, 1, dim=4)], str(tmp_path / "dims"))
    assert sorted(os.listdir(tmp_path)) == ["cache"]  # failed builds leave nothing
    with open(os.path.join(path, "features.bin"), "r+b") as f:
        f.truncate(10)
    with pytest.raises(FeatureCacheError, match=r"features\.bin: expected 128 bytes \(4x8 float32\), found 10"):
        FeatureCache(path)
    with pytest.raises(FileNotFoundError, match="build it with tools/build_feature_cache.py"):
        FeatureCache(str(tmp_path / "dims"))


def test_build_feature_cache_script_from_json_folder_and_tsv(tmp_path, capsys):
    folder = tmp_path / "trainval"
    folder.mkdir()
    json_items = [make_regions(1, 2, seed=1), make_regions(2, 3, seed=2)]
    for r in json_items:
        write_feature_json(str(folder / "{}.json".format(r.image_id)), r)
    tsv_items = [make_regions(3, 4, image_box=False, seed=3)]
    write_tsv(str(tmp_path / "test2015.tsv"), tsv_items)
    out = str(tmp_path / "cache")
    load_script("build_feature_cache").main([str(folder), str(tmp_path / "test2015.tsv"), "--out", out,
                                             "--feature-dim", "8"])
    assert "3 images, 9 boxes of 8 features (float32)" in capsys.readouterr().out
    cache = FeatureCache(out)
    for r in json_items + tsv_items:
        assert_same(cache[r.image_id], r)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """Features of two tiny images through tools/extract_features.py, once as JSON and once as TSV,
    with a random ResNet-18 given by --weights."""
    root = tmp_path_factory.mktemp("extract")
    rng = np.random.default_rng(0)
    sizes = {"a.png": (40, 30), "b.jpg": (24, 36)}
    for name, (w, h) in sizes.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(str(root / name))
    entries = [{"image_id": 9, "image": "a.png", "boxes": [[0, 0, 39, 29], [5, 5, 20, 25, 0.9], [30, 2, 39, 12]]},
               {"image_id": 12, "image": "b.jpg", "boxes": [[1, 2, 10, 30]]}]
    (root / "boxes.json").write_text(json.dumps(entries))
    torch.manual_seed(0)
    torch.save(resnet18().state_dict(), str(root / "resnet18-random.pth"))
    args = ["--boxes", str(root / "boxes.json"), "--image-root", str(root), "--weights",
            str(root / "resnet18-random.pth"), "--device", "cpu"]
    tiny = ["--opts", "NETWORK.IMAGE_NUM_LAYERS", "18", "SCALES", "[48, 64]"]
    script = load_script("extract_features")
    script.main(args + ["--out", str(root / "features"), "--format", "json"] + tiny)
    script.main(args + ["--out", str(root / "features.tsv"), "--format", "tsv"] + tiny)
    return root, entries, sizes, script


def test_extracted_features_read_back_equal_in_both_formats(extracted):
    root, entries, sizes, _ = extracted
    from_json = {r.image_id: r for r in iter_feature_folder(str(root / "features"))}
    from_tsv = {r.image_id: r for r in iter_tsv(str(root / "features.tsv"))}
    assert sorted(from_json) == sorted(from_tsv) == [9, 12]
    for e in entries:
        j, t = from_json[e["image_id"]], from_tsv[e["image_id"]]
        assert (j.image_w, j.image_h) == (t.image_w, t.image_h) == sizes[e["image"]]
        np.testing.assert_array_equal(j.boxes, np.array([b[:4] for b in e["boxes"]], np.float32))
        np.testing.assert_array_equal(j.boxes, t.boxes)
        assert j.features.shape == (len(e["boxes"]), 512)  # ResNet-18's res5 width
        np.testing.assert_array_equal(j.features, t.features)  # two runs, two formats, same numbers
        assert j.image_box_feature.shape == (512,) and t.image_box_feature is None
    image9 = from_json[9]
    # The first box of image 9 is the whole image: the same RoI as the whole-image feature.
    np.testing.assert_array_equal(image9.features[0], image9.image_box_feature)
    assert np.abs(image9.features[1] - image9.features[0]).max() > 1e-3
    # The cache built from the extractor's output gives the same arrays back.
    cache_path = str(root / "cache")
    write_feature_cache(iter_feature_folder(str(root / "features")), cache_path, overwrite=True)
    assert_same(FeatureCache(cache_path)[9], image9)


def test_extractor_uses_the_weights_it_is_given(extracted, tmp_path):
    root, _, _, script = extracted
    torch.manual_seed(1)
    torch.save(resnet18().state_dict(), str(tmp_path / "other.pth"))
    args = ["--image-root", str(root), "--device", "cpu", "--out", str(tmp_path / "f"),
            "--opts", "NETWORK.IMAGE_NUM_LAYERS", "18", "SCALES", "[48, 64]"]
    boxes = ["--boxes", str(root / "boxes.json")]
    script.main(boxes + ["--weights", str(tmp_path / "other.pth")] + args)
    other = read_feature_json(str(tmp_path / "f" / "9.json"))
    first = read_feature_json(str(root / "features" / "9.json"))
    assert np.abs(other.features - first.features).max() > 1e-3

    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, str(tmp_path / "partial.pth"))
    with pytest.raises(UserInputError, match=r"partial\.pth.*not a ResNet state dict for this depth"):
        script.main(boxes + ["--weights", str(tmp_path / "partial.pth")] + args)
    (tmp_path / "bad_boxes.json").write_text(json.dumps([{"image_id": 3, "image": "a.png", "boxes": [[1, 2, 3]]}]))
    with pytest.raises(UserInputError, match=r"bad_boxes\.json: image_id 3: 'boxes' must be a list of \[x1, y1"):
        script.main(["--boxes", str(tmp_path / "bad_boxes.json"), "--weights", str(tmp_path / "other.pth")] + args)


def test_images_of_one_size_batched_give_the_features_of_one_at_a_time(extracted, tmp_path):
    root, _, _, script = extracted
    rng = np.random.default_rng(1)
    entries = []
    for k in range(3):  # two images of one size (one forward when batched), then one of another size
        w, h = (40, 30) if k < 2 else (30, 40)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(str(tmp_path / "{}.png".format(k)))
        entries.append({"image_id": k, "image": "{}.png".format(k), "boxes": [[1, 2, 20, 25]] * (k + 1)})
    (tmp_path / "boxes.json").write_text(json.dumps(entries))
    common = ["--boxes", str(tmp_path / "boxes.json"), "--image-root", str(tmp_path), "--device", "cpu",
              "--weights", str(root / "resnet18-random.pth"), "--opts", "NETWORK.IMAGE_NUM_LAYERS", "18",
              "SCALES", "[48, 64]"]
    script.main(common[:-5] + ["--batch-size", "1", "--out", str(tmp_path / "one")] + common[-5:])
    script.main(common[:-5] + ["--batch-size", "8", "--out", str(tmp_path / "eight")] + common[-5:])
    for k in range(3):
        one = read_feature_json(str(tmp_path / "one" / "{}.json".format(k)))
        eight = read_feature_json(str(tmp_path / "eight" / "{}.json".format(k)))
        assert eight.features.shape == (k + 1, 512)
        np.testing.assert_allclose(eight.features, one.features, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(eight.image_box_feature, one.image_box_feature, rtol=1e-4, atol=1e-5)
