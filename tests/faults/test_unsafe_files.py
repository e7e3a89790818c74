"""Files that would run code when unpickled -- a pickle that creates a file through os.system, exec,
eval or builtins.open -- fed through every path the product loads files by, with and without
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: the file is never created and the error names the refused file.
A scan fails on any bare torch.load / pickle.load outside common/fileio/safe_load.py."""
import os
import pickle
import re

import pytest
import torch
from yacs.config import CfgNode

from common.checkpoint import checkpointer as ck
from common.checkpoint.partial_pretrain import load_partial_pretrain
from common.engine import load_for_inference
from common.fileio.safe_load import UnreadableFileError, load_pickle, load_tensors
from common.modeling.fast_rcnn import FastRCNN
from common.modeling.nlp.bert_loading import language_pretrained_weights, read_bert_weights
from tests.conftest import ROOT
from tests import tiny_vcr as tiny_vcr_cfg
from tests.faults import harness, tiny_task


class Payload:
    """Unpickling calls ``call(*args)``: each one creates the file ``marker``."""

    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def payloads(marker):
    return {
        "os.system": Payload(os.system, ("touch '{}'".format(marker),)),
        "exec": Payload(exec, ("open({!r}, 'w').write('x')".format(str(marker)),)),
        "eval": Payload(eval, ("open({!r}, 'w')".format(str(marker)),)),
        "builtins.open": Payload(open, (str(marker), "w")),
    }


# What the file asks to call, as the loaders name it (builtins.open is io.open).
REFUSED = {"os.system": "posix.system", "exec": "builtins.exec", "eval": "builtins.eval", "builtins.open": "io.open"}


def write_evil(path, payload, fmt="zip"):
    """A checkpoint-shaped dict with the payload inside: torch.save's zip or legacy format, or a plain
    pickle of protocol 2 or the highest (framed) one (no tensors: pickling one names a torch global
    first, which is refused before the payload)."""
    plain = fmt.startswith("pickle")
    tensors = {} if plain else {"w": torch.zeros(2)}
    obj = {"state_dict": tensors, "optimizer": {}, "extra": payload}
    if plain:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2 if fmt == "pickle" else pickle.HIGHEST_PROTOCOL)
    else:
        torch.save(obj, str(path), _use_new_zipfile_serialization=fmt == "zip")
    return str(path)


def refused(path, name):
    return r"{} was refused \(.*\): it asks to call {}, .*nothing from the file was run".format(
        re.escape(str(path)), re.escape(name))


@pytest.fixture(params=[False, True], ids=["env-unset", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"])
def force_no_weights_only(request, monkeypatch):
    if request.param:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    else:
        monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)


def tiny_resnet_config(image_pretrained):
    net = CfgNode(dict(IMAGE_NUM_LAYERS=18, IMAGE_C5_DILATED=False, IMAGE_STRIDE_IN_1x1=False,
                       IMAGE_PRETRAINED=image_pretrained, IMAGE_PRETRAINED_EPOCH=0, IMAGE_FROZEN_BACKBONE_STAGES=[],
                       IMAGE_FROZEN_BN=False, IMAGE_SEMANTIC=False, IMAGE_FEAT_PRECOMPUTED=False,
                       OUTPUT_CONV5=False, IMAGE_ROI_POOLED_SIZE=4))
    return CfgNode(dict(NETWORK=net))


def bert_network(bert_pretrained, folder=""):
    return CfgNode(dict(BERT_PRETRAINED=bert_pretrained, BERT_PRETRAINED_EPOCH=0, BERT_MODEL_NAME=folder,
                        VLBERT=CfgNode()))


@pytest.mark.parametrize("fmt", ["zip", "legacy", "pickle", "pickle-highest"])
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_every_tensor_loading_path_refuses_code(kind, fmt, tmp_path, force_no_weights_only):
    marker = tmp_path / "created_by_pickle"
    payload = payloads(marker)[kind]
    evil = write_evil(tmp_path / "evil-0000.model", payload, fmt)
    evil_prefix = evil[:-len("-0000.model")]  # {prefix}-{epoch:04d}.model names
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "bert_config.json").write_text("{}")
    evil_bin = write_evil(bert / "pytorch_model.bin", payload, fmt)
    tiny = tiny_task.TinyNet(None)
    paths = {
        "load_tensors": (evil, lambda: load_tensors(evil)),
        "checkpoint (resume, val.py, test.py)": (evil, lambda: ck.load_checkpoint_file(evil)),
        "NETWORK.PARTIAL_PRETRAIN": (evil, lambda: load_partial_pretrain(tiny, evil)),
        "inference model": (evil, lambda: load_for_inference(tiny_task.TINY_TASK, CfgNode({"MODULE": "TinyNet"}),
                                                             evil, "cpu")),
        "NETWORK.IMAGE_PRETRAINED": (evil, lambda: FastRCNN(tiny_resnet_config(evil_prefix), final_dim=8).init_weight()),
        "BERT weights": (evil, lambda: read_bert_weights(evil)),
        "NETWORK.BERT_PRETRAINED": (evil, lambda: language_pretrained_weights(bert_network(evil_prefix))),
        "NETWORK.BERT_MODEL_NAME": (evil_bin, lambda: language_pretrained_weights(bert_network("", str(bert)))),
    }
    for what, (path, attempt) in paths.items():
        with pytest.raises((UnreadableFileError, ck.CheckpointError)) as info:
            attempt()
        assert re.fullmatch(refused(path, REFUSED[kind]) + r"[^\n]*", str(info.value)), (what, str(info.value))
        assert not marker.exists(), what


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_plain_pickles_refuse_code_and_keep_plain_values(kind, protocol, tmp_path):
    marker = tmp_path / "created_by_pickle"
    path = tmp_path / "refs(unc).p"
    plain = {"refs": [{"ref_id": 1, "sentences": [{"raw": "the man on the left", "tokens": ["man", "left"]}],
                       "bbox": (1.5, 2.0, 30.0, 40.25), "split": "testA", "ok": True, "none": None}],
             "ids": {3, 4}, "frozen": frozenset({"a"}), "bytes": b"\x00\xff", "c": 1 + 2j}
    with open(path, "wb") as f:
        pickle.dump(plain, f, protocol=protocol)
    assert load_pickle(str(path), "RefCOCO refs file") == plain
    with open(path, "wb") as f:
        pickle.dump(dict(plain, evil=payloads(marker)[kind]), f, protocol=protocol)
    with pytest.raises(UnreadableFileError, match=refused(path, REFUSED[kind])):
        load_pickle(str(path), "RefCOCO refs file")
    assert not marker.exists()


def test_truncated_or_foreign_files_name_the_file(tmp_path):
    ckpt = tmp_path / "m-0000.model"
    torch.save({"state_dict": {"w": torch.zeros(100)}}, str(ckpt))
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:len(data) // 2])
    with pytest.raises(UnreadableFileError, match=r"m-0000\.model is not a readable weights file \("):
        load_tensors(str(ckpt))
    refs = tmp_path / "refs.p"
    refs.write_bytes(pickle.dumps({"a": [1, 2, 3]})[:-4])
    with pytest.raises(UnreadableFileError, match=r"refs\.p is not a readable RefCOCO refs file \("):
        load_pickle(str(refs), "RefCOCO refs file")
    with pytest.raises(FileNotFoundError, match="absent.p"):
        load_pickle(str(tmp_path / "absent.p"))


def test_resume_and_partial_pretrain_entries_refuse_code(tiny_cfg, tiny_vcr, tmp_path, capsys, monkeypatch):
    """Through the training entries, with the environment variable set: a refused newest checkpoint is
    skipped with a warning naming it; a refused PARTIAL_PRETRAIN file (a VL-BERT task's key: VCR here)
    stops the run with one error."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "created_by_pickle"
    folder = harness.out_dir(tmp_path / "m")
    assert harness.run_here(tiny_cfg, tmp_path / "m", opts=["TRAIN.END_EPOCH", 1]) == 0
    evil = write_evil(os.path.join(folder, "tiny-0001.model"), payloads(marker)["os.system"])  # the newest
    capsys.readouterr()
    assert harness.run_here(tiny_cfg, tmp_path / "m", opts=["TRAIN.END_EPOCH", 2]) == 0
    out = capsys.readouterr().out
    assert re.search(r"skipping unreadable checkpoint, falling back to the previous one: " + refused(evil, "posix.system"),
                     out), out[-2000:]
    assert "Resumed from {}".format(os.path.join(folder, "tiny-0000.model")) in out

    pretrain = write_evil(tmp_path / "pretrain.model", payloads(marker)["exec"])
    argv = ["--cfg", tiny_vcr_cfg.CFG, "--model-dir", str(tmp_path / "p"),
            "--opts"] + tiny_vcr.opts({"NETWORK.PARTIAL_PRETRAIN": str(pretrain)})
    assert tiny_vcr_cfg.run_script(tiny_vcr_cfg.ENTRY, argv) == 2
    err = capsys.readouterr().err
    assert re.fullmatch("error: " + refused(pretrain, "builtins.exec") + r"\.[^\n]*\n", err), err
    assert not marker.exists()


PRODUCT_DIRS = ("common", "vcr", "vqa", "pretrain", "refcoco", "cls", "scripts", "tools", "demo", "bench")
UNSAFE = re.compile(r"\btorch\.load\b|\btorch\.jit\.load\b|\bpickle\.loads?\b|\bUnpickler\b|\bcPickle\b|\bdill\b"
                    r"|\bmarshal\.loads?\b|allow_pickle\s*=\s*True|\byaml\.(?:load|unsafe_load|full_load)\b")


def test_no_bare_unpickling_outside_safe_load():
    offenders = []
    for top in PRODUCT_DIRS:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith((".py", ".sh")) or os.path.relpath(path, ROOT) == os.path.join(
                        "common", "fileio", "safe_load.py"):
                    continue
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        code = line.split("#")[0]
                        if UNSAFE.search(code):
                            offenders.append("{}:{}: {}".format(os.path.relpath(path, ROOT), number, line.strip()))
    assert offenders == [], "load files through common.fileio.safe_load:\n" + "\n".join(offenders)


def evil_sharded_folder(folder, marker):
    """A sharded checkpoint folder (as an FSDP run writes: shards, DCP's index, rest.pt) whose DCP index
    ``.metadata`` is a pickle calling os.system; returns the index's path."""
    from common.checkpoint.sharded import INDEX_FILE, save_sharded_checkpoint

    save_sharded_checkpoint({"state_dict": {"w": torch.zeros(2)}, "train_state": {"epoch": 1}}, str(folder))
    index = os.path.join(str(folder), INDEX_FILE)
    with open(index, "wb") as f:
        pickle.dump({"state_dict_metadata": payloads(marker)["os.system"]}, f)
    return index


def test_a_sharded_folder_whose_index_runs_code_is_refused_by_every_reader(tiny_cfg, tmp_path, capsys):
    """The DCP index of a folder read as a checkpoint by resume, val.py, test.py, the predictor and export: one
    ``error:`` line naming the index file (resume with AUTO_RESUME: a warning naming it, then the previous
    checkpoint), the command never run."""
    marker = tmp_path / "created_by_pickle"
    # resume: the newest checkpoint of a tiny run replaced by the folder
    folder = harness.out_dir(tmp_path / "m")
    assert harness.run_here(tiny_cfg, tmp_path / "m", opts=["TRAIN.END_EPOCH", 1]) == 0
    index = evil_sharded_folder(os.path.join(folder, "tiny-0001.model"), marker)
    capsys.readouterr()
    assert harness.run_here(tiny_cfg, tmp_path / "m", opts=["TRAIN.END_EPOCH", 2]) == 0
    out = capsys.readouterr().out
    assert re.search(r"skipping unreadable checkpoint, falling back to the previous one: " + refused(
        index, "posix.system"), out), out[-2000:]
    assert "Resumed from {}".format(os.path.join(folder, "tiny-0000.model")) in out
    assert not marker.exists()

    from tests.test_export import CLS_OPTS
    evil = tmp_path / "evil-0000.model"
    index = evil_sharded_folder(evil, marker)
    cfg = os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml")
    commands = {
        "val.py": (os.path.join(ROOT, "cls", "val.py"), ["--cfg", cfg, "--ckpt", evil, "--opts"] + CLS_OPTS),
        "test.py": (os.path.join(ROOT, "cls", "test.py"), ["--cfg", cfg, "--ckpt", evil, "--result-path",
                                                           tmp_path / "res", "--opts"] + CLS_OPTS),
        "predictor": (os.path.join(ROOT, "tools", "predict.py"), ["--cfg", cfg, "--ckpt", evil, "--image",
                                                                  tmp_path / "x.png", "--opts"] + CLS_OPTS),
        "export": (os.path.join(ROOT, "tools", "export.py"), ["--cfg", cfg, "--ckpt", evil, "--format", "onnx",
                                                              "--out", tmp_path / "x.onnx", "--opts"] + CLS_OPTS),
    }
    from PIL import Image
    Image.new("RGB", (32, 32)).save(str(tmp_path / "x.png"))
    for what, (entry, argv) in commands.items():
        capsys.readouterr()
        assert tiny_vcr_cfg.run_script(entry, [str(a) for a in argv]) == 2, what
        err = capsys.readouterr().err
        assert re.fullmatch("error: " + refused(index, "posix.system") + r"[^\n]*\n", err), (what, err)
        assert not marker.exists(), what


@pytest.mark.slow
def test_a_sharded_run_refuses_a_folder_whose_index_runs_code(tiny_cfg, tmp_path):
    """TRAIN.RESUME of an FSDP run (a process group of one rank, the model sharded: rank 0 checks the folder's
    index before every rank reads its shards) from an epoch folder whose index calls os.system, through the
    launcher: one error line naming the index, no torchrun traceback, exit 2, nothing run."""
    marker = tmp_path / "created_by_pickle"
    opts = ["TRAIN.STRATEGY", "fsdp", "TRAIN.END_EPOCH", 1]
    rc, _, err = harness.run(tiny_cfg, tmp_path / "m", opts=opts, dist=True, timeout=300)
    assert rc == 0, err[-3000:]
    folder = os.path.join(harness.out_dir(tmp_path / "m"), "tiny-0000.model")
    assert os.path.isdir(folder)
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump({"state_dict_metadata": payloads(marker)["os.system"]}, f)
    rc, _, err = harness.run(tiny_cfg, tmp_path / "m", dist=True, timeout=300, opts=[
        "TRAIN.STRATEGY", "fsdp", "TRAIN.RESUME", True, "TRAIN.BEGIN_EPOCH", 1, "TRAIN.END_EPOCH", 2])
    assert rc == 2 and "Traceback" not in err, err[-3000:]  # the launcher's one line for a user mistake
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    # the launcher's output folder path holds a "./": the index is named from the run's folder on
    assert len(errors) == 1 and re.fullmatch("error: .*" + refused(os.path.join("train_train", "tiny-0000.model",
                                                                                ".metadata"), "posix.system") + ".*",
                                              errors[0]), err[-3000:]
    assert not marker.exists()


def test_a_dcp_index_holds_only_tensor_entries_in_files_of_its_folder(tmp_path):
    """The reader admits DCP's metadata classes, and of them only what a folder of tensors holds: an entry DCP
    would read with ``torch.load(weights_only=False)`` (BytesStorageMetadata) or a shard path outside the folder
    is refused by name; a folder as the writer leaves it reads back exactly (the same bytes)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from common.checkpoint.sharded import INDEX_FILE, read_sharded_checkpoint, save_sharded_checkpoint
    from common.fileio.safe_load import load_dcp_index

    folder = str(tmp_path / "run-0000.model")
    weights = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    save_sharded_checkpoint({"state_dict": weights, "rng": [{"torch": torch.arange(4, dtype=torch.uint8)}]}, folder)
    back = read_sharded_checkpoint(folder)
    assert all(torch.equal(back["state_dict"][k], v) and back["state_dict"][k].dtype == v.dtype
               for k, v in weights.items())
    index_path = os.path.join(folder, INDEX_FILE)
    index = load_dcp_index(index_path)
    bytes_entry = pickle.loads(pickle.dumps(index))
    bytes_entry.state_dict_metadata["state_dict/w"] = BytesStorageMetadata()
    outside = pickle.loads(pickle.dumps(index))
    next(iter(outside.storage_data.values())).relative_path = "../elsewhere.distcp"
    for crafted, message in ((bytes_entry, "it asks to call torch.distributed.checkpoint.metadata.BytesStorageMetadata"),
                             (outside, "a shard outside its folder")):
        with open(index_path, "wb") as f:
            pickle.dump(crafted, f)
        with pytest.raises(ck.CheckpointError, match=re.escape(index_path) + ".*" + re.escape(message)):
            ck.load_checkpoint_file(folder)
