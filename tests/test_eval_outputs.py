"""The val / test command lines write the same files and print the same accuracies, byte for byte, as the
code before the shared inference loop (issue 21): golden files in tests/data/eval_golden/, made by that code
on the tiny fixture data with seeded random weights (fp32 on CPU, one thread).

The float columns of the VCR CSVs are exact reprs, so the golden files hold for this machine's torch build;
``EVAL_GOLDEN_WRITE=1`` rewrites them (only from code whose outputs are known to be right).
"""
import os
import re
import warnings

import pytest
import torch

from common.checkpoint import save_checkpoint
from common.modeling.module import RandomInitWarning
from tests.conftest import ROOT
from tests.tiny_vcr import run_script

GOLDEN = os.path.join(ROOT, "tests", "data", "eval_golden")
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def _checkpoint(task, cfg, path):
    """A checkpoint of ``task``'s model for ``cfg`` with seed-0 weights."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RandomInitWarning)
        model = task.build_model(cfg)
    save_checkpoint(str(path), model, torch.optim.SGD(model.parameters(), lr=0.1))
    return str(path)


def _run(script, argv, capsys):
    """Printed lines of ``python <script> argv`` run here, less log lines (time-stamped) and those naming a
    (temporary) path."""
    capsys.readouterr()
    assert run_script(os.path.join(ROOT, script), argv) in (0, None)
    return "".join(line + "\n" for line in capsys.readouterr().out.splitlines()
                   if "saved to" not in line and not LOG_LINE.match(line))


def _check(name, data):
    """``data`` (str or bytes) equals tests/data/eval_golden/<name> byte for byte."""
    data = data.encode() if isinstance(data, str) else data
    path = os.path.join(GOLDEN, name)
    if os.environ.get("EVAL_GOLDEN_WRITE") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    with open(path, "rb") as f:
        assert f.read() == data, name


def _check_files(folder, capsys_text, prefix):
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            _check(prefix + name, f.read())
    _check(prefix + "stdout.txt", capsys_text)


def test_vcr_val_and_test_outputs(tmp_path, capsys):
    from tests.faults.vcr_data import CFG, make_tiny_vcr
    from vcr.task import TASK

    opts = make_tiny_vcr(str(tmp_path / "in"))
    ckpt = _checkpoint(TASK, TASK.load_config(CFG, opts), tmp_path / "vcr-0000.model")
    out = tmp_path / "out"
    printed = _run("vcr/test.py", ["--a-cfg", CFG, "--a-ckpt", ckpt, "--r-cfg", CFG, "--r-ckpt", ckpt,
                                   "--result-path", str(out), "--result-name", "tiny", "--opts"] + opts, capsys)
    printed += _run("vcr/val.py", ["--a-cfg", CFG, "--a-ckpt", ckpt, "--opts"] + opts, capsys)
    _check_files(out, printed, "vcr_")


def test_vqa_val_and_test_outputs(tmp_path, capsys):
    from tests.tiny_vqa import CFGS, make_inputs
    from vqa.task import TASK

    inputs = make_inputs(tmp_path / "in")
    cfg, opts = CFGS["base_4x16G_fp32"], inputs.opts()
    ckpt = _checkpoint(TASK, TASK.load_config(cfg, opts), tmp_path / "vqa-0000.model")
    out = tmp_path / "out"
    common = ["--cfg", cfg, "--ckpt", ckpt, "--result-path", str(out), "--result-name", "tiny"]
    printed = _run("vqa/test.py", common + ["--opts"] + opts, capsys)
    printed += _run("vqa/val.py", common + ["--opts"] + opts, capsys)
    _check_files(out, printed, "vqa_")


def test_refcoco_val_and_test_outputs(tiny_vcr, tmp_path, capsys):
    from refcoco.task import TASK
    from tests.refcoco_fixture import write_refcoco
    from tests.test_refcoco_end2end import CFGS, tiny_opts

    cfg = os.path.join(CFGS, "base_detected_regions_4x16G.yaml")
    opts = tiny_opts(tiny_vcr, write_refcoco(str(tmp_path / "in")), "")
    ckpt = _checkpoint(TASK, TASK.load_config(cfg, opts), tmp_path / "refcoco-0000.model")
    out = tmp_path / "out"
    printed = _run("refcoco/test.py", ["--cfg", cfg, "--ckpt", ckpt, "--split", "test", "val", "--result-path",
                                       str(out), "--result-name", "tiny", "--opts"] + opts, capsys)
    printed += _run("refcoco/val.py", ["--cfg", cfg, "--ckpt", ckpt, "--opts"] + opts, capsys)
    _check_files(out, printed, "refcoco_")


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread, as the golden files were made: the same float sums whatever the core count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
