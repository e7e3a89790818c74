"""Facts about the CPU kernels PyTorch picked on this machine, for tests that depend on them."""
import functools

import torch
import torch.nn.functional as F

CPU_BF16_SDPA_BUG = (
    "PyTorch's bf16 CPU scaled_dot_product_attention fails on this machine ('pack_vnni2 is only supported when "
    "avx512 is supported'): an AMX processor with ATEN_CPU_CAPABILITY forced below avx512 (seen with torch 2.14.1); "
    "not our code, and the same call works with the kernels PyTorch picks by itself")


@functools.lru_cache(maxsize=None)
def cpu_bf16_sdpa_broken():
    """True when a bf16 ``F.scaled_dot_product_attention`` of 97 tokens raises on the CPU (the PyTorch bug of
    :data:`CPU_BF16_SDPA_BUG`; sequences of ~97 tokens or more take the flash kernel that trips it)."""
    q = torch.zeros(1, 1, 97, 8, dtype=torch.bfloat16)
    try:
        F.scaled_dot_product_attention(q, q, q)
    except RuntimeError as e:
        if "pack_vnni2" in str(e):
            return True
        raise
    return False
