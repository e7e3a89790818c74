"""Running the tiny task (tests/faults/tiny_task.py) with faults, and comparing whole training states."""
import math
import os
import pathlib
import subprocess

import torch

from common.checkpoint import checkpointer as ck
from common.cli import run_main
from tests.conftest import ROOT
from tests.faults import tiny_task

FINAL = "tiny-0002.model"  # the state after the last of the 3 epochs


def out_dir(model_dir):
    """The run's output folder under ``model_dir``."""
    return os.path.join(str(model_dir), "output", "tiny", "train_train")


def launch(cfg, model_dir, faults=None, opts=(), nprocs=1, dist=False, **popen):
    """Start the tiny task in child processes through the launch scripts (nondist_run.sh / dist_run_single.sh;
    ``dist``: dist_run_single.sh for one process too, which then has a process group)."""
    if nprocs == 1 and not dist:
        cmd = [os.path.join(ROOT, "scripts", "nondist_run.sh"), tiny_task.SCRIPT, cfg, str(model_dir)]
    else:
        cmd = [os.path.join(ROOT, "scripts", "dist_run_single.sh"), str(nprocs), tiny_task.SCRIPT, cfg, str(model_dir)]
    if opts:
        cmd += ["--opts"] + [str(o) for o in opts]
    env = dict(os.environ, **{k: str(v) for k, v in (faults or {}).items()})
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def fake_slurm(folder):
    """A folder of links to tests/fake_slurm's ``srun``, ``scontrol`` and ``sinfo`` (put it first in PATH);
    they write their records (``srun_args``, ``requeued``) into it."""
    bin_dir = pathlib.Path(folder) / "bin"
    bin_dir.mkdir()
    for name in ("srun", "scontrol", "sinfo"):
        (bin_dir / name).symlink_to(os.path.join(ROOT, "tests", "fake_slurm", name))
    return bin_dir


def run(cfg, model_dir, timeout=120, **kwargs):
    """:func:`launch` and wait: ``(returncode, stdout, stderr)``."""
    proc = launch(cfg, model_dir, **kwargs)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def run_here(cfg, model_dir, monkeypatch=None, faults=None, opts=()):
    """Run the tiny task in this process, as its command line would (``common.cli.run_main`` included);
    read its output with pytest's ``capsys``.

    Faults are patched through ``monkeypatch`` (undone after the test).
    Returns:
        the exit code: 0 when ``main`` returned, else ``run_main``'s (2 for a user error).
    """
    if faults:
        tiny_task.install_faults(dict(faults), monkeypatch.setattr)
    argv = ["--cfg", cfg, "--model-dir", str(model_dir)] + (["--opts"] + [str(o) for o in opts] if opts else [])
    try:
        run_main(lambda: tiny_task.main(argv))
        return 0
    except SystemExit as e:
        return e.code
    finally:
        tiny_task.install_faults({})


def training_state(path):
    """Everything a checkpoint holds but its config text (the output path differs between runs)."""
    state = ck.load_checkpoint_file(path)
    state.pop("config", None)
    return state


def assert_same(a, b, where="checkpoint"):
    """Recursive equality, bit for bit for tensors (NaN equals NaN); the message names the first difference."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b) or a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True), \
            where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str), (where, sorted(a), sorted(b))
        for k in a:
            assert_same(a[k], b[k], "{}[{!r}]".format(where, k))
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, "{}[{}]".format(where, i))
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def checkpoint_names(model_dir):
    """Sorted names of the ``.model`` files (complete checkpoints) in the run's output folder."""
    return sorted(f for f in os.listdir(out_dir(model_dir)) if f.endswith(".model"))
