"""Forward+backward speed and peak memory of our BERT encoder vs pytorch_pretrained_bert's BertEncoder.

Same weights (ours loads the baseline's state dict), same padded batch, fp32, each implementation in its
own process. Memory: on CPU, the bytes of the distinct non-parameter tensors autograd keeps for the
backward pass (the activation memory at the forward/backward boundary, where the step's memory peaks;
weights and gradients are the same for both); on CUDA, ``torch.cuda.max_memory_allocated`` above the
memory held before the step.

    .venv/bin/python bench/encoder_speed.py --threads 2            # BERT-base, batch 8, 128 tokens, CPU
    .venv/bin/python bench/encoder_speed.py --device cuda --batch 32
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, hidden_act='gelu',
            hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, max_position_embeddings=512,
            type_vocab_size=2, initializer_range=0.02)


def build(impl):
    """The baseline encoder (seeded init) or ours with the baseline's weights, in train mode."""
    from pytorch_pretrained_bert.modeling import BertConfig, BertEncoder as ReferenceEncoder
    torch.manual_seed(0)
    reference = ReferenceEncoder(BertConfig(30522, **BASE))
    if impl == 'reference':
        return reference
    from types import SimpleNamespace
    from common.modeling.nlp.modeling import BertEncoder
    ours = BertEncoder(SimpleNamespace(**BASE))
    ours.load_state_dict(reference.state_dict())
    return ours


def batch(args, device):
    from common.modeling.nlp.modeling import attention_bias
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(args.batch, args.tokens, BASE['hidden_size'], generator=g)
    # Realistic padding: lengths spread between half and all of the tokens.
    lengths = torch.linspace(args.tokens // 2, args.tokens, args.batch).long()
    mask = torch.arange(args.tokens)[None] < lengths[:, None]
    return hidden.to(device), attention_bias(mask).to(device)


def run_one(args):
    """Time ``args.steps`` forward+backward steps of one implementation; print a JSON line."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = build(args.impl).to(device).train()
    hidden, bias = batch(args, device)

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    def step():
        x = hidden.clone().requires_grad_(True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x, bias, output_all_encoded_layers=False)[-1]
        out.float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)

    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize()

    torch.manual_seed(2)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
    step()
    activation_mib = sum(saved.values()) / 2 ** 20
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    peak_mib = (torch.cuda.max_memory_allocated() - base_alloc) / 2 ** 20 if device.type == 'cuda' else activation_mib
    times.sort()
    print(json.dumps({'impl': args.impl, 'median_s': times[len(times) // 2], 'min_s': times[0],
                      'peak_extra_mib': peak_mib}))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--tokens', type=int, default=128)
    parser.add_argument('--steps', type=int, default=5, help='timed forward+backward steps')
    parser.add_argument('--warmup', type=int, default=1, help='untimed steps after the first one')
    parser.add_argument('--threads', type=int, default=2, help='torch CPU threads')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--impl', choices=('ours', 'reference'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.impl:
        return run_one(args)

    results = {}
    for impl in ('reference', 'ours'):
        cmd = [sys.executable, os.path.abspath(__file__), '--impl', impl] + sys.argv[1:]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[impl] = json.loads(out.strip().splitlines()[-1])
    ref, ours = results['reference'], results['ours']
    valid = int(torch.linspace(args.tokens // 2, args.tokens, args.batch).long().sum())
    print("BERT-base encoder, batch {} x {} tokens ({} valid, rest padding), fp32, {} ({} threads), "
          "forward+backward, median of {}".format(args.batch, args.tokens, valid, args.device, args.threads,
                                                  args.steps))
    memory = 'activations kept for backward' if args.device == 'cpu' else 'peak memory above weights'
    print("  pytorch_pretrained_bert BertEncoder: {:8.3f} s/step   {} {:8.1f} MiB".format(
        ref['median_s'], memory, ref['peak_extra_mib']))
    print("  ours (SDPA, fused ops, no padding):  {:8.3f} s/step   {} {:8.1f} MiB".format(
        ours['median_s'], memory, ours['peak_extra_mib']))
    print("  speed-up: {:.2f}x   memory ratio (ours / reference): {:.2f}".format(
        ref['median_s'] / ours['median_s'], ours['peak_extra_mib'] / max(ref['peak_extra_mib'], 1e-9)))


if __name__ == '__main__':
    main()
