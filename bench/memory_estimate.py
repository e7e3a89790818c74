"""Per-rank training memory of a config under DDP or FSDP: parameters, gradients, optimizer state and
activations, from one training step traced on the meta device, and (``--measure``) the same step measured in
real CPU processes of a gloo process group.

    python bench/memory_estimate.py --cfg CFG --world-size N --strategy ddp|fsdp [--precision fp16|bf16|fp32]
        [--checkpointing] [--task TASK] [--measure] [--json FILE] [--opts KEY VALUE ...]

The estimate builds the task's model from the config on ``torch.device('meta')`` (no weights are read:
``NETWORK.*PRETRAINED`` / ``BERT_MODEL_NAME`` are emptied), for ``fsdp`` shards it as training does (with
:func:`common.parallel.fsdp.shard_model`: the same shard groups and placements) in a fake process group of
``--world-size`` ranks (``torch.testing._internal.distributed.fake_pg``: collectives that move nothing), turns
the weights into fake tensors (meta storage, the CPU's dispatch, so autocast applies) and runs two optimizer
steps (:func:`train_step`: forward under autocast, backward, clipping, the optimizer of ``TRAIN.OPTIMIZER``) on
a synthetic batch of the config's per-rank micro-batch (:func:`synthetic_batch`), under PyTorch's memory trackers
(``torch.distributed._tools``: ``MemTracker``, ``FSDPMemTracker`` for a sharded model), which account every
storage the step allocates and frees. Reported per rank:

* parameters, gradients, optimizer state: the bytes of the (local shards of the) tensors after the second
  step, by dtype (fp32 master weights; AdamW's two moments in ``TRAIN.OPTIM_STATE_DTYPE``); under DDP on more
  than one rank also DDP's gradient buckets (a second copy of the gradients: the engine builds DDP without
  ``gradient_as_bucket_view``; they are added, not traced: DDP cannot wrap fake tensors);
* activations: what the forward of the second step leaves alive for the backward (tensors saved for
  backward, autocast's low-precision weight copies, the outputs), the live bytes at the end of the forward
  minus those at its start (``NETWORK.GRADIENT_CHECKPOINTING`` / ``--checkpointing`` changes them);
* peak: the highest live bytes of the traced step (FSDP's gathered layer and its unsharded gradients,
  backward and optimizer temporaries included).

``--measure`` runs the same two steps on real tensors in ``--world-size`` CPU processes (gloo; DDP as the
engine builds it on more than one rank, or ``shard_model``) and takes the same figures per rank: the tensor
bytes the same way, the activations and the peak from the CPU allocator's own allocation and free events
(``torch.profiler`` with ``profile_memory``), an account independent of the trackers. It prints both and the
ratio measured / estimated (goal: within 10%, ``tests/test_memory_estimate.py``).

The batch is the config's micro-batch (``TRAIN.BATCH_IMAGES`` per rank) at its largest sizes, an upper bound:
``cls`` images of ``DATASET.IMAGE_SIZE``; ``vcr`` Q->A items of 20-piece questions and answers with 24 objects
on the ``SCALES`` canvas (bench/throughput.py's synthetic items, each at the top of its range). The data-
dependent ops of the model (which tokens are real) then keep every element, what the trace assumes.
"""
import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from unittest import mock

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.errors import UserInputError  # noqa: E402
from common.optim import build_optimizer  # noqa: E402

PRECISIONS = {"fp32": ["TRAIN.FP16", "false"], "fp16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "float16"],
              "bf16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "bfloat16"]}
# Random weights: memory does not depend on them and nothing is read from disk (on meta nothing could be).
RANDOM_INIT = ["NETWORK.PARTIAL_PRETRAIN", "", "NETWORK.IMAGE_PRETRAINED", "", "NETWORK.BERT_MODEL_NAME", ""]
TASKS_WITH_BATCH = ("cls", "vcr")
STEPS = 2  # the optimizer state exists from the first step on: the second is the steady one
MIB = 2.0 ** 20
FORWARD_MARK = "memory_estimate/forward"
DDP_MARK = "memory_estimate/ddp"


# --------------------------------------------------------------------------------------------- #
# What the estimate and the measurement share: config, batch, step, tensor bytes
# --------------------------------------------------------------------------------------------- #
def load_config(cfg_path, task_name=None, precision=None, checkpointing=False, opts=()):
    """``(task, cfg)``: the frozen config of ``cfg_path`` for ``task_name`` (default: the folder of the YAML
    file, ``cfgs/<task>/``) with random weights, ``precision`` (None: the config's) and ``checkpointing``.

    Raises:
        UserInputError: a missing file, a task this tool has no synthetic batch for.
    """
    from common.task import get_task
    if not os.path.isfile(cfg_path):
        raise UserInputError("--cfg {}: no such file".format(cfg_path))
    name = task_name or os.path.basename(os.path.dirname(os.path.abspath(cfg_path)))
    if name not in TASKS_WITH_BATCH:
        raise UserInputError("--cfg {}: task '{}' has no synthetic batch here (tasks: {}; --task names one)".format(
            cfg_path, name, ", ".join(TASKS_WITH_BATCH)))
    __import__(name + ".task")  # registers the task
    task = get_task(name)
    defaults = task.defaults()
    extra = [x for key, value in zip(RANDOM_INIT[::2], RANDOM_INIT[1::2]) if key.split(".")[1] in defaults.NETWORK
             for x in (key, value)]
    extra += PRECISIONS[precision] if precision else []
    if checkpointing:
        extra += ["NETWORK.GRADIENT_CHECKPOINTING", "true"]
    return task, task.load_config(cfg_path, extra + list(opts))


def precision_of(cfg):
    """'fp32', 'fp16' or 'bf16': the autocast dtype the config trains in."""
    if not cfg.TRAIN.FP16:
        return "fp32"
    return "bf16" if cfg.TRAIN.FP16_DTYPE in ("bfloat16", "bf16") else "fp16"


def synthetic_batch(task, cfg):
    """One training micro-batch of ``cfg`` at its largest sizes (see the module docstring), CPU tensors in the
    order the task's model takes them."""
    b = int(cfg.TRAIN.BATCH_IMAGES)
    g = torch.Generator().manual_seed(0)
    if task.name == "cls":
        s = int(cfg.DATASET.IMAGE_SIZE)
        return (torch.randn(b, 3, s, s, generator=g), torch.randint(0, cfg.NETWORK.NUM_CLASSES, (b,), generator=g),
                torch.arange(b))
    from bench.throughput import synthetic_items
    from common.data.collate import BatchCollator, canvas_scales
    names = ["image", "boxes", "masks", "question", "question_align_matrix", "answer_choices",
             "answer_align_matrix", "answer_label", "im_info"]
    return tuple(BatchCollator(names, scales=canvas_scales(cfg))(synthetic_items(cfg, b, longest=True)))


def autocast_of(cfg, device_type="cpu"):
    """The autocast context of the config's precision on ``device_type`` (a null context in fp32)."""
    precision = precision_of(cfg)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def train_step(model, optimizer, batch, cfg, around_forward=contextlib.nullcontext, device_type="cpu"):
    """One optimizer step of one micro-batch as the engine's: forward under autocast, the mean loss backward,
    clipping at ``TRAIN.CLIP_GRAD_NORM`` (> 0), the optimizer step, gradients set to None. The loss scale is
    left out (a scalar; unscaling is in place) and so is the skip test (it reads a value, which a trace has
    not). ``around_forward()`` is entered around the forward (markers, tracker snapshots)."""
    with around_forward():
        with autocast_of(cfg, device_type):
            _, loss = model(*batch)
        loss = loss.mean()
    loss.backward()
    if cfg.TRAIN.CLIP_GRAD_NORM > 0:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                       cfg.TRAIN.CLIP_GRAD_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _local(t):
    """The local tensor of a DTensor (an FSDP shard), else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(tensors):
    """{dtype name: bytes} of the distinct storages under ``tensors`` (DTensors: their local shards)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    seen, out = set(), defaultdict(int)
    for t in tensors:
        local = _local(t)
        storage = local.untyped_storage()
        key = StorageWeakRef(storage)
        if key in seen:
            continue
        seen.add(key)
        out[str(local.dtype).replace("torch.", "")] += storage.nbytes()
    return dict(out)


def state_bytes(model, optimizer, grads):
    """Per-rank {"parameters", "gradients", "optimizer state"}: {dtype: bytes} of the model's parameters and
    buffers, of ``grads`` (the gradients as the optimizer step sees them) and of the optimizer's state tensors."""
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"parameters": tensor_bytes(list(model.parameters()) + list(model.buffers())),
            "gradients": tensor_bytes(grads), "optimizer state": tensor_bytes(state)}


def grads_at_step(model, optimizer):
    """Installs a pre-hook on ``optimizer.step`` that keeps the list of the gradients it will read; returns
    that list (filled at each step)."""
    grads = []

    def hook(opt, args, kwargs):
        grads[:] = [p.grad for p in model.parameters() if p.grad is not None]
    optimizer.register_step_pre_hook(hook)
    return grads


def ddp_bucket_bytes(model):
    """Bytes of DDP's gradient buckets: one copy of every trainable parameter's gradient (``Reducer``,
    ``gradient_as_bucket_view=False`` as the engine builds DDP)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------------- #
# The estimate: a step traced on meta (fake) tensors
# --------------------------------------------------------------------------------------------- #
class ShadowValues(torch.utils._python_dispatch.TorchDispatchMode):
    """Keeps the real values of the small tensors computed from the batch alone (masks, lengths, box counts)
    next to their fake twins, so that the data-dependent ops of a model (``nonzero``, ``int(mask.sum())``) get
    the sizes the real step would: an op whose fake inputs all have a real value (and a factory op) is also run
    on those values, and a fake op that needs values is answered from them. Tensors that touch a weight, and
    results above :attr:`MAX_NUMEL` elements, get none (nothing large is ever computed).

    Args:
        fake_mode: the ``FakeTensorMode`` below this mode.
        values: {fake tensor: its real value} to start from (the batch).
    """
    MAX_NUMEL = 1 << 22

    def __init__(self, fake_mode, values):
        super().__init__()
        from torch.utils.weak import WeakIdKeyDictionary
        self.fake_mode = fake_mode
        self.values = WeakIdKeyDictionary(values)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                                   FakeTensor, unset_fake_temporarily)
        from torch.utils._pytree import tree_flatten, tree_map
        kwargs = kwargs or {}
        fakes = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, FakeTensor)]
        known = all(t in self.values for t in fakes)

        def run(stand_in):
            with unset_fake_temporarily():
                return func(*tree_map(stand_in, args), **tree_map(stand_in, kwargs))
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if known:
                return tree_map(lambda r: self._fake(r) if torch.is_tensor(r) else r, run(self._real))
            # A value-less input (an activation indexed by a mask): the op on a meta stand-in of it gives the shape.
            shapes = run(lambda t: self._real(t) if isinstance(t, FakeTensor) and t in self.values else self._meta(t))
            return tree_map(lambda m: torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=fakes[0].device)
                            if torch.is_tensor(m) else m, shapes)
        if not known or any(torch.is_tensor(o) and o.numel() > self.MAX_NUMEL for o in tree_flatten(out)[0]):
            return out
        values = run(self._real)
        for o, r in zip(tree_flatten(out)[0], tree_flatten(values)[0]):
            if isinstance(o, FakeTensor) and torch.is_tensor(r):
                self.values[o] = r
        return out

    def _real(self, t):
        from torch._subclasses.fake_tensor import FakeTensor
        return self.values[t] if isinstance(t, FakeTensor) else t

    @staticmethod
    def _meta(t):
        from torch._subclasses.fake_tensor import FakeTensor
        if not isinstance(t, FakeTensor):
            return t
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    def _fake(self, r):
        fake = self.fake_mode.from_tensor(r)
        self.values[fake] = r
        return fake


def _memory_tracker():
    """``torch.distributed._tools.mem_tracker.MemTracker`` without its gradient hooks: it would hook every
    parameter and fails on a frozen one (a frozen ResNet stage); gradients are then counted as the backward's
    other tensors, and the totals this tool reads stay the same."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)
    return Tracker()


def _tracker_total(tracker, device, kind="Total"):
    """Live bytes on ``device`` of the tracker's category ``kind`` (its value, e.g. 'Unsharded Param'), or of
    all."""
    snap = tracker.get_tracker_snapshot("current").get(device, {})
    return sum(v for k, v in snap.items() if getattr(k, "value", k) == kind)


def estimate(task, cfg, world_size, strategy):
    """The per-rank figures of a step traced on meta tensors (see the module docstring): {"parameters",
    "gradients", "optimizer state"} as {dtype: bytes}, "ddp buckets", "activations" and "peak" in bytes."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from common.modeling.module import held_random_init_warnings
    from common.parallel.fsdp import shard_model
    from common.runtime import distributed as cdist

    fsdp = strategy == "fsdp"
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        with held_random_init_warnings(), torch.device("meta"):
            model = task.build_model(cfg)
        model.train()
        if fsdp:
            shard_model(model, mesh=init_device_mesh("cpu", (world_size,)))
        cpu = torch.device("cpu")
        real_batch = synthetic_batch(task, cfg)
        with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
            for module in model.modules():  # each once: a module shared by two parents is swapped once
                module.to_empty(device=cpu, recurse=False)
            batch = tuple(fake_mode.from_tensor(t) for t in real_batch)
            optimizer = build_optimizer(cfg, model, world_size)
            grads = grads_at_step(model, optimizer)
            tracker = FSDPMemTracker(model, optimizer) if fsdp else _memory_tracker()
            if fsdp:
                tracker.track_inputs(batch)
            else:
                tracker.track_external(model, optimizer, *batch)
            live, gathered = [], []

            @contextlib.contextmanager
            def around_forward():
                start = _tracker_total(tracker, cpu)
                yield
                live.append(_tracker_total(tracker, cpu) - start)
                gathered.append(_tracker_total(tracker, cpu, "Unsharded Param"))
            # an object collective (the ViT image encoder's union of the ranks' image sizes) cannot run on fake
            # tensors; in the fake group every rank holds this rank's batch, so it gathers this rank's object
            gather = mock.patch.object(cdist, "all_gather", lambda obj: [obj] * world_size)
            with ShadowValues(fake_mode, dict(zip(batch, real_batch))), tracker, gather:
                for i in range(STEPS):
                    if i:
                        tracker.reset_mod_stats()
                    train_step(model, optimizer, batch, cfg, around_forward)
            peak = tracker.get_tracker_snapshot("peak").get(cpu, {}).get("Total", 0)
            out = state_bytes(model, optimizer, grads)
    finally:
        if fsdp:
            dist.destroy_process_group()
    buckets = ddp_bucket_bytes(model) if strategy == "ddp" and world_size > 1 else 0
    out.update({"ddp buckets": buckets, "activations": live[-1], "gathered after forward": gathered[-1],
                "peak": peak + buckets})
    return out


# --------------------------------------------------------------------------------------------- #
# The measurement: real processes, gloo, the CPU allocator's events
# --------------------------------------------------------------------------------------------- #
def allocator_timeline(prof):
    """[(time ns, live bytes)] of the CPU allocator's allocation and free events of ``prof``."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live, out = 0, []
    for t, nbytes in events:
        live += nbytes
        out.append((t, live))
    return out


def live_at(timeline, t_ns):
    """Live bytes of ``timeline`` just before ``t_ns``."""
    value = 0
    for t, live in timeline:
        if t >= t_ns:
            break
        value = live
    return value


def _build_for_measure(task, cfg, strategy, world_size, device, ddp_mark):
    """(model, the module the step calls, optimizer, its gradient list) on ``device`` as the engine builds them:
    DDP on more than one rank (built inside ``ddp_mark()``), or :func:`common.parallel.fsdp.shard_model`."""
    from common.modeling.module import held_random_init_warnings
    from common.parallel.fsdp import shard_model
    with held_random_init_warnings():
        model = task.build_model(cfg).to(device)
    model.train()
    net = model
    if strategy == "fsdp":
        shard_model(model)
    elif world_size > 1:
        # init_sync=False: the broadcast of rank 0's weights is not part of what DDP keeps, and its flat buffer
        # may be freed on gloo's worker thread, where the profiler does not see the free.
        with ddp_mark():
            net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                      find_unused_parameters=task.find_unused_parameters,
                                                      init_sync=False)
    optimizer = build_optimizer(cfg, model, world_size)
    return model, net, optimizer, grads_at_step(model, optimizer)


def measure_cpu(task, cfg, strategy, world_size):
    """This rank's figures of the step on the CPU: tensor bytes as :func:`state_bytes`; DDP's buckets, the
    activations and the peak from the CPU allocator's events (``torch.profiler``, ``profile_memory``)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        batch = synthetic_batch(task, cfg)
        model, net, optimizer, grads = _build_for_measure(task, cfg, strategy, world_size, torch.device("cpu"),
                                                          lambda: record_function(DDP_MARK))
        for _ in range(STEPS):
            train_step(net, optimizer, batch, cfg, lambda: record_function(FORWARD_MARK))
        figures = state_bytes(model, optimizer, grads)
    timeline = allocator_timeline(prof)
    marks = defaultdict(list)
    for e in prof.profiler.kineto_results.events():
        marks[e.name()].append((e.start_ns(), e.end_ns()))

    def growth(mark, which):
        start, end = which(marks[mark]) if marks[mark] else (0, 0)
        return live_at(timeline, end) - live_at(timeline, start)
    figures.update({"ddp buckets": growth(DDP_MARK, min), "activations": growth(FORWARD_MARK, max),
                    "peak": max(live for _, live in timeline)})
    return figures


def measure_cuda(task, cfg, strategy, world_size, device):
    """This rank's figures of the step on the GPU ``device``: as :func:`measure_cpu`, from the CUDA caching
    allocator's counts (``memory_allocated``, ``max_memory_allocated``)."""
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    growth = defaultdict(int)

    @contextlib.contextmanager
    def counted(name):
        start = torch.cuda.memory_allocated(device)
        yield
        growth[name] = torch.cuda.memory_allocated(device) - start
    batch = tuple(t.to(device) for t in synthetic_batch(task, cfg))
    model, net, optimizer, grads = _build_for_measure(task, cfg, strategy, world_size, device,
                                                      lambda: counted("ddp buckets"))
    for _ in range(STEPS):
        train_step(net, optimizer, batch, cfg, lambda: counted("activations"), device_type="cuda")
    figures = state_bytes(model, optimizer, grads)
    figures.update({"ddp buckets": growth["ddp buckets"], "activations": growth["activations"],
                    "peak": torch.cuda.max_memory_allocated(device) - base})
    return figures


def measure_rank(rank, world_size, cfg_path, task_name, precision, checkpointing, opts, strategy, port, out_dir,
                 device_type="cpu"):
    """One rank of ``--measure`` (a process of ``torch.multiprocessing.spawn``; gloo on the CPU, NCCL on GPU
    ``rank``): writes its figures as JSON to ``out_dir/rank<rank>.json``."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = device_type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size,
                            device_id=torch.device("cuda", rank) if cuda else None)
    try:
        task, cfg = load_config(cfg_path, task_name, precision, checkpointing, opts)
        torch.manual_seed(cfg.RNG_SEED + rank)
        figures = measure_cuda(task, cfg, strategy, world_size, torch.device("cuda", rank)) if cuda else \
            measure_cpu(task, cfg, strategy, world_size)
        with open(os.path.join(out_dir, "rank{}.json".format(rank)), "w") as f:
            json.dump(figures, f)
    finally:
        dist.destroy_process_group()


def measure(cfg_path, task_name, precision, checkpointing, opts, world_size, strategy, device_type="cpu"):
    """The per-rank figures of ``world_size`` real processes (CPU: gloo; ``device_type`` 'cuda': NCCL, one GPU
    a rank), as :func:`estimate` gives them: a list, one dict per rank."""
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(measure_rank, args=(world_size, cfg_path, task_name, precision, checkpointing, list(opts), strategy,
                                     port, out_dir, device_type), nprocs=world_size)
        ranks = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, "rank{}.json".format(rank))) as f:
                ranks.append(json.load(f))
    return ranks


# --------------------------------------------------------------------------------------------- #
# Report
# --------------------------------------------------------------------------------------------- #
def total(figure):
    """Bytes of a figure: a number, or the sum of a {dtype: bytes} dict."""
    return sum(figure.values()) if isinstance(figure, dict) else figure


def state_total(figures):
    """Parameters + gradients + optimizer state (+ DDP's buckets), bytes per rank."""
    return sum(total(figures[k]) for k in ("parameters", "gradients", "optimizer state", "ddp buckets")
               if k in figures)


ROWS = ("parameters", "gradients", "optimizer state", "ddp buckets", "activations", "peak")
SUM = "params + grads + optimizer"


def figure(figures, key):
    """Bytes of row ``key`` of ``figures`` (one rank's)."""
    return state_total(figures) - figures.get("ddp buckets", 0) if key == SUM else total(figures.get(key, 0))


def report(head, est, measured=None):
    """The printed table of one run: a row per figure, MiB per rank, estimated and (rank 0) measured."""
    lines = [head, "{:<40} {:>12}{}".format("per rank", "estimate MiB", "  measured MiB  measured/est."
                                           if measured else "")]
    for key in ROWS + (SUM,):
        detail = ""
        if isinstance(est.get(key), dict) and est[key]:
            detail = " (" + ", ".join("{} {:.1f}".format(d, b / MIB) for d, b in sorted(est[key].items())
                                      if b >= MIB / 10) + ")"
        if key == "activations" and est.get("gathered after forward"):
            detail = " (of which gathered parameters {:.1f})".format(est["gathered after forward"] / MIB)
        e = figure(est, key)
        line = "{:<40} {:>12.1f}".format(key + detail, e / MIB)
        if measured:
            m = figure(measured[0], key)
            line += "  {:>12.1f}  {:>13}".format(m / MIB, "{:.3f}".format(m / e) if e else "-")
        lines.append(line)
    return "\n".join(lines)


def markdown(label, runs):
    """A Markdown table of ``runs`` [(world size, strategy, estimate)] of the config ``label``: a row per
    strategy, per world size parameters + gradients + optimizer state (+ DDP's buckets) / activations / peak,
    GiB per rank."""
    sizes = sorted({n for n, _, _ in runs})
    gib = lambda b: "{:.2f}".format(b / 2.0 ** 30)  # noqa: E731
    lines = ["| config | strategy | " + " | ".join("{} rank{}".format(n, "s" if n > 1 else "") for n in sizes) + " |",
             "| --- | --- | " + " | ".join("---" for _ in sizes) + " |"]
    for strategy in dict.fromkeys(s for _, s, _ in runs):
        cells = {n: "{} / {} / {}".format(gib(state_total(est)), gib(est["activations"]), gib(est["peak"]))
                 for n, s, est in runs if s == strategy}
        lines.append("| {} | {} | {} |".format(label, strategy, " | ".join(cells.get(n, "-") for n in sizes)))
    return "\n".join(lines)


def config_label(cfg_path, cfg):
    """The config's file name, and for a timm model its architecture."""
    name = os.path.splitext(os.path.basename(cfg_path))[0]
    return name + (" ({})".format(cfg.NETWORK.ARCH) if "ARCH" in cfg.NETWORK else "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cfg", required=True, help="the YAML config")
    parser.add_argument("--world-size", type=int, nargs="+", default=[1], help="ranks, one or more (default 1)")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), nargs="+", default=["ddp"], help="one or both")
    parser.add_argument("--precision", choices=tuple(PRECISIONS), help="autocast dtype (default: the config's)")
    parser.add_argument("--checkpointing", action="store_true", help="NETWORK.GRADIENT_CHECKPOINTING true")
    parser.add_argument("--task", choices=TASKS_WITH_BATCH, help="the task (default: the folder of --cfg)")
    parser.add_argument("--measure", action="store_true",
                        help="also run the step in --world-size real processes and measure it")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="of --measure: CPU processes (gloo) or one GPU a rank (NCCL); default cpu")
    parser.add_argument("--markdown", action="store_true",
                        help="print a Markdown table: per world size parameters + gradients + optimizer state "
                             "(+ DDP buckets) / activations / peak, GiB per rank")
    parser.add_argument("--json", help="write the figures as JSON to this file")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    args = parser.parse_args(argv)
    if min(args.world_size) < 1:
        parser.error("--world-size: expected at least 1, got {}".format(min(args.world_size)))
    try:
        task, cfg = load_config(args.cfg, args.task, args.precision, args.checkpointing, args.opts)
    except (UserInputError, ValueError, KeyError) as e:
        print("error: {}".format(e), file=sys.stderr)
        return 2
    runs, results = [], []
    for n in args.world_size:
        for strategy in args.strategy:
            t0 = time.perf_counter()
            est = estimate(task, cfg, n, strategy)
            traced_s = time.perf_counter() - t0
            measured = measure(args.cfg, task.name, args.precision, args.checkpointing, args.opts, n, strategy,
                               args.device) if args.measure else None
            runs.append((n, strategy, est))
            results.append({"world_size": n, "strategy": strategy, "estimate": est, "measured": measured})
            if not args.markdown:
                print(report("{} on {} rank(s), {}, {}, gradient checkpointing {}, micro-batch {} per rank (traced in "
                             "{:.0f} s)".format(args.cfg, n, strategy, precision_of(cfg), "on" if
                                               cfg.NETWORK.GRADIENT_CHECKPOINTING else "off",
                                               cfg.TRAIN.BATCH_IMAGES, traced_s), est, measured), flush=True)
    if args.markdown:
        print(markdown(config_label(args.cfg, cfg), runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cfg": args.cfg, "precision": precision_of(cfg), "micro_batch": cfg.TRAIN.BATCH_IMAGES,
                       "checkpointing": bool(cfg.NETWORK.GRADIENT_CHECKPOINTING), "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
