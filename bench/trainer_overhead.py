"""Overhead of ``common.trainer.Trainer`` over a bare hand-written loop doing the same work.

Both run the same model, data, precision (autocast + loss scaling), accumulation k and
clipping; the trainer gets its precision from ``amp.build_precision`` as the engine does and
runs the LR and TensorBoard hooks (no writer: nothing written); the bare loop uses
``torch.amp.GradScaler`` directly and no hooks, metrics or writer. Runs alternate (bare, trainer, bare, ...) and the median time per optimizer step of
each is compared (and the ratio of the fastest runs, less sensitive to a busy machine).
Prints both figures and the ratios per precision. Target: ratio < 1.03.

    python bench/trainer_overhead.py [--precision fp32 bf16 fp16] [--repeats 7] [--threads 1]

fp16 autocast on the CPU runs ~20x slower than fp32 (no fp16 matmul kernels), hence not a default.
"""
import argparse
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import amp  # noqa: E402
from common.hooks.lr_scheduler import LRSchedulerHook  # noqa: E402
from common.hooks.tensorboard import TensorBoardHook  # noqa: E402
from common.trainer import Trainer  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Net(torch.nn.Module):
    """A small transformer classifier: x [B, T, D] float32, label [B] int64 -> (outputs, loss)."""

    def __init__(self, dim=256, layers=2, classes=10):
        super().__init__()
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, classes)

    def forward(self, x, label):
        logits = self.head(self.encoder(x).mean(1)).float()
        return {"logits": logits}, torch.nn.functional.cross_entropy(logits, label)


def make_batches(n, batch, seq, dim):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, seq, dim, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(n)]


def bare_loop(model, optimizer, batches, k, dtype, clip):
    """What a user would write by hand: autocast, GradScaler, accumulation, clip, step."""
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    model.train()
    for i, batch in enumerate(batches):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            _, loss = model(*batch)
        scaler.scale(loss / k).backward()
        if (i + 1) % k == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)


def trainer_loop(model, optimizer, batches, k, dtype, clip):
    autocast, scaler = amp.build_precision(dtype is not None, dtype or "float32", "cpu", loss_scale="dynamic",
                                           min_loss_scale=128.)
    Trainer(model, optimizer, batches, scaler=scaler, autocast=autocast, hooks=[LRSchedulerHook(), TensorBoardHook()],
            grad_accumulate_steps=k, clip_grad_norm=clip, logger=logging.getLogger("bench")).train(0, 1)


def setup(precision):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    dtype = DTYPES.get(precision)
    return model, optimizer, dtype


def time_per_step(fn, model, optimizer, batches, k, dtype, clip):
    start = time.perf_counter()
    fn(model, optimizer, batches, k, dtype, clip)
    return (time.perf_counter() - start) / (len(batches) // k)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--k", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per timed run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = make_batches(args.k * args.steps, args.batch, args.seq, 256)
    print("model: 2-layer transformer d=256, micro-batch {}x{}, k={}, {} steps/run, SGD, clip 1.0, {} thread(s)"
          .format(args.batch, args.seq, args.k, args.steps, args.threads))
    print("{:<6} {:>14} {:>14} {:>8} {:>10}".format("prec", "bare ms/step", "train ms/step", "ratio", "min ratio"))
    for precision in args.precision:
        bare = setup(precision)  # each side trains its own model
        ours = setup(precision)
        times = {"bare": [], "train": []}
        for rep in range(args.repeats + 1):  # the first round warms up
            for name, fn, (model, optimizer, dtype) in (("bare", bare_loop, bare), ("train", trainer_loop, ours)):
                t = time_per_step(fn, model, optimizer, batches, args.k, dtype, 1.0)
                if rep:
                    times[name].append(t)
        b, t = statistics.median(times["bare"]), statistics.median(times["train"])
        min_ratio = min(times["train"]) / min(times["bare"])  # the least disturbed run of each
        print("{:<6} {:>14.2f} {:>14.2f} {:>8.3f} {:>10.3f}".format(precision, 1e3 * b, 1e3 * t, t / b, min_ratio))


if __name__ == "__main__":
    main()
