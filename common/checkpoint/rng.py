"""The RNG states of a process (python, numpy, torch CPU and CUDA) as plain values: a checkpoint holds one
per rank so that a resumed run continues each rank's random stream (:mod:`common.checkpoint.checkpointer`)."""
import random

import numpy as np
import torch


def rng_state():
    """This process's RNG states (python, numpy, torch CPU, every CUDA device) as plain values."""
    bit_generator, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"bit_generator": bit_generator, "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state):
    """Restore :func:`rng_state` (CUDA states only for devices present on both sides)."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    npst = state["numpy"]
    np.random.set_state((npst["bit_generator"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state["cuda"]:
        n = min(len(state["cuda"]), torch.cuda.device_count())
        torch.cuda.set_rng_state_all(state["cuda"][:n])
