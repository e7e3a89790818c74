"""common.amp: Apex-style facade and LossScaler modes (on torch.amp.GradScaler) on CPU autocast."""
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


def _scaler_step(scaler, model, optimizer, x, y, inject_inf=False, max_norm=None):
    """One step through the LossScaler API the trainer uses; returns its StepResult."""
    scaler.backward(torch.nn.functional.mse_loss(model(x).float(), y))
    if inject_inf:
        next(model.parameters()).grad[0, 0] = float("inf")
    result = scaler.step(optimizer, max_norm)
    optimizer.zero_grad()
    return result


def test_dynamic_scale_floor_cap_and_growth():
    model = _toy()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = amp.LossScaler("dynamic", min_loss_scale=128., max_loss_scale=2. ** 17, growth_interval=3)
    x, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # 2**16 halves 9 times down to the floor 128, then stays there
        for _ in range(12):
            assert not _scaler_step(scaler, model, opt, x, y, inject_inf=True).applied
        assert scaler.scale == 128.
        scaler.scale = 2. ** 16
        # doubles after every 3 clean steps, up to the cap 2**17
        for expected in [2. ** 16, 2. ** 16, 2. ** 17, 2. ** 17, 2. ** 17, 2. ** 17, 2. ** 17]:
            assert _scaler_step(scaler, model, opt, x, y).applied
            assert scaler.scale == expected
            assert scaler.grad_scaler.get_scale() == expected
        assert scaler.unskipped == 1
        assert not _scaler_step(scaler, model, opt, x, y, inject_inf=True).applied
        assert (scaler.scale, scaler.unskipped) == (2. ** 16, 0)


def test_fp16_step_goes_through_grad_scaler(monkeypatch):
    calls = []
    real_step = torch.amp.GradScaler.step

    def spy(self, optimizer, *args, **kwargs):
        calls.append(self.get_scale())
        return real_step(self, optimizer, *args, **kwargs)
    monkeypatch.setattr(torch.amp.GradScaler, "step", spy)
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_scale=256.)
    scaler = amp.scaler_of(opt)
    assert isinstance(scaler.grad_scaler, torch.amp.GradScaler) and scaler.grad_scaler.is_enabled()
    x, y = _data()
    _apex_step(model, opt, x, y)                 # Apex style: optimizer.step()
    _scaler_step(scaler, model, opt, x, y, max_norm=1.)  # trainer style: scaler.step()
    assert calls == [256., 256.]
    bf16 = _toy()
    bf16, opt_bf16 = amp.initialize(bf16, torch.optim.SGD(bf16.parameters(), lr=0.1), dtype="bfloat16")
    assert not amp.scaler_of(opt_bf16).grad_scaler.is_enabled()


@pytest.mark.parametrize("max_norm", [None, 1.])
def test_unscaled_modes_skip_non_finite_steps(max_norm):
    for dtype in ("bfloat16", "float32"):
        model = _toy()
        model, opt = amp.initialize(model, torch.optim.Adam(model.parameters(), lr=1e-2), dtype=dtype)
        scaler = amp.scaler_of(opt)
        x, y = _data()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _scaler_step(scaler, model, opt, x, y, max_norm=max_norm).applied
            before = _snapshot(model, opt)
            result = _scaler_step(scaler, model, opt, x, y, inject_inf=True, max_norm=max_norm)
        assert not result.applied
        _assert_same(before, _snapshot(model, opt))
        assert scaler.state_dict() == {"loss_scale": 1., "unskipped": 0}


def test_clipping_unscales_once_and_reports_true_norm():
    ref = _toy()
    x, y = _data()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9).item()
    model = _toy()
    model, opt = amp.initialize(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_scale="dynamic")
    scaler = amp.scaler_of(opt)
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    scaler.backward(loss)
    list(amp.master_params(opt))  # unscales; the step below must not unscale again
    result = scaler.step(opt, 1e9)
    assert result.applied
    assert result.grad_norm == pytest.approx(ref_norm, rel=1e-2)
    with pytest.raises(ValueError, match="does not scale"):
        amp.LossScaler().scale = 2.


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
    # GradScaler would double it after growth_interval clean steps: the constant is put back
    fixed = amp.LossScaler(128., growth_interval=2)
    for _ in range(3):
        assert _scaler_step(fixed, model2, opt2, x, y).applied
        assert (fixed.scale, fixed.grad_scaler.get_scale()) == (128., 128.)


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


def test_state_dict_round_trip_and_legacy_keys():
    model = _toy()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = amp.LossScaler("dynamic", min_loss_scale=128.)
    x, y = _data()
    _scaler_step(scaler, model, opt, x, y, inject_inf=True)
    _scaler_step(scaler, model, opt, x, y)
    other = amp.LossScaler("dynamic")
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == {"loss_scale": 2. ** 15, "unskipped": 1}
    assert other.grad_scaler.state_dict()["scale"] == 2. ** 15
    assert other.grad_scaler.state_dict()["_growth_tracker"] == 1
    # what the previous LossScaler (and Apex) wrote: loads, and the next steps continue from it
    legacy = amp.LossScaler("dynamic", growth_interval=3)
    legacy.load_state_dict({"loss_scale": 512., "unskipped": 2})
    assert _scaler_step(legacy, model, opt, x, y).applied
    assert legacy.state_dict() == {"loss_scale": 1024., "unskipped": 0}
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


def test_build_precision_explicit_autocast_and_scaler():
    """The product's path: the autocast context and the scaler, with nothing patched."""
    model = torch.nn.Linear(4, 4)
    forward = model.forward
    autocast, scaler = amp.build_precision(True, "float16", "cpu", loss_scale="dynamic", min_loss_scale=128.)
    with autocast():
        assert model(torch.randn(2, 4)).dtype == torch.float16
    assert scaler.dynamic and scaler.grad_scaler.is_enabled() and scaler.min_loss_scale == 128.
    assert scaler.scale == 2. ** 16
    assert model.forward == forward and not hasattr(model, "_amp_orig_forward")

    autocast, scaler = amp.build_precision(True, "bfloat16", "cpu", loss_scale=512.)
    with autocast():
        assert model(torch.randn(2, 4)).dtype == torch.bfloat16
    assert not scaler.grad_scaler.is_enabled() and scaler.scale == 1.

    autocast, scaler = amp.build_precision(False, "float16", "cpu", loss_scale="dynamic")
    with autocast():
        assert model(torch.randn(2, 4)).dtype == torch.float32
    assert not scaler.grad_scaler.is_enabled()
    with pytest.raises(ValueError, match="FP16_DTYPE"):
        amp.build_precision(True, "float8", "cpu")
