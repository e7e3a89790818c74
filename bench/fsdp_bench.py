"""FSDP (TRAIN.STRATEGY 'fsdp') on gloo CPU ranks: the two measurements docs/fsdp.md quotes.

* ``precision``: one optimizer step of a BERT encoder sharded by :func:`common.parallel.fsdp.shard_model`, bf16
  compute either as autocast over fp32 shards (what the trainer does) or as FSDP2's ``MixedPrecisionPolicy``
  (parameters all-gathered in bf16, gradients reduced in fp32); median step time and the largest difference of
  the loss from an fp32 step.
* ``checkpoint``: the training stall of one sharded checkpoint save (the time the ``Checkpointer.save`` call
  takes), synchronous (``dcp.save``) against TRAIN.ASYNC_CHECKPOINT (``dcp.async_save``), and the time until the
  background write is complete.

    python bench/fsdp_bench.py [precision|checkpoint|all] [--ranks 2] [--layers 4] [--hidden 256] [--steps 5]
"""
import argparse
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    parser.add_argument("what", nargs="?", default="all", choices=["precision", "checkpoint", "all"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args, port), nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
