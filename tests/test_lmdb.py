"""LMDB stores: packing with tools/pack_lmdb.py (round trip, re-run, crash then re-run, bad input), reading
through the storage resolver (common/data/storage.py, lmdbreader.py) with one environment per DataLoader worker
under fork, spawn and forkserver, and every task's loader reading ``.lmdb@`` paths as it reads folders."""
import json
import os
import signal
import subprocess
import sys
import zipfile

import multiprocessing as mp
import numpy as np
import pytest
import torch
from PIL import Image

from common.data.lmdbreader import LmdbReader
from common.data.loading import load_image, load_json
from common.data.storage import list_dir, read_bytes, stored_folder
from common.data.zipreader import ZipReader
from common.errors import UserInputError
from tests.conftest import ROOT
from tests.lmdb_items import StoreItems
from tests.test_pretrain_captions import cc_root  # noqa: F401 (fixture: the reference's caption layout)

sys.path.insert(0, os.path.join(ROOT, "tools"))
import pack_lmdb  # noqa: E402

SCRIPT = os.path.join(ROOT, "tools", "pack_lmdb.py")


@pytest.fixture(autouse=True)
def _close_handles():
    yield
    LmdbReader.close_all()
    ZipReader.close_all()


def write_tree(root):
    """``root/imgs``: 3 PNG, 2 JPEG and 3 JSON files in sub-folders, and a text file; returns {relative path: bytes}."""
    rng = np.random.RandomState(0)
    files = {}
    for i in range(3):
        path = os.path.join(root, "imgs", "a", "{}.png".format(i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (6, 8, 3), dtype=np.uint8)).save(path)
    for i in range(2):
        path = os.path.join(root, "imgs", "b", "c", "{}.JPG".format(i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (9, 7, 3), dtype=np.uint8)).save(path, "JPEG")
    for i in range(3):
        with open(os.path.join(root, "imgs", "b", "{}.json".format(i)), "w") as f:
            json.dump({"i": i, "boxes": [[1.5, 2, 3, 4]]}, f)
    with open(os.path.join(root, "imgs", "notes.txt"), "w") as f:
        f.write("not packed")
    for folder, _, names in os.walk(os.path.join(root, "imgs")):
        for name in names:
            path = os.path.join(folder, name)
            files[os.path.relpath(path, root).replace(os.sep, "/")] = open(path, "rb").read()
    return files


# ------------------------------------------------------------------------------------------------ #
# Packing
# ------------------------------------------------------------------------------------------------ #
def test_pack_round_trip_and_rerun_adds_nothing(tmp_path):
    files = write_tree(str(tmp_path))
    out = str(tmp_path / "imgs.lmdb")
    summary = pack_lmdb.pack(out, [str(tmp_path / "imgs")], commit_every=3, progress=False)
    packed = {k: v for k, v in files.items() if not k.endswith(".txt")}
    assert summary["added"] == summary["items"] == len(packed) == 8
    assert summary["bytes"] == summary["bytes_added"] == sum(map(len, packed.values()))
    assert summary["skipped"] == [(str(tmp_path / "imgs" / "notes.txt"), "not an image or JSON file (--ext)")]
    for key, data in packed.items():
        assert read_bytes(out + "@/" + key) == data  # bytes as stored on disk, keys = relative paths
    assert load_json(out + "@/imgs/b/1.json") == {"i": 1, "boxes": [[1.5, 2, 3, 4]]}
    assert np.array_equal(np.asarray(load_image(out + "@/imgs/a/2.png")),
                          np.asarray(load_image(str(tmp_path / "imgs" / "a" / "2.png"))))
    assert list_dir(out + "@/imgs") == (["a", "b"], [])
    assert list_dir(out + "@/imgs/b") == (["c"], ["0.json", "1.json", "2.json"])
    with pytest.raises(FileNotFoundError, match="'imgs/notes.txt' is not inside LMDB store"):
        read_bytes(out + "@/imgs/notes.txt")
    LmdbReader.close_all()
    again = pack_lmdb.pack(out, [str(tmp_path / "imgs")], progress=False)
    assert (again["added"], again["present"], again["items"], again["bytes"]) == (0, 8, 8, summary["bytes"])


def test_zip_source_keeps_the_member_names(tmp_path):
    files = write_tree(str(tmp_path))
    with zipfile.ZipFile(str(tmp_path / "imgs.zip"), "w") as z:
        for key, data in files.items():
            z.writestr(key, data)
    from_zip, from_folder = str(tmp_path / "z.lmdb"), str(tmp_path / "f.lmdb")
    pack_lmdb.pack(from_zip, [str(tmp_path / "imgs.zip")], progress=False)
    pack_lmdb.pack(from_folder, [str(tmp_path / "imgs")], progress=False)
    assert LmdbReader.keys(from_zip) == LmdbReader.keys(from_folder) == sorted(k for k in files if ".txt" not in k)
    # --root: keys relative to the folder itself (the reference's `cd train_image && zip ../train_image.zip ./*`)
    rooted = str(tmp_path / "r.lmdb")
    pack_lmdb.pack(rooted, [str(tmp_path / "imgs" / "b")], root=str(tmp_path / "imgs" / "b"), progress=False)
    assert LmdbReader.keys(rooted) == ["0.json", "1.json", "2.json", "c/0.JPG", "c/1.JPG"]


def _pack_then_die(out, source, after):
    """Pack, killing this process (SIGKILL: no clean-up, no abort) when reading the file number ``after``."""
    real, count = pack_lmdb.Entry.read, [0]

    def read(entry, archives):
        count[0] += 1
        if count[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(entry, archives)
    pack_lmdb.Entry.read = read
    pack_lmdb.pack(out, [source], commit_every=2, progress=False)


def test_crash_mid_pack_then_rerun_completes(tmp_path):
    files = write_tree(str(tmp_path))
    out = str(tmp_path / "imgs.lmdb")
    child = mp.get_context("fork").Process(target=_pack_then_die, args=(out, str(tmp_path / "imgs"), 6))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    with pytest.raises(UserInputError, match="imgs.lmdb' is incomplete: .*run tools/pack_lmdb.py again"):
        read_bytes(out + "@/imgs/a/0.png")
    summary = pack_lmdb.pack(out, [str(tmp_path / "imgs")], commit_every=2, progress=False)
    assert summary["present"] == 4 and summary["added"] == 4  # two transactions of 2 had been committed
    assert summary["bytes"] == sum(len(v) for k, v in files.items() if not k.endswith(".txt"))
    for key, data in files.items():
        if not key.endswith(".txt"):
            assert read_bytes(out + "@/" + key) == data


def test_bad_input_names_the_path(tmp_path):
    write_tree(str(tmp_path))
    with pytest.raises(UserInputError, match="source '.*nowhere' does not exist"):
        pack_lmdb.pack(str(tmp_path / "x.lmdb"), [str(tmp_path / "nowhere")], progress=False)
    with pytest.raises(UserInputError, match="output '.*notes.txt' is a file"):
        pack_lmdb.pack(str(tmp_path / "imgs" / "notes.txt"), [str(tmp_path / "imgs")], progress=False)
    with pytest.raises(UserInputError, match="output '.*imgs' is a folder that is not an LMDB store"):
        pack_lmdb.pack(str(tmp_path / "imgs"), [str(tmp_path / "imgs" / "a")], progress=False)
    with pytest.raises(UserInputError, match="source folder '.*imgs' is not inside --root '.*a'"):
        pack_lmdb.pack(str(tmp_path / "x.lmdb"), [str(tmp_path / "imgs")], root=str(tmp_path / "imgs" / "a"),
                       progress=False)
    with pytest.raises(FileNotFoundError, match="LMDB store '.*none.lmdb' does not exist"):
        read_bytes(str(tmp_path / "none.lmdb") + "@/x.jpg")
    fake = tmp_path / "fake.lmdb"  # a folder whose data.mdb is no LMDB file
    fake.mkdir()
    (fake / "data.mdb").write_bytes(b"not lmdb" * 1000)
    with pytest.raises(UserInputError, match="'.*fake.lmdb' is not an LMDB store"):
        read_bytes(str(fake) + "@/x.jpg")


def test_command_line_prints_progress_and_summary(tmp_path):
    write_tree(str(tmp_path))
    out = str(tmp_path / "imgs.lmdb")
    done = subprocess.run([sys.executable, SCRIPT, out, str(tmp_path / "imgs")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "8/8" in done.stderr  # tqdm bar
    assert "imgs.lmdb: 8 items" in done.stdout and "skipped 1: not an image or JSON file" in done.stdout
    bad = subprocess.run([sys.executable, SCRIPT, out, str(tmp_path / "nowhere")], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "error: source '{}' does not exist".format(tmp_path / "nowhere") in bad.stderr


def test_repacking_a_big_zip_adds_nothing_and_says_so(tmp_path):
    """40 zip members of 2 MB (80 MB, above the first map size of 64 MB) packed twice through the command line:
    the second run adds nothing, says so, and the store is complete with the same bytes."""
    rng = np.random.default_rng(0)
    members = {"big/{:02d}.jpg".format(i): rng.bytes(2 << 20) for i in range(40)}
    with zipfile.ZipFile(str(tmp_path / "big.zip"), "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    out = str(tmp_path / "s.lmdb")
    runs = [subprocess.run([sys.executable, SCRIPT, out, str(tmp_path / "big.zip")], capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    assert "s.lmdb: 40 items, 83.9 MB; this run added 40 files (83.9 MB), 0 were already there" in runs[0].stdout
    assert runs[1].stdout.splitlines()[:2] == [
        "{}: 40 items, 83.9 MB; this run added 0 files (0.0 MB), 40 were already there, 0 skipped".format(out),
        "  nothing to add: every file is already in the store"]
    assert read_bytes(out + "@/big/07.jpg") == members["big/07.jpg"]
    LmdbReader.close_all()


# ------------------------------------------------------------------------------------------------ #
# One environment per worker process
# ------------------------------------------------------------------------------------------------ #
@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow),
                                    pytest.param("forkserver", marks=pytest.mark.slow)])
def test_each_worker_opens_its_own_environment(tmp_path, method):
    """Two epochs (workers start again in each) of 2 workers; spawn and forkserver workers import torch: slow."""
    files = write_tree(str(tmp_path))
    out = str(tmp_path / "imgs.lmdb")
    pack_lmdb.pack(out, [str(tmp_path / "imgs")], progress=False)
    keys = sorted(k for k in files if not k.endswith(".txt"))
    dataset = StoreItems(out, keys)
    parent_env = dataset[0][2]  # the parent opens (and caches) an environment before the workers start
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2,
                                         multiprocessing_context=mp.get_context(method))
    for epoch in range(2):  # workers start again each epoch
        items = list(loader)
        assert [bytes(data.numpy()) for _, data, _ in items] == [files[k] for k in keys]
        worker_pids = {pid for pid, _, _ in items}
        assert len(worker_pids) == 2 and os.getpid() not in worker_pids
        per_worker = {pid: {tuple(envs) for p, _, envs in items if p == pid} for pid in worker_pids}
        assert all(len(envs) == 1 and len(next(iter(envs))) == 1 for envs in per_worker.values())  # one each
    if method == "fork":  # closed before the fork: no worker inherited it; the parent reads on with a new one
        assert not LmdbReader._envs or parent_env != [id(e) for e, _ in LmdbReader._envs.values()]
    assert bytes(dataset[1][1].numpy()) == files[keys[1]]


# ------------------------------------------------------------------------------------------------ #
# The tasks' loaders on .lmdb@ paths
# ------------------------------------------------------------------------------------------------ #
def pack_folder(folder, root=None):
    """Pack ``folder`` into ``folder.lmdb`` (keys with the folder's name, or relative to ``root``) and move the
    folder away, so that only the store can be read."""
    pack_lmdb.pack(folder.rstrip("/") + ".lmdb", [folder], root=root, progress=False)
    os.rename(folder, folder.rstrip("/") + "_moved")


def restore_folder(folder):
    os.rename(folder.rstrip("/") + "_moved", folder)


def assert_items_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        elif isinstance(x, (list, tuple)):
            assert_items_equal(x, y)
        elif isinstance(x, dict):
            assert x.keys() == y.keys()
            assert_items_equal(list(x.values()), list(y.values()))
        else:
            assert x == y


def test_vcr_reads_an_lmdb_store(tmp_path):
    from tests.test_vcr_data import make_dataset, write_vcr
    root = write_vcr(str(tmp_path))
    folder_item = make_dataset(root)[0]
    pack_folder(os.path.join(root, "vcr1images"))
    ds = make_dataset(root, storage="lmdb")
    assert ds.image_root == stored_folder(os.path.join(root, "vcr1images"), "lmdb")
    assert ds.image_root.endswith("vcr1images.lmdb@/vcr1images")
    assert_items_equal(ds[0], folder_item)


def test_vqa_reads_an_lmdb_store(tmp_path):
    from tests.test_vqa_data import FEATURES_36, make, write_data
    from common.data.transforms import ToTensor
    coco = write_data(tmp_path)
    kw = dict(with_precomputed_visual_feat=False, transform=ToTensor())
    folder_items = [make(tmp_path, **kw)[i] for i in range(3)]
    for sub in ("vgbua_res101_precomputed/" + FEATURES_36, "train2014", "val2014"):
        pack_folder(str(coco / sub))
    ds = make(tmp_path, storage="lmdb", **kw)
    assert ".lmdb@/" in ds.files[0][2]
    for i in range(3):
        assert_items_equal(ds[i], folder_items[i])


def test_refcoco_reads_an_lmdb_store(tmp_path):
    from tests.test_refcoco_data import dataset
    from tests.refcoco_fixture import write_refcoco
    root = write_refcoco(str(tmp_path))
    plain = dataset(root)[0]
    pack_folder(os.path.join(root, "train2014"))
    ds = dataset(root, storage="lmdb")
    assert ds.items[0]["image_fn"].endswith("train2014.lmdb@/train2014/COCO_train2014_000000000001.jpg")
    assert np.array_equal(np.asarray(ds[0][0]), np.asarray(plain[0]))


def test_cls_imagefolder_reads_an_lmdb_store(tmp_path):
    from cls.data.augment import build_augment
    from cls.data.datasets import ImageFolder
    from tests.test_cls import _eval_cfg
    for cls_name, value in (("dog", 200), ("cat", 10), ("cat", 30)):
        folder = tmp_path / "train" / cls_name
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(folder / "{}.png".format(value))
    augment = build_augment(_eval_cfg(DATASET__IMAGE_SIZE=8), "val")
    plain = ImageFolder(str(tmp_path), "train", augment)
    plain_items = [plain[i] for i in range(3)]
    pack_folder(str(tmp_path / "train"))
    stored = ImageFolder(str(tmp_path), "train", augment, storage="lmdb")
    assert stored.classes == plain.classes == ["cat", "dog"] and torch.equal(stored.labels, plain.labels)
    assert_items_equal([stored[i] for i in range(3)], plain_items)
    with pytest.raises(UserInputError, match="image folder .*val.lmdb@/val does not exist"):
        ImageFolder(str(tmp_path), "val", augment, storage="lmdb")


def test_pretraining_captions_read_lmdb_stores(cc_root):
    from common.data.skips import SkipCounter, read_or_skip
    from pretrain.data.conceptual_captions import load_detections, read_caption_index
    root = cc_root
    index = os.path.join(root, "train_frcnn.json")
    folder = read_caption_index(index, root, storage="folder")
    for name in ("train_image", "train_frcnn"):  # the reference's zips hold bare names: keys relative to the folder
        pack_folder(os.path.join(root, name), root=os.path.join(root, name))
    stored = read_caption_index(index, root, storage="lmdb")
    assert stored[1].image == os.path.join(root, "train_image.lmdb@/00000001.jpg")
    assert stored[1].frcnn == os.path.join(root, "train_frcnn.lmdb@/00000001.json")  # train_frcnn.0.zip@ -> one store
    for name in ("train_image", "train_frcnn"):
        restore_folder(os.path.join(root, name))
    for f, s in zip(folder, stored):
        df, ds = load_detections(f.frcnn, with_features=True), load_detections(s.frcnn, with_features=True)
        assert torch.equal(df.features, ds.features) and torch.equal(df.boxes, ds.boxes)
    # the same images read, and the same ones (truncated, not an image, missing) skipped
    counts = []
    for records in (folder, stored):
        counter = SkipCounter("image", max_share=1.0)
        images = [read_or_skip(load_image, r.image, counter) for r in records]
        counts.append((counter.skipped, [None if im is None else np.asarray(im).tobytes() for im in images]))
    assert counts[0] == counts[1] and counts[0][0] == 3


# ------------------------------------------------------------------------------------------------ #
# Same training from folders and from an LMDB store
# ------------------------------------------------------------------------------------------------ #
@pytest.mark.slow
def test_training_from_lmdb_equals_training_from_folders(tmp_path_factory, tiny_vcr):
    """The tiny VCR run through vcr/train_end2end.py, from the image folder (in the main process) and from a
    store packed by the real script (2 forked workers per loader): the same logged values and final weights,
    bit for bit."""
    from tests.tiny_vcr import checkpoint, tensorboard_scalars, train_in_process
    data = str(tmp_path_factory.mktemp("lmdb_data"))
    for name in os.listdir(tiny_vcr.data):
        if name.endswith(".jsonl"):
            with open(os.path.join(tiny_vcr.data, name), "rb") as src, open(os.path.join(data, name), "wb") as dst:
                dst.write(src.read())
    done = subprocess.run([sys.executable, SCRIPT, os.path.join(data, "vcr1images.lmdb"),
                           os.path.join(tiny_vcr.data, "vcr1images")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = {}
    for name, changes in (("folder", {}), ("lmdb", {"DATASET.DATASET_PATH": data, "DATASET.LMDB_MODE": True,
                                                    "NUM_WORKERS_PER_GPU": 2})):
        model_dir = tmp_path_factory.mktemp(name)
        assert train_in_process(model_dir, tiny_vcr.opts(changes)) == 0
        scalars = {tag: v for tag, v in tensorboard_scalars(model_dir).items()
                   if not tag.startswith(("Speed/", "Time/", "Memory/"))}  # timings and memory differ, of course
        runs[name] = (scalars, checkpoint(model_dir, 0)["state_dict"])
    (scalars, weights), (lmdb_scalars, lmdb_weights) = runs["folder"], runs["lmdb"]
    assert any("Loss" in tag for tag in scalars) and any("Val" in tag for tag in scalars)
    assert scalars == lmdb_scalars  # losses, accuracies, LR, loss scale, gradient norms
    assert weights.keys() == lmdb_weights.keys() and all(torch.equal(weights[k], lmdb_weights[k]) for k in weights)


@pytest.mark.slow
def test_pretraining_from_lmdb_stores_equals_folders_through_the_entry_point(tiny_pretrain, tmp_path):
    """Pretraining (images, detector files, the text corpus) through pretrain/train_end2end.py from LMDB stores
    packed by the real script ends with the same weights as from the folders, bit for bit."""
    import shutil
    from tests import tiny_pretrain as tp
    from tests.faults import harness

    name = "base_e2e_16x16G_fp16.yaml"
    stored = str(tmp_path / "cc")
    shutil.copytree(tiny_pretrain.captions, stored)
    for folder in ("train_image", "train_frcnn", "val_image", "val_frcnn"):
        pack_folder(os.path.join(stored, folder), root=os.path.join(stored, folder))
    entries = tp.datasets(name, tiny_pretrain)
    for entry in entries:
        if entry["DATASET"] == "conceptual_captions":
            entry.update(DATASET_PATH=stored, LMDB_MODE=True)
    assert tp.train(tmp_path / "folders", name, tp.opts(name, tiny_pretrain)) == 0
    assert tp.train(tmp_path / "lmdb", name, tp.opts(name, tiny_pretrain, {"DATASET": entries})) == 0
    states = [harness.training_state(tp.checkpoint_path(tmp_path / run, name, 0))["state_dict"]
              for run in ("folders", "lmdb")]
    harness.assert_same(states[1], states[0], "state_dict")
