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
that scales, runs backward, unscales once, clips, steps and updates, with its own state dict)
built on ``torch.amp.GradScaler``.

Two ways in:

* the product: :func:`build_precision` gives the autocast context and the :class:`LossScaler`;
  the engine passes both to :class:`common.trainer.Trainer`. Nothing is patched.
* user code written for Apex: :func:`initialize`, :func:`scale_loss`, :func:`master_params`,
  :func:`state_dict` (the facade at the end of this module) do what Apex did, patching the
  model's forward and the optimizer's step as Apex did, over the same :class:`LossScaler`.

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
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

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


def _value(norm: torch.Tensor) -> float:
    """The float of a 0-dim norm; of a sharded one (a DTensor of FSDP gradients), the norm over all shards."""
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return norm.item()


class StepResult(NamedTuple):
    """Outcome of :meth:`LossScaler.step`: ``applied`` is False when the step was skipped;
    ``grad_norm`` is the total (unscaled) gradient 2-norm when clipping ran, else None."""
    applied: bool
    grad_norm: Optional[float]


class LossScaler:
    """Loss scaling for one optimizer: scale -> backward -> unscale once -> clip -> step -> update.

    The scaling itself is a ``torch.amp.GradScaler`` (:attr:`grad_scaler`): it multiplies the
    loss, unscales the gradients while looking for inf/nan, skips ``optimizer.step()`` when it
    finds some and adjusts the scale. This class adds what Apex had and GradScaler lacks: a floor
    and a cap on the dynamic scale, a constant-scale mode, unscaling that may be asked for more
    than once per step, the skipped-step report the trainer needs, and Apex's state-dict names.

    Modes (``loss_scale``):

    * ``None`` (fp32 or bf16): no scaling (the GradScaler is disabled). A step whose gradients
      hold inf/nan is still skipped, found from the total gradient norm.
    * ``'dynamic'``: starts at ``init_scale`` (2**16), halves on a step with inf/nan gradients,
      doubles after ``growth_interval`` (2000) clean steps in a row, clamped to
      ``[min_loss_scale, max_loss_scale]`` (Apex's dynamic scaler; the reference used a floor of 128).
    * a number: constant scale; steps with inf/nan gradients are skipped, the scale stays.

    A skipped step leaves params and optimizer state untouched (``optimizer.step()`` is not
    called); so does a step whose clipped total norm is not finite.

    Args:
        loss_scale: ``None``, ``'dynamic'`` or a positive number.
        min_loss_scale: floor of the dynamic scale (None: no floor).
        max_loss_scale: cap of the dynamic scale.
        init_scale: first dynamic scale.
        growth_interval: clean steps before the dynamic scale doubles.
        sharded: the gradients are FSDP shards (DTensors): inf/nan found on any rank's shard skips the step
            on every rank (``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler``).
        device: device type of the gradients (``'cpu'``, ``'cuda'``); :func:`initialize` passes
            the one of the model's params.

    Raises:
        ValueError: a loss scale that is neither ``'dynamic'`` nor a positive finite number.
    """

    def __init__(self, loss_scale: Union[None, str, float] = None, min_loss_scale: Optional[float] = None,
                 max_loss_scale: float = 2. ** 24, init_scale: float = 2. ** 16, growth_interval: int = 2000,
                 device: str = "cpu", sharded: bool = False):
        self.dynamic = isinstance(loss_scale, str)
        if self.dynamic and loss_scale != "dynamic":
            raise ValueError("TRAIN.FP16_LOSS_SCALE: expected 'dynamic' or a number, got {!r}".format(loss_scale))
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = float(max_loss_scale)
        if self.dynamic:
            scale = self._clamp(float(init_scale))
        else:
            scale = 1. if loss_scale is None else float(loss_scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError("TRAIN.FP16_LOSS_SCALE: expected a positive finite number, got {!r}".format(loss_scale))
        # Sharded gradients (FSDP): each rank sees only its shard's inf/nan; ShardedGradScaler all-reduces them.
        scaler_class = ShardedGradScaler if sharded else torch.amp.GradScaler
        self.grad_scaler = scaler_class(device, init_scale=scale, growth_interval=int(growth_interval),
                                        enabled=loss_scale is not None)
        self._scale = scale  # host copy of the scale: reading it never waits for the device
        self._unscaled = False  # this step's gradients are unscaled already
        self._in_step = False  # the scaler is calling optimizer.step() (see _amp_optimizer_step)

    def _clamp(self, scale: float) -> float:
        return min(max(scale, self.min_loss_scale or 0.), self.max_loss_scale)

    # -- the pieces, in the order a step uses them ---------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale`` (the loss itself when not scaling)."""
        return self.grad_scaler.scale(loss)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the scaled loss; gradients accumulate, scaled, into ``.grad``."""
        self.scale_loss(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale, once per step however often called
        (``GradScaler.unscale_`` raises on a second call)."""
        if not self._unscaled:
            self.grad_scaler.unscale_(optimizer)
            self._unscaled = True

    def step(self, optimizer: torch.optim.Optimizer, max_norm: Optional[float] = None,
             parameters=None) -> StepResult:
        """Unscale (if not done yet), clip, then ``GradScaler.step`` (which skips the optimizer
        step on inf/nan gradients) unless the clipped norm is not finite; :meth:`update` either way.
        A param group with a ``max_grad_norm`` entry (> 0) is first clipped to that norm on its own.

        Args:
            optimizer: the optimizer whose gradients were produced through :meth:`backward`.
            max_norm: clip the total 2-norm to this (None or <= 0: no clipping).
            parameters: params to clip over (default: all params of the optimizer).

        Returns:
            :class:`StepResult`; ``grad_norm`` is the total norm before clipping, in true
            (unscaled) gradient units.
        """
        self.unscale_(optimizer)
        for group in optimizer.param_groups:
            if group.get("max_grad_norm", 0) > 0:  # a group's own limit (e.g. TRAIN.VISUAL_SCALE_CLIP_GRAD_NORM)
                torch.nn.utils.clip_grad_norm_(group["params"], group["max_grad_norm"])
        grad_norm = None
        finite = True
        if max_norm is not None and max_norm > 0:
            if parameters is None:
                parameters = [p for g in optimizer.param_groups for p in g["params"]]
            grad_norm = _value(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
            finite = math.isfinite(grad_norm)
        elif not self.grad_scaler.is_enabled():
            # A disabled GradScaler does not look for inf/nan; a non-finite total norm tells.
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            finite = not grads or math.isfinite(_value(torch.nn.utils.get_total_norm(grads)))
        if finite:
            self._in_step = True
            try:
                self.grad_scaler.step(optimizer)
            finally:
                self._in_step = False
        overflow = self.update()
        return StepResult(finite and not overflow, grad_norm)

    def update(self) -> bool:
        """End of a step: ``GradScaler.update()``, then the floor and cap (dynamic) or the
        constant scale put back (fixed) through ``GradScaler.update(new_scale)``.

        Returns:
            True when the step's gradients held inf/nan (GradScaler lowered the scale, so it
            skipped the optimizer step); always False without scaling.
        """
        self._unscaled = False
        if not self.grad_scaler.is_enabled():
            return False
        before = self._scale
        self.grad_scaler.update()
        after = self.grad_scaler.get_scale()
        target = self._clamp(after) if self.dynamic else before
        if target != after:
            self.grad_scaler.update(target)
        self._scale = target
        return after < before

    # -- state -------------------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        """Current loss scale (1.0 without scaling)."""
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._set(float(value), self.unskipped)

    @property
    def unskipped(self) -> int:
        """Clean steps since the dynamic scale last changed (GradScaler's growth tracker)."""
        return self.grad_scaler.state_dict()["_growth_tracker"] if self.grad_scaler.is_enabled() else 0

    @unskipped.setter
    def unskipped(self, value: int) -> None:
        self._set(self._scale, int(value))

    def _set(self, scale: float, unskipped: int) -> None:
        """Put scale and growth tracker into the GradScaler (its public state dict)."""
        if not self.grad_scaler.is_enabled():
            raise ValueError("this loss scaler does not scale (fp32 or bf16): its scale stays 1")
        state = self.grad_scaler.state_dict()
        state.update(scale=scale, _growth_tracker=unskipped)
        self.grad_scaler.load_state_dict(state)
        self._scale = scale

    def state_dict(self) -> dict:
        """``{'loss_scale': float, 'unskipped': int}``: the names of an Apex loss scaler's state."""
        return {"loss_scale": self._scale, "unskipped": self.unskipped}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore :meth:`state_dict` (ours or Apex's); a fixed-scale run keeps its configured
        scale, a run without scaling ignores it."""
        if self.grad_scaler.is_enabled():
            self._set(float(state_dict["loss_scale"]) if self.dynamic else self._scale,
                      int(state_dict["unskipped"]))


def autocast_context(device_type: str, dtype: Union[str, torch.dtype]):
    """Zero-argument callable returning the forward's context manager:
    ``torch.autocast(device_type, dtype)``, or a no-op context for float32.

    Raises:
        ValueError: unknown dtype (see :func:`resolve_dtype`).
    """
    dtype = resolve_dtype(dtype)
    if dtype == torch.float32:
        return contextlib.nullcontext
    return functools.partial(torch.autocast, device_type=device_type, dtype=dtype)


def build_precision(enabled: bool, dtype: Union[str, torch.dtype], device_type: str,
                    loss_scale: Union[str, float] = "dynamic", min_loss_scale: Optional[float] = None,
                    max_loss_scale: float = 2. ** 24, sharded: bool = False):
    """The autocast context and the loss scaler of a run (TRAIN.FP16, FP16_DTYPE, FP16_LOSS_SCALE).

    float16 scales the loss (``loss_scale``: 'dynamic' or a number); bfloat16 and float32 do not
    (a step with inf/nan gradients is still skipped). ``enabled=False`` means float32. ``sharded``: the
    gradients are FSDP shards (TRAIN.STRATEGY 'fsdp'; see :class:`LossScaler`).

    Returns:
        (autocast, scaler): see :func:`autocast_context` and :class:`LossScaler`.
    Raises:
        ValueError: unknown dtype or bad loss scale.
    """
    dtype = resolve_dtype(dtype) if enabled else torch.float32
    scaler = LossScaler(loss_scale if dtype == torch.float16 else None, min_loss_scale=min_loss_scale,
                        max_loss_scale=max_loss_scale, device=device_type, sharded=sharded)
    return autocast_context(device_type, dtype), scaler


# --------------------------------------------------------------------------------------------- #
# Apex-style facade for user code
# --------------------------------------------------------------------------------------------- #
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
    weights stay fp32. The optimizer gets a :class:`LossScaler` (see :func:`scaler_of`) on the
    params' device; its ``step()`` goes through the scaler's ``torch.amp.GradScaler`` and skips
    steps with non-finite gradients. bf16 and fp32 do not scale the loss.
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
    enabled = enabled and opt_level != "O0"
    dtype = resolve_dtype(dtype) if enabled else torch.float32
    param = next(model.parameters(), None)
    if param is None:
        raise ValueError("amp.initialize: the model has no parameters, so its device is unknown")
    _, scaler = build_precision(enabled, dtype, param.device.type, loss_scale, min_loss_scale, max_loss_scale,
                                sharded=isinstance(param, DTensor))  # a model sharded by FSDP
    if dtype != torch.float32:
        model._amp_device_type = param.device.type
        model._amp_dtype = dtype
        if not hasattr(model, "_amp_orig_forward"):  # a second initialize only changes the dtype
            model._amp_orig_forward = model.forward
            model.forward = types.MethodType(_autocast_forward, model)
    _SCALERS[optimizer] = scaler
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
