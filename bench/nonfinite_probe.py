"""Cost of the non-finite probe (common/diagnostics/nonfinite.py) while every value is finite: step time, on / off.

While all is finite the probe only keeps a reference to each micro-batch of the accumulation group and the RNG
state before its forward; no hook is registered. Runs alternate (off, on, off, ...) on the same model and data
in one process, and the median time per optimizer step of each is compared (and the ratio of the fastest runs,
less sensitive to a busy machine). Expected: a ratio within the run-to-run noise (about 1.00 +- 0.03).

    python bench/nonfinite_probe.py [--precision fp32 bf16] [--repeats 7] [--threads 1]
"""
import argparse
import logging
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.trainer_overhead import DTYPES, Net, make_batches  # noqa: E402
from common import amp  # noqa: E402
from common.diagnostics.nonfinite import NonFiniteProbe  # noqa: E402
from common.trainer import Trainer  # noqa: E402


def time_per_step(model, optimizer, batches, k, dtype, probe_on):
    """Seconds per optimizer step of one epoch of the Trainer over ``batches``, with or without the probe."""
    autocast, scaler = amp.build_precision(dtype is not None, dtype or "float32", "cpu", loss_scale="dynamic",
                                           min_loss_scale=128.)
    probe = NonFiniteProbe(model, autocast, None, "bench", str(dtype)) if probe_on else None
    trainer = Trainer(model, optimizer, batches, scaler=scaler, autocast=autocast, grad_accumulate_steps=k,
                      clip_grad_norm=1.0, logger=logging.getLogger("bench"), probe=probe)
    start = time.perf_counter()
    trainer.train(0, 1)
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
    print("{:<6} {:>12} {:>12} {:>8} {:>10}".format("prec", "off ms/step", "on ms/step", "ratio", "min ratio"))
    for precision in args.precision:
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        dtype = DTYPES.get(precision)
        times = {False: [], True: []}
        for rep in range(args.repeats + 1):  # the first round warms up
            for on in (False, True):
                t = time_per_step(model, optimizer, batches, args.k, dtype, on)
                if rep:
                    times[on].append(t)
        off, on = statistics.median(times[False]), statistics.median(times[True])
        print("{:<6} {:>12.2f} {:>12.2f} {:>8.3f} {:>10.3f}".format(
            precision, 1e3 * off, 1e3 * on, on / off, min(times[True]) / min(times[False])))


if __name__ == "__main__":
    main()
