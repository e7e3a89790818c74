"""Caption pretraining from tar shards (``DATASET.DATASET: 'cc_shards'``): the epoch order, sharding over
ranks and workers, the samples against the reference layout's, dirty members, grid regions, the converter
round trip, and (slow) training and SIGKILL + resume through ``pretrain/train_end2end.py``."""
import gzip
import io
import itertools
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchvision.transforms.functional import to_tensor

from common.data import tar_shards
from common.data.samplers import SampleKey, make_batch_sampler
from common.data.skips import SkipCounter, TooManySkipsError
from common.errors import UserInputError
from pretrain.data.caption_dataset import ConceptualCaptionsDataset
from pretrain.data.caption_shards import CaptionShardDataset
from pretrain.data.conceptual_captions import read_caption_index
from tools.convert_cc_shards import from_shards, index, to_shards
from tests import pretrain_fixtures
from tests import tiny_pretrain as tp
from tests import tiny_vcr as vcr
from tests.test_pretrain_train import load


def jpeg(color, size=(20, 16)):
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def text_shards(folder, counts):
    """Shards of ``.txt``-only samples, ``counts[s]`` in shard s, captions 'k<global index>'; returns paths."""
    paths, n = [], 0
    for s, count in enumerate(counts):
        samples = [{"__key__": "{:06d}".format(n + i), "txt": "k{}".format(n + i).encode()} for i in range(count)]
        n += count
        tar_shards.write_shards(samples, os.path.join(str(folder), "part{}".format(s)), per_shard=count)
        paths.append(os.path.join(str(folder), "part{}-00000.tar".format(s)))
    return paths


# --------------------------------------------------------------------------------------------- #
# Index, order, sharding
# --------------------------------------------------------------------------------------------- #
def test_epoch_order_is_a_seeded_permutation_following_the_shards():
    counts = [4, 4, 3]
    a = tar_shards.epoch_order(counts, seed=5, epoch=2, buffer=3)
    assert sorted(a.tolist()) == list(range(11))
    assert np.array_equal(a, tar_shards.epoch_order(counts, 5, 2, 3))
    assert not np.array_equal(a, tar_shards.epoch_order(counts, 5, 3, 3))
    plain = tar_shards.epoch_order(counts, 5, 2, buffer=1).tolist()  # whole shards, each in file order
    shard_of = [0] * 4 + [1] * 4 + [2] * 3
    blocks = [list(group) for _, group in itertools.groupby(plain, key=lambda i: shard_of[i])]
    assert len(blocks) == 3 and all(block == sorted(block) for block in blocks), plain


def test_index_names_members_and_is_cached_next_to_the_shard(tmp_path):
    sample = {"__key__": "a1", "jpg": jpeg("red"), "txt": b"a red square", "json": b"{}", "cls.txt": b"3"}
    tar_shards.write_shards([sample, {"__key__": "b2", "png": b"x"}], str(tmp_path / "s"))
    path = str(tmp_path / "s-00000.tar")
    index = tar_shards.ShardIndex.build([path])
    assert len(index) == 2 and [index.image_ext(i) for i in range(2)] == ["jpg", "png"]
    assert index.read(0, "txt") == b"a red square" and index.read(0, "image") == sample["jpg"]
    assert index.name(1, "image") == path + ":b2.png" and not index.has(1, "txt")
    with pytest.raises(FileNotFoundError, match="b2.txt"):
        index.read(1, "txt")
    assert json.load(open(path + tar_shards.INDEX_SUFFIX))["size"] == os.path.getsize(path)
    assert tar_shards.ShardIndex.build([path]).keys.tolist() == [b"a1", b"b2"]  # from the cache


def test_pattern_and_file_errors_name_the_key_or_file(tmp_path):
    with pytest.raises(tar_shards.ShardError, match=r"DATASET.TRAIN_SHARDS: 2 of 2 shard file\(s\) not found"):
        tar_shards.expand_shards("x-{0..1}.tar", str(tmp_path), "DATASET.TRAIN_SHARDS")
    with pytest.raises(tar_shards.ShardError, match="must be local"):
        tar_shards.expand_shards("pipe:curl -s http://x/a.tar", "", "DATASET.TRAIN_SHARDS")
    path = text_shards(tmp_path, [3])[0]
    with open(path, "rb") as f:
        data = f.read()
    with open(str(tmp_path / "z.tar.gz"), "wb") as f:
        f.write(gzip.compress(data))
    with pytest.raises(tar_shards.ShardError, match="gzip-compressed.*gunzip"):
        tar_shards.index_shard(str(tmp_path / "z.tar.gz"))
    offset, size = dict(tar_shards.index_shard(path))["000002"]["txt"]
    with open(str(tmp_path / "cut.tar"), "wb") as f:  # the last member's data cut short
        f.write(data[:offset + size - 1])
    assert [key for key, _ in tar_shards.index_shard(str(tmp_path / "cut.tar"))] == ["000000", "000001"]


class _Keys(Dataset):
    """The caption of each sample read from its shard, with the worker that read it."""

    def __init__(self, index):
        self.index = index

    def __len__(self):
        return len(self.index)

    def epoch_order(self, seed, epoch):
        return tar_shards.epoch_order(self.index.counts, seed, epoch, buffer=3)

    def __getitem__(self, key):
        return self.index.read(key.index, "txt").decode(), get_worker_info().id


def test_two_ranks_by_two_workers_read_every_sample_once_with_an_uneven_last_shard(tmp_path):
    index = tar_shards.ShardIndex.build(text_shards(tmp_path, [4, 4, 4, 1]))  # 13 samples
    data = _Keys(index)
    per_rank, lengths = [], []
    for rank in range(2):
        sampler = make_batch_sampler(data, 2, True, world_size=2, rank=rank, seed=3, sample_keys=True)
        sampler.set_epoch(1)
        loader = DataLoader(data, batch_sampler=sampler, num_workers=2, collate_fn=list)
        per_rank.append([item for batch in loader for item in batch])
        lengths.append((len(sampler), len(list(sampler))))
    assert lengths == [(4, 4), (4, 4)]  # 7 samples a rank in batches of 2: the same number of steps
    read = [caption for items in per_rank for caption, _ in items]
    assert sorted(set(read)) == sorted("k{}".format(i) for i in range(13))
    assert len(read) == 14  # the padding to equal ranks repeats one sample, as for every data set
    assert {worker for items in per_rank for _, worker in items} == {0, 1}
    # the ranks deal out the global order: seeded shard order + shuffle buffer, the same for every layout
    order = data.epoch_order(3, 1).tolist()
    order += order[:1]
    assert [c for c, _ in per_rank[0]] == ["k{}".format(i) for i in order[0::2]]
    assert [c for c, _ in per_rank[1]] == ["k{}".format(i) for i in order[1::2]]


# --------------------------------------------------------------------------------------------- #
# Samples
# --------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo captions (11 photographs + 2 scenes for training) and their shards (4 samples a shard)."""
    import runpy
    root = tmp_path_factory.mktemp("cc_demo")
    make = runpy.run_path(os.path.join(tp.ROOT, "demo", "make_demo_captions.py"))["make_demo_captions"]
    make(str(root / "cc"), sizes=(2, 1))
    pattern = to_shards(str(root / "cc"), "train", str(root / "shards"), per_shard=4)
    assert pattern == "train-{00000..00003}.tar"
    return str(root / "cc"), tar_shards.expand_shards(pattern, str(root / "shards")), str(root)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None and y is None) or torch.equal(x, y)


def tensor_image(sample):
    """The smallest transform: the PIL image as a float tensor (3, H, W)."""
    return dict(sample, image=to_tensor(sample["image"]))


def test_shard_samples_equal_the_reference_layouts(demo, tmp_path):
    folder, paths, _ = demo
    tok = pretrain_fixtures.tokenizer(tmp_path)
    records = read_caption_index(os.path.join(folder, "train_frcnn.json"), folder)
    for precomputed in (False, True):
        reference = ConceptualCaptionsDataset(records, tok, precomputed=precomputed, transform=tensor_image)
        shards = CaptionShardDataset(tar_shards.ShardIndex.build(paths), tok, precomputed=precomputed,
                                     transform=tensor_image)
        assert len(shards) == len(reference) == 13
        for i in (0, 5, 12):
            _same(shards[SampleKey(i, 1, 7)], reference[SampleKey(i, 1, 7)])


def test_corrupt_members_are_skipped_and_counted(tmp_path):
    good = {"txt": b"a red square", "json": json.dumps({"caption": "unused"}).encode()}
    samples = [dict(good, __key__="000000", jpg=jpeg("red")),
               dict(good, __key__="000001", jpg=b"not a jpeg"),                  # undecodable image
               {"__key__": "000002", "jpg": jpeg("blue"), "txt": b"\xff\xfe"},   # caption not UTF-8
               {"__key__": "000003", "jpg": jpeg("green"), "json": b"{broken"},  # caption JSON broken
               dict(good, __key__="000004", jpg=jpeg("white"))]
    tar_shards.write_shards(samples, str(tmp_path / "dirty"))
    index = tar_shards.ShardIndex.build([str(tmp_path / "dirty-00000.tar")])
    tok = pretrain_fixtures.tokenizer(tmp_path)
    data = CaptionShardDataset(index, tok, grid=(2, 2), with_mvrc=False, with_rel=False, transform=tensor_image,
                               skips=SkipCounter("sample", max_share=1.0, min_seen=5))
    image, boxes, im_info = data[SampleKey(1, 0, 0)][:3]
    assert im_info[4].item() == 4 and image.shape == (3, 16, 20)  # sample 1 takes sample 4's place
    assert (data.skips.skipped, data.skips.seen) == (3, 4)
    assert "000001.jpg" in data.skips.first[0] and "000002.txt" in data.skips.first[1]
    assert "000003.json" in data.skips.first[2]
    strict = CaptionShardDataset(index, tok, grid=(2, 2), with_mvrc=False, transform=tensor_image,
                                 skips=SkipCounter("sample", max_share=0.0, min_seen=5,
                                                   setting="DATASET.MAX_SKIPPED_SHARE"))
    with pytest.raises(TooManySkipsError, match=r"MAX_SKIPPED_SHARE; the first: .*dirty-00000.tar:000001 \(cannot"):
        strict[SampleKey(1, 0, 0)]


def test_grid_regions_without_detector_output_and_npy_features(tmp_path):
    feats = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    npy = io.BytesIO()
    np.save(npy, feats)
    det = {"image_w": 20, "image_h": 16, "num_boxes": 2,
           "boxes": b64([[0, 0, 9, 9], [5, 5, 19, 15]]), "classes": b64([[0.6, 0.4], [0.1, 0.9]])}
    tar_shards.write_shards([{"__key__": "a", "jpg": jpeg("red"), "txt": b"a red square",
                              "json": json.dumps(det).encode(), "npy": npy.getvalue()}], str(tmp_path / "g"))
    index = tar_shards.ShardIndex.build([str(tmp_path / "g-00000.tar")])
    tok = pretrain_fixtures.tokenizer(tmp_path)
    grid = CaptionShardDataset(index, tok, grid=(2, 3), with_mvrc=False, num_classes=1601, transform=tensor_image)
    _, boxes, _, _, _, _, ops, labels = grid[SampleKey(0, 0, 0)]
    assert boxes.shape == (7, 4) and boxes[0].tolist() == [0, 0, 19, 15] and boxes[1].tolist() == [0, 0, 6, 7]
    assert ops.tolist() == [0] * 7 and labels.shape == (7, 1601)
    with pytest.raises(UserInputError, match="NETWORK.WITH_MVRC_LOSS"):
        CaptionShardDataset(index, tok, grid=(2, 3))
    with pytest.raises(UserInputError, match="NETWORK.IMAGE_FEAT_PRECOMPUTED"):
        CaptionShardDataset(index, tok, grid=(2, 3), precomputed=True, with_mvrc=False)
    boxes = CaptionShardDataset(index, tok, precomputed=True, num_classes=2)[SampleKey(0, 0, 0)][1]
    assert torch.equal(boxes[1:, 4:], torch.from_numpy(feats[[1, 0]]))  # regions by best class score


def test_config_refuses_a_misspelt_grid_and_shard_keys_on_the_json_layout(tmp_path):
    from tests.conftest import load_task

    task, cfg = load_task("pretrain"), tp.cfg_path("base_prec_withouttextonly_4x16G_fp32.yaml")
    with pytest.raises(UserInputError, match="DATASET.GRID_BOXES: expected 'ROWSxCOLS'"):
        task.load_config(cfg, ["DATASET.GRID_BOXES", "4by4"])
    loaded = task.load_config(cfg, ["DATASET.GRID_BOXES", "2x2"])
    with pytest.raises(UserInputError, match="DATASET.GRID_BOXES is read by DATASET.DATASET 'cc_shards' only"):
        ConceptualCaptionsDataset.from_config(loaded, "train")


def b64(rows):
    from common.data.region_features import encode_array
    return encode_array(np.asarray(rows, dtype=np.float32))


def test_converter_round_trip_and_webdataset_reads_the_shards(demo, tmp_path):
    import webdataset

    folder, paths, root = demo
    count = from_shards("train-{00000..00003}.tar", str(tmp_path / "back"), root=os.path.join(root, "shards"))
    assert count == 13
    a = read_caption_index(os.path.join(folder, "train_frcnn.json"), folder)
    b = read_caption_index(str(tmp_path / "back" / "train_frcnn.json"), str(tmp_path / "back"))
    assert [r.caption for r in a] == [r.caption for r in b]
    for x, y in zip(a, b):
        assert os.path.relpath(x.image, folder) == os.path.relpath(y.image, str(tmp_path / "back"))
        assert open(x.image, "rb").read() == open(y.image, "rb").read()
        assert json.load(open(x.frcnn)) == json.load(open(y.frcnn))
    for path in paths:  # written by the data set tests, if they ran
        if os.path.exists(path + tar_shards.INDEX_SUFFIX):
            os.remove(path + tar_shards.INDEX_SUFFIX)
    assert index(os.path.join(root, "shards", "train-{00000..00003}.tar"), workers=2) == 13
    assert all(os.path.isfile(path + tar_shards.INDEX_SUFFIX) for path in paths)
    keys = [s["__key__"] for s in webdataset.WebDataset(paths, shardshuffle=False)]
    assert keys == ["{:09d}".format(i) for i in range(13)]


# --------------------------------------------------------------------------------------------- #
# Through pretrain/train_end2end.py
# --------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def shard_inputs(tiny_pretrain, tmp_path_factory):
    """The tiny pretraining captions as shards: (folder, train pattern, val pattern)."""
    out = str(tmp_path_factory.mktemp("tiny_shards"))
    return (out, to_shards(tiny_pretrain.captions, "train", out, per_shard=4),
            to_shards(tiny_pretrain.captions, "val", out, per_shard=4))


def shard_opts(name, inputs, shards, extra=None, **entry_changes):
    """``--opts`` of a tiny run of the shipped config ``name`` whose caption entry reads ``shards``."""
    out, train, val = shards
    entries = tp.datasets(name, inputs)
    single = isinstance(entries, dict)
    entries = [entries] if single else entries
    for entry in entries:
        if entry["DATASET"] == "conceptual_captions":
            entry.update(DATASET="cc_shards", DATASET_PATH=out, TRAIN_SHARDS=train, VAL_SHARDS=val, TEST_SHARDS=val,
                         SHUFFLE_BUFFER=3, **entry_changes)
    return tp.opts(name, inputs, {"DATASET": entries[0] if single else entries}, extra or {})


@pytest.mark.slow
def test_shards_train_through_the_entry_point_with_detector_output_and_with_grid_regions_resnet_and_vit(
        tmp_path, tiny_pretrain, shard_inputs):
    name = "base_prec_withouttextonly_4x16G_fp32.yaml"
    assert tp.train(tmp_path / "prec", name, shard_opts(name, tiny_pretrain, shard_inputs)) == 0
    assert load(tp.checkpoint_path(tmp_path / "prec", name, 0))["train_state"]["global_step"] == 8
    name = "base_e2e_16x16G_fp16.yaml"
    grid = {"NETWORK.WITH_MVRC_LOSS": False, "TRAIN.LOSS_LOGGERS": [["mlm_loss_wvc", "MLMLossWVC"]]}
    opts = shard_opts(name, tiny_pretrain, shard_inputs, grid, GRID_BOXES="2x2")
    assert tp.train(tmp_path / "grid", name, opts) == 0
    log = vcr.log_text_in(tp.output_folder(tmp_path / "grid", name))
    assert "MLMAccWVC" in log and "MVRCAccuracy" not in log
    # Pretraining without boxes: the ViT image encoder on grid regions of the shards' images.
    from tests.test_vit_end2end import vit_opts
    opts = shard_opts(name, tiny_pretrain, shard_inputs, grid, GRID_BOXES="2x2") + vit_opts("pretrain")
    assert tp.train(tmp_path / "vit", name, opts + ["NETWORK.MASK_RAW_PIXELS", "false"]) == 0
    state = load(tp.checkpoint_path(tmp_path / "vit", name, 0))["state_dict"]
    assert any(k.startswith("image_feature_extractor.vit.") for k in state)


@pytest.mark.slow
def launch(model_dir, name, opts, env=None):
    """``pretrain/train_end2end.py`` in a child process through tests/fault_injection.py: (exit code, output)."""
    cmd = [sys.executable, os.path.join(tp.ROOT, "tests", "fault_injection.py"), "--cfg", tp.cfg_path(name),
           "--model-dir", str(model_dir), "--opts"] + opts
    out = subprocess.run(cmd, env=dict(os.environ, **vcr.LAUNCH_ENV, FAULT_ENTRY=tp.ENTRY, **(env or {})),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    return out.returncode, out.stdout


@pytest.mark.slow
def test_sigkill_and_resume_from_shards_is_exact(tmp_path, tiny_pretrain, shard_inputs):
    """2 loader workers; killed after optimizer step 11 of 16, resumed from the mid-epoch checkpoint of step 9."""
    name = "base_prec_withouttextonly_4x16G_fp32.yaml"
    opts = shard_opts(name, tiny_pretrain, shard_inputs, {"TRAIN.END_EPOCH": 2, "TRAIN.CHECKPOINT_STEPS": 3,
                                                          "NUM_WORKERS_PER_GPU": 2})
    rc, out = launch(tmp_path / "clean", name, opts)
    assert rc == 0, out[-3000:]
    rc, out = launch(tmp_path / "killed", name, opts, {"FAULT_KILL_AFTER_STEP": "11"})
    assert rc == -signal.SIGKILL, out[-3000:]
    rc, out = launch(tmp_path / "killed", name, opts)
    assert rc == 0, out[-3000:]
    assert "Resumed from" in out and "epoch 1, batch 1, optimizer step 9" in out, out[-3000:]
    a = load(tp.checkpoint_path(tmp_path / "killed", name, 1))
    b = load(tp.checkpoint_path(tmp_path / "clean", name, 1))
    assert a["train_state"] == b["train_state"] and a["train_state"]["global_step"] == 16
    for k in b["state_dict"]:
        assert torch.equal(a["state_dict"][k], b["state_dict"][k]), k
    for i, state in b["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(a["optimizer"]["state"][i][key]), torch.as_tensor(value)), (i, key)
