"""Where a non-finite value was born (common/diagnostics/nonfinite.py): through the tiny task's real entry point, a hook
in the test makes a named module's output inf (or a named parameter's gradient nan) from some step on; the
divergence error names that module and direction, and the saved micro-batch replays to the same module with
tools/replay_step.py."""
import glob
import os
import re
import sys

import pytest
import torch

from common.trainer import DIVERGED_EXIT_CODE
from tests import tiny_cls
from tests.conftest import ROOT
from tests.faults import harness, tiny_task
from tests.tiny_vcr import run_script

REPLAY = os.path.join(ROOT, "tools", "replay_step.py")
FC1 = "backbone.blocks.0.mlp.fc1"  # its input is its parent's (the Mlp's) input


def _break_module(monkeypatch, module_name, from_call):
    """From the ``from_call``-th training forward of TinyNet's sub-module ``module_name`` on, its output is +inf
    (counted over every TinyNet of the test: the one tools/replay_step.py builds goes on from the run's count)."""
    real_init, calls = tiny_task.TinyNet.__init__, [0]

    def init(self, config):
        real_init(self, config)

        def hook(module, inputs, output):
            if module.training:
                calls[0] += 1
            return output * float("inf") if calls[0] >= from_call else output
        self.get_submodule(module_name).register_forward_hook(hook)
    monkeypatch.setattr(tiny_task.TinyNet, "__init__", init)


def _break_grad(monkeypatch, param_name, from_call):
    """From the ``from_call``-th gradient of TinyNet's parameter ``param_name`` on, it is nan (counted as above)."""
    real_init, calls = tiny_task.TinyNet.__init__, [0]

    def init(self, config):
        real_init(self, config)

        def hook(grad):
            calls[0] += 1
            return grad * float("nan") if calls[0] >= from_call else grad
        self.get_parameter(param_name).register_hook(hook)
    monkeypatch.setattr(tiny_task.TinyNet, "__init__", init)


def _error_line(capsys):
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in out + err, out + err
    return errors[0]


@pytest.mark.parametrize("fp16", [False, True])
def test_forward_inf_names_module(tiny_cfg, tmp_path, monkeypatch, capsys, fp16):
    _break_module(monkeypatch, "mlp.2", from_call=9)
    code = harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.MAX_CONSECUTIVE_SKIPS", 3, "TRAIN.FP16", fp16])
    assert code == DIVERGED_EXIT_CODE
    line = _error_line(capsys)
    print(line)
    assert "forward output of module 'mlp.2' (Dropout" in line, line
    files = glob.glob(os.path.join(harness.out_dir(tmp_path), "nonfinite-step*.pt"))
    assert len(files) == 1
    # the file replays (in a fresh model built by the tool) to the same module
    saved = torch.load(files[0], weights_only=True)
    assert saved["finding"]["module"] == "mlp.2" and saved["dtype"] == ("float16" if fp16 else "float32")
    command = re.search(r"replay it with: python tools/replay_step.py (\S+)", line).group(1)
    assert os.path.samefile(command, files[0])
    code, replayed = _replay(files[0], capsys)
    assert code == 0 and replayed.startswith("replay: forward output of module 'mlp.2' (Dropout"), replayed


def _replay(path, capsys):
    """tools/replay_step.py on ``path`` in this process (its main); (exit code, the printed 'replay:' line)."""
    import runpy
    tool = runpy.run_path(REPLAY)
    code = tool["main"]([path, "--device", "cpu"])
    out = capsys.readouterr().out
    return code, next(line for line in out.splitlines() if line.startswith("replay:"))


@pytest.mark.parametrize("fp16", [False, True])
def test_nan_gradient_names_parameter(tiny_cfg, tmp_path, monkeypatch, capsys, fp16):
    """A tensor hook makes the gradient of 'mlp.3.weight' nan: the error names module mlp.3, backward, and the
    parameter; the saved batch replays to it."""
    _break_grad(monkeypatch, "mlp.3.weight", from_call=9)
    code = harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.MAX_CONSECUTIVE_SKIPS", 3, "TRAIN.FP16", fp16])
    assert code == DIVERGED_EXIT_CODE
    line = _error_line(capsys)
    assert "backward input gradient of module 'mlp.3' (Linear, torch.float32, parameter 'weight'" in line, line
    (path,) = glob.glob(os.path.join(harness.out_dir(tmp_path), "nonfinite-step*.pt"))
    code, replayed = _replay(path, capsys)
    assert code == 0 and "backward input gradient of module 'mlp.3' (Linear" in replayed, replayed


def test_early_fp16_skip_costs_nothing_fp32_skip_is_diagnosed(tiny_cfg, tmp_path, monkeypatch, capsys):
    """nan gradients from micro-batch 45 of 48 on: fp16 skips the last 2 steps as loss-scale search (no replay,
    no file, the run ends well); fp32 skips them too, but says where the first was born, writes its file and
    goes on to the end."""
    for fp16 in (True, False):
        monkeypatch.undo()  # a fresh count for each run
        _break_grad(monkeypatch, "mlp.0.bias", from_call=45)
        model_dir = tmp_path / str(fp16)
        assert harness.run_here(tiny_cfg, model_dir, opts=["TRAIN.FP16", fp16]) == 0
        out, err = capsys.readouterr()
        files = glob.glob(os.path.join(harness.out_dir(model_dir), "nonfinite-step*.pt"))
        if fp16:
            assert files == [] and "skipped for inf/nan" not in out + err
        else:
            assert [os.path.basename(f) for f in files] == ["nonfinite-step23.pt"]
            assert re.search(r"optimizer step 23 skipped for inf/nan: the first non-finite value: backward input "
                             r"gradient of module 'mlp.0' \(Linear, torch.float32, parameter 'bias'", out + err)


@pytest.fixture(scope="module")
def cls_data(tmp_path_factory):
    """A CIFAR-10-format folder of 15 training and 10 test images (demo/make_cls_demo_data.py)."""
    sys.path.insert(0, os.path.join(ROOT, "demo"))
    import make_cls_demo_data
    return make_cls_demo_data.write(str(tmp_path_factory.mktemp("cls_data")), train=15, test=10)


@pytest.mark.parametrize("cfg_name", ["vit_base16_cifar100_1x24G_bf16", "demo_cpu"])
def test_inf_input_gradient_of_a_layer_sharing_its_parents_input_names_the_layer(cls_data, tmp_path, monkeypatch,
                                                                                capsys, cfg_name):
    """fc1's backward makes its input gradient inf (a full backward hook; its forward stays finite). fc1's input
    is its parent Mlp's input, one tensor: the error line, the log and the replay name fc1, not the Mlp. In bf16
    autocast with gradient checkpointing (the bf16 recipe) and in fp32 without it (demo_cpu)."""
    from cls.task import TASK

    real_build = type(TASK).build_model

    def build_model(self, cfg):
        model = real_build(self, cfg)
        model.get_submodule(FC1).register_full_backward_hook(
            lambda module, grad_input, grad_output: tuple(None if g is None else g * float("inf") for g in grad_input))
        return model
    monkeypatch.setattr(type(TASK), "build_model", build_model)
    cfg = os.path.join(ROOT, "cfgs", "cls", cfg_name + ".yaml")
    code = run_script(os.path.join(ROOT, "cls", "train_end2end.py"), [
        "--cfg", cfg, "--model-dir", str(tmp_path), "--opts"] + tiny_cls.opts(cls_data, cfg_name) + [
        "TRAIN.MAX_CONSECUTIVE_SKIPS", "1"])
    assert code == DIVERGED_EXIT_CODE
    named = "backward input gradient of module '{}' (Linear, torch.float32;".format(FC1)
    line = _error_line(capsys)
    assert named in line, line
    (log,) = glob.glob(str(tmp_path / "output" / "cls" / cfg_name / "train_train" / "*.log"))
    with open(log) as f:
        assert named in next(line for line in f if "optimizer step 1 skipped for inf/nan" in line)
    (path,) = glob.glob(str(tmp_path / "output" / "cls" / cfg_name / "train_train" / "nonfinite-step1.pt"))
    code, replayed = _replay(path, capsys)
    assert code == 0 and replayed.startswith("replay: " + named), replayed
