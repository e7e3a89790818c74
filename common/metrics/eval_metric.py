"""Running metrics with the reference's interface: ``update(outputs)``, ``get()``, ``reset()``.

A metric keeps two sums, ``sum_metric`` and ``num_inst`` (tensors or numbers; tensors may live
on the GPU so ``update`` never waits for the device). ``get()`` returns their ratio; when a
process group is initialised and ``allreduce`` is on, both sums are all-reduced first so every
rank reports the global value. ``get()`` is then a collective: call it on every rank.
"""
import torch
import torch.distributed as dist


def _all_reduce_sums(sums: torch.Tensor) -> torch.Tensor:
    """Sum a small float64 CPU tensor over all ranks (through the current GPU for NCCL)."""
    if dist.get_backend() == "nccl":
        sums = sums.cuda()
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums.cpu()


class EvalMetric:
    """Base class: a subclass implements ``update(outputs)`` adding to ``sum_metric`` / ``num_inst``.

    Add out of place (``self.sum_metric = self.sum_metric + correct``) so a GPU tensor can join
    the CPU zero that ``reset`` puts there.

    Args:
        name: display name (``Train-<name>``, ``Val-<name>``).
        allreduce: sum over ranks in ``get()`` when a process group exists.
    """

    def __init__(self, name: str, allreduce: bool = True):
        self.name = str(name)
        self.allreduce = allreduce
        self.reset()

    def __str__(self):
        return "EvalMetric: {}".format(dict(self.get_name_value()))

    def update(self, outputs: dict) -> None:
        """Add one batch: ``outputs`` is the dict the model returned."""
        raise NotImplementedError

    def reset(self) -> None:
        self.sum_metric = torch.tensor(0., dtype=torch.float64)
        self.num_inst = torch.tensor(0., dtype=torch.float64)

    def get(self):
        """``(name, value)``: ``sum_metric / num_inst`` over all ranks; nan before any update."""
        sums = torch.stack([torch.as_tensor(self.sum_metric, dtype=torch.float64).detach().cpu(),
                            torch.as_tensor(self.num_inst, dtype=torch.float64).detach().cpu()])
        if self.allreduce and dist.is_available() and dist.is_initialized():
            sums = _all_reduce_sums(sums)
        total, count = sums.tolist()
        return self.name, (total / count if count else float("nan"))

    def get_name_value(self):
        """``[(name, value), ...]``."""
        name, value = self.get()
        if not isinstance(name, list):
            name, value = [name], [value]
        return list(zip(name, value))
