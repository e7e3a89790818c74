"""Model EMA (TRAIN.EMA_DECAY, common/hooks/ema.py): the averaged weights after 3 optimizer steps equal the
hand-computed average of the weights after each step; the tiny task's run writes ``-ema.model``,
``Val-EMA-*`` scalars and the EMA state in its checkpoint; a SIGKILL + resume ends with the same EMA."""
import os
import signal

import pytest
import torch

from common.hooks.base import HookBase
from common.hooks.ema import ModelEma
from common.trainer import Trainer
from tests.faults import harness
from tests.tiny_vcr import tensorboard_scalars_in


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("seen", torch.zeros((), dtype=torch.long))

    def forward(self, x, y):
        self.seen += 1
        return {}, torch.nn.functional.cross_entropy(self.fc(x), y)


class _Weights(HookBase):
    """The model's state after each optimizer step."""

    def __init__(self, model):
        self.model, self.after = model, []

    def after_step(self, ctx):
        self.after.append({k: v.clone() for k, v in self.model.state_dict().items()})


class _NotValidated:
    validated = False


def test_ema_after_three_steps_equals_the_hand_computed_average():
    torch.manual_seed(0)
    net = _Net()
    start = {k: v.clone() for k, v in net.state_dict().items()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(3)]
    weights = _Weights(net)
    ema = ModelEma(net, 0.9, _NotValidated(), None, "unused")
    Trainer(net, optimizer, batches, hooks=[weights, ema]).train(0, 1)

    expected = start
    for after in weights.after:
        expected = {k: 0.9 * expected[k] + 0.1 * after[k] if k != "seen" else after[k] for k in after}
    got = ema.state_dict()
    assert not torch.equal(weights.after[-1]["fc.weight"], start["fc.weight"])
    for k in expected:
        assert torch.allclose(got[k], expected[k], rtol=0, atol=1e-6), k
    assert got["seen"].item() == 3  # integer buffers are copied, not averaged


def test_tiny_run_validates_and_saves_the_ema_model(tiny_cfg, tmp_path):
    assert harness.run_here(tiny_cfg, tmp_path, opts=["TRAIN.EMA_DECAY", 0.9, "TRAIN.END_EPOCH", 1]) == 0
    folder = harness.out_dir(tmp_path)
    ema_file = harness.training_state(os.path.join(folder, "tiny-ema.model"))
    ckpt = harness.training_state(os.path.join(folder, "tiny-0000.model"))
    assert sorted(ema_file) == ["state_dict"]
    harness.assert_same(ema_file["state_dict"], {k: v.float() for k, v in ckpt["ema"].items()})
    assert not torch.equal(ema_file["state_dict"]["mlp.0.weight"], ckpt["state_dict"]["mlp.0.weight"])
    scalars = tensorboard_scalars_in(folder)
    assert [step for step, _ in scalars["Val-EMA-Acc"]] == [15]
    assert 0.0 <= scalars["Val-EMA-Acc"][0][1] <= 1.0


@pytest.mark.slow
def test_ema_resumes_bit_for_bit_after_a_kill(tiny_cfg, tmp_path):
    opts = ["TRAIN.EMA_DECAY", 0.9, "TRAIN.END_EPOCH", 2]
    assert harness.run_here(tiny_cfg, tmp_path / "clean", opts=opts) == 0
    clean = harness.out_dir(tmp_path / "clean")

    # Killed in epoch 1 (16 micro-batches per epoch), after its mid-epoch checkpoint at 4 micro-batches.
    work = tmp_path / "killed"
    rc, out, err = harness.run(tiny_cfg, work, opts=opts, faults={"FAULT_KILL_AT_BATCH": 16 + 7})
    assert rc == -signal.SIGKILL, err[-2000:]
    rc, out, err = harness.run(tiny_cfg, work, opts=opts)
    assert rc == 0, err[-2000:]
    assert "Resumed from" in out + err
    resumed = harness.out_dir(work)
    for name in ("tiny-0001.model", "tiny-ema.model"):
        harness.assert_same(harness.training_state(os.path.join(resumed, name)),
                            harness.training_state(os.path.join(clean, name)), name)
