"""tools/check_env.py, run as a subprocess as on a new machine: torch's version and every requirement's."""
import importlib.metadata
import os
import re
import subprocess
import sys

import torch

from tests.conftest import ROOT

EXPECTED_REQUIREMENTS = ["torch", "torchvision", "yacs", "tensorboardX", "tensorboard", "numpy", "pillow", "pyyaml",
                         "tqdm", "safetensors", "pytorch-pretrained-bert", "scikit-image", "matplotlib", "timm", "lmdb",
                         "webdataset"]


def test_check_env_names_torch_and_every_requirement_with_its_version():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "check_env.py")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["torch"] == torch.__version__
    assert lines["CUDA available"] == str(torch.cuda.is_available())
    assert re.fullmatch(r"\d+ \(os\.cpu_count\(\) {}\)".format(os.cpu_count()), lines["torch threads"])
    assert {"bf16 on CPU", "fp16 on CPU", "cuDNN"} <= set(lines)
    for name in EXPECTED_REQUIREMENTS:
        assert lines["requirement " + name] == importlib.metadata.version(name)
    assert sorted(k for k in lines if k.startswith("requirement ")) == sorted("requirement " + n
                                                                               for n in EXPECTED_REQUIREMENTS)
