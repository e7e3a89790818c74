"""RefCOCO+ annotation files: refs(unc).p only through the restricted unpickler, instances.json, splits, boxes."""
import builtins
import json
import os
import pickle
import pickletools

import pytest
import torch

from common.errors import UserInputError
from common.fileio.safe_load import UnreadableFileError
from refcoco.data.proposals import VGBoxes, load_mattnet_detections
from refcoco.data.refer import SPLITS, RefCOCODataError, Refer, split_matches, xywh_to_xyxy
from tests.refcoco_fixture import refs_list, write_refcoco


class Calls:
    """Pickles as a call of ``function(*args)``: what a hostile refs file would hold."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


# Refused global -> (callable, argument) that writes the marker file when called. The pickler spells
# os.system "posix.system", open "io.open" and eval "__builtin__.eval" (protocol 0); the file is
# rewritten to name the globals as hand-made hostile files do.
HOSTILE = {
    "os.system": (os.system, "touch '{}'", b"cposix\nsystem\n"),
    "builtins.open": (builtins.open, "{}", b"cio\nopen\n"),
    "builtins.eval": (eval, "open({!r}, 'w')", b"c__builtin__\neval\n"),
}


def hostile_refs(name, marker):
    """Protocol-0 pickle of a valid ref followed by a call of the ``name`` global."""
    function, argument, spelled = HOSTILE[name]
    args = (argument.format(marker), "w") if name == "builtins.open" else (argument.format(marker),)
    data = pickle.dumps(refs_list()[:1] + [Calls(function, *args)], protocol=0)
    assert spelled in data
    module, attr = name.split(".")
    return data.replace(spelled, "c{}\n{}\n".format(module, attr).encode())


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_refs_file_is_refused_and_runs_nothing(tmp_path, name):
    marker = str(tmp_path / "pwned")
    data = hostile_refs(name, marker)
    # Sanity, without running it: the file asks the unpickler to import the callable and call it.
    ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    assert ("GLOBAL", name.replace(".", " ")) in ops and ("REDUCE", None) in ops

    root = write_refcoco(str(tmp_path / "coco"))
    refs_file = os.path.join(root, "refcoco+", "refs(unc).p")
    with open(refs_file, "wb") as f:
        f.write(data)
    with pytest.raises(UnreadableFileError) as error:
        Refer(root)
    message = str(error.value)
    assert refs_file in message and "asks to call {}".format(name) in message
    assert "nothing from the file was run" in message
    assert isinstance(error.value, UserInputError)
    assert not os.path.exists(marker)


def test_refs_and_instances_are_indexed(tmp_path):
    refer = Refer(write_refcoco(str(tmp_path)))
    assert list(refer.refs) == [1, 2, 3, 4]
    assert refer.refs[1]["sentences"][1]["tokens"] == ["small", "red", "one"]
    assert sorted(refer.images) == [1, 2] and sorted(refer.annotations) == [11, 12, 21]
    assert refer.referred_box(1).tolist() == [2, 3, 12, 11]
    assert refer.referred_box(4).tolist() == [20, 5, 35, 25]
    assert refer.image_boxes(1).tolist() == [[2, 3, 12, 11], [20, 5, 35, 25]]
    assert refer.image_boxes(2).tolist() == [[0, 0, 10, 10]]
    assert refer.image_boxes(99).shape == (0, 4)


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_any_pickle_protocol_of_plain_refs_loads(tmp_path, protocol):
    root = write_refcoco(str(tmp_path))
    with open(os.path.join(root, "refcoco+", "refs(unc).p"), "wb") as f:
        pickle.dump(refs_list(), f, protocol=protocol)
    assert Refer(root).refs[3]["split"] == "testA"


def test_splits_follow_the_refer_toolkit(tmp_path):
    refer = Refer(write_refcoco(str(tmp_path)))
    assert {s: refer.ref_ids(s) for s in SPLITS} == {
        "train": [1], "val": [2], "testA": [3], "testB": [4], "test": [3, 4]}
    assert split_matches("testA", "testAB") and split_matches("testB", "testAB") and split_matches("test", "testC")
    assert not split_matches("testA", "train") and not split_matches("train", "trainval")
    with pytest.raises(ValueError, match="unknown RefCOCO\\+ split 'minival'.*train, val, testA, testB, test"):
        refer.ref_ids("minival")


def test_missing_files_are_named(tmp_path):
    root = write_refcoco(str(tmp_path))
    os.remove(os.path.join(root, "refcoco+", "instances.json"))
    with pytest.raises(FileNotFoundError, match=r"refcoco\+/instances.json.*PREPARE_DATA.md"):
        Refer(root)


def rewrite_refs(root, refs):
    with open(os.path.join(root, "refcoco+", "refs(unc).p"), "wb") as f:
        pickle.dump(refs, f)


@pytest.mark.parametrize("change, message", [
    (lambda refs: refs[1].pop("sentences"), r"ref 1\): missing key\(s\) sentences"),
    (lambda refs: refs[2].update(ann_id=99), r"ref 2, ref_id 3\): ann_id 99 is not in .*instances.json"),
    (lambda refs: refs[2].update(image_id=1), r"ref 2, ref_id 3\): image_id 1 differs from that of annotation 21"),
    (lambda refs: refs[0]["sentences"][0].update(tokens="the left box"),
     r"ref 0, ref_id 1\): sent_id 0: tokens must be a list"),
    (lambda refs: refs[3].update(ref_id=1), r"ref 3, ref_id 1\): ref_id is used twice"),
])
def test_bad_refs_name_file_and_ref(tmp_path, change, message):
    root = write_refcoco(str(tmp_path))
    refs = refs_list()
    change(refs)
    rewrite_refs(root, refs)
    with pytest.raises(RefCOCODataError, match=r"refs\(unc\).p \(" + message):
        Refer(root)


def test_refs_must_be_a_list(tmp_path):
    root = write_refcoco(str(tmp_path))
    rewrite_refs(root, {"refs": refs_list()})
    with pytest.raises(RefCOCODataError, match="expected a list of refs, got dict"):
        Refer(root)


@pytest.mark.parametrize("change, message", [
    (lambda inst: inst.pop("annotations"), r"\(annotations\): expected a COCO instances object"),
    (lambda inst: inst["annotations"][1].update(bbox=[1, 2, 3]), r"\(annotations\[1\]\): bbox must be \[x, y, w, h\]"),
    (lambda inst: inst["annotations"][2].update(image_id=7), r"\(annotations\[2\]\): image_id 7 is not among"),
    (lambda inst: inst["images"][0].pop("height"), r"\(images\[0\]\): missing field\(s\) height"),
])
def test_bad_instances_name_file_and_entry(tmp_path, change, message):
    root = write_refcoco(str(tmp_path))
    path = os.path.join(root, "refcoco+", "instances.json")
    instances = json.load(open(path))
    change(instances)
    json.dump(instances, open(path, "w"))
    with pytest.raises(RefCOCODataError, match=r"instances.json " + message):
        Refer(root)


def test_xywh_to_xyxy_adds_width_without_minus_one():
    assert xywh_to_xyxy([[2, 3, 10, 8], [0.5, 1, 0, 0]]).tolist() == [[2, 3, 12, 11], [0.5, 1, 0.5, 1]]
    assert xywh_to_xyxy([]).shape == (0, 4)


def test_mattnet_detections_per_image(tmp_path):
    root = write_refcoco(str(tmp_path))
    path = os.path.join(root, "refcoco+", "proposal", "res101_coco_minus_refer_notime_dets.json")
    detections = load_mattnet_detections(path)
    assert list(detections) == [1]
    assert detections[1].tolist() == [[3, 3, 13, 11], [0, 0, 5, 5]] and detections[1].dtype == torch.float32
    json.dump([{"image_id": 1, "box": [1, 2]}], open(path, "w"))
    with pytest.raises(RefCOCODataError, match=r"dets.json \(detection 0\): expected .*'box': \[x, y, w, h\]"):
        load_mattnet_detections(path)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        load_mattnet_detections(str(tmp_path / "nowhere.json"))


def test_vg_boxes_from_zip_or_folder(tmp_path):
    root = write_refcoco(str(tmp_path))
    vg = VGBoxes(root)
    assert ".zip@/trainval2014_resnet101_faster_rcnn_genome" in vg.root
    assert vg(2).tolist() == [[0, 0, 5, 5], [1, 1, 9, 9]] and vg(2).dtype == torch.float32
    # unpacked folder instead of the archive
    import zipfile
    folder = os.path.join(root, "vgbua_res101_precomputed")
    with zipfile.ZipFile(os.path.join(folder, "trainval2014_resnet101_faster_rcnn_genome.zip")) as z:
        z.extractall(folder)
    os.remove(os.path.join(folder, "trainval2014_resnet101_faster_rcnn_genome.zip"))
    assert VGBoxes(root)(1).tolist() == [[1, 1, 20, 20]]
    with open(os.path.join(folder, "trainval2014_resnet101_faster_rcnn_genome", "1.json"), "w") as f:
        json.dump({"num_boxes": 3, "boxes": "AAAA"}, f)
    with pytest.raises(RefCOCODataError, match="1.json: expected 'num_boxes' and base64 float32 'boxes'"):
        VGBoxes(root)(1)
