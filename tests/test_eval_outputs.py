"""The val / test command lines write the same files and print the same accuracies as the code before the
shared inference loop (issue 21): golden files in tests/data/eval_golden/, made by that code on the tiny
fixture data with seeded random weights (fp32 on CPU, one thread).

The golden files were written on one processor: ids, order, names, keys, layout and formatting compare exactly,
floats within the tolerance of :mod:`tests.golden`, and a chosen answer or box exactly unless the run's two best
scores for it were within that tolerance (then either is accepted). ``EVAL_GOLDEN_WRITE=1`` rewrites them (only
from code whose outputs are known to be right). CI runs it under other CPU kernels (``scripts/run_tests.sh
--cpu-passes``) and tests/test_cpu_passes.py under ATen's ``default`` ones.
"""
import contextlib
import os
import re
import warnings

import pytest
import torch

from common.checkpoint.checkpointer import save_checkpoint
from common.modeling.module import RandomInitWarning
from tests.conftest import ROOT
from tests.golden import Choices, assert_json_close, assert_text_close
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


@contextlib.contextmanager
def _choices(candidates):
    """:class:`tests.golden.Choices` of every eval-mode forward whose outputs hold ``label_logits`` ``(B, K)``
    (a global forward hook: the entry points build the model themselves); ``candidates(args, outputs, b)`` is
    the list of K values row b can output."""
    choices = Choices()

    def hook(module, args, output):
        outputs = output[0] if isinstance(output, tuple) else output
        if not module.training and isinstance(outputs, dict) and "label_logits" in outputs:
            for b, row in enumerate(outputs["label_logits"]):
                choices.record(row, candidates(args, outputs, b))

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield choices
    finally:
        handle.remove()


def _check(name, data, choices):
    """``data`` (bytes) equals tests/data/eval_golden/<name> (:mod:`tests.golden`: JSON through
    ``assert_json_close``, other text through ``assert_text_close``)."""
    path = os.path.join(GOLDEN, name)
    if os.environ.get("EVAL_GOLDEN_WRITE") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    with open(path, "rb") as f:
        golden = f.read().decode()
    if name.endswith(".json"):
        assert_json_close(data.decode(), golden, name, choices)
    else:
        assert_text_close(data.decode(), golden, name, loose_counts=choices.ties)


def _check_files(folder, printed, prefix, choices):
    """Every file the run wrote in ``folder`` and its ``printed`` text against the golden files ``prefix*``."""
    names = sorted(os.listdir(folder))
    if os.environ.get("EVAL_GOLDEN_WRITE") != "1":
        golden = sorted(n[len(prefix):] for n in os.listdir(GOLDEN) if n.startswith(prefix))
        assert sorted(names + ["stdout.txt"]) == golden, (names, golden)
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            _check(prefix + name, f.read(), choices)
    _check(prefix + "stdout.txt", printed.encode(), choices)


def test_vcr_val_and_test_outputs(tmp_path, capsys):
    from tests.faults.vcr_data import CFG, make_tiny_vcr
    from vcr.task import TASK

    opts = make_tiny_vcr(str(tmp_path / "in"))
    ckpt = _checkpoint(TASK, TASK.load_config(CFG, opts), tmp_path / "vcr-0000.model")
    out = tmp_path / "out"
    with _choices(lambda args, outputs, b: list(range(outputs["label_logits"].shape[1]))) as choices:
        printed = _run("vcr/test.py", ["--a-cfg", CFG, "--a-ckpt", ckpt, "--r-cfg", CFG, "--r-ckpt", ckpt,
                                       "--result-path", str(out), "--result-name", "tiny", "--opts"] + opts, capsys)
        printed += _run("vcr/val.py", ["--a-cfg", CFG, "--a-ckpt", ckpt, "--opts"] + opts, capsys)
    _check_files(out, printed, "vcr_", choices)


def test_vqa_val_and_test_outputs(tmp_path, capsys):
    from tests.tiny_vqa import CFGS, make_inputs
    from vqa.data.answers import AnswerVocab
    from vqa.task import TASK

    inputs = make_inputs(tmp_path / "in")
    cfg, opts = CFGS["base_4x16G_fp32"], inputs.opts()
    config = TASK.load_config(cfg, opts)
    ckpt = _checkpoint(TASK, config, tmp_path / "vqa-0000.model")
    answers = AnswerVocab.from_file(config.DATASET.ANSWER_VOCAB_FILE).answers
    out = tmp_path / "out"
    common = ["--cfg", cfg, "--ckpt", ckpt, "--result-path", str(out), "--result-name", "tiny"]
    with _choices(lambda args, outputs, b: answers) as choices:
        printed = _run("vqa/test.py", common + ["--opts"] + opts, capsys)
        printed += _run("vqa/val.py", common + ["--opts"] + opts, capsys)
    _check_files(out, printed, "vqa_", choices)


def test_refcoco_val_and_test_outputs(tiny_vcr, tmp_path, capsys):
    from refcoco.task import TASK
    from tests.refcoco_fixture import write_refcoco
    from tests.test_refcoco_end2end import CFGS, tiny_opts

    cfg = os.path.join(CFGS, "base_detected_regions_4x16G.yaml")
    opts = tiny_opts(tiny_vcr, write_refcoco(str(tmp_path / "in")), "")
    ckpt = _checkpoint(TASK, TASK.load_config(cfg, opts), tmp_path / "refcoco-0000.model")
    out = tmp_path / "out"
    with _choices(_refcoco_boxes) as choices:
        printed = _run("refcoco/test.py", ["--cfg", cfg, "--ckpt", ckpt, "--split", "test", "val", "--result-path",
                                           str(out), "--result-name", "tiny", "--opts"] + opts, capsys)
        printed += _run("refcoco/val.py", ["--cfg", cfg, "--ckpt", ckpt, "--opts"] + opts, capsys)
    _check_files(out, printed, "refcoco_", choices)


def _refcoco_boxes(args, outputs, b):
    """The candidate boxes of item b in original image pixels, as the model's ``pred_boxes``: the inputs
    ``(image, boxes [B, N, 4+], im_info [B, 4+] with scale_x, scale_y at 2, 3, expression)``."""
    boxes, im_info = args[1], args[2]
    return (boxes[b, :, :4] / im_info[b, [2, 3, 2, 3]].to(boxes.dtype)).tolist()


@pytest.fixture(autouse=True)
def _one_thread():
    """One thread, as the golden files were made: the same float sums whatever the core count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
