"""Which ``scaled_dot_product_attention`` kernel runs in our VL-BERT encoder and in the cls task's ViT, per autocast
dtype: the one PyTorch picks (the ``aten::_scaled_dot_product_*`` op in the profiler's trace of a forward +
backward), and which of flash / memory-efficient / cuDNN / math can run these inputs at all (each forced in
turn with ``torch.nn.attention.sdpa_kernel``; a refused one gives PyTorch's reason).

Inputs: the base Q->A config's encoder (12 x 768, 12 heads) on 4 sequences of 226 tokens with key padding (the
additive mask our encoder passes, ``attention_bias``), and ViT-B/16 at 224 px (``cfgs/cls/vit_base16_cifar100_1x24G
_fp16.yaml``) on a batch of 8; ``--tiny``: 2 x 32 encoder, bench/vit_step.py's tiny ViT (a CPU check).

    python bench/sdpa_backend.py [--device cpu|cuda] [--tiny] [--json FILE]
"""
import argparse
import json
import os
import re
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

# Profiler op name (prefix) -> backend; the CPU's flash kernel is its own op.
OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
       "aten::_scaled_dot_product_flash_attention": "flash",
       "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
       "aten::_scaled_dot_product_cudnn_attention": "cudnn",
       "aten::_scaled_dot_product_attention_math": "math"}
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "mem-efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
VCR_CFG = "cfgs/vcr/base_q2a_4x16G_fp16.yaml"
VIT_CFG = "cfgs/cls/vit_base16_cifar100_1x24G_fp16.yaml"


def vlbert_step(device, tiny):
    """A forward + backward of our BertEncoder (the config's VLBERT node) on padded sequences."""
    from common.modeling.nlp.modeling import BertEncoder, attention_bias
    from vcr.task import TASK

    opts = ["NETWORK.VLBERT.hidden_size", "32", "NETWORK.VLBERT.num_hidden_layers", "2",
            "NETWORK.VLBERT.num_attention_heads", "2", "NETWORK.VLBERT.intermediate_size", "64"] if tiny else []
    vl = TASK.load_config(VCR_CFG, opts).NETWORK.VLBERT
    encoder = BertEncoder(vl).to(device).train()
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([226, 201, 180, 150])
    mask = torch.arange(226)[None, :] < lengths[:, None]
    x = torch.randn(4, 226, vl.hidden_size, generator=g).to(device).requires_grad_(True)
    bias = attention_bias(mask).to(device)

    def step():
        encoder(x, bias, output_all_encoded_layers=False)[-1].float().sum().backward()
    return step


def vit_step(device, tiny):
    """A forward + backward of the cls task's model (a timm ViT) on random images."""
    from bench.vit_step import TINY
    from cls.task import TASK
    from common.engine import build_model

    cfg = TASK.load_config(VIT_CFG, TINY if tiny else [])
    model = build_model(TASK, cfg, device).train()
    size, batch = cfg.DATASET.IMAGE_SIZE, 8
    images = torch.randn(batch, 3, size, size, device=device)
    labels = torch.randint(0, cfg.NETWORK.NUM_CLASSES, (batch,), device=device)

    def step():
        model(images, labels, torch.arange(batch, device=device))[1].float().sum().backward()
    return step


def kernels_run(step, device, dtype):
    """Backends whose op appears in the profiler's trace of ``step`` under autocast ``dtype``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.autocast(device.type, dtype=dtype):
        step()
    names = {e.key for e in prof.key_averages()}
    # the longest matching prefix names the op ('..._flash_attention_for_cpu' before '..._flash_attention')
    found = {OPS[max((p for p in OPS if n == p or n.startswith(p + "_backward")), key=len)]
             for n in names if any(n == p or n.startswith(p + "_backward") for p in OPS)}
    return sorted(found)


def kernels_possible(step, device, dtype):
    """({backend: True}, {backend: reason}) of each backend forced alone for ``step``."""
    possible, refused = [], {}
    for name, backend in BACKENDS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]), torch.autocast(device.type, dtype=dtype):
                    step()
                possible.append(name)
            except (RuntimeError, NotImplementedError) as e:
                why = [re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", str(w.message)) for w in caught
                       if "kernel" in str(w.message).lower()]
                refused[name] = " / ".join(why + [str(e).splitlines()[0]])[:400]
    return possible, refused


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tiny", action="store_true", help="tiny models (a CPU check of the bench)")
    parser.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtypes = ["bf16", "fp16"] if device.type == "cuda" else ["bf16"]
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "models": {}}
    for model, make in (("vlbert", vlbert_step), ("vit", vit_step)):
        torch.manual_seed(0)
        step = make(device, args.tiny)
        result["models"][model] = {}
        for dtype in dtypes:
            ran = kernels_run(step, device, DTYPES[dtype])
            possible, refused = kernels_possible(step, device, DTYPES[dtype])
            result["models"][model][dtype] = {"ran": ran, "possible": possible, "refused": refused}
            print("{:7s} {}: ran {}; possible {}".format(model, dtype, "+".join(ran) or "no SDPA op",
                                                       "+".join(possible) or "none"))
            for name, why in refused.items():
                print("          {} refused: {}".format(name, why))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
