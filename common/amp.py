"""Mixed precision on ``torch.autocast`` behind the Apex ``amp`` API the reference release used.

The reference trained with NVIDIA Apex (opt level O2, ``loss_scale=TRAIN.FP16_LOSS_SCALE``,
``min_loss_scale=128``). Apex is gone from current PyTorch stacks; this module gives the same
calls on native autocast::

    model, optimizer = amp.initialize(model, optimizer, loss_scale='dynamic', min_loss_scale=128.)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)
    optimizer.step()          # skipped when the gradients hold inf/nan

Everything is done by one :class:`LossScaler` (the idea of timm's ``NativeScaler``: one object
that scales, runs backward, unscales once, clips, steps and updates, with its own state dict);
the module-level functions are a thin facade over the scaler attached to an optimizer. The
shared trainer (``common/trainer.py``) talks to the scaler directly.

Weights stay fp32 and are the master params; only the forward runs in fp16/bf16 (autocast),
so Apex's O1/O2/O3 all mean "autocast with fp32 master weights" here and O0 means fp32.
"""
import contextlib
import functools
import math
import types
import weakref
from typing import Iterator, NamedTuple, Optional, Union

import torch

_SCALERS: "weakref.WeakKeyDictionary[torch.optim.Optimizer, LossScaler]" = weakref.WeakKeyDictionary()
_DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float32": torch.float32, "fp32": torch.float32}


def resolve_dtype(dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    """``'float16'``/``'bfloat16'``/``'float32'`` (or aliases, or a torch dtype) -> torch dtype.

    Raises:
        ValueError: unknown name (the config key is ``TRAIN.FP16_DTYPE``).
    """
    if dtype is None:
        return torch.float16
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError("mixed precision dtype must be float16, bfloat16 or float32, got {}".format(dtype))
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError("TRAIN.FP16_DTYPE: expected one of {}, got {!r}".format(sorted(_DTYPES), dtype)) from None


class StepResult(NamedTuple):
    """Outcome of :meth:`LossScaler.step`: ``applied`` is False when the step was skipped;
    ``grad_norm`` is the total (unscaled) gradient 2-norm when clipping ran, else None."""
    applied: bool
    grad_norm: Optional[float]


class LossScaler:
    """Loss scaling for one optimizer: scale -> backward -> unscale once -> clip -> step -> update.

    Modes (``loss_scale``):

    * ``None`` (fp32 or bf16): scale 1, nothing to grow or shrink.
    * ``'dynamic'``: starts at ``init_scale`` (2**16), halves on a step with inf/nan gradients,
      doubles after ``growth_interval`` (2000) clean steps in a row, clamped to
      ``[min_loss_scale, max_loss_scale]`` (Apex's dynamic scaler; the reference used a floor of 128).
    * a number: constant scale.

    In every mode a step whose gradients hold inf/nan (or whose clipped norm is not finite) is
    skipped: ``optimizer.step()`` is not called, so params and optimizer state stay untouched.
    Gradients are unscaled exactly once per optimizer step however often :meth:`unscale_` runs.

    Args:
        loss_scale: ``None``, ``'dynamic'`` or a positive number.
        min_loss_scale: floor of the dynamic scale (None: no floor).
        max_loss_scale: cap of the dynamic scale.
        init_scale: first dynamic scale.
        growth_interval: clean steps before the dynamic scale doubles.

    Raises:
        ValueError: a loss scale that is neither ``'dynamic'`` nor a positive finite number.
    """

    def __init__(self, loss_scale: Union[None, str, float] = None, min_loss_scale: Optional[float] = None,
                 max_loss_scale: float = 2. ** 24, init_scale: float = 2. ** 16, growth_interval: int = 2000):
        self.dynamic = isinstance(loss_scale, str)
        if self.dynamic and loss_scale != "dynamic":
            raise ValueError("TRAIN.FP16_LOSS_SCALE: expected 'dynamic' or a number, got {!r}".format(loss_scale))
        if self.dynamic:
            scale = min(max(float(init_scale), min_loss_scale or 0.), max_loss_scale)
        else:
            scale = 1. if loss_scale is None else float(loss_scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError("TRAIN.FP16_LOSS_SCALE: expected a positive finite number, got {!r}".format(loss_scale))
        self.scale = scale
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = float(max_loss_scale)
        self.growth_interval = int(growth_interval)
        self.unskipped = 0  # clean steps since the last change of the dynamic scale
        self._found_inf = None  # per-step: 0-dim float tensor once the gradients are unscaled
        self._in_step = False

    # -- the pieces, in the order a step uses them ---------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (the loss itself when the scale is 1)."""
        return loss if self.scale == 1. else loss * self.scale

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the scaled loss; gradients accumulate, scaled, into ``.grad``."""
        self.scale_loss(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Divide the gradients by the scale and look for inf/nan, once per step.

        Returns:
            0-dim float32 tensor on the gradients' device: 1. if any gradient is not finite.
        """
        if self._found_inf is not None:
            return self._found_inf
        grads = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        if not grads:
            self._found_inf = torch.zeros(())
            return self._found_inf
        found = []
        for (device, _), group_grads in grads.items():
            found_inf = torch.zeros(1, device=device)
            inv_scale = torch.full((1,), 1. / self.scale, device=device)
            # The kernel torch.amp.GradScaler uses: in-place multiply + finite check in one pass.
            torch._amp_foreach_non_finite_check_and_unscale_(group_grads, found_inf, inv_scale)
            found.append(found_inf)
        device = found[0].device
        self._found_inf = torch.stack([f.to(device) for f in found]).amax()
        return self._found_inf

    def step(self, optimizer: torch.optim.Optimizer, max_norm: Optional[float] = None,
             parameters=None) -> StepResult:
        """Unscale (if not done yet), clip, then ``optimizer.step()`` unless a gradient or the
        norm is not finite; update the scale either way.

        Args:
            optimizer: the optimizer whose gradients were produced through :meth:`backward`.
            max_norm: clip the total 2-norm to this (None or <= 0: no clipping).
            parameters: params to clip over (default: all params of the optimizer).

        Returns:
            :class:`StepResult`; ``grad_norm`` is the total norm before clipping, in true
            (unscaled) gradient units.
        """
        found_inf = self.unscale_(optimizer)
        grad_norm = None
        if max_norm is not None and max_norm > 0:
            if parameters is None:
                parameters = [p for g in optimizer.param_groups for p in g["params"]]
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
            # One host sync for both numbers.
            found, grad_norm = torch.stack([found_inf.to(norm.device), norm.float()]).tolist()
            skip = found > 0 or not math.isfinite(grad_norm)
        else:
            skip = found_inf.item() > 0
        if not skip:
            self._in_step = True
            try:
                optimizer.step()
            finally:
                self._in_step = False
        self.update(overflow=skip)
        return StepResult(not skip, grad_norm)

    def update(self, overflow: bool) -> None:
        """End of a step: adjust the dynamic scale and forget the step's unscale state."""
        self._found_inf = None
        if not self.dynamic:
            return
        if overflow:
            self.scale = self.scale / 2.
            if self.min_loss_scale is not None:
                self.scale = max(self.scale, float(self.min_loss_scale))
            self.unskipped = 0
            return
        self.unskipped += 1
        if self.unskipped == self.growth_interval:
            self.scale = min(self.scale * 2., self.max_loss_scale)
            self.unskipped = 0

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{'loss_scale': float, 'unskipped': int}``: the names of an Apex loss scaler's state."""
        return {"loss_scale": self.scale, "unskipped": self.unskipped}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict`; a fixed-scale or unscaled run keeps its configured scale."""
        if self.dynamic:
            self.scale = float(state_dict["loss_scale"])
        self.unskipped = int(state_dict["unskipped"])


def _autocast_forward(module, *args, **kwargs):
    """Forward of a model passed through :func:`initialize`: the original forward under autocast.

    A bound method (not a closure) so ``copy.deepcopy`` and pickling rebind it to the copy.
    """
    with torch.autocast(device_type=module._amp_device_type, dtype=module._amp_dtype):
        return module._amp_orig_forward(*args, **kwargs)


def _amp_optimizer_step(optimizer, *args, **kwargs):
    """``optimizer.step`` of an optimizer passed through :func:`initialize`: goes through the
    scaler (skip on inf/nan, update the scale); the scaler calls back in to run the real step."""
    scaler = _SCALERS[optimizer]
    if scaler._in_step:
        return optimizer._amp_orig_step(*args, **kwargs)
    scaler.step(optimizer)
    return None


def initialize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, opt_level: str = "O2",
               loss_scale: Union[str, float] = "dynamic", min_loss_scale: Optional[float] = None,
               max_loss_scale: float = 2. ** 24, keep_batchnorm_fp32=None,
               dtype: Union[str, torch.dtype] = torch.float16, enabled: bool = True):
    """Apex ``amp.initialize`` on autocast: returns the same ``(model, optimizer)`` objects.

    The model's forward then runs under ``torch.autocast(<device type of its params>, dtype)``;
    weights stay fp32. The optimizer gets a :class:`LossScaler` (see :func:`scaler_of`) and its
    ``step()`` skips steps with non-finite gradients. bf16 and fp32 do not scale the loss.
    An LR scheduler built before or after this call keeps working without warnings (the
    scheduler's marker on ``optimizer.step`` is preserved).

    Args:
        opt_level: 'O0' (fp32) or 'O1'/'O2'/'O3' (autocast, fp32 master weights).
        loss_scale: ``'dynamic'`` or a number (ignored for bf16/fp32).
        min_loss_scale, max_loss_scale: bounds of the dynamic scale.
        keep_batchnorm_fp32: accepted for Apex compatibility; autocast keeps norms in fp32.
        dtype: ``torch.float16`` / ``torch.bfloat16`` or their names.
        enabled: False behaves like O0.

    Raises:
        ValueError: unknown opt level, dtype or loss scale; model without parameters;
            optimizer already initialized.
    """
    del keep_batchnorm_fp32
    if opt_level not in ("O0", "O1", "O2", "O3"):
        raise ValueError("amp opt_level must be one of O0, O1, O2, O3, got {!r}".format(opt_level))
    if optimizer in _SCALERS:
        raise ValueError("amp.initialize was already called for this optimizer")
    dtype = resolve_dtype(dtype)
    if opt_level == "O0" or not enabled:
        dtype = torch.float32
    param = next(model.parameters(), None)
    if param is None:
        raise ValueError("amp.initialize: the model has no parameters, so its device is unknown")
    if dtype != torch.float32:
        model._amp_device_type = param.device.type
        model._amp_dtype = dtype
        if not hasattr(model, "_amp_orig_forward"):  # a second initialize only changes the dtype
            model._amp_orig_forward = model.forward
            model.forward = types.MethodType(_autocast_forward, model)
    _SCALERS[optimizer] = LossScaler(loss_scale if dtype == torch.float16 else None,
                                     min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
    optimizer._amp_orig_step = optimizer.step

    def step(opt, *args, **kwargs):
        return _amp_optimizer_step(opt, *args, **kwargs)
    # Copies the LR scheduler's `_wrapped_by_lr_sched` marker off the step being replaced, so a
    # scheduler built before initialize() does not warn that optimizer.step was overridden.
    functools.update_wrapper(step, optimizer.step)
    optimizer.step = types.MethodType(step, optimizer)
    return model, optimizer


def scaler_of(optimizer: torch.optim.Optimizer) -> Optional[LossScaler]:
    """The :class:`LossScaler` attached by :func:`initialize`, or None."""
    return _SCALERS.get(optimizer)


def _scaler(optimizer) -> LossScaler:
    scaler = _SCALERS.get(optimizer)
    if scaler is None:
        raise RuntimeError("this optimizer was not passed through amp.initialize")
    return scaler


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Yield ``loss * loss_scale`` for ``.backward()`` (Apex ``amp.scale_loss``)."""
    yield _scaler(optimizer).scale_loss(loss)


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.nn.Parameter]:
    """The optimizer's params with their gradients unscaled (once per step, however often this
    is called), ready for ``clip_grad_norm_``."""
    _scaler(optimizer).unscale_(optimizer)
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict() -> dict:
    """Loss-scaler states of every initialized optimizer, ``{'loss_scaler0': {...}, ...}``
    (Apex's layout), in initialization order."""
    return {"loss_scaler{}".format(i): s.state_dict() for i, s in enumerate(_SCALERS.values())}


def load_state_dict(state: dict) -> None:
    """Restore :func:`state_dict` into the initialized optimizers' scalers, in order.

    Raises:
        ValueError: the number of scalers differs.
    """
    scalers = list(_SCALERS.values())
    if len(state) != len(scalers):
        raise ValueError("amp state holds {} loss scalers, {} optimizers are initialized"
                         .format(len(state), len(scalers)))
    for i, scaler in enumerate(scalers):
        scaler.load_state_dict(state["loss_scaler{}".format(i)])
