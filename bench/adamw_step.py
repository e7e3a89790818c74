"""Time of one BertAdamW step, multi-tensor (``foreach=True``, ours) vs one tensor at a time (``foreach=False``,
the reference's loop), on the parameters of VL-BERT-base's language part (BERT-base: 12 layers x 768, word
embeddings 30522 x 768; 109 M weights in 194 tensors). Steps alternate; the median of each is compared.

    python bench/adamw_step.py [--device cpu|cuda] [--steps 7] [--threads 2] [--tiny] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common.modeling.nlp.modeling import BertEncoder  # noqa: E402
from common.optim import BertAdamW  # noqa: E402

BASE = SimpleNamespace(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                       hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
# --tiny: the same tensors per layer at 64 units, 2 layers, 1000 words (a check of the bench itself)
TINY = SimpleNamespace(**dict(vars(BASE), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=256))


def params(device, tiny=False):
    """BERT-base weights (or :data:`TINY`'s) with random gradients (one fresh set per optimizer)."""
    torch.manual_seed(0)
    arch, words = (TINY, 1000) if tiny else (BASE, 30522)
    width = arch.hidden_size
    module = torch.nn.ModuleList([BertEncoder(arch), torch.nn.Embedding(words, width), torch.nn.Embedding(512, width)])
    ps = [p.to(device).detach().requires_grad_(True) for p in module.parameters()]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def step_times(optimizers, steps, device):
    """Median seconds of one ``step()`` of each optimizer (dict name -> optimizer), the optimizers taking
    turns for ``steps`` timed rounds after one untimed round (state allocation); CUDA is synchronised."""
    times = {name: [] for name in optimizers}
    for i in range(steps + 1):
        for name, opt in optimizers.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-unit BERT (a check of the bench itself)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures printed as JSON to FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    opts = {mode: BertAdamW(params(device, args.tiny), lr=1e-4, weight_decay=1e-4, foreach=mode == "foreach")
            for mode in ("plain", "foreach")}
    times = step_times(opts, args.steps, device)
    n = sum(p.numel() for p in opts["plain"].param_groups[0]["params"])
    plain, fast = times["plain"], times["foreach"]
    print("BertAdamW step, {:.0f} M weights in {} tensors, {} ({} threads), median of {} steps".format(
        n / 1e6, len(opts["plain"].param_groups[0]["params"]), args.device, args.threads, args.steps))
    print("  one tensor at a time (reference): {:8.1f} ms".format(1e3 * plain))
    print("  multi-tensor (ours):              {:8.1f} ms".format(1e3 * fast))
    print("  speed-up: {:.2f}x".format(plain / fast))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "weights": n, "plain_ms": 1e3 * plain, "foreach_ms": 1e3 * fast,
                       "speedup": plain / fast}, f, indent=1)


if __name__ == "__main__":
    main()
