"""common.amp: Apex-style facade and LossScaler modes on CPU autocast."""
import copy
import warnings

import pytest
import torch

from common import amp


def _toy(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _data(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def _snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    state = copy.deepcopy(optimizer.state_dict()["state"])
    return params, state


def _assert_same(snap_a, snap_b):
    for a, b in zip(snap_a[0], snap_b[0]):
        assert torch.equal(a, b)
    assert snap_a[1].keys() == snap_b[1].keys()
    for k in snap_a[1]:
        for name, v in snap_a[1][k].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(snap_b[1][k][name]))


def _apex_step(model, optimizer, x, y, inject_inf=False):
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    if inject_inf:
        next(model.parameters()).grad[0, 0] = float("inf")
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1e9)
    optimizer.step()
    optimizer.zero_grad()


def test_forward_runs_under_autocast_weights_stay_fp32():
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), dtype="float16")
    x, _ = _data()
    assert model(x).dtype == torch.float16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # deepcopy rebinds the patched forward to the copy
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone[0].weight.zero_()
    assert not torch.equal(clone(x), model(x))
    model_bf16 = _toy()
    model_bf16, opt_bf16 = amp.initialize(model_bf16, torch.optim.SGD(model_bf16.parameters(), lr=0.1),
                                          dtype=torch.bfloat16)
    assert model_bf16(x).dtype == torch.bfloat16
    assert amp.scaler_of(opt_bf16).scale == 1.


def test_dynamic_scale_halves_on_inf_and_step_is_skipped_without_warning():
    model = _toy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)  # built before initialize
    model, opt = amp.initialize(model, opt, loss_scale="dynamic", min_loss_scale=128.)
    scaler = amp.scaler_of(opt)
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _apex_step(model, opt, x, y)
        sched.step()
        assert scaler.scale == 2. ** 16
        before = _snapshot(model, opt)
        _apex_step(model, opt, x, y, inject_inf=True)
        _assert_same(before, _snapshot(model, opt))
        assert scaler.scale == 2. ** 15
        _apex_step(model, opt, x, y)
        sched.step()
    assert opt.state_dict()["state"][0]["step"].item() == 2
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.25)


def test_dynamic_scale_floor_cap_and_growth():
    scaler = amp.LossScaler("dynamic", min_loss_scale=128., max_loss_scale=2. ** 17, growth_interval=3)
    for _ in range(20):
        scaler.update(overflow=True)
    assert scaler.scale == 128.
    scaler = amp.LossScaler("dynamic", min_loss_scale=128., max_loss_scale=2. ** 17, growth_interval=3)
    for expected in [2. ** 16, 2. ** 16, 2. ** 17, 2. ** 17, 2. ** 17, 2. ** 17]:
        scaler.update(overflow=False)
        assert scaler.scale == expected
    scaler.update(overflow=False)  # cap reached: stays
    assert scaler.scale == 2. ** 17
    scaler.update(overflow=True)
    assert (scaler.scale, scaler.unskipped) == (2. ** 16, 0)


def test_fixed_scale_skips_inf_step_and_keeps_scale():
    model2 = _toy()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    model2, opt2 = amp.initialize(model2, opt2, loss_scale=128.)
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _apex_step(model2, opt2, x, y)
        before = _snapshot(model2, opt2)
        _apex_step(model2, opt2, x, y, inject_inf=True)
    _assert_same(before, _snapshot(model2, opt2))
    assert amp.scaler_of(opt2).scale == 128.


def test_master_params_unscales_once_and_matches_fp32_gradients():
    ref = _toy()
    x, y = _data()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_scale=1024.)
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, opt) as scaled:
        assert scaled.item() == pytest.approx(loss.item() * 1024., rel=1e-6)
        scaled.backward()
    list(amp.master_params(opt))
    grads = [p.grad.clone() for p in amp.master_params(opt)]
    for g, p in zip(grads, ref.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=2e-2, atol=2e-3)


def test_scheduler_after_initialize_no_warning():
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=1.), loss_scale="dynamic")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1. / (s + 1))
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _apex_step(model, opt, x, y)
            sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_state_dict_round_trip():
    scaler = amp.LossScaler("dynamic", min_loss_scale=128.)
    scaler.update(overflow=True)
    scaler.update(overflow=False)
    other = amp.LossScaler("dynamic")
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == {"loss_scale": 2. ** 15, "unskipped": 1}
    fixed = amp.LossScaler(128.)
    fixed.load_state_dict({"loss_scale": 7., "unskipped": 0})
    assert fixed.scale == 128.
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=1.))
    amp.scaler_of(opt).scale = 4.
    state = amp.state_dict()
    key = "loss_scaler{}".format(len(state) - 1)
    assert state[key] == {"loss_scale": 4., "unskipped": 0}


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="FP16_LOSS_SCALE"):
        amp.LossScaler("static")
    with pytest.raises(ValueError, match="FP16_LOSS_SCALE"):
        amp.LossScaler(-1.)
    with pytest.raises(ValueError, match="FP16_DTYPE"):
        amp.resolve_dtype("float8")
    model = _toy()
    with pytest.raises(ValueError, match="opt_level"):
        amp.initialize(model, torch.optim.SGD(model.parameters(), lr=1.), opt_level="O4")
    with pytest.raises(RuntimeError, match="amp.initialize"):
        list(amp.master_params(torch.optim.SGD(model.parameters(), lr=1.)))
