"""BertAdamW with its moments stored in bf16 (``TRAIN.OPTIM_STATE_DTYPE: 'bfloat16'``) against fp32 moments,
on the parameters of timm's ``vit_base_patch16_224`` (random init, nothing downloaded: 86.6 M weights).
Prints the optimizer-state memory ratio bf16 / fp32 (bytes of the state tensors after the first step) and
the step time ratio (the two optimizers step alternately; medians compared), measured in one run.

timm is a bench-only dependency (the engine does not import it): ``pip install 'timm>=1.0'``.

    python bench/optim_state.py [--device cpu|cuda] [--steps 7] [--threads 2] [--foreach auto|on|off]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.adamw_step import step_times  # noqa: E402
from common.optim import BertAdamW  # noqa: E402


def vit_params(device):
    """ViT-B/16's weights (fp32) with fixed random gradients: one fresh set per optimizer."""
    import timm
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False)
    ps = [p.detach().to(device).requires_grad_(True) for p in model.parameters()]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def state_bytes(opt):
    """Bytes held by the optimizer's state tensors (the moments; the int step counters are not tensors)."""
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--foreach", default="auto", choices=["auto", "on", "off"],
                        help="BertAdamW's foreach: auto = multi-tensor on CUDA, per-tensor loop on the CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    foreach = {"auto": None, "on": True, "off": False}[args.foreach]
    opts = {name: BertAdamW(vit_params(device), lr=5e-4, weight_decay=0.05, foreach=foreach, state_dtype=dtype)
            for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    step = step_times(opts, args.steps, device)
    params = opts["float32"].param_groups[0]["params"]
    n = sum(p.numel() for p in params)
    mem = {name: state_bytes(opt) for name, opt in opts.items()}
    print("BertAdamW on vit_base_patch16_224: {:.1f} M weights in {} tensors, {} ({} threads), foreach {}, "
          "median of {} steps".format(n / 1e6, len(params), args.device, args.threads, args.foreach, args.steps))
    for name in opts:
        print("  state {:8s}: {:7.1f} MiB   step {:8.1f} ms".format(name, mem[name] / 2 ** 20, 1e3 * step[name]))
    print("  memory ratio bf16/fp32 (optimizer state): {:.3f}".format(mem["bfloat16"] / mem["float32"]))
    print("  memory ratio bf16/fp32 (state + fp32 weights + fp32 grads): {:.3f}".format(
        (mem["bfloat16"] + 8 * n) / (mem["float32"] + 8 * n)))
    print("  step time ratio bf16/fp32: {:.2f}".format(step["bfloat16"] / step["float32"]))


if __name__ == "__main__":
    main()
