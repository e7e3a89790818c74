"""Every CUDA figure of the project in one run of at most 6 minutes: the steps of ``bench/gpu_suite.sh`` (which
installs the carried wheels first and calls this). Each step runs in its own processes under its own timeout; a
failing step is recorded with its reason and the suite goes on. Results: ``gpu_suite.md`` (a table, one row per
step) and ``gpu_suite.json`` under ``--out``; with ``--only`` the named steps are run again and the rows of the
others are kept from the files already there. Exit code 0 when every row is ``ok`` or ``skip``, 1 otherwise,
2 for bad arguments.

Steps (``--list`` prints them):

* ``env``: ``tools/check_env.py``;
* ``inputs``: the tiny data and random weight files of the training runs (``bench/gpu_suite_inputs.py``);
* ``agree-vcr-fp16``: the VCR demo config trained 8 steps in fp16 on the GPU and in fp32 on the CPU (same data,
  seed and weights, no dropout); per-step training losses compared up to the first skipped fp16 step (included)
  (:func:`agreement`);
* ``e2e-<task>-<fp16|bf16>`` for vcr, vqa, refcoco, pretrain, cls: ``<task>/train_end2end.py`` for one epoch of
  2 optimizer steps (fp16: dynamic loss scale), then again with ``TRAIN.END_EPOCH 2``, which must resume from the
  checkpoint and train one epoch more; steps applied / skipped, loss scale, final loss (finite), peak memory;
* ``ddp-vcr-fp16``: the tiny VCR run through ``scripts/dist_run_single.sh 1`` (torchrun: an NCCL process group,
  DDP, pinned-memory loading);
* ``throughput-<fp32|fp16|bf16>``: ``bench/throughput.py`` on the base Q->A paper config at its real sizes;
* ``vit-<bf16|fp16>``: ``bench/vit_step.py``, ViT-B/16 at 224 px, batch 64;
* ``adamw``: ``bench/adamw_step.py``, BertAdamW's multi-tensor step against one tensor at a time;
* ``sdpa``: ``bench/sdpa_backend.py``, which attention kernel runs in the VL-BERT encoder and the ViT;
* ``fsdp-memory``: ``bench/memory_estimate.py --measure``, the ViT demo's step under DDP and FSDP on 2 GPUs (one
  when the machine has one) against its trace on meta tensors (:func:`step_fsdp_memory`).

``--dry-run`` runs the same steps on the CPU (GPUs hidden) at tiny sizes, fp32 in place of fp16 (the CPU's fp16
convolutions are ~10x slower) and bf16 vs fp32 for the agreement, in about 3 minutes on 2 cores: the proof that the
suite works before a GPU is at hand.
"""
import argparse
import datetime
import fnmatch
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TASKS = ("vcr", "vqa", "refcoco", "pretrain", "cls")
PRECISION_OPTS = {"fp32": ["TRAIN.FP16", "false"],
                  "fp16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "float16", "TRAIN.FP16_LOSS_SCALE", "dynamic"],
                  "bf16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "bfloat16"]}
# Unit roundoff (half the distance from 1 to the next number) of the agreement run's dtypes.
UNIT_ROUNDOFF = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
# Agreement tolerance on the relative difference of a step's training loss, in units of the dtype's roundoff.
AGREE_ULPS = 8
SUITE_BUDGET_S = 330  # of the 6 minutes: 30 s left for the wheels and the machine's start-up noise
DRY_BUDGET_S = 1200  # the dry run's: a safety net only (3 minutes on an idle 2-core CPU, 3x that on a busy one)


@dataclass
class Row:
    """One line of the table: a step, what it ran, its status, figures (name -> value) and the reason of a
    ``fail`` or ``skip``."""
    step: str
    what: str
    precision: str = ""
    status: str = "fail"
    figures: Dict[str, object] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0


class StepFailed(Exception):
    """A step's check did not hold; the message is the row's reason."""


class StepSkipped(Exception):
    """A step that does not apply to this machine; the message is the row's reason."""


@dataclass
class Step:
    """A named check: ``run(suite, row)`` fills the row's figures and raises :class:`StepFailed` or
    :class:`StepSkipped`; its processes stop at its timeout (``timeout_s`` on the GPU, ``dry_timeout_s`` dry)."""
    name: str
    what: str
    run: Callable[["Suite", "Row"], None]
    timeout_s: int           # on the GPU
    dry_timeout_s: int       # with --dry-run
    precision: str = ""
    parallel: bool = False   # runs alongside the other parallel steps (no timing in it)
    needs_inputs: bool = False
    dry_precision: str = ""  # what --dry-run runs instead, when not the rule of Suite.ran_precision


class Suite:
    """The run's settings and the helpers the steps share: child processes under a timeout, the inputs."""

    def __init__(self, args):
        self.dry = args.dry_run
        self.out = os.path.abspath(args.out)
        self.work = os.path.abspath(args.work)
        self.logs = os.path.join(self.out, "logs")
        self.python = sys.executable
        self.deadline = time.monotonic() + args.budget
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.dry:
            self.env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU's, on any machine
        # CPU threads of each training run: they run side by side (the benches run alone)
        self.train_env = {"OMP_NUM_THREADS": "1" if self.dry else "2"}
        self.device = "cpu" if self.dry else "cuda"
        self.bf16 = True  # whether the device runs bf16 (main checks the GPU's)
        self._procs, self._lock = set(), threading.Lock()
        # per thread, of the step it runs: .deadline (the end of its timeout), .log (its log file)
        self._step = threading.local()

    def start_step(self, step):
        self._step.deadline = time.monotonic() + (step.dry_timeout_s if self.dry else step.timeout_s)
        self._step.log = os.path.join(self.logs, step.name + ".log")
        os.makedirs(self.logs, exist_ok=True)
        open(self._step.log, "w").close()

    def ran_precision(self, precision):
        """The precision a step of ``precision`` runs in: on the dry run's CPU fp32 stands in for fp16."""
        return "fp32" if self.dry and precision == "fp16" else precision

    def run(self, cmd, env=None):
        """Run ``cmd`` (a list) until the running step's timeout or the suite's budget ends, whichever is first;
        appends the command and its output to the step's log (``<out>/logs/<step>.log``); returns its output.

        Raises:
            StepFailed: non-zero exit (the reason: its last error line), timeout or the budget spent.
        """
        now = time.monotonic()
        timeout_s = min(self._step.deadline, self.deadline) - now
        if self.deadline - now <= 1:
            raise StepFailed("not run: the suite's time budget is spent")
        if timeout_s <= 1:
            raise StepFailed("timed out: the step's time is spent")
        proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=dict(self.env, **(env or {})),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        with self._lock:
            self._procs.add(proc)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        finally:
            with self._lock:
                self._procs.discard(proc)
        with open(self._step.log, "a") as f:
            f.write("$ {}\n{}{}\n".format(" ".join(map(str, cmd)), out, "\n(killed: timeout)" if timed_out else ""))
        if timed_out:
            which = "the suite's budget" if self.deadline <= self._step.deadline else "the step's timeout"
            raise StepFailed("timed out after {:.0f} s ({}): {}".format(timeout_s, which, short(cmd)))
        if proc.returncode:
            raise StepFailed("exit {} of {}: {}".format(proc.returncode, short(cmd), last_error(out)))
        return out

    def parallel(self, calls):
        """Run the callables ``calls`` in threads under the running step's timeout; returns when all are done."""
        deadline, log = self._step.deadline, self._step.log

        def call(fn):
            self._step.deadline, self._step.log = deadline, log
            fn()
        threads = [threading.Thread(target=call, args=(fn,)) for fn in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def kill_all(self):
        with self._lock:
            for proc in list(self._procs):
                os.killpg(proc.pid, signal.SIGKILL)

    def runs(self):
        """{name: {"entry", "cfg", "opts"}} of bench/gpu_suite_inputs.py, written by the ``inputs`` step."""
        path = os.path.join(self.work, "inputs", "runs.json")
        if not os.path.exists(path):
            raise StepFailed("no inputs: the inputs step did not complete")
        with open(path) as f:
            return json.load(f)

    def step_dir(self, name):
        folder = os.path.join(self.work, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        return folder


def short(cmd):
    """The script of a command line (its first ``.py`` / ``.sh`` argument), for reasons."""
    return next((os.path.relpath(str(c), ROOT) for c in cmd if str(c).endswith((".py", ".sh"))), str(cmd[0]))


def last_error(out):
    """The last line of ``out`` that names an error, else its last non-empty line (at most 300 characters)."""
    lines = [l.strip() for l in out.splitlines() if l.strip()]
    errors = [l for l in lines if re.search(r"error|Error|Exception|Traceback", l)]
    return ((errors or lines or ["(no output)"])[-1])[:300]


# --------------------------------------------------------------------------------------------- #
# Steps
# --------------------------------------------------------------------------------------------- #
def step_env(suite, row):
    out = suite.run([suite.python, "tools/check_env.py"])
    found = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    row.figures = {k: found[k] for k in ("python", "torch", "torch CUDA build", "GPU 0", "bf16 on GPU", "cuDNN")
                   if k in found}
    missing = [k for k, v in found.items() if v == "not installed"]
    if missing:
        raise StepFailed("missing: " + ", ".join(missing))


def step_inputs(suite, row):
    folder = suite.step_dir("inputs")
    suite.run([suite.python, "bench/gpu_suite_inputs.py", folder] + (["--demo-train", "5"] if suite.dry else []))
    row.figures = {"runs": ", ".join(sorted(suite.runs()))}


SUMMARY = re.compile(r"Training summary: (\d+) optimizer steps applied, (\d+) skipped \(inf/nan gradients\); final "
                     r"loss scale ([0-9.e+-]+|inf|nan); ([0-9.]+|nan) s per optimizer step \((\d+) steps")


def training_summary(out):
    """(applied, skipped, loss scale, s per step, steps tried in this run) of a run's summary line."""
    found = SUMMARY.findall(out)
    if not found:
        raise StepFailed("no 'Training summary' line: " + last_error(out))
    a, s, scale, per_step, tried = found[-1]
    return int(a), int(s), float(scale), float(per_step), int(tried)


def check_device(out, device):
    """The run whose output is ``out`` trained on ``device`` ('cpu' / 'cuda'), by its log's first line."""
    found = re.search(r"training on \d+ process\(es\), device (\w+)", out)
    if not found or found.group(1) != device:
        raise StepFailed("trained on {}, not {}".format(found.group(1) if found else "an unknown device", device))


def run_folder(model_dir):
    """The output folder (the one holding config.yaml) of the run under ``model_dir``."""
    found = glob.glob(os.path.join(model_dir, "**", "config.yaml"), recursive=True)
    if len(found) != 1:
        raise StepFailed("expected one output folder under {}, found {}".format(model_dir, len(found)))
    return os.path.dirname(found[0])


def checked_checkpoint(folder, epoch):
    """The epoch checkpoint of ``folder`` read through the safe loader; every float tensor must be finite."""
    import torch
    from common.checkpoint.checkpointer import load_checkpoint_file

    paths = glob.glob(os.path.join(folder, "*-{:04d}.model".format(epoch)))
    if len(paths) != 1:
        raise StepFailed("no epoch-{} checkpoint in {}".format(epoch, folder))
    ckpt = load_checkpoint_file(paths[0])
    bad = [k for k, v in ckpt["state_dict"].items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise StepFailed("non-finite weights in {}: {}".format(os.path.basename(paths[0]), bad[0]))
    return ckpt


def scalars(folder):
    from common.diagnostics.tb_events import read_scalars
    return read_scalars(os.path.join(folder, "tensorboard_logs"))


def step_e2e(task, precision):
    def run(suite, row):
        spec = suite.runs()[task]
        model_dir = suite.step_dir(row.step)
        cmd = [suite.python, spec["entry"], "--cfg", spec["cfg"], "--model-dir", model_dir, "--opts"] + spec["opts"]
        cmd += PRECISION_OPTS[suite.ran_precision(precision)] + ["TRAIN.AUTO_RESUME", "true"]
        out = suite.run(cmd, env=suite.train_env)
        check_device(out, suite.device)
        applied, skipped, scale, per_step, tried = training_summary(out)
        folder = run_folder(model_dir)
        first = checked_checkpoint(folder, 0)
        if first["train_state"]["global_step"] != applied:
            raise StepFailed("checkpoint step {} != {} applied".format(first["train_state"]["global_step"], applied))
        out = suite.run(cmd + ["TRAIN.END_EPOCH", "2"], env=suite.train_env)
        resumed = "Resumed from {}: epoch 1, batch 0, optimizer step {}".format(
            glob.glob(os.path.join(folder, "*-0000.model"))[0], applied)
        if resumed not in out:
            raise StepFailed("the second run did not resume from the epoch-0 checkpoint")
        applied2, skipped2, scale2, _, tried2 = training_summary(out)
        if applied2 + skipped2 != applied + skipped + tried2 or tried2 != tried:
            raise StepFailed("resume: {} + {} steps before, {} + {} after {} more".format(
                applied, skipped, applied2, skipped2, tried2))
        if checked_checkpoint(folder, 1)["train_state"]["global_step"] != applied2:
            raise StepFailed("epoch-1 checkpoint step != {} applied".format(applied2))
        points = scalars(folder)
        loss = points["Train-Loss"][-1][1]
        if not math.isfinite(loss):
            raise StepFailed("final training loss {}".format(loss))
        row.figures = {"steps applied/skipped": "{}/{}".format(applied, skipped), "loss scale": scale,
                       "resume": "+{} steps ({}/{})".format(tried2, applied2, skipped2), "final loss scale": scale2,
                       "final loss": round(loss, 4), "s/step": per_step,
                       "peak MiB": round(max(v for _, v in points.get("Memory/peak_MiB", [(0, 0.0)])), 1)}
    return run


def step_ddp(suite, row):
    spec = suite.runs()["vcr"]
    model_dir = suite.step_dir(row.step)
    cmd = ["scripts/dist_run_single.sh", "1", spec["entry"], spec["cfg"], model_dir, "--opts"] + spec["opts"]
    out = suite.run(cmd + PRECISION_OPTS[suite.ran_precision("fp16")], env=suite.train_env)
    check_device(out, suite.device)
    backend = "gloo" if suite.dry else "nccl"
    group = re.search(r"process group: (\w+), (\d+) process\(es\)", out)
    if not group or group.group(1) != backend:
        raise StepFailed("expected a {} process group, the log says {}".format(
            backend, group.group(0) if group else "none"))
    applied, skipped, scale, per_step, _ = training_summary(out)
    checked_checkpoint(run_folder(model_dir), 0)
    row.figures = {"process group": group.group(0).split(": ", 1)[1], "steps applied/skipped": "{}/{}".format(
        applied, skipped), "loss scale": scale, "s/step": per_step}


def agreement(losses, reference, skipped, dtype):
    """Per-step relative loss differences of the half-precision run against the fp32 one, up to the first
    skipped half-precision step (its loss still comes from the same weights; after it the two trajectories part
    by design, one update fewer), and the tolerance.

    Tolerance: ``AGREE_ULPS`` (8) units of the dtype's roundoff u, relative (fp16 u = 2^-11: 0.39%; bf16 u = 2^-8:
    3.1%). The first step compares two forwards of the same weights: autocast rounds the inputs of every matmul
    and convolution to u (accumulating in fp32) and the loss, a mean of log-softmaxes, keeps a fraction of that:
    0.33 u measured for bf16 against fp32 on the CPU over the dry run's 4 steps. Each later step adds the
    difference of one AdamW update (of the size of the LR whatever the gradients' rounding), which the 8 warm-up
    steps keep small. 8 u leaves room for that growth and for the GPU's fp32 (CPU reference) kernels, while a
    wrong result (a mask or scale lost, a wrong kernel: differences of percents) fails.

    Args:
        losses, reference: ``[(step, loss)]`` of the two runs (TensorBoard ``Train-Loss``).
        skipped: ``[(step, skipped steps so far)]`` of the half-precision run (``Skipped-Steps``).
    Returns:
        (compared steps, max relative difference, tolerance).
    """
    first_skip = next((s for s, n in skipped if n > 0), None)
    ref = dict(reference)
    pairs = [(l, ref[s]) for s, l in losses if s in ref and (first_skip is None or s <= first_skip)]
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in pairs), default=float("nan"))
    return len(pairs), worst, AGREE_ULPS * UNIT_ROUNDOFF[dtype]


def step_agree(suite, row):
    spec = suite.runs()["agree"]
    half = "bf16" if suite.dry else "fp16"
    base = suite.step_dir(row.step)
    cpu_env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1" if suite.dry else "8"}
    sides = {half: (suite.train_env, PRECISION_OPTS[half]), "fp32-cpu": (cpu_env, PRECISION_OPTS["fp32"])}
    folders, errors = {}, []

    def train(name):
        env, opts = sides[name]
        model_dir = os.path.join(base, name)
        cmd = [suite.python, spec["entry"], "--cfg", spec["cfg"], "--model-dir", model_dir, "--opts"] + spec["opts"]
        try:
            check_device(suite.run(cmd + opts, env=env), suite.device if name == half else "cpu")
            folders[name] = run_folder(model_dir)
        except StepFailed as e:
            errors.append("{}: {}".format(name, e))
    suite.parallel([lambda name=name: train(name) for name in sides])
    if errors:
        raise StepFailed("; ".join(errors))
    a, b = scalars(folders[half]), scalars(folders["fp32-cpu"])
    n, worst, tol = agreement(a["Train-Loss"], b["Train-Loss"], a.get("Skipped-Steps", []), half)
    row.figures = {"steps compared": n, "of": len(b["Train-Loss"]), "max rel. loss diff": "{:.2e}".format(worst),
                   "tolerance": "{:.2e} ({} u)".format(tol, AGREE_ULPS),
                   "loss first/last {}".format(half): "{:.4f}/{:.4f}".format(a["Train-Loss"][0][1],
                                                                          a["Train-Loss"][-1][1]),
                   "fp32": "{:.4f}/{:.4f}".format(b["Train-Loss"][0][1], b["Train-Loss"][-1][1])}
    if n == 0 or not worst <= tol:
        raise StepFailed("losses differ by {:.2e} relative (tolerance {:.2e})".format(worst, tol))


# The dry run's throughput: the demo config shrunk (32-48 px, 1 encoder layer, micro-batches of 1, no accumulation).
DRY_THROUGHPUT = ["--cfg", "cfgs/vcr/demo_q2a_cpu.yaml", "--steps", "1", "--warmup", "0", "--threads", "1", "--opts",
                  "SCALES", "[32,48]", "TRAIN.BATCH_IMAGES", "1", "TRAIN.GRAD_ACCUMULATE_STEPS", "1",
                  "NETWORK.VLBERT.num_hidden_layers", "1"]


def step_throughput(precision):
    def run(suite, row):
        folder = suite.step_dir(row.step)
        result = os.path.join(folder, "throughput.json")
        cmd = [suite.python, "bench/throughput.py", "--device", suite.device, "--synthetic",
               "--precision", suite.ran_precision(precision), "--json", result]
        cmd += DRY_THROUGHPUT if suite.dry else ["--steps", "2"]
        suite.run(cmd)
        with open(result) as f:
            r = json.load(f)
        ours, ref = r["paths"]["ours"], r["paths"]["reference"]
        row.figures = {"micro-batch": "{} x k={}".format(r["micro_batch"], r["k"]),
                       "samples/s ours": round(ours["samples/s"], 3), "ref": round(ref["samples/s"], 3),
                       "ours/ref": round(r["ratio"], 3), "MFU % meas.": round(ours["MFU meas. %"], 2),
                       "MFU % sheet": None if ours["MFU sheet %"] is None else round(ours["MFU sheet %"], 2),
                       "matmul peak TFLOP/s": round(r["matmul_peak_tflops"], 2),
                       "peak MiB ours/ref": "{:.0f}/{:.0f}".format(ours["peak MiB"], ref["peak MiB"])}
    return run


DRY_VIT = ["--tiny", "--batch", "4", "--accum", "1", "--rounds", "2", "--steps", "1"]


def step_vit(precision):
    def run(suite, row):
        folder = suite.step_dir(row.step)
        result = os.path.join(folder, "vit_step.json")
        cmd = [suite.python, "bench/vit_step.py", "--device", suite.device, "--precision",
               suite.ran_precision(precision), "--json", result]
        cmd += DRY_VIT if suite.dry else ["--batch", "64", "--accum", "1", "--rounds", "4", "--steps", "2"]
        suite.run(cmd)
        with open(result) as f:
            r = json.load(f)
        peak = r["peak_mib"] or {}
        row.figures = {"model": "{} {} px batch {}".format(r["arch"], r["image_size"], r["batch"]),
                       "samples/s ours": round(r["samples_per_s"]["ours"], 1),
                       "timm": round(r["samples_per_s"]["timm"], 1), "ours/timm": round(r["ratio"], 3),
                       "MFU % meas.": round(100 * r["mfu"]["ours"], 2),
                       "MFU % sheet": round(100 * r["mfu_sheet"]["ours"], 2) if r["mfu_sheet"] else None,
                       "peak MiB ours/timm": "{:.0f}/{:.0f}".format(peak["ours"], peak["timm"]) if peak else None,
                       "bf16/fp32 optimizer state": round(r["optim_state_ratio"], 3)}
    return run


def step_adamw(suite, row):
    folder = suite.step_dir(row.step)
    result = os.path.join(folder, "adamw_step.json")
    suite.run([suite.python, "bench/adamw_step.py", "--device", suite.device, "--json", result]
              + (["--tiny", "--steps", "2"] if suite.dry else []))
    with open(result) as f:
        r = json.load(f)
    row.figures = {"weights M": round(r["weights"] / 1e6, 1), "one tensor at a time ms": round(r["plain_ms"], 2),
                   "multi-tensor ms": round(r["foreach_ms"], 2), "speed-up": round(r["speedup"], 2)}


def step_sdpa(suite, row):
    folder = suite.step_dir("sdpa")
    result = os.path.join(folder, "sdpa.json")
    cmd = [suite.python, "bench/sdpa_backend.py", "--device", suite.device, "--json", result]
    suite.run(cmd + (["--tiny"] if suite.dry else []))
    with open(result) as f:
        r = json.load(f)
    for model, found in r["models"].items():
        for dtype, what in found.items():
            row.figures["{} {} ran".format(model, dtype)] = "+".join(what["ran"]) or "none"
            row.figures["{} {} possible".format(model, dtype)] = "+".join(what["possible"]) or "none"


# Measured / estimated memory of the fsdp-memory step: the CPU's allocator counts what the trace counts; the GPU
# adds kernel workspaces (cuBLAS, cuDNN) and other attention kernels than the CPU's trace.
MEMORY_TOLERANCE = {"cpu": 0.10, "cuda": 0.25}


def step_fsdp_memory(suite, row):
    """The ViT demo (bf16) one step under DDP and FSDP (``bench/memory_estimate.py --measure``) on 2 ranks: 2 GPUs
    (NCCL needs one a rank), or 1 when the machine has one; the dry run: 2 CPU processes (gloo). Fails when a
    rank's parameters, gradients, optimizer state or peak differ from the trace by more than
    :data:`MEMORY_TOLERANCE`, or FSDP's parameters + gradients + optimizer state exceed 1/N of DDP's + 5%."""
    import torch
    ranks = 2 if suite.dry else min(2, torch.cuda.device_count())
    result = os.path.join(suite.step_dir(row.step), "memory.json")
    suite.run([suite.python, "bench/memory_estimate.py", "--cfg", "cfgs/cls/demo_cpu.yaml", "--world-size", ranks,
               "--strategy", "ddp", "fsdp", "--precision", "bf16", "--measure", "--device", suite.device,
               "--json", result], env=suite.train_env)
    with open(result) as f:
        runs = {r["strategy"]: r for r in json.load(f)["runs"]}
    tolerance = MEMORY_TOLERANCE[suite.device]
    row.figures["ranks"] = ranks if ranks == 2 else "1 (one GPU: the 2-rank run needs 2)"
    problems = []
    for strategy, run in runs.items():
        est = run["estimate"]
        worst = max(run["measured"], key=lambda m: m["peak"])
        row.figures["{} peak MiB est./meas.".format(strategy)] = "{:.1f}/{:.1f}".format(est["peak"] / 2 ** 20,
                                                                                       worst["peak"] / 2 ** 20)
        for key in ("parameters", "gradients", "optimizer state", "peak"):
            for m in run["measured"]:
                e, got = memory_total(est[key]), memory_total(m[key])
                if abs(got - e) > tolerance * e:
                    problems.append("{} {}: measured {} B, traced {} B".format(strategy, key, got, e))
    ddp, fsdp = (memory_state(runs[s]["estimate"]) for s in ("ddp", "fsdp"))
    row.figures["fsdp/ddp params+grads+optimizer"] = "{:.3f} (1/N = {:.3f})".format(fsdp / ddp, 1 / ranks)
    if fsdp > ddp / ranks * 1.05:
        problems.append("fsdp holds {:.3f} of ddp's parameters + gradients + optimizer state".format(fsdp / ddp))
    if problems:
        raise StepFailed("; ".join(problems[:3]))


def memory_total(value):
    """Bytes of a figure of bench/memory_estimate.py's JSON: a number or a {dtype: bytes} dict."""
    return sum(value.values()) if isinstance(value, dict) else value


def memory_state(figures):
    return sum(memory_total(figures[k]) for k in ("parameters", "gradients", "optimizer state"))


def steps():
    """Every step, in the order they run (the parallel ones together after ``inputs``)."""
    out = [Step("env", "tools/check_env.py", step_env, 60, 60),
           Step("inputs", "tiny data + random BERT/ResNet files", step_inputs, 120, 120)]
    # the longest of the side-by-side steps first
    out.append(Step("agree-vcr-fp16", "VCR demo config, 1 epoch: GPU fp16 vs CPU fp32", step_agree, 240, 180,
                    "fp16", parallel=True, needs_inputs=True, dry_precision="bf16 vs fp32"))
    for task in TASKS:
        for precision in ("fp16", "bf16"):
            out.append(Step("e2e-{}-{}".format(task, precision), task + "/train_end2end.py: 1 epoch, then 1 resumed",
                            step_e2e(task, precision), 200, 150, precision, parallel=True, needs_inputs=True))
    out.append(Step("ddp-vcr-fp16", "scripts/dist_run_single.sh 1 vcr/train_end2end.py: NCCL + DDP, 1 epoch",
                    step_ddp, 200, 150, "fp16", parallel=True, needs_inputs=True))
    out.append(Step("fsdp-memory", "bench/memory_estimate.py --measure: ViT demo, DDP and FSDP on 2 ranks",
                    step_fsdp_memory, 150, 240, "bf16", parallel=True))
    for precision in ("fp32", "fp16", "bf16"):
        out.append(Step("throughput-" + precision, "bench/throughput.py base Q->A (ResNet-101, 12 x 768)",
                        step_throughput(precision), 150, 150, precision))
    for precision in ("bf16", "fp16"):
        out.append(Step("vit-" + precision, "bench/vit_step.py ViT-B/16 224 px batch 64", step_vit(precision),
                        120, 120, precision))
    out.append(Step("sdpa", "bench/sdpa_backend.py: SDPA kernel of VL-BERT and ViT", step_sdpa, 90, 90))
    out.append(Step("adamw", "bench/adamw_step.py: BertAdamW multi-tensor vs per tensor, BERT-base", step_adamw,
                    60, 60))
    return out


# --------------------------------------------------------------------------------------------- #
# Running and writing
# --------------------------------------------------------------------------------------------- #
def run_step(suite, step):
    ran = (suite.dry and step.dry_precision) or suite.ran_precision(step.precision)
    row = Row(step.name, step.what, ran + (" (GPU: {})".format(step.precision) if ran != step.precision else ""))
    start = time.monotonic()
    suite.start_step(step)
    try:
        if step.precision == "bf16" and not suite.bf16:
            raise StepSkipped("this GPU has no bf16 (torch.cuda.is_bf16_supported() is False)")
        step.run(suite, row)
        row.status = "ok"
    except StepSkipped as e:
        row.status, row.reason = "skip", str(e)
    except StepFailed as e:
        row.status, row.reason = "fail", str(e)
    except Exception as e:  # a bug or an unexpected output of a step: recorded, the suite goes on
        row.status, row.reason = "fail", "{}: {}".format(type(e).__name__, e)[:300]
    row.seconds = round(time.monotonic() - start, 1)
    print("[gpu_suite] {:<20} {:<4} {:6.1f} s  {}".format(row.step, row.status, row.seconds, row.reason), flush=True)
    return row


def run_steps(suite, chosen, jobs):
    """Run the ``chosen`` steps in order, the parallel ones ``jobs`` at a time; returns their rows."""
    rows = []
    parallel = [s for s in chosen if s.parallel]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for step in chosen:
            if not step.parallel:
                rows.append(run_step(suite, step))
            elif step is parallel[0]:
                rows.extend(pool.map(lambda s: run_step(suite, s), parallel))
    return rows


def header(suite):
    import torch
    gpu = torch.cuda.get_device_name(0) if not suite.dry and torch.cuda.is_available() else "none (CPU)"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "dry run (CPU, tiny sizes)" if suite.dry else "GPU", "gpu": gpu, "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node()}


def cell(value):
    return "-" if value is None else str(value).replace("|", "/").replace("\n", " ")


def markdown(head, rows):
    """The ``gpu_suite.md`` text: a header line and one table row per step."""
    lines = ["# GPU suite: {mode}, {gpu}".format(**head), "",
             "{date}; torch {torch}, Python {python}, host {host}.".format(**head), "",
             "| step | what | precision | status | figures | reason | s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        figures = "; ".join("{} {}".format(k, cell(v)) for k, v in r.figures.items())
        lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
            r.step, cell(r.what), cell(r.precision) or "-", r.status, figures or "-", cell(r.reason) or "-", r.seconds))
    return "\n".join(lines) + "\n"


def write_results(out, head, rows):
    """``gpu_suite.json`` and ``gpu_suite.md`` under ``out``, each written to a temporary file then renamed."""
    files = {"gpu_suite.json": json.dumps({"header": head, "rows": [asdict(r) for r in rows]}, indent=1) + "\n",
             "gpu_suite.md": markdown(head, rows)}
    for name, text in files.items():
        tmp = os.path.join(out, "." + name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))


def previous_rows(out, mode):
    """The rows of an earlier run's ``gpu_suite.json`` in ``out`` of the same ``mode`` (GPU or dry run); none if
    absent, unreadable or of the other mode."""
    try:
        with open(os.path.join(out, "gpu_suite.json")) as f:
            saved = json.load(f)
        return [Row(**r) for r in saved["rows"]] if saved["header"]["mode"] == mode else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


def select(all_steps, only):
    """The steps named by ``--only`` (comma-separated names or shell patterns, ``e2e-*``), plus ``inputs`` when a
    chosen step needs it and the last run's inputs are not kept; raises ValueError naming an unknown pattern."""
    if not only:
        return list(all_steps)
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    names = [s.name for s in all_steps]
    for p in patterns:
        if not fnmatch.filter(names, p):
            raise ValueError("--only: no step matches '{}' (steps: {})".format(p, ", ".join(names)))
    return [s for s in all_steps if any(fnmatch.fnmatch(s.name, p) for p in patterns)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench_out",
                        help="folder of gpu_suite.md / gpu_suite.json (default: $OUT when set, else bench_out/)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "gpu_suite_work"),
                        help="folder of the inputs and the runs' outputs, kept for --only (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU at tiny sizes")
    parser.add_argument("--only", help="comma-separated steps (or patterns like 'e2e-*') to run again")
    parser.add_argument("--jobs", type=int, help="parallel training steps (default 8 on the GPU, 2 dry)")
    parser.add_argument("--budget", type=float,
                        help="seconds for all steps (default {} on the GPU, {} dry)".format(SUITE_BUDGET_S, DRY_BUDGET_S))
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    args = parser.parse_args(argv)
    if args.budget is None:
        args.budget = DRY_BUDGET_S if args.dry_run else SUITE_BUDGET_S
    all_steps = steps()
    if args.list:
        for s in all_steps:
            print("{:<20} {}".format(s.name, s.what))
        return 0
    try:
        chosen = select(all_steps, args.only)
    except ValueError as e:
        print("error: {}".format(e), file=sys.stderr)
        return 2
    suite = Suite(args)
    if not suite.dry:
        import torch
        if not torch.cuda.is_available():
            print("error: torch sees no GPU (torch {}); run with --dry-run for the CPU".format(torch.__version__),
                  file=sys.stderr)
            return 2
        suite.bf16 = torch.cuda.is_bf16_supported()
    if any(s.needs_inputs for s in chosen) and not any(s.name == "inputs" for s in chosen):
        if not os.path.exists(os.path.join(suite.work, "inputs", "runs.json")):
            chosen.insert(0, next(s for s in all_steps if s.name == "inputs"))
    os.makedirs(suite.work, exist_ok=True)
    try:
        rows = run_steps(suite, chosen, args.jobs or (2 if suite.dry else 8))
    except KeyboardInterrupt:
        suite.kill_all()
        raise
    head = header(suite)
    fresh = {r.step: r for r in rows}
    kept = [r for r in previous_rows(suite.out, head["mode"]) if r.step not in fresh] if args.only else []
    order = [s.name for s in all_steps]
    merged = sorted(kept + rows, key=lambda r: order.index(r.step) if r.step in order else len(order))
    write_results(suite.out, head, merged)
    print("[gpu_suite] wrote {} and {}".format(*(os.path.join(suite.out, n) for n in ("gpu_suite.md",
                                                                                      "gpu_suite.json"))))
    return 0 if all(r.status in ("ok", "skip") for r in merged) else 1


if __name__ == "__main__":
    sys.exit(main())
