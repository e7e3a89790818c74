"""A tiny task for the fault-injection tests, trained through the product's entry point.

    python tests/faults/tiny_task.py --cfg CFG --model-dir DIR [--dist] [--opts KEY VALUE ...]
    scripts/dist_run_single.sh 2 tests/faults/tiny_task.py CFG DIR [--opts ...]

It is a task plug-in like ``vcr/`` (a registered dataset, a model class, metrics) given to
``common.engine.train_net``, so set-up, resume, checkpoints, validation, logging and the launch
scripts are the product's own. Data (synthetic, 2 classes) and model (an MLP) are small, so a run
spends most of its time starting Python. Randomness comes from every source a real run has:
dropout (the global torch RNG), per-sample noise (the ``SampleKey`` generator) and shuffling (the
sampler's seed), so an inexact resume shows in the final weights.

Faults for the tests, from environment variables or :func:`install_faults` (counted in this process,
1-based):
    FAULT_KILL_AT_BATCH=n       SIGKILL at the start of the n-th training micro-batch
    FAULT_KILL_WHEN_NAMED=path  ... once ``path`` exists (a background checkpoint save named; 60 s at most)
    FAULT_SIGNAL_AT_BATCH=n:SIG send SIG (TERM, USR1) to itself at the start of the n-th training micro-batch;
                                several n:SIG pairs, comma-separated, send several
    FAULT_SIGNAL_STEP_AT_BATCH=n:SIG  send SIG (through kill(1)) to every rank listed in FAULT_PID_DIR and to
                                all their child processes (DataLoader workers), as SLURM signals a job step
    FAULT_DIE_RANK=r            ... only on rank r (default: whatever the rank)
    FAULT_KILL_AT_VAL_BATCH=n   SIGKILL at the n-th validation batch
    FAULT_SIGNAL_AT_VAL_BATCH=n:SIG  send SIG to itself at the n-th validation batch
    FAULT_KILL_IN_SAVE=n        SIGKILL halfway through writing the n-th checkpoint file
    FAULT_SAVE_ERROR=ENOSPC:n   from the n-th checkpoint file on, writing fails: ENOSPC (the device is
                                full after 1 kB of the file) or EACCES (the folder refuses new files)
    FAULT_SLOW_BATCH_S=s        each training micro-batch takes s more seconds (time to signal a run); in a
                                SLURM job only in its first run (SLURM_RESTART_COUNT unset)
    FAULT_NAN_FROM_BATCH=n      the loss is NaN from the n-th training micro-batch on
    FAULT_RSS_LOG=path          append "<micro-batch> <peak RSS in KiB>" every 100 training micro-batches
    FAULT_PID_DIR=folder        write this process's pid to <folder>/<rank>.pid
    FAULT_CLOSE_DELAY_S=s       closing the TensorBoard writer (rank 0, the end of train_net) takes s more seconds
    FAULT_SAMPLE_LOG=path       append "<epoch> <index>" of each training sample loaded to <path>.<rank>
    FAULT_UNUSED_HEAD=1         TinyNet gets a head that no forward uses (parameters that never get a gradient),
                                registered first (the optimizer's state then starts at the third parameter)
"""
import errno
import io
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
from tensorboardX import SummaryWriter  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from common.cli import config_from_args, run_main, train_argument_parser  # noqa: E402
from common.config import common_defaults  # noqa: E402
from common.data.build import register_dataset  # noqa: E402
from common.data.samplers import resolve_key  # noqa: E402
from common.engine import train_net  # noqa: E402
from common.fileio import safe_write  # noqa: E402
from common.metrics.composite_eval_metric import CompositeEvalMetric  # noqa: E402
from common.metrics.loss_logger import LossLogger  # noqa: E402
from common.modeling.module import Module  # noqa: E402
from common.registry import Registry  # noqa: E402
from common.task import Task, register_task  # noqa: E402
from vcr.function.metrics import Accuracy  # noqa: E402

SCRIPT = os.path.abspath(__file__)
FEATURES = 8
SIZES = {"train": 64, "val": 16, "test": 16}
CONFIG = """\
RNG_SEED: 7
OUTPUT_PATH: ./output
MODULE: TinyNet
MODEL_PREFIX: tiny
NUM_WORKERS_PER_GPU: 0
LOG_FREQUENT: 1
DATASET:
  DATASET: faults_tiny
  DATASET_PATH: {data}
  TRAIN_IMAGE_SET: train
  LABEL_INDEX_IN_BATCH: 1
TRAIN:
  BATCH_IMAGES: 4
  ASPECT_GROUPING: false
  END_EPOCH: 3
  OPTIMIZER: SGD
  LR: 0.05
  MOMENTUM: 0.9
  WD: 0.0001
  LR_SCHEDULE: step
  LR_STEP: [1, 2]
  LR_FACTOR: 0.5
  GRAD_ACCUMULATE_STEPS: 2
  CLIP_GRAD_NORM: 10.0
  FP16: true
  FP16_LOSS_SCALE: dynamic
  CHECKPOINT_STEPS: 2
  CHECKPOINT_KEEP: 2
  AUTO_RESUME: true
VAL:
  BATCH_IMAGES: 8
"""


def write_config(folder):
    """Write the tiny run's YAML to ``folder/tiny.yaml`` (data folder: ``folder``) and return its path.

    64 training samples in micro-batches of 4 (16 per epoch), k = 2, 3 epochs, fp16 with a dynamic
    loss scale, a step LR schedule, a checkpoint every 2 optimizer steps and at each epoch end.
    The run's output folder is ``<model dir>/output/tiny/train_train``.
    """
    path = os.path.join(str(folder), "tiny.yaml")
    with open(path, "w") as f:
        f.write(CONFIG.format(data=str(folder)))
    return path


FAULTS = {}  # the FAULT_* settings of this process (see install_faults)


def _fault_int(name):
    return int(FAULTS[name]) if name in FAULTS else None


# ----------------------------------------------------------------------------------------- task
class TinyData(torch.utils.data.Dataset):
    """``(x [8] float32, label int64)`` items; training items get noise from their SampleKey."""
    data_names = ("x", "label")

    def __init__(self, n, seed, noisy):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long()
        self.noisy = noisy

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        return cls(SIZES[mode], {"train": 1, "val": 2, "test": 3}[mode], noisy=mode == "train")

    def __len__(self):
        return len(self.x)

    def __getitem__(self, key):
        index, g = resolve_key(key)
        x = self.x[index]
        if self.noisy and "FAULT_SAMPLE_LOG" in FAULTS:
            with open("{}.{}".format(FAULTS["FAULT_SAMPLE_LOG"], os.environ.get("RANK", 0)), "a") as f:
                f.write("{} {}\n".format(key.epoch, index))
        if self.noisy:
            x = x + 0.1 * torch.randn(FEATURES, generator=g)
        return x, self.y[index]


class TinyNet(Module):
    """MLP 8 -> 512 -> 2 with dropout (wide enough that a graph kept per step shows in the memory test);
    the fault hooks run at the start of each forward."""

    def __init__(self, config):
        super().__init__(config)
        if "FAULT_UNUSED_HEAD" in FAULTS:
            self.unused_head = nn.Linear(FEATURES, 3)
        self.mlp = nn.Sequential(nn.Linear(FEATURES, 512), nn.ReLU(), nn.Dropout(0.3), nn.Linear(512, 2))
        self.train_batches = 0
        self.val_batches = 0

    def init_weight(self):
        pass

    def train_forward(self, x, label):
        self.train_batches += 1
        on_train_batch(self.train_batches)
        logits = self.mlp(x)
        loss = nn.functional.cross_entropy(logits.float(), label)
        if self.train_batches >= (_fault_int("FAULT_NAN_FROM_BATCH") or float("inf")):
            loss = loss * float("nan")
        return {"label_logits": logits, "label": label, "ans_loss": loss}, loss

    def inference_forward(self, x):
        self.val_batches += 1
        if self.val_batches == _fault_int("FAULT_KILL_AT_VAL_BATCH"):
            os.kill(os.getpid(), signal.SIGKILL)
        _send_signals("FAULT_SIGNAL_AT_VAL_BATCH", self.val_batches)
        return {"label_logits": self.mlp(x)}


class TinyTask(Task):
    """The tiny task: shared defaults, the registered 'faults_tiny' data, TinyNet, accuracy and its loss."""
    name = "faults_tiny"
    models = Registry("faults.tiny", [TinyNet])

    def defaults(self):
        return common_defaults()

    def build_metrics(self, cfg, for_training):
        metrics = CompositeEvalMetric([Accuracy("Acc")])
        if for_training:
            metrics.add(LossLogger("ans_loss", "AnsLoss"))
        return metrics


register_dataset("faults_tiny", TinyData)
TINY_TASK = register_task(TinyTask())  # tools/replay_step.py finds it by name


# --------------------------------------------------------------------------------------- faults
def on_train_batch(n):
    rank = int(os.environ.get("RANK", 0))
    die_rank = _fault_int("FAULT_DIE_RANK")
    if die_rank in (None, rank):
        if n == _fault_int("FAULT_KILL_AT_BATCH"):
            _wait_for(FAULTS.get("FAULT_KILL_WHEN_NAMED"), 60)
            os.kill(os.getpid(), signal.SIGKILL)
        _send_signals("FAULT_SIGNAL_AT_BATCH", n)
        for pair in filter(None, FAULTS.get("FAULT_SIGNAL_STEP_AT_BATCH", "").split(",")):
            at, sig = pair.split(":")
            if int(at) == n:
                # from another process, as SLURM's step daemon: a worker exits on its parent's SIGTERM
                subprocess.run(["kill", "-s", sig] + [str(p) for p in _step_pids(FAULTS["FAULT_PID_DIR"])], check=True)
    if "FAULT_SLOW_BATCH_S" in FAULTS and "SLURM_RESTART_COUNT" not in os.environ:
        time.sleep(float(FAULTS["FAULT_SLOW_BATCH_S"]))
    if "FAULT_RSS_LOG" in FAULTS and n % 100 == 0:
        with open(FAULTS["FAULT_RSS_LOG"], "a") as f:
            f.write("{} {}\n".format(n, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def _wait_for(path, timeout_s):
    """Return once ``path`` exists (None: at once) or after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while path and not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)


def _send_signals(name, n):
    """Send this process the signals that the fault ``name`` ('n:SIG,n:SIG...') schedules at count ``n``."""
    for pair in filter(None, FAULTS.get(name, "").split(",")):
        at, sig = pair.split(":")
        if int(at) == n:
            os.kill(os.getpid(), getattr(signal, "SIG" + sig))


def _step_pids(pid_dir):
    """The pids of the ranks in ``pid_dir`` (FAULT_PID_DIR) and of all their descendants, from /proc."""
    pids = [int(open(os.path.join(pid_dir, f)).read()) for f in sorted(os.listdir(pid_dir)) if f.endswith(".pid")]
    for pid in pids:  # the list grows while it is walked: children, then theirs
        with open("/proc/{0}/task/{0}/children".format(pid)) as f:
            pids += [int(c) for c in f.read().split()]
    return pids


class _FullDevice(io.FileIO):
    """A file on a device that is full after 1 kB: ``write`` fails with ENOSPC, as a real one does."""

    def write(self, data):
        if self.tell() + len(data) > 1024:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def _save_error(files):
    """'ENOSPC' / 'EACCES' when the ``files``-th checkpoint file must fail, else None."""
    if "FAULT_SAVE_ERROR" not in FAULTS:
        return None
    kind, first = FAULTS["FAULT_SAVE_ERROR"].split(":")
    return kind if files >= int(first) else None


def install_faults(faults, patch=setattr):
    """Set this process's faults (``{'FAULT_...': value}``, see the module doc) and patch the checkpoint
    writing they need through ``patch(obj, name, value)`` (pytest's ``monkeypatch.setattr`` in-process;
    the patches follow :data:`FAULTS`, so ``install_faults({})`` turns them off)."""
    FAULTS.clear()
    FAULTS.update(faults)
    saves, files = [0], [0]
    real_save, real_mkstemp, real_fdopen = torch.save, tempfile.mkstemp, os.fdopen

    def save(obj, f, *args, **kwargs):
        saves[0] += 1
        if saves[0] == _fault_int("FAULT_KILL_IN_SAVE"):
            f.write(b"PK\x03\x04 half a checkpoint")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *args, **kwargs)

    def mkstemp(suffix=None, prefix=None, dir=None, text=False):
        if ".model." in (prefix or ""):
            files[0] += 1
            if _save_error(files[0]) == "EACCES":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                                      os.path.join(dir, prefix + "x1y2z3" + suffix))
        return real_mkstemp(suffix=suffix, prefix=prefix, dir=dir, text=text)

    def fdopen(fd, mode="r", *args, **kwargs):
        name = os.readlink("/proc/self/fd/{}".format(fd))
        if ".model." in name and "w" in mode and _save_error(files[0]) == "ENOSPC":
            return io.BufferedWriter(_FullDevice(fd, "wb"))
        return real_fdopen(fd, mode, *args, **kwargs)

    if "FAULT_KILL_IN_SAVE" in faults:
        patch(torch, "save", save)
    if "FAULT_SAVE_ERROR" in faults:
        patch(tempfile, "mkstemp", mkstemp)
        patch(safe_write.os, "fdopen", fdopen)
    if "FAULT_CLOSE_DELAY_S" in faults:
        real_close = SummaryWriter.close

        def slow_close(writer):
            time.sleep(float(faults["FAULT_CLOSE_DELAY_S"]))
            real_close(writer)
        patch(SummaryWriter, "close", slow_close)
    if "FAULT_PID_DIR" in faults:
        with open(os.path.join(faults["FAULT_PID_DIR"], "{}.pid".format(os.environ.get("RANK", 0))), "w") as f:
            f.write(str(os.getpid()))


def main(argv=None):
    """``train_net`` on the tiny task with the command line ``argv`` (default ``sys.argv[1:]``), on one
    CPU thread (a run in the test process and one in a child process compute the same bits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = train_argument_parser("tiny fault-test task").parse_args(argv)
        train_net(args, config_from_args(args, TINY_TASK), TINY_TASK)
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    install_faults({k: v for k, v in os.environ.items() if k.startswith("FAULT_")})
    run_main(record(main))
