"""Gradient accumulation keeps no graph alive: after every micro-batch of the real Trainer, no tensor
that autograd saved for a backward is still referenced (peak memory with k micro-batches of b stays that
of one micro-batch of b; bench/throughput.py --accumulate measures it)."""
import weakref

import pytest
import torch

from common.hooks.base import HookBase
from common.trainer import Trainer


class Net(torch.nn.Module):
    """x [B, 8] -> (outputs, loss); ``leak=True`` keeps its hidden activation (the bug the check must catch)."""

    def __init__(self, leak=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.leak = torch.nn.Linear(8, 32), torch.nn.Linear(32, 1), leak

    def forward(self, x):
        hidden = torch.relu(self.fc1(x))
        if self.leak:
            self.kept = hidden
        out = self.fc2(hidden)
        return {"out": out}, out.pow(2).mean()


class FreshBatches:
    """``n`` batches made on the fly (nothing but the loop holds them)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            yield (torch.randn(4, 8),)


class LiveSavedTensors(HookBase):
    """After each micro-batch, counts the tensors autograd saved that are still alive (weights excluded)."""

    def __init__(self, net):
        self.weights = {p.data_ptr() for p in net.parameters()}
        self.saved, self.live_after_batch = [], []

    def pack(self, tensor):
        if tensor.data_ptr() not in self.weights:
            self.saved.append(weakref.ref(tensor))
        return tensor

    def after_batch(self, ctx):
        self.live_after_batch.append(sum(ref() is not None for ref in self.saved))


def _live_saved_tensors(net, k):
    counter = LiveSavedTensors(net)
    trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), FreshBatches(8), hooks=[counter],
                      grad_accumulate_steps=k)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        trainer.train(0, 1)
    assert counter.saved  # the forward did save tensors
    return counter.live_after_batch


@pytest.mark.parametrize("k", [1, 4])
def test_no_saved_activation_outlives_its_micro_batch(k):
    live = _live_saved_tensors(Net(), k)
    # only what the loop holds until the next micro-batch: its input (saved by fc1) and the returned
    # output (saved by pow); nothing of earlier micro-batches, whatever k
    assert live == [2] * 8


def test_the_check_sees_a_kept_activation():
    # the kept activation was saved twice (relu's result, fc2's input)
    assert _live_saved_tensors(Net(leak=True), 4) == [4] * 8
