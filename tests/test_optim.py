"""common.optim: LR scaling rule, LR_MULT groups, SGD/Adam/BERT AdamW."""
import math

import pytest
import torch

from common.optim import BertAdamW, build_optimizer, images_per_step, param_groups
from vcr.task import TASK as VCR_TASK


def _cfg(**train):
    cfg = VCR_TASK.load_config(None).clone()
    cfg.defrost()
    for key, value in train.items():
        setattr(cfg.TRAIN, key, value)
    return cfg


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.vlbert = torch.nn.Linear(3, 4)
        self.final_mlp = torch.nn.Linear(4, 2)
        self.frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)


def test_images_per_step_and_base_lr():
    assert images_per_step(_cfg(BATCH_IMAGES=4, GRAD_ACCUMULATE_STEPS=2), world_size=8) == 64
    assert images_per_step(_cfg(BATCH_IMAGES=[2, 3], GRAD_ACCUMULATE_STEPS=1), world_size=2) == 10
    opt = build_optimizer(_cfg(LR=1e-3, BATCH_IMAGES=4, GRAD_ACCUMULATE_STEPS=4, OPTIMIZER="SGD"), Net(), 2)
    assert opt.param_groups[-1]["lr"] == pytest.approx(1e-3 * 32)


def test_lr_mult_groups_in_order_first_match_wins():
    net = Net()
    groups = param_groups(net, [["final_mlp", 10.0], ["mlp.bias", 0.5]], base_lr=0.1)
    assert [g["lr"] for g in groups] == pytest.approx([1.0, 0.05, 0.1])
    assert groups[0]["params"] == [net.final_mlp.weight, net.final_mlp.bias]
    assert groups[1]["params"] == []
    assert groups[2]["params"] == [net.frozen, net.vlbert.weight, net.vlbert.bias]  # frozen too, like the reference
    with pytest.raises(ValueError, match="TRAIN.LR_MULT"):
        param_groups(net, [["final_mlp"]], base_lr=0.1)


def test_build_sgd_adam_and_unknown():
    sgd = build_optimizer(_cfg(OPTIMIZER="SGD", MOMENTUM=0.8, WD=0.01, LR=0.5, BATCH_IMAGES=1), Net())
    assert isinstance(sgd, torch.optim.SGD)
    assert (sgd.defaults["momentum"], sgd.defaults["weight_decay"], sgd.defaults["lr"]) == (0.8, 0.01, 0.5)
    adam = build_optimizer(_cfg(OPTIMIZER="Adam", WD=0.01), Net())
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["weight_decay"] == 0.01
    adamw = build_optimizer(_cfg(OPTIMIZER="AdamW", WD=0.01), Net())
    assert isinstance(adamw, BertAdamW)
    defaults = adamw.defaults
    assert (defaults["betas"], defaults["eps"], defaults["correct_bias"]) == ((0.9, 0.999), 1e-6, True)
    with pytest.raises(ValueError, match="TRAIN.OPTIMIZER"):
        build_optimizer(_cfg(OPTIMIZER="LAMB"), Net())


def _bert_adamw_reference(p, grads, lr, wd, betas=(0.9, 0.999), eps=1e-6):
    """The BERT AdamW update written out element by element, one step per gradient."""
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    p = p.clone().double()
    for t, g in enumerate(grads, 1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        step = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
        p = p - step * m / (v.sqrt() + eps)
        p = p - lr * wd * p
    return p


def test_bert_adamw_matches_the_bert_update_and_not_torch_adamw():
    torch.manual_seed(0)
    p0 = torch.randn(5, 3)
    grads = [torch.randn(5, 3) * 1e-3 for _ in range(6)]
    ours = torch.nn.Parameter(p0.clone())
    theirs = torch.nn.Parameter(p0.clone())
    opt = BertAdamW([ours], lr=1e-2, weight_decay=0.1)
    torch_opt = torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.1, eps=1e-6)
    for g in grads:
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    expected = _bert_adamw_reference(p0, grads, lr=1e-2, wd=0.1)
    torch.testing.assert_close(ours.detach().double(), expected, rtol=1e-6, atol=1e-7)
    assert (theirs.detach().double() - expected).abs().max() > 1e-5  # different update: not used
    state = opt.state_dict()["state"][0]
    assert state["step"] == 6 and set(state) == {"step", "exp_avg", "exp_avg_sq"}


def test_bert_adamw_state_round_trip_and_skips_params_without_grad():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = BertAdamW([a, b], lr=0.1)
    a.grad = torch.ones(2)
    opt.step()
    assert torch.equal(b.detach(), torch.ones(2)) and b not in opt.state
    clone = BertAdamW([torch.nn.Parameter(a.detach().clone()), torch.nn.Parameter(torch.ones(2))], lr=0.1)
    clone.load_state_dict(opt.state_dict())
    assert clone.state_dict()["state"][0]["step"] == 1
    with pytest.raises(ValueError, match="betas"):
        BertAdamW([a], betas=(1.0, 0.999))


def test_bert_adamw_foreach_and_plain_loop_give_the_same_update():
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2), ()]
    start = [torch.randn(s) for s in shapes]
    params = {mode: [torch.nn.Parameter(p.clone()) for p in start] for mode in ("foreach", "plain")}
    opts = {mode: BertAdamW([{"params": ps[:2], "lr": 1e-2}, {"params": ps[2:], "lr": 3e-3, "weight_decay": 0.0}],
                            lr=1e-2, weight_decay=0.05, foreach=mode == "foreach")
            for mode, ps in params.items()}
    for _ in range(20):
        grads = [torch.randn(s) for s in shapes]
        for mode, ps in params.items():
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            opts[mode].step()
    for fast, plain in zip(params["foreach"], params["plain"]):
        torch.testing.assert_close(fast.detach(), plain.detach(), rtol=1e-6, atol=1e-6)
    moved = max((p.detach() - s).abs().max().item() for p, s in zip(params["plain"], start))
    assert moved > 1e-2  # the steps did move the weights
    assert opts["plain"].state_dict()["state"][0]["step"] == 20


def test_bert_adamw_default_uses_the_per_tensor_loop_on_cpu(monkeypatch):
    import common.optim as optim
    calls = []
    monkeypatch.setattr(optim, "_plain_update", lambda *args: calls.append(len(args[0])))
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    before = p.detach().clone()
    BertAdamW([p], lr=1e-2).step()
    assert calls == [1]  # CPU parameters: the loop (multi-tensor kernels are slower there)
    BertAdamW([p], lr=1e-2, foreach=True).step()
    assert calls == [1] and not torch.equal(p.detach(), before)  # forced multi-tensor path updates in place


# ---------------------------------------------------------------- TRAIN.OPTIM_STATE_DTYPE 'bfloat16'

def _adamw_run(state_dtype, foreach, steps=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(64, 32, generator=g)), torch.nn.Parameter(torch.randn(32, generator=g))]
    opt = BertAdamW(params, lr=1e-2, weight_decay=0.05, foreach=foreach, state_dtype=state_dtype)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return params, opt


@pytest.mark.parametrize("foreach", [False, True])
def test_bf16_state_is_stored_in_bf16_and_updates_stay_close_to_fp32_state(foreach):
    ours, opt = _adamw_run(torch.bfloat16, foreach)
    ref, ref_opt = _adamw_run(torch.float32, foreach)
    for p in ours:
        state = opt.state[p]
        assert (state["exp_avg"].dtype, state["exp_avg_sq"].dtype, p.dtype) == (torch.bfloat16, torch.bfloat16,
                                                                                torch.float32)
    for p, r, p0 in zip(ours, ref, _adamw_run(torch.float32, foreach, steps=0)[0]):
        moved = (r - p0).abs()
        # 5 steps of lr 1e-2 move each weight by up to 5e-2; bf16 moments change that by < 1% of the move
        assert (p - r).abs().max() <= 0.01 * moved.max() and not torch.equal(p, r)
    for p, r in zip(ours, ref):  # moments within a few bf16 roundings (2**-8 relative each) of the fp32 ones
        for key in ("exp_avg", "exp_avg_sq"):
            m, m_ref = opt.state[p][key].float(), ref_opt.state[r][key]
            assert (m - m_ref).abs().max() <= 0.02 * m_ref.abs().max()


@pytest.mark.parametrize("foreach", [False, True])
def test_bf16_state_a_tiny_update_still_moves_the_fp32_weight(foreach):
    w = torch.nn.Parameter(torch.full((4,), 1.0))
    opt = BertAdamW([w], lr=1e-6, foreach=foreach, state_dtype=torch.bfloat16)
    w.grad = torch.ones(4)
    opt.step()
    # the first Adam step moves by lr = 1e-6: 1/128 of bf16's spacing at 1.0 (2**-7), fp32 keeps it
    assert w.dtype == torch.float32
    assert torch.allclose(w.detach(), torch.full((4,), 1.0 - 1e-6), rtol=0, atol=1e-9)
    assert (w.detach() < 1.0).all()


def test_bf16_state_checkpoint_round_trip_resumes_bit_for_bit():
    params, opt = _adamw_run(torch.bfloat16, foreach=False, steps=3)
    saved = torch.load(_save(opt.state_dict()), weights_only=True)
    assert saved["state"][0]["exp_avg"].dtype == torch.bfloat16
    clones = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = BertAdamW(clones, lr=1e-2, weight_decay=0.05, foreach=False, state_dtype=torch.bfloat16)
    resumed.load_state_dict(saved)
    assert all(resumed.state[p][k].dtype == torch.bfloat16 for p in clones for k in ("exp_avg", "exp_avg_sq"))
    g = torch.Generator().manual_seed(7)
    for p, c in zip(params, clones):
        p.grad = torch.randn(p.shape, generator=g)
        c.grad = p.grad.clone()
    opt.step()
    resumed.step()
    assert all(torch.equal(p, c) for p, c in zip(params, clones))
    assert all(torch.equal(opt.state[p]["exp_avg_sq"], resumed.state[c]["exp_avg_sq"]) for p, c in zip(params, clones))


def _save(obj):
    import io
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_bf16_state_chunks_match_one_chunk(monkeypatch):
    import common.optim as optim
    one, _ = _adamw_run(torch.bfloat16, foreach=True)
    monkeypatch.setattr(optim, "STATE_CHUNK_NUMEL", 100)  # each tensor its own chunk
    many, _ = _adamw_run(torch.bfloat16, foreach=True)
    assert all(torch.equal(a, b) for a, b in zip(one, many))  # exact: elementwise steps, chunking reorders no sum
    assert [list(c) for c in optim._chunks([torch.ones(3), torch.ones(3), torch.ones(5), torch.ones(1)], 6)] == \
        [[0, 1], [2, 3]]


def test_build_optimizer_state_dtype():
    model = Net()
    opt = build_optimizer(_cfg(OPTIMIZER="AdamW", OPTIM_STATE_DTYPE="bfloat16"), model)
    assert opt.state_dtype == torch.bfloat16
    assert build_optimizer(_cfg(OPTIMIZER="AdamW"), model).state_dtype == torch.float32
    with pytest.raises(ValueError, match="TRAIN.OPTIM_STATE_DTYPE 'bfloat16' is implemented for TRAIN.OPTIMIZER "
                                         "'AdamW' only, got 'SGD'"):
        build_optimizer(_cfg(OPTIMIZER="SGD", OPTIM_STATE_DTYPE="bfloat16"), model)
    with pytest.raises(ValueError, match="TRAIN.OPTIM_STATE_DTYPE: expected one of float32, bfloat16, got 'fp8'"):
        build_optimizer(_cfg(OPTIMIZER="AdamW", OPTIM_STATE_DTYPE="fp8"), model)
