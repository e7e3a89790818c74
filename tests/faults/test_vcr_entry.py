"""Bad inputs through the VCR commands on tiny generated data: a corrupt jsonl line and a corrupt image
are named in one ``error:`` line (exit code 2); a ResNet weights file that would run code is refused
even with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1; the random-initialisation warning appears only when the
weights really stay random (training without IMAGE_PRETRAINED), not in vcr/val.py or vcr/test.py,
which load trained weights from the checkpoint."""
import os
import re
import runpy
import shutil
import sys
import warnings

import pytest
import torch

from common.checkpoint import checkpointer as ck
from common.modeling.module import RandomInitWarning
from tests.conftest import ROOT
from tests.faults import vcr_data
from tests.faults.test_unsafe_files import payloads, refused, write_evil
from vcr.task import TASK as VCR_TASK
from common import engine
from vcr.task import TASK as VCR_TASK

RANDOM_RESNET = "NETWORK.IMAGE_PRETRAINED is empty: the ResNet image backbone keeps its random initialisation"


def run(monkeypatch, script, *args):
    """Run ``python <script> <args>`` in this process (the script's own ``__main__`` code); its exit code."""
    monkeypatch.setattr(sys, "argv", [script] + list(args))
    monkeypatch.syspath_prepend(os.path.join(ROOT, os.path.dirname(script)))  # for its `import _init_paths`
    try:
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code


def train(tiny_vcr, tmp_path, monkeypatch, *opts):
    data, base_opts = tiny_vcr
    return run(monkeypatch, "vcr/train_end2end.py", "--cfg", vcr_data.CFG, "--model-dir", str(tmp_path / "model"),
               "--opts", *(base_opts + list(opts)))


@pytest.fixture(scope="module")
def tiny_vcr(tmp_path_factory):
    """(data folder, --opts) of a tiny VCR set-up: demo data and a 1-layer BERT folder."""
    root = str(tmp_path_factory.mktemp("tiny_vcr"))
    opts = vcr_data.make_tiny_vcr(root)
    return opts[opts.index("DATASET.DATASET_PATH") + 1], opts


def random_init_warnings(caught):
    return [str(w.message) for w in caught if re.search("random(ly)? init", str(w.message))]


def printed_random_init_warnings(out):
    """The random-initialisation warnings an entry point printed (its log routes warnings to stdout)."""
    return [line.split("RandomInitWarning: ", 1)[1] for line in out.splitlines() if "RandomInitWarning: " in line]


def one_error_line(captured):
    err = captured.err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_corrupt_jsonl_line_is_named(tiny_vcr, tmp_path, capsys, monkeypatch):
    data, opts = tiny_vcr
    broken = tmp_path / "train.jsonl"
    with open(os.path.join(data, "train.jsonl")) as f:
        lines = f.readlines()
    lines[2] = lines[2][:40] + "\n"  # line 3 cut short
    broken.write_text("".join(lines))
    assert train(tiny_vcr, tmp_path, monkeypatch, "DATASET.TRAIN_ANNOTATION_FILE", str(broken)) == 2
    assert re.fullmatch(r"error: {} line 3: not valid JSON \(.+\)".format(re.escape(str(broken))),
                        one_error_line(capsys.readouterr()))


def test_corrupt_image_is_named_and_random_resnet_is_warned(tiny_vcr, tmp_path, capsys, monkeypatch):
    data, opts = tiny_vcr
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    image = copy / "vcr1images" / "shapes" / "train_00000.jpg"  # item of train.jsonl line 1
    image.write_bytes(image.read_bytes()[:200])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code = train(tiny_vcr, tmp_path, monkeypatch, "DATASET.DATASET_PATH", str(copy), "TRAIN.SHUFFLE", "false")
    assert code == 2
    captured = capsys.readouterr()
    assert re.fullmatch(r"error: {} line 1 \(annot_id shapes-train-0\): cannot decode image '{}': .+".format(
        re.escape(str(copy / "train.jsonl")), re.escape(str(image))), one_error_line(captured))
    # training really starts from a random ResNet: said once
    assert printed_random_init_warnings(captured.out) == [RANDOM_RESNET]


def test_image_pretrained_that_runs_code_is_refused(tiny_vcr, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "created_by_pickle"
    evil = write_evil(tmp_path / "resnet-0000.model", payloads(marker)["os.system"])
    assert train(tiny_vcr, tmp_path, monkeypatch, "NETWORK.IMAGE_PRETRAINED", str(tmp_path / "resnet")) == 2
    assert re.fullmatch("error: " + refused(evil, "posix.system") + r".*", one_error_line(capsys.readouterr()))
    assert not marker.exists()


@pytest.fixture(scope="module")
def checkpoint(tiny_vcr, tmp_path_factory):
    """A checkpoint of the tiny VCR model (weights as built: inference only needs them loaded)."""
    cfg = VCR_TASK.load_config(vcr_data.CFG, tiny_vcr[1])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomInitWarning)
        model = VCR_TASK.build_model(cfg)
    path = str(tmp_path_factory.mktemp("ckpt") / "vcr-0000.model")
    ck.save_checkpoint(path, model, torch.optim.SGD(model.parameters(), lr=0.1))
    return path


def test_val_does_not_warn_about_random_weights(tiny_vcr, checkpoint, capsys, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert run(monkeypatch, "vcr/val.py", "--cfg", vcr_data.CFG, "--ckpt", checkpoint, "--opts", *tiny_vcr[1]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Q->A accuracy on val: [0-9.]+", out)
    assert printed_random_init_warnings(out) == []


def test_test_csv_does_not_warn_about_random_weights(tiny_vcr, checkpoint, tmp_path):
    cfg = VCR_TASK.load_config(vcr_data.CFG, tiny_vcr[1] + ["DATASET.TASK", "Q2A"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = engine.test_net(VCR_TASK, cfg, checkpoint, str(tmp_path), "tiny")
    assert os.path.isfile(path)
    assert random_init_warnings(caught) == []
