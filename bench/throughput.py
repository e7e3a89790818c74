"""End-to-end training throughput, time split, peak memory, model FLOPs and MFU of a VCR config, for our
implementation and for a reference-equivalent path, measured in one run.

Both paths run the real engine step: the model from ``common.engine.build_model``, the optimizer from
``common.optim.build_optimizer``, autocast and loss scaler from ``common.engine.build_precision``, and
``common.trainer.Trainer`` (accumulation, clipping, skip check) over the config's batches. They differ where
the reference release computed differently:

* reference-equivalent: the encoder is ``pytorch_pretrained_bert``'s ``BertEncoder`` (the one the
  reference trained with) holding the same weights: eager attention over all padded tokens, LayerNorm and
  GELU written out in element-wise ops; ``AdamW`` updates one tensor at a time (``BertAdamW(foreach=False)``).
* ours: SDPA attention, dense layers on the real tokens only, fused LayerNorm/GELU, ``BertAdamW``'s default
  (multi-tensor kernels on CUDA; on the CPU the same loop as the reference, which is faster there).
  ``--opts TRAIN.COMPILE inductor`` also compiles its forward (``common.compile``; the warm-up steps,
  untimed, include the compilation); the reference path stays eager.

Both paths are built in one process and their optimizer steps alternate (reference, ours, ours,
reference, ...), so a busy machine slows both alike; the peak memory of each comes from a run of that path
alone in its own process. Printed per path:
samples/s, tokens/s (real tokens through the encoder), the split of a micro-batch's time into data /
forward / backward / optimizer (+ the rest: transfer, metrics, hooks), peak memory (CUDA: max allocated;
CPU: peak resident set of the process), model FLOPs per sample (encoder ``6 N T + 12 layers H L^2`` on real
tokens, see ``common/diagnostics/flops.py``; the image encoder's FLOPs per image (ResNet, or ViT with ``--encoder vit``)
counted by ``torch.utils.flop_counter``) and
MFU against the peak of a large matmul measured in the same run (and, on CUDA, the GPU's datasheet peak).

``--synthetic`` feeds batches of VCR items drawn at the sizes of real VCR Q->A items (question 6-20 word
pieces, each answer 5-20, 4-24 detected objects plus the whole-image box, images at SCALES with a 3:2
aspect) through the real collate; without it the config's data loader runs (data included in the time).
``--accumulate K`` also runs ours with TRAIN.GRAD_ACCUMULATE_STEPS = 1 and K at the same micro-batch and
reports the ratio of their peak memories (target <= 1.05: accumulation keeps no graph alive).

``--padding-cost`` times ours twice instead, in the same alternating way: images padded to the fixed
``SCALES`` canvas (the default, batch-independent results) and to each batch's largest image
(``DATASET.PAD_TO_BATCH_MAX true``); synthetic images then have varied landscape aspects (width 4:3 of
the short side up to the SCALES long side) so that per-batch padding has something to save.

    # base VCR config shrunk for 2 CPU cores: the same encoder and tokens per sample, a small image part
    python bench/throughput.py --synthetic --steps 3 --accumulate 4 --opts SCALES "[128,192]" \
        TRAIN.BATCH_IMAGES 1 NETWORK.IMAGE_NUM_LAYERS 18 NETWORK.IMAGE_ROI_POOLED_SIZE 4 \
        NETWORK.IMAGE_C5_DILATED false DATASET.MASK_SIZE 2
    # the demo with a ViT image encoder of about the ResNet-18's FLOPs (cfgs/vcr/demo_q2a_vit_cpu.yaml's)
    python bench/throughput.py --cfg cfgs/vcr/demo_q2a_cpu.yaml --synthetic --steps 2 --encoder vit --opts \
        NETWORK.IMAGE_VIT_ARCH vit_tiny_patch16_224 NETWORK.IMAGE_VIT_ARCH_KWARGS "[['patch_size',12]]" DATASET.MASK_SIZE 4
    # the demo config, bf16 (its data loader when data/demo exists: drop --synthetic)
    python bench/throughput.py --cfg cfgs/vcr/demo_q2a_cpu.yaml --synthetic --precision bf16
    # a GPU
    python bench/throughput.py --device cuda --precision bf16 --synthetic --steps 20
    # the fixed image canvas against per-batch padding, demo config
    python bench/throughput.py --cfg cfgs/vcr/demo_q2a_cpu.yaml --synthetic --steps 2 --padding-cost
"""
import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_CFG = "cfgs/vcr/base_q2a_4x16G_fp16.yaml"
PRECISIONS = {"fp32": ["TRAIN.FP16", "False"], "fp16": ["TRAIN.FP16", "True", "TRAIN.FP16_DTYPE", "float16"],
              "bf16": ["TRAIN.FP16", "True", "TRAIN.FP16_DTYPE", "bfloat16"]}
# Random weights: the speed does not depend on them and the bench needs no downloaded files.
RANDOM_INIT = ["NETWORK.PARTIAL_PRETRAIN", "", "NETWORK.IMAGE_PRETRAINED", "", "NETWORK.BERT_MODEL_NAME", ""]
# Dense bf16/fp16 tensor-core peaks from the datasheets (FLOP/s, without sparsity), by device name.
DATASHEET_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12,
                  "V100": 125e12, "T4": 65e12, "L4": 121e12, "RTX 4090": 165e12, "RTX 3090": 71e12}
# Synthetic VCR Q->A items: inclusive ranges of word pieces and objects.
QUESTION_LEN, ANSWER_LEN, OBJECTS = (6, 20), (5, 20), (4, 24)
NUM_CHOICES = 4
DISTINCT_BATCHES = 8
# The paths timed against each other: (baseline, ours) of the printed ratio.
BATCH_MAX = "batch_max"  # ours with DATASET.PAD_TO_BATCH_MAX true
PAIRS = {False: ("reference", "ours"), True: (BATCH_MAX, "ours")}


# --------------------------------------------------------------------------------------------- #
# What both paths share
# --------------------------------------------------------------------------------------------- #
def load_cfg(args):
    """The frozen VCR config of ``args.cfg`` with random init, the precision, the image encoder of ``--encoder``
    and the user's --opts."""
    from common.modeling.image_encoder import switch_encoder_opts
    from common.task import get_task
    import vcr.task  # noqa: F401  (registers the task)
    task = get_task("vcr")
    encoder = switch_encoder_opts(task.defaults(), args.encoder) if args.encoder else []
    opts = (RANDOM_INIT + PRECISIONS[args.precision] + ["NUM_WORKERS_PER_GPU", str(args.workers)] + encoder
            + list(args.opts))
    if args.accumulate_run:
        opts += ["TRAIN.GRAD_ACCUMULATE_STEPS", str(args.accumulate_run)]
    return task, task.load_config(os.path.join(ROOT, args.cfg) if not os.path.isabs(args.cfg) else args.cfg, opts)


def path_cfg(cfg, impl):
    """The config of path ``impl``: ``cfg``, with ``DATASET.PAD_TO_BATCH_MAX`` set for :data:`BATCH_MAX`."""
    if impl != BATCH_MAX:
        return cfg
    cfg = cfg.clone()
    cfg.defrost()
    cfg.DATASET.PAD_TO_BATCH_MAX = True
    cfg.freeze()
    return cfg


def synthetic_items(cfg, count, seed=0, varied=False, longest=False):
    """``count`` VCR Q->A training items (tuples in the dataset's ``data_names`` order) of realistic sizes;
    images 3:2, or of widths drawn from 4:3 of the short side to the SCALES long side when ``varied``;
    ``longest``: every question, answer and object count at the top of its range (no padding in a batch).

    Raises:
        ValueError: a config whose task is not Q2A (the items hold answers, not rationales).
    """
    if cfg.DATASET.TASK != "Q2A":
        raise ValueError("--synthetic builds Q2A items; the config has DATASET.TASK {}".format(cfg.DATASET.TASK))
    g = torch.Generator().manual_seed(seed)
    short = int(cfg.SCALES[0]) if cfg.SCALES else 600
    long_side = int(cfg.SCALES[1]) if len(cfg.SCALES) > 1 else 1000
    height, width = short, min(long_side, short * 3 // 2)
    mask = int(cfg.DATASET.MASK_SIZE)
    vocab = cfg.NETWORK.VLBERT.vocab_size
    image_box = cfg.DATASET.ADD_IMAGE_AS_A_BOX

    def randint(lo, hi):
        return hi if longest else int(torch.randint(lo, hi + 1, (1,), generator=g))

    def text(length, boxes):
        ids = torch.randint(1000, vocab, (length,), generator=g)
        tags = torch.where(torch.rand(length, generator=g) < 0.2, torch.randint(0, boxes, (length,), generator=g),
                           torch.full((length,), 0 if image_box else -1))
        return torch.stack([ids, tags, torch.arange(length)], 1)

    items = []
    for index in range(count):
        if varied:
            width = randint(short * 4 // 3, long_side)
        objects = randint(*OBJECTS) + int(image_box)
        xy = torch.rand(objects, 2, generator=g) * torch.tensor([width * 0.7, height * 0.7])
        wh = 8 + torch.rand(objects, 2, generator=g) * torch.tensor([width * 0.3 - 8, height * 0.3 - 8])
        boxes = torch.cat([xy, xy + wh, torch.ones(objects, 1), torch.randint(1, 81, (objects, 1), generator=g)], 1)
        if image_box:
            boxes[0] = torch.tensor([0, 0, width - 1, height - 1, 1, 0])
        question = text(randint(*QUESTION_LEN), objects)
        answers = [text(randint(*ANSWER_LEN), objects) for _ in range(NUM_CHOICES)]
        items.append((torch.rand(3, height, width, generator=g), boxes, torch.ones(objects, mask, mask), question,
                      torch.eye(len(question)), answers, [torch.eye(len(a)) for a in answers],
                      torch.tensor(randint(0, NUM_CHOICES - 1)),
                      torch.tensor([width, height, 1.0, 1.0, index], dtype=torch.float32)))
    return items


class Batches:
    """``n`` batches, with a ``len()`` (what the Trainer needs): from a list, or the first ``n`` of a loader."""

    def __init__(self, source, n):
        self.source, self.n = source, n

    def __len__(self):
        return self.n

    def __iter__(self):
        it = iter(self.source)
        for _ in range(self.n):
            yield next(it)


def make_batches(task, cfg, args, n):
    """``n`` micro-batches: synthetic ones (``DISTINCT_BATCHES`` collated once and cycled: no data time, and
    the same host memory whatever ``n``), or the first ``n`` of the train loader."""
    if args.synthetic:
        from common.data.collate import BatchCollator, canvas_scales
        b = int(cfg.TRAIN.BATCH_IMAGES)
        items = synthetic_items(cfg, b * DISTINCT_BATCHES, varied=args.padding_cost)
        names = ["image", "boxes", "masks", "question", "question_align_matrix", "answer_choices",
                 "answer_align_matrix", "answer_label", "im_info"]
        collate = BatchCollator(names, scales=canvas_scales(cfg))
        distinct = [collate(items[i * b:(i + 1) * b]) for i in range(DISTINCT_BATCHES)]
        return Batches(itertools.cycle(distinct), n)
    from common.engine import build_loader
    loader = build_loader(task, cfg, "train")
    if len(loader) < n:
        raise ValueError("the train loader has {} batches, the bench needs {} (fewer --steps or --synthetic)"
                         .format(len(loader), n))
    return Batches(loader, n)


class ReferenceEncoder(torch.nn.Module):
    """``pytorch_pretrained_bert``'s BertEncoder with the weights of ``ours``, called like ours."""

    def __init__(self, ours, vl):
        super().__init__()
        from pytorch_pretrained_bert.modeling import BertConfig, BertEncoder
        config = BertConfig(vl.vocab_size, hidden_size=vl.hidden_size, num_hidden_layers=vl.num_hidden_layers,
                            num_attention_heads=vl.num_attention_heads, intermediate_size=vl.intermediate_size,
                            hidden_act=vl.hidden_act, hidden_dropout_prob=vl.hidden_dropout_prob,
                            attention_probs_dropout_prob=vl.attention_probs_dropout_prob)
        self.inner = BertEncoder(config)
        self.inner.load_state_dict(ours.state_dict())

    def forward(self, hidden_states, attention_mask, output_all_encoded_layers=True, output_attention_probs=False):
        if output_attention_probs:
            raise ValueError("the reference encoder does not return attention probabilities")
        return self.inner(hidden_states, attention_mask, output_all_encoded_layers)


class Recorder:
    """Trainer hook and encoder pre-hook: per micro-batch timings and the real / padded encoder tokens."""

    def __init__(self):
        self.timings, self.samples, self.lens, self.padded = [], 0, [], 0

    def encoder_pre_hook(self, module, inputs):
        bias = inputs[1]  # [S, 1, 1, L] additive mask, 0 on real tokens
        self.lens.extend((bias[:, 0, 0, :] > -5000).sum(1).tolist())
        self.padded += bias.shape[0] * bias.shape[-1]

    # HookBase protocol (duck-typed: the Trainer calls these by name)
    def before_train(self, ctx): pass
    def before_epoch(self, ctx): pass
    def after_step(self, ctx): pass
    def after_epoch(self, ctx): pass
    def after_train(self, ctx): pass

    def after_batch(self, ctx):
        self.timings.append(ctx.record.timings)
        self.samples += ctx.record.samples


def synced(fn, device):
    """``fn`` followed by a device sync on CUDA, so per-phase wall times are the device's."""
    if device.type != "cuda":
        return fn

    def call(*a, **k):
        out = fn(*a, **k)
        torch.cuda.synchronize(device)
        return out
    return call


def resnet_flops_per_image(model, batch, autocast, device):
    """Forward + backward FLOPs of the image encoder (``image_feature_extractor``) per image, or 0."""
    from torch.utils.flop_counter import FlopCounterMode
    extractor = getattr(model, "image_feature_extractor", None)
    if extractor is None:
        return 0
    with FlopCounterMode(display=False) as counter:
        with autocast():
            _, loss = model(*batch)
        loss.mean().backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts()
    names = [n for n in counts if n.endswith("image_feature_extractor")]
    return sum(sum(counts[n].values()) for n in names) / batch[0].shape[0]


# --------------------------------------------------------------------------------------------- #
# One measured run (a child process)
# --------------------------------------------------------------------------------------------- #
class Path:
    """One implementation set up for timed steps: model, optimizer, precision, batches, recorder.

    ``impl``: ``'reference'``, ``'ours'`` or :data:`BATCH_MAX` (ours on :func:`path_cfg`'s batches)."""

    def __init__(self, impl, task, cfg, args, device):
        cfg = path_cfg(cfg, impl)
        from common.compile import compile_forward
        from common.diagnostics.flops import dense_weight_count
        from common.engine import build_model, build_precision
        from common.optim import BertAdamW, build_optimizer

        torch.manual_seed(0)  # both paths start from the same weights
        self.impl, self.cfg, self.device = impl, cfg, device
        self.model = build_model(task, cfg, device)
        bert = self.model.vlbert._module
        self.dense = dense_weight_count(bert.encoder)
        if impl == "reference":
            bert.encoder = ReferenceEncoder(bert.encoder, cfg.NETWORK.VLBERT).to(device)
        self.optimizer = build_optimizer(cfg, self.model)
        if impl == "reference" and isinstance(self.optimizer, BertAdamW):
            self.optimizer.foreach = False
        elif impl == "reference":
            for group in self.optimizer.param_groups:
                group["foreach"] = False
        if impl != "reference":  # TRAIN.COMPILE is ours to offer; the reference ran eager
            compile_forward(self.model, cfg.TRAIN.COMPILE)
        self.forward = self.model.forward
        self.autocast, self.scaler = build_precision(cfg, device)
        self.k = int(cfg.TRAIN.GRAD_ACCUMULATE_STEPS)
        self.recorder = Recorder()
        bert.encoder.register_forward_pre_hook(self.recorder.encoder_pre_hook)
        self.batches = iter(make_batches(task, cfg, args, (args.warmup + args.steps) * self.k))
        self.first = lambda: next(iter(make_batches(task, cfg, args, 1)))
        self.wall = 0.0

    def resnet_flops(self):
        from common.data.collate import to_device
        return resnet_flops_per_image(self.model, to_device(list(self.first()), self.device), self.autocast,
                                      self.device)

    def train(self, n_steps, timed):
        """``n_steps`` optimizer steps through the Trainer; their wall time counts when ``timed``."""
        import logging
        from common.trainer import Trainer
        model = self.model
        model.forward = synced(self.forward, self.device)
        self.scaler.backward = synced(type(self.scaler).backward.__get__(self.scaler), self.device)
        trainer = Trainer(model, self.optimizer, Batches(self.batches, n_steps * self.k), scaler=self.scaler,
                          autocast=self.autocast, hooks=[self.recorder] if timed else [],
                          grad_accumulate_steps=self.k, clip_grad_norm=self.cfg.TRAIN.CLIP_GRAD_NORM,
                          logger=logging.getLogger("bench"))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        trainer.train(0, 1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if timed:
            self.wall += time.perf_counter() - start

    def report(self, resnet_flops, peak):
        from common.diagnostics.flops import encoder_train_flops
        vl, rec = self.cfg.NETWORK.VLBERT, self.recorder
        split = [sum(t[i] for t in rec.timings) for i in range(6)]
        return {"impl": self.impl, "k": self.k, "wall_s": self.wall, "samples": rec.samples,
                "tokens": sum(rec.lens), "padded_tokens": rec.padded,
                "data_s": split[0], "forward_s": split[2], "backward_s": split[3], "optimizer_s": split[4],
                "other_s": self.wall - split[0] - split[2] - split[3] - split[4], "peak_mib": peak,
                "encoder_flops": encoder_train_flops(self.dense, rec.lens, vl.num_hidden_layers, vl.hidden_size),
                "resnet_flops_per_image": resnet_flops, "batch_images": int(self.cfg.TRAIN.BATCH_IMAGES),
                "image_encoder": self.cfg.NETWORK.IMAGE_ENCODER,
                "layers": vl.num_hidden_layers, "hidden": vl.hidden_size, "dense_weights": self.dense}


def peak_memory_mib(device):
    """CUDA: max allocated since the last reset; CPU: the process's peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10


def run_worker(args):
    """``--worker both``: both paths in this process, their optimizer steps alternating (a busy machine
    slows both alike); prints a JSON list. ``--worker ours|reference``: one path alone, for its peak memory;
    prints a JSON dict."""
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task, cfg = load_cfg(args)
    impls = list(PAIRS[args.padding_cost]) if args.worker == "both" else [args.worker]
    paths = [Path(impl, task, cfg, args, device) for impl in impls]
    flops = paths[-1].resnet_flops() if args.worker == "both" else 0
    for path in paths:
        path.train(args.warmup, timed=False)
        path.recorder.__init__()  # count the timed steps' tokens only
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        for path in (paths if step % 2 == 0 else paths[::-1]):
            path.train(1, timed=True)
    reports = [p.report(flops, peak_memory_mib(device)) for p in paths]
    print(json.dumps(reports if args.worker == "both" else reports[0]))


# --------------------------------------------------------------------------------------------- #
# The parent: rounds, matmul peak, table
# --------------------------------------------------------------------------------------------- #
def matmul_peak(device, precision, threads, seconds=2.0):
    """FLOP/s of a large square matmul in the run's dtype on ``device`` (the best of repeated runs)."""
    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32  # autocast on the CPU runs fp16 matmuls slowly; the fp32 peak is the bound
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end or best == 0.0:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(4 if device.type == "cuda" else 1):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, (4 if device.type == "cuda" else 1) * 2 * n ** 3 / (time.perf_counter() - t))
    return best


def datasheet_peak(device, precision):
    """The datasheet's dense fp16/bf16 peak of this GPU, or None (CPU, fp32, unknown name)."""
    if device.type != "cuda" or precision == "fp32":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in DATASHEET_PEAK.items() if k in name), None)


def child(args, impl, accumulate=0, steps=None):
    """Run ``--worker impl`` in a fresh process (``steps`` timed steps after no warm-up when given)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--accumulate-run", str(accumulate)]
    if steps is not None:
        cmd += ["--steps-override", str(steps)]
    cmd += sys.argv[1:]  # last: it may end with --opts
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit("error: the {} run failed (exit {})".format(impl, done.returncode))
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(r, peak, sheet):
    """Figures of one run (a JSON dict of :func:`run_worker`)."""
    wall = r["wall_s"]
    flops_per_sample = r["encoder_flops"] / r["samples"] + r["resnet_flops_per_image"]
    achieved = flops_per_sample * r["samples"] / wall
    return {"samples/s": r["samples"] / wall, "tokens/s": r["tokens"] / wall,
            "data %": 100 * r["data_s"] / wall, "fwd %": 100 * r["forward_s"] / wall,
            "bwd %": 100 * r["backward_s"] / wall, "opt %": 100 * r["optimizer_s"] / wall,
            "other %": 100 * r["other_s"] / wall, "peak MiB": r["peak_mib"],
            "GFLOP/sample": flops_per_sample / 1e9, "TFLOP/s": achieved / 1e12,
            "MFU meas. %": 100 * achieved / peak, "MFU sheet %": 100 * achieved / sheet if sheet else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", default=DEFAULT_CFG, help="VCR config (default %(default)s)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32", choices=sorted(PRECISIONS))
    parser.add_argument("--synthetic", action="store_true", help="synthetic batches of VCR sizes, no loader")
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed optimizer steps first")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--workers", type=int, default=0, help="NUM_WORKERS_PER_GPU of the loader")
    parser.add_argument("--accumulate", type=int, default=0, help="also measure the memory of K vs 1 micro-batches")
    parser.add_argument("--encoder", choices=["resnet", "vit"],
                        help="image encoder (NETWORK.IMAGE_ENCODER) instead of the config's; the ViT's size from "
                             "--opts NETWORK.IMAGE_VIT_ARCH / IMAGE_VIT_ARCH_KWARGS (default ViT-B/16)")
    parser.add_argument("--padding-cost", action="store_true",
                        help="time ours with the fixed image canvas against ours with per-batch image padding")
    parser.add_argument("--json", metavar="FILE", help="also write the figures printed as JSON to FILE")
    parser.add_argument("--opts", nargs=argparse.REMAINDER, default=[], help="config overrides KEY VALUE ...")
    parser.add_argument("--worker", choices=["ours", "reference", BATCH_MAX, "both"], help=argparse.SUPPRESS)
    parser.add_argument("--accumulate-run", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps-override", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps_override is not None:  # a memory run: one step, no warm-up
        args.steps, args.warmup = args.steps_override, 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no GPU")
    if args.worker:
        return run_worker(args)

    device = torch.device(args.device)
    base_impl, _ = PAIRS[args.padding_cost]
    timed = {r["impl"]: r for r in child(args, "both")}
    for impl in (base_impl, "ours"):  # each alone in a process: its own peak memory
        timed[impl]["peak_mib"] = child(args, impl, steps=1)["peak_mib"]
    peak = matmul_peak(device, args.precision, args.threads)
    sheet = datasheet_peak(device, args.precision)
    rows = {impl: summarise(r, peak, sheet) for impl, r in timed.items()}
    ref, ours = timed[base_impl], timed["ours"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, {} threads".format(args.threads)
    print("{} | {} | {} | {} | micro-batch {} x k={} | {} timed optimizer steps per path, alternating".format(
        args.cfg, " ".join(args.opts) or "no --opts", args.precision, name, ours["batch_images"], ours["k"],
        args.steps))
    print("encoder: {} layers x {} hidden, {:.1f} M dense weights; real tokens/sample {:.0f}, padded {:.0f} "
          "(reference computes those); image encoder ({}) {:.2f} GFLOP/image (fwd+bwd); matmul peak measured "
          "{:.2f} TFLOP/s{}"
          .format(ours["layers"], ours["hidden"], ours["dense_weights"] / 1e6, ours["tokens"] / ours["samples"],
                  ours["padded_tokens"] / ours["samples"], ours["image_encoder"], ours["resnet_flops_per_image"] / 1e9,
                  peak / 1e12,
                  ", datasheet {:.0f}".format(sheet / 1e12) if sheet else ""))
    cols = list(rows["ours"])
    print("{:<10}".format("path") + "".join("{:>14}".format(c) for c in cols))
    for impl in (base_impl, "ours"):
        print("{:<10}".format(impl) + "".join(
            "{:>14}".format("-" if v is None else "{:.3g}".format(v)) for v in rows[impl].values()))
    print("{}: {:.2f}x samples/s, peak memory ratio {:.2f}".format(
        "fixed canvas / per-batch padding (ours both)" if args.padding_cost else "ours / reference",
        ref["wall_s"] / ours["wall_s"], ours["peak_mib"] / ref["peak_mib"]))
    figures = {"device": name, "precision": args.precision, "micro_batch": ours["batch_images"], "k": ours["k"],
               "steps": args.steps, "matmul_peak_tflops": peak / 1e12,
               "datasheet_peak_tflops": sheet / 1e12 if sheet else None, "paths": rows, "ratio": ref["wall_s"] / ours["wall_s"], "peak_memory_ratio": ours["peak_mib"] / ref["peak_mib"]}
    if args.accumulate:
        one, many = child(args, "ours", 1, steps=1), child(args, "ours", args.accumulate, steps=1)
        print("accumulation: peak memory k={} {:.0f} MiB, k=1 {:.0f} MiB, ratio {:.3f} (target <= 1.05)".format(
            args.accumulate, many["peak_mib"], one["peak_mib"], many["peak_mib"] / one["peak_mib"]))
        figures["accumulation_memory_ratio"] = many["peak_mib"] / one["peak_mib"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
