"""The first thing to run on a new machine: what this machine gives the trainer.

Prints one ``name: value`` line each for Python, torch (and the CUDA / cuDNN it was built with), the
GPUs (name, compute capability, memory), bf16 and fp16 support, torch's thread count, and the
installed version of every package named in ``requirements.txt`` (``importlib.metadata``; "not
installed" when missing, with exit code 1 then).

    python tools/check_env.py
"""
import importlib.metadata
import os
import platform
import re
import sys

import torch

REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")


def requirement_names(path=REQUIREMENTS):
    """Distribution names of the requirement lines of ``path`` (comments, blank lines and ``-r`` includes skipped)."""
    names = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                names.append(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0))
    return names


def _supports(dtype, device):
    """Whether a matmul in ``dtype`` runs on ``device`` (a tiny one is tried)."""
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        return bool(torch.isfinite(a @ a).all())
    except RuntimeError:
        return False


def lines():
    """The report, as (name, value) pairs; the last ones are the requirements."""
    out = [("python", platform.python_version()), ("platform", platform.platform()),
           ("torch", torch.__version__), ("torch CUDA build", torch.version.cuda or "none (CPU build)"),
           ("CUDA available", torch.cuda.is_available())]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            out.append(("GPU {}".format(i), "{}, compute capability {}.{}, {:.1f} GiB".format(
                props.name, props.major, props.minor, props.total_memory / 2 ** 30)))
        out.append(("bf16 on GPU", torch.cuda.is_bf16_supported()))
        out.append(("fp16 on GPU", _supports(torch.float16, "cuda")))
    else:
        out.append(("GPU", "none"))
    out.append(("bf16 on CPU", _supports(torch.bfloat16, "cpu")))
    out.append(("fp16 on CPU", _supports(torch.float16, "cpu")))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out.append(("cuDNN", cudnn if cudnn else "not available"))
    out.append(("torch threads", "{} (os.cpu_count() {})".format(torch.get_num_threads(), os.cpu_count())))
    for name in requirement_names():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        out.append(("requirement " + name, version))
    return out


def main():
    report = lines()
    for name, value in report:
        print("{}: {}".format(name, value))
    return 1 if any(value == "not installed" for _, value in report) else 0


if __name__ == "__main__":
    sys.exit(main())
