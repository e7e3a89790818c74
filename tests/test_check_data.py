"""tools/check_data.py on the tiny VCR data (tests/tiny_vcr.py) with bad items planted: each is listed with its
file, line and reason, the JSON report holds them all, the exit code is 2 (0 on the clean data)."""
import json
import os
import shutil

from PIL import Image

from tests.conftest import ROOT
from tests.tiny_vcr import CFG, run_script

SCRIPT = os.path.join(ROOT, "tools", "check_data.py")


def check(tiny_vcr, data, report, *splits):
    return run_script(SCRIPT, ["--cfg", CFG, "--split", *splits, "--json", str(report), "--opts"] +
                      tiny_vcr.opts(DATASET__DATASET_PATH=data))


def test_clean_data_exits_0_with_a_summary_per_split(tmp_path, tiny_vcr, capsys):
    assert check(tiny_vcr, tiny_vcr.data, tmp_path / "r.json", "train", "val") in (0, None)
    out = capsys.readouterr().out
    assert "train: 16 items, 0 bad, 0 warnings; read (headers) in " in out
    assert "val: 1 items, 0 bad, 0 warnings; read (headers) in " in out  # val_shapes.jsonl of TINY_OPTS
    report = json.load(open(tmp_path / "r.json"))
    assert report["task"] == "vcr" and sorted(report["splits"]) == ["train", "val"]
    assert report["splits"]["train"]["items"] == 16 and report["splits"]["train"]["bad"] == []


def test_bad_items_are_listed_with_their_file_line_and_reason(tmp_path, tiny_vcr, capsys):
    data = str(tmp_path / "data")
    shutil.copytree(tiny_vcr.data, data)
    images = os.path.join(data, "vcr1images")
    ann_file = os.path.join(data, "train.jsonl")
    lines = [json.loads(line) for line in open(ann_file)]
    by_image = {}
    for i, item in enumerate(lines):
        by_image.setdefault(item["img_fn"], []).append(i)
    scenes = [found[0] for image, found in sorted(by_image.items()) if len(found) == 1][:4]  # images of one item
    assert len(scenes) == 4
    # (images of one item each) line of scenes[0]: its image is missing; scenes[1]: a box beyond the image; scenes[2]: not an image;
    # scenes[3]: stored with EXIF orientation 6, its metadata made on the stored pixels (a warning, not bad)
    lines[scenes[0]]["img_fn"] = "shapes/nowhere.jpg"
    meta_path = os.path.join(images, lines[scenes[1]]["metadata_fn"])
    meta = json.load(open(meta_path))
    meta["boxes"][0][2] = meta["width"] + 20.0
    json.dump(meta, open(meta_path, "w"))
    with open(os.path.join(images, lines[scenes[2]]["img_fn"]), "wb") as f:
        f.write(b"not a jpeg")
    rotated = os.path.join(images, lines[scenes[3]]["img_fn"])
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(rotated).save(rotated, exif=exif)
    with open(ann_file, "w") as f:
        f.writelines(json.dumps(item) + "\n" for item in lines)

    assert check(tiny_vcr, data, tmp_path / "r.json", "train") == 2
    captured = capsys.readouterr()
    report = json.load(open(tmp_path / "r.json"))["splits"]["train"]
    assert report["items"] == 16
    bad = {entry["line"]: entry for entry in report["bad"]}
    assert sorted(bad) == [scenes[0] + 1, scenes[1] + 1, scenes[2] + 1]  # jsonl lines from 1
    assert all(entry["file"] == ann_file for entry in report["bad"])
    assert "No such file or directory: '{}'".format(os.path.join(images, "shapes", "nowhere.jpg")) in \
        bad[scenes[0] + 1]["reason"]
    assert bad[scenes[1] + 1]["reason"] == (
        "VCRDataError: {} (for {} line {}): box 0 [{}, {}, {}, {}] reaches beyond the image {} ({}x{} pixels)".format(
            meta_path, ann_file, scenes[1] + 1, *[round(float(v), 2) for v in meta["boxes"][0][:4]],
            os.path.join(images, lines[scenes[1]]["img_fn"]), meta["width"], meta["height"]))
    assert "cannot decode image" in bad[scenes[2] + 1]["reason"]
    (warned,) = report["warnings"]
    assert warned["line"] == scenes[3] + 1 and warned["warning"].startswith(
        "ImageOrientationWarning: {} has EXIF orientation 6".format(rotated))
    out = captured.out
    assert "train: 16 items, 3 bad, 1 warnings; read (headers) in " in out
    assert "  bad {} line {}: {}".format(ann_file, scenes[1] + 1, bad[scenes[1] + 1]["reason"]) in out
    assert captured.err.strip().splitlines()[-1] == ("error: 3 bad item(s); fix them (or their metadata) before "
                                                     "training")


def test_cls_labels_beyond_num_classes_are_reported(tmp_path, capsys):
    """20 images of the cls demo set (labels 0-3 of its 10 classes) read in full with NETWORK.NUM_CLASSES 3: the
    split is one bad data set."""
    import tests.test_cls  # noqa: F401  (puts demo/ on sys.path)
    import make_cls_demo_data
    data = make_cls_demo_data.write(str(tmp_path / "data"), train=20, test=10)
    code = run_script(SCRIPT, ["--cfg", os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml"), "--split", "train",
                               "--opts", "DATASET.DATASET_PATH", data, "NETWORK.NUM_CLASSES", "3"])
    assert code == 2
    assert capsys.readouterr().out.splitlines() == [
        "train: 0 items, 1 bad, 0 warnings; read (not built) in 0.0 s",
        "  bad data set: UserInputError: NETWORK.NUM_CLASSES: expected more than the largest label 3 of '{}' split "
        "'train' (10 classes), got 3".format(data)]
    assert run_script(SCRIPT, ["--cfg", os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml"), "--split", "train",
                               "--opts", "DATASET.DATASET_PATH", data]) in (0, None)
    assert capsys.readouterr().out.startswith("train: 20 items, 0 bad, 0 warnings; read (in full) in ")
