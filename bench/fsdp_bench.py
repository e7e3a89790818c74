"""FSDP (TRAIN.STRATEGY 'fsdp') on gloo CPU ranks: the two measurements docs/fsdp.md quotes.

* ``precision``: one optimizer step of a BERT encoder sharded by :func:`common.parallel.fsdp.shard_model`, bf16
  compute either as autocast over fp32 shards (what the trainer does) or as FSDP2's ``MixedPrecisionPolicy``
  (parameters all-gathered in bf16, gradients reduced in fp32); median step time and the largest difference of
  the loss from an fp32 step.
* ``checkpoint``: the training stall of one sharded checkpoint save (the time the ``Checkpointer.save`` call
  takes), synchronous (``dcp.save``) against TRAIN.ASYNC_CHECKPOINT (``dcp.async_save``), and the time until the
  background write is complete.
* ``memory``: each rank's peak resident memory (``VmHWM``, reset before each phase through
  ``/proc/self/clear_refs``) in the phases of a cls ViT run (``cfgs/cls/demo_cpu.yaml``, 32 x 32 images, patch 8,
  ``--vit WIDTH DEPTH HEADS``, default ViT-B: 768 12 12, ~85 M parameters, fp32, AdamW) under ddp and fsdp on each
  of ``--world-sizes`` gloo ranks: start (ddp: the engine's ``build_model``, then DDP; fsdp: as the engine starts a
  sharded run, ``build_model`` recorded on the meta device, ``shard_model``, then ``fill``; the optimizer),
  a training step, validation (the engine's ``run_validation`` on the demo data), a save (``Checkpointer.save``);
  then in new processes start again and a resume (``Checkpointer.resume``, AUTO_RESUME). Beside each, what the
  phase added to the resident memory at its start, and bench/memory_estimate.py's traced step peak.
  ``--pretrained``: every run starts from a timm weights file of the ViT (``NETWORK.IMAGE_PRETRAINED``).

    python bench/fsdp_bench.py [precision|checkpoint|all] [--ranks 2] [--layers 4] [--hidden 256] [--steps 5]
    python bench/fsdp_bench.py memory [--vit 768 12 12] [--world-sizes 1 2 4] [--strategies ddp fsdp] [--pretrained]
"""
import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common.checkpoint.checkpointer import Checkpointer, epoch_checkpoint_path  # noqa: E402
from common.checkpoint.train_state import new_train_state  # noqa: E402
from common.modeling.nlp.modeling import BertEncoder  # noqa: E402
from common.parallel.fsdp import shard_model  # noqa: E402


def encoder(args):
    config = SimpleNamespace(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4,
                             intermediate_size=4 * args.hidden, hidden_act="gelu", hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return BertEncoder(config)


def step(model, optimizer, x, bias, context):
    with context():
        out = model(x, bias, output_all_encoded_layers=False)[0].float()
        loss = (out * torch.linspace(-1, 1, out.shape[-1])).mean()  # a loss that the rounding of every unit moves
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def timed_steps(model, x, bias, context, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every step sees the same weights
    losses, times = [], []
    for _ in range(steps + 1):  # the first step warms up
        tic = time.perf_counter()
        losses.append(step(model, optimizer, x, bias, context))
        times.append(time.perf_counter() - tic)
    return statistics.median(times[1:]), losses[-1]


def precision(args, rank):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    torch.manual_seed(1 + rank)
    x = torch.randn(args.batch, args.length, args.hidden)
    bias = torch.zeros(args.batch, 1, 1, args.length)
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    fp32 = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    ref_time, ref_loss = timed_steps(shard_model(encoder(args)), x, bias, fp32, args.steps)
    auto_time, auto_loss = timed_steps(shard_model(encoder(args)), x, bias, autocast, args.steps)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mp_time, mp_loss = timed_steps(shard_model(encoder(args), mp_policy=policy), x, bias, fp32, args.steps)
    if rank == 0:
        print("precision: {} ranks, BERT {} layers x {}, batch {} x {} tokens, median of {} steps".format(
            args.ranks, args.layers, args.hidden, args.batch, args.length, args.steps))
        for name, t, loss in (("fp32", ref_time, ref_loss), ("autocast bf16 over fp32 shards", auto_time, auto_loss),
                              ("MixedPrecisionPolicy bf16 params, fp32 reduce", mp_time, mp_loss)):
            print("  {:48s} {:7.3f} s/step  loss {:.6f} (|d| from fp32 {:.2e})".format(name, t, loss,
                                                                                    abs(loss - ref_loss)))


def checkpoint(args, rank):
    model = shard_model(encoder(args))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.length, args.hidden)
    bias = torch.zeros(args.batch, 1, 1, args.length)
    step(model, optimizer, x, bias, lambda: torch.autocast("cpu", enabled=False))  # the moments exist
    folder = tempfile.mkdtemp() if rank == 0 else None
    folder = [folder]
    dist.broadcast_object_list(folder)
    results = {}
    for mode in ("sync", "async"):
        ckpt = Checkpointer(model, optimizer, os.path.join(folder[0], mode), async_save=mode == "async")
        stalls, totals = [], []
        for i in range(args.saves):
            dist.barrier()
            tic = time.perf_counter()
            ckpt.save(epoch_checkpoint_path(ckpt.prefix, i), new_train_state(epoch=i + 1))
            stalls.append(time.perf_counter() - tic)
            ckpt.wait()
            dist.barrier()
            totals.append(time.perf_counter() - tic)
        results[mode] = statistics.median(stalls), statistics.median(totals)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("checkpoint: {} ranks, {:.1f} M parameters + AdamW moments, median of {} saves".format(
            args.ranks, params / 1e6, args.saves))
        for mode, (stall, total) in results.items():
            print("  {:5s} training stall {:.3f} s per save, written after {:.3f} s".format(mode, stall, total))


MIB = 2.0 ** 20
PHASES = ("start", "step", "validation", "save")  # a first run; then, in new processes, "start" and "resume"


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


class PhasePeaks:
    """Per phase: the peak resident memory of this process during it (VmHWM, reset at its start) and the resident
    memory at its start, in bytes."""

    def __init__(self):
        self.figures = {}

    def measure(self, name, run):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the kernel's reset of the peak (VmHWM) to the current resident size
        before = _rss_kib("VmRSS")
        out = run()
        self.figures[name] = {"peak": _rss_kib("VmHWM") * 1024, "before": before * 1024}
        return out


def memory_config(args, data):
    """``(task, cfg)`` of the measured cls ViT (random weights, fp32, AdamW), with AUTO_RESUME from ``prefix``."""
    from bench.memory_estimate import load_config
    width, depth, heads = args.vit
    opts = ["NETWORK.ARCH_KWARGS", "[['img_size', 32], ['patch_size', 8], ['embed_dim', {}], ['depth', {}], "
            "['num_heads', {}]]".format(width, depth, heads), "DATASET.DATASET_PATH", data, "NUM_WORKERS_PER_GPU", 0,
            "TRAIN.BATCH_IMAGES", args.batch, "VAL.BATCH_IMAGES", args.batch, "TRAIN.AUTO_RESUME", True,
            "TRAIN.BEGIN_EPOCH", 0, "TRAIN.END_EPOCH", 2]
    if getattr(args, "image_pretrained", None):
        opts += ["NETWORK.IMAGE_PRETRAINED", args.image_pretrained]
    return load_config(os.path.join(ROOT, "cfgs", "cls", "demo_cpu.yaml"), "cls", "fp32", False,
                       [str(o) for o in opts])


def memory_worker(rank, args, rendezvous, strategy, world_size, folder, resume):
    """One rank of the memory bench: the phases of a first run, or (``resume``) start and resume; writes its
    figures to ``folder/<run>-<rank>.json``."""
    from bench.memory_estimate import synthetic_batch, train_step
    from common.engine import build_loader, build_model, record_sharded_build, run_validation
    from common.optim import build_optimizer
    from common.parallel.meta_init import fill

    import warnings
    from common.modeling.module import RandomInitWarning

    warnings.simplefilter("ignore", RandomInitWarning)  # random weights on purpose: memory does not depend on them
    torch.set_num_threads(args.threads)
    # a file rendezvous: a free TCP port picked beforehand may be taken by another program before the ranks bind it
    dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=world_size)
    try:
        task, cfg = memory_config(args, os.path.join(folder, "data"))
        torch.manual_seed(cfg.RNG_SEED + rank)
        peaks = PhasePeaks()

        def start():
            if strategy == "fsdp":  # as the engine starts a sharded run: built on the meta device, filled by groups
                recording = record_sharded_build(task, cfg)
                shard_model(recording.model)
                model = fill(recording, torch.device("cpu"))
                return model, model, build_optimizer(cfg, model, world_size)
            model = net = build_model(task, cfg, torch.device("cpu"))
            if world_size > 1:
                net = torch.nn.parallel.DistributedDataParallel(model,
                                                                find_unused_parameters=task.find_unused_parameters)
            return model, net, build_optimizer(cfg, model, world_size)
        model, net, optimizer = peaks.measure("start", start)
        checkpointer = Checkpointer(model, optimizer, os.path.join(folder, "{}-{}".format(strategy, world_size)),
                                    config=cfg)
        batch = synthetic_batch(task, cfg)
        if resume:
            peaks.measure("resume", lambda: checkpointer.resume(cfg.TRAIN))
        else:
            peaks.measure("step", lambda: train_step(net, optimizer, batch, cfg))
            loader = build_loader(task, cfg, "val", world_size, rank)
            peaks.measure("validation", lambda: run_validation(net, loader, task.build_metrics(cfg, False),
                                                               task.label_index_in_batch(cfg)))
            peaks.measure("save", lambda: (checkpointer.save(epoch_checkpoint_path(checkpointer.prefix, 0),
                                                             new_train_state(epoch=1)), checkpointer.wait()))
        with open(os.path.join(folder, "{}-{}.json".format("resume" if resume else "run", rank)), "w") as f:
            json.dump(peaks.figures, f)
    finally:
        dist.destroy_process_group()


def memory(args):
    """The memory table (see the module docstring), printed per strategy and world size, one line per rank."""
    import shutil
    sys.path.insert(0, os.path.join(ROOT, "demo"))
    import make_cls_demo_data
    from bench.memory_estimate import estimate

    width, depth, heads = args.vit
    root = tempfile.mkdtemp(prefix="fsdp_memory_")
    try:
        make_cls_demo_data.write(os.path.join(root, "data"), train=max(args.batch * 4, 10), test=args.val_images)
        task, cfg = memory_config(args, os.path.join(root, "data"))
        from common.modeling.module import held_random_init_warnings
        if args.pretrained:  # a timm weights file of the ViT (random values), read by every rank's start
            with held_random_init_warnings():
                backbone = task.build_model(cfg).backbone
            args.image_pretrained = os.path.join(root, "vit_pretrained.pth")
            torch.save(backbone.state_dict(), args.image_pretrained)
            del backbone
        with held_random_init_warnings(), torch.device("meta"):
            params = sum(p.numel() for p in task.build_model(cfg).parameters())
        weights, state = 4 * params, 12 * params  # fp32 weights; + AdamW's two fp32 moments: a checkpoint's tensors
        print("memory: cls ViT width {} depth {} heads {} (32 x 32 images, patch 8): {:.1f} M parameters, fp32 "
              "weights {:.0f} MiB, weights + AdamW moments {:.0f} MiB; micro-batch {}, {} validation images, {} "
              "thread(s) a rank; {}; MiB per rank: peak during the phase (what it added to the resident memory at "
              "its start)".format(width, depth, heads, params / 1e6, weights / MIB, state / MIB, args.batch,
                                  args.val_images, args.threads,
                                  "started from a pretrained file (NETWORK.IMAGE_PRETRAINED, {:.0f} MiB)".format(
                                      os.path.getsize(args.image_pretrained) / MIB) if args.pretrained
                                  else "random initial weights"), flush=True)
        print("| strategy | ranks | rank | start | step | validation | save | resume (new processes) | "
              "estimate: step peak, state |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for strategy in args.strategies:
            for n in args.world_sizes:
                est = estimate(task, cfg, n, strategy)
                folder = os.path.join(root, "{}-{}".format(strategy, n))
                os.makedirs(folder)
                os.symlink(os.path.join(root, "data"), os.path.join(folder, "data"))
                for resume in (False, True):
                    rendezvous = os.path.join(folder, "rendezvous-{}".format(int(resume)))
                    mp.start_processes(memory_worker, args=(args, rendezvous, strategy, n, folder, resume), nprocs=n,
                                       start_method="spawn")
                state_est = sum(sum(v.values()) if isinstance(v, dict) else v for k, v in est.items()
                                if k in ("parameters", "gradients", "optimizer state", "ddp buckets"))
                for rank in range(n):
                    figures = {}
                    for run in ("run", "resume"):
                        with open(os.path.join(folder, "{}-{}.json".format(run, rank))) as f:
                            figures[run] = json.load(f)
                    cell = lambda f: "{:.0f} (+{:.0f})".format(f["peak"] / MIB, (f["peak"] - f["before"]) / MIB)  # noqa: E731
                    print("| {} | {} | {} | {} | {} | {} | {} | {} | {:.0f}, {:.0f} |".format(
                        strategy, n, rank, *[cell(figures["run"][p]) for p in PHASES],
                        cell(figures["resume"]["resume"]), est["peak"] / MIB, state_est / MIB), flush=True)
                shutil.rmtree(folder)
        print("goal at {} ranks (issue 48): resume adds at most {:.0f} MiB (1/N of the state + 20%), validation at most "
              "{:.0f} MiB (1/N of the fp32 weights + 20%)".format(max(args.world_sizes),
                                                                   1.2 * state / max(args.world_sizes) / MIB,
                                                                   1.2 * weights / max(args.world_sizes) / MIB))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        if args.what in ("precision", "all"):
            precision(args, rank)
        if args.what in ("checkpoint", "all"):
            checkpoint(args, rank)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", default="all", choices=["precision", "checkpoint", "memory", "all"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vit", type=int, nargs=3, default=[768, 12, 12], metavar=("WIDTH", "DEPTH", "HEADS"),
                        help="memory: the ViT's width, blocks and heads (default ViT-B)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4], help="memory: ranks, each in turn")
    parser.add_argument("--strategies", nargs="+", choices=["ddp", "fsdp"], default=["ddp", "fsdp"])
    parser.add_argument("--val-images", type=int, default=32, help="memory: validation images")
    parser.add_argument("--pretrained", action="store_true",
                        help="memory: start from a timm weights file of the ViT (NETWORK.IMAGE_PRETRAINED)")
    args = parser.parse_args()
    if args.what == "memory":
        memory(args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args, port), nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
