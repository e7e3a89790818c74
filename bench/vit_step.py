"""Our engine's training step against timm's own, on the same ViT, precision, accumulation and optimizer
settings, alternating in one run (a bench: nothing is downloaded, weights random, data synthetic).

Ours: the cls task's model, ``build_optimizer`` (BertAdamW), ``build_precision`` (autocast + LossScaler) and
``common.trainer.Trainer`` (accumulation, unscale, clip, step or skip), built from a cls config.
timm's: the forward / backward / step core of timm's ``train.py`` (``train_one_epoch``): the same timm model
(same weights), ``create_optimizer_v2('adamw')`` (torch AdamW), LabelSmoothingCrossEntropy, autocast and
``NativeScaler`` (fp16) with ``clip_grad`` on the update micro-batch, ``zero_grad`` after it.

Prints per side the median samples/s over the rounds, the ratio ours / timm (goal >= 0.97), the peak device
memory (CUDA), MFU (model FLOPs 6 N T + 12 L H T^2 per sample, common/diagnostics/flops.py, against the measured
throughput of a square matmul in the same dtype) and the optimizer-state bytes of bf16 vs fp32 moments.

    python bench/vit_step.py [--cfg cfgs/cls/vit_base16_cifar100_1x24G_fp16.yaml] [--precision fp32|fp16|bf16]
        [--batch 16] [--accum 4] [--rounds 5] [--steps 2] [--device cpu|cuda] [--tiny] [--json FILE]
        [--opts KEY VALUE ...]

``--tiny``: a 32 px ViT of 4 blocks of width 96 (the demo's), for a CPU check of the bench itself.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timm  # noqa: E402
from timm.loss import LabelSmoothingCrossEntropy  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from timm.utils import NativeScaler  # noqa: E402

from bench.optim_state import state_bytes  # noqa: E402
from bench.throughput import datasheet_peak  # noqa: E402
from cls.task import TASK  # noqa: E402
from common.diagnostics.flops import dense_weight_count, encoder_train_flops  # noqa: E402
from common.engine import build_model, build_precision  # noqa: E402
from common.optim import build_optimizer  # noqa: E402
from common.trainer import Trainer  # noqa: E402

TINY = ["DATASET.IMAGE_SIZE", "32", "NETWORK.ARCH", "vit_tiny_patch16_224", "NETWORK.NUM_CLASSES", "10",
        "NETWORK.ARCH_KWARGS", "[['img_size', 32], ['patch_size', 4], ['embed_dim', 96], ['depth', 4], ['num_heads', 3]]"]
PRECISION = {"fp32": ["TRAIN.FP16", "false"], "fp16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "float16"],
             "bf16": ["TRAIN.FP16", "true", "TRAIN.FP16_DTYPE", "bfloat16"]}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory(device):
    """Peak allocated device memory since the last reset, MiB (0 on the CPU: not measured)."""
    return torch.cuda.max_memory_allocated() / 2 ** 20 if device.type == "cuda" else 0.0


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def matmul_peak(device, dtype, n):
    """FLOP/s of an ``n x n`` matmul in ``dtype`` (best of 5)."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(6):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def timm_side(ours, cfg, device, dtype):
    """timm's model (our weights), optimizer, loss and ``step(batches)`` running train.py's inner loop."""
    net, train = cfg.NETWORK, cfg.TRAIN
    model = timm.create_model(net.ARCH, num_classes=net.NUM_CLASSES, drop_path_rate=net.DROP_PATH_RATE,
                              **dict(net.ARCH_KWARGS)).to(device)
    model.load_state_dict(ours.backbone.state_dict())
    model.set_grad_checkpointing(net.GRADIENT_CHECKPOINTING)
    optimizer = create_optimizer_v2(model, "adamw", lr=train.LR * train.BATCH_IMAGES * train.GRAD_ACCUMULATE_STEPS,
                                    weight_decay=train.WD)
    loss_fn = LabelSmoothingCrossEntropy(train.LABEL_SMOOTHING) if train.LABEL_SMOOTHING else torch.nn.CrossEntropyLoss()
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if train.FP16 else contextlib.nullcontext
    scaler = NativeScaler(device=device.type) if train.FP16 and dtype == torch.float16 else None
    clip = train.CLIP_GRAD_NORM if train.CLIP_GRAD_NORM > 0 else None
    k = train.GRAD_ACCUMULATE_STEPS

    def step(batches):
        for i, (x, y, _) in enumerate(batches):
            need_update = (i + 1) % k == 0
            with autocast():
                loss = loss_fn(model(x), y)
            loss = loss / k
            if scaler is not None:
                scaler(loss, optimizer, clip_grad=clip, parameters=model.parameters(), need_update=need_update)
            else:
                loss.backward()
                if need_update:
                    if clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                    optimizer.step()
            if need_update:
                optimizer.zero_grad()
    return model, step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cfg", default="cfgs/cls/vit_base16_cifar100_1x24G_fp16.yaml")
    parser.add_argument("--precision", default="fp16", choices=sorted(PRECISION))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="alternations (the first, warm-up, is dropped)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per side per round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the figures printed as JSON to FILE")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()
    device = torch.device(args.device)
    opts = (TINY if args.tiny else []) + PRECISION[args.precision] + [
        "TRAIN.BATCH_IMAGES", str(args.batch), "TRAIN.GRAD_ACCUMULATE_STEPS", str(args.accum)] + args.opts
    cfg = TASK.load_config(args.cfg, opts)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    if args.precision == "fp16" and device.type == "cpu":
        dtype = torch.float16  # CPU autocast fp16 is slow but runs

    torch.manual_seed(0)
    model = build_model(TASK, cfg, device)
    optimizer = build_optimizer(cfg, model)
    autocast, scaler = build_precision(cfg, device)
    trainer = Trainer(model, optimizer, [], scaler=scaler, autocast=autocast, grad_accumulate_steps=args.accum,
                      clip_grad_norm=cfg.TRAIN.CLIP_GRAD_NORM)
    size = cfg.DATASET.IMAGE_SIZE
    batches = [(torch.randn(args.batch, 3, size, size, device=device),
                torch.randint(0, cfg.NETWORK.NUM_CLASSES, (args.batch,), device=device),
                torch.arange(args.batch, device=device)) for _ in range(args.accum * args.steps)]
    trainer.loader = batches
    timm_model, timm_step = timm_side(model, cfg, device, dtype)
    samples = len(batches) * args.batch

    rates, peaks = {"ours": [], "timm": []}, {"ours": 0.0, "timm": 0.0}
    for r in range(args.rounds):
        for name, run in (("ours", lambda: trainer.train(0, 1)), ("timm", lambda: timm_step(batches))):
            reset_peak(device)
            sync(device)
            t = time.perf_counter()
            run()
            sync(device)
            if r > 0:
                rates[name].append(samples / (time.perf_counter() - t))
            peaks[name] = max(peaks[name], peak_memory(device))
    ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["timm"])

    backbone = model.backbone
    tokens = backbone.patch_embed.num_patches + getattr(backbone, "num_prefix_tokens", 1)
    flops = encoder_train_flops(dense_weight_count(backbone), [tokens], len(backbone.blocks), backbone.embed_dim)
    peak = matmul_peak(device, dtype, 4096 if device.type == "cuda" else 1024)

    cfg32 = TASK.load_config(args.cfg, opts + ["TRAIN.OPTIM_STATE_DTYPE", "float32"])
    cfg16 = TASK.load_config(args.cfg, opts + ["TRAIN.OPTIM_STATE_DTYPE", "bfloat16"])
    x, y, index = batches[0]
    model.train()
    model(x, y, index)[1].backward()
    moments = {}
    for name, c in (("float32", cfg32), ("bfloat16", cfg16)):
        opt = build_optimizer(c, model)
        opt.step()
        moments[name] = state_bytes(opt)

    print("{} {}, {} px, batch {} x {} accumulated, {} on {}".format(
        cfg.NETWORK.ARCH, "tiny" if args.tiny else "", size, args.batch, args.accum, args.precision, device))
    for name, rate in (("ours", ours), ("timm", theirs)):
        memory = "{:8.1f} MiB".format(peaks[name]) if device.type == "cuda" else "n/a (CPU)"
        print("{:5s} {:9.1f} samples/s  peak memory {}  MFU {:.3f}".format(name, rate, memory, rate * flops / peak))
    print("ratio ours / timm samples/s: {:.3f} (goal >= 0.97); matmul peak {:.2f} TFLOP/s ({})".format(
        ours / theirs, peak / 1e12, dtype))
    print("optimizer state bf16 / fp32: {:.3f} ({} / {} bytes)".format(
        moments["bfloat16"] / moments["float32"], moments["bfloat16"], moments["float32"]))
    if args.json:
        sheet = datasheet_peak(device, args.precision)
        with open(args.json, "w") as f:
            json.dump({"arch": cfg.NETWORK.ARCH, "image_size": size, "batch": args.batch, "accum": args.accum,
                       "precision": args.precision, "device": str(device),
                       "samples_per_s": {"ours": ours, "timm": theirs}, "ratio": ours / theirs,
                       "mfu": {"ours": ours * flops / peak, "timm": theirs * flops / peak},
                       "mfu_sheet": {"ours": ours * flops / sheet, "timm": theirs * flops / sheet} if sheet else None,
                       "flops_per_sample": flops, "datasheet_peak_tflops": sheet / 1e12 if sheet else None,
                       "peak_mib": peaks if device.type == "cuda" else None, "matmul_peak_tflops": peak / 1e12,
                       "optim_state_ratio": moments["bfloat16"] / moments["float32"]}, f, indent=1)


if __name__ == "__main__":
    main()
