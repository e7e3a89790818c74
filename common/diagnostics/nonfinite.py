"""Where a non-finite value was born: replay a micro-batch with hooks and name the first module that made it.

While every value is finite nothing is hooked: :class:`NonFiniteProbe` only keeps, for each micro-batch of
the current accumulation group, a reference to the batch as the loader gave it (host memory) and the RNG
state before its forward. When the trainer asks (:meth:`NonFiniteProbe.diagnose`: a skipped step in fp32 or
bf16; in fp16 once the skips in a row reach ``TRAIN.MAX_CONSECUTIVE_SKIPS`` or the loss scale sits at its
floor), each micro-batch of the group is replayed on the same weights with the same RNG state:

* forward: a forward hook on every module; the first module (in the order modules finish) whose output holds
  inf/nan is named, with its output dtype and the largest |value| of its inputs;
* backward (only when the forward stayed finite): the loss times the step's loss scale is back-propagated with a
  hook on every parameter and on every module input that needs a gradient; the first of these gradients, in
  the order autograd computes them, that holds inf/nan names its module (and the parameter). Each module gets
  its inputs as views of its own (a forward pre-hook; a view's backward is the identity), so a layer whose
  input is its parent's input (``mlp.fc1`` in ``mlp``) has an input gradient of its own: the one its backward
  made, complete before its parent's. The innermost module whose backward made the non-finite value is named.

Buffers (BatchNorm statistics), the RNG state and the gradients are put back afterwards, so a run that goes
on (fp32 / bf16 after one skipped step) is not changed by the replay. The batch, the RNG state, the weights
and the finding are written to ``nonfinite-step{N}.pt`` in the run folder (readable by
``common.fileio.safe_load.load_tensors``); ``python tools/replay_step.py FILE`` replays it in a fresh process
(:func:`replay_file`).
"""
import math
import os
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import torch

from common.data.collate import Batch, to_device
from common.fileio.safe_write import atomic_write

FILE_PATTERN = "nonfinite-step{}.pt"


@dataclass
class Finding:
    """The first module whose output (``direction='forward'``) or input gradient (``'backward'``) held inf/nan.

    ``module``: its dotted name in the model ('' = the model itself); ``kind``: its class name; ``parameter``:
    the parameter whose gradient was the first non-finite one (backward, else ''); ``dtype``: of the
    non-finite tensor; ``max_abs_input``: the largest |value| of the module's inputs in the forward (inf/nan
    included; nan when it had no floating input); ``micro_batch``: index of the replayed micro-batch in the epoch.
    """
    direction: str
    module: str
    kind: str
    dtype: str
    max_abs_input: float
    parameter: str = ""
    micro_batch: int = -1

    def describe(self) -> str:
        """One phrase, e.g. ``forward output of module 'mlp.0' (Linear, torch.float16; max |input| 3.1)``."""
        what = "output" if self.direction == "forward" else "input gradient"
        name = "'{}'".format(self.module) if self.module else "(the model)"
        param = ", parameter '{}'".format(self.parameter) if self.parameter else ""
        return "{} {} of module {} ({}, {}{}; max |input| {:.4g})".format(
            self.direction, what, name, self.kind, self.dtype, param, self.max_abs_input)


def _tensors(value):
    """The tensors in a (nested) output: tensor, list/tuple, dict."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _map_tensors(fn, value):
    """``value`` with ``fn`` applied to each tensor in it, through plain lists, tuples and dicts (a container is
    rebuilt only when a tensor in it changed; other types are kept as they are)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in (list, tuple):
        mapped = [_map_tensors(fn, v) for v in value]
        return type(value)(mapped) if any(m is not v for m, v in zip(mapped, value)) else value
    if type(value) is dict:
        mapped = {k: _map_tensors(fn, v) for k, v in value.items()}
        return mapped if any(mapped[k] is not v for k, v in value.items()) else value
    return value


def _non_finite(value) -> Optional[torch.Tensor]:
    """The first floating tensor in ``value`` holding inf/nan, or None."""
    for t in _tensors(value):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return t
    return None


def _max_abs(value) -> float:
    """Largest |value| over the floating tensors of ``value`` (nan when there are none, or a nan among them)."""
    maxima = [t.detach().abs().max().float().item() for t in _tensors(value) if t.is_floating_point() and t.numel()]
    if not maxima:
        return float("nan")
    return float("nan") if any(math.isnan(m) for m in maxima) else max(maxima)


def unwrap(net: torch.nn.Module) -> torch.nn.Module:
    """The model under a DDP wrapper (replays run on one process, without gradient all-reduce)."""
    return getattr(net, "module", net)


def get_rng_state(device: torch.device) -> dict:
    """The torch RNG state a forward draws from: ``{'cpu': uint8 tensor, 'cuda': uint8 tensor or None}``."""
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore :func:`get_rng_state`."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def replay(model: torch.nn.Module, batch, rng: dict, autocast: Callable, loss_scale: float,
           device: torch.device, micro_batch: int = -1) -> Optional[Finding]:
    """Run ``model(*batch)`` forward and backward with hooks (see the module docstring); returns the
    :class:`Finding`, or None when every value stayed finite. The model's buffers, the RNG state and the
    parameters' gradients are restored afterwards.

    Args:
        model: the unwrapped model (train mode, as in the step).
        batch: the micro-batch fields (host or device tensors, nested lists allowed).
        rng: :func:`get_rng_state` taken before the micro-batch's forward.
        autocast: zero-argument callable returning the step's autocast context.
        loss_scale: the step's loss scale (1 without scaling): fp16 gradients overflow at the scaled values.
    """
    names = {m: n for n, m in model.named_modules()}
    owner = {p: (m, pn) for m in names for pn, p in m.named_parameters(recurse=False)}
    found: List[Finding] = []
    input_max = {}
    handles = []

    def pre_hook(module, inputs):
        if found:
            return None
        views = {}  # one view per input tensor: an argument given twice stays one tensor (`q is k` checks)

        def own(t):
            if not (isinstance(t, torch.Tensor) and t.requires_grad):
                return t
            if id(t) not in views:
                views[id(t)] = t.view_as(t)
                handles.append(views[id(t)].register_hook(lambda g, m=module: grad_hook(g, m, "")))
            return views[id(t)]
        return _map_tensors(own, tuple(inputs))

    def forward_hook(module, inputs, output):
        input_max[module] = _max_abs(inputs)
        bad = _non_finite(output)
        if bad is not None and not found:
            found.append(Finding("forward", names[module], type(module).__name__, str(bad.dtype),
                                 input_max[module], micro_batch=micro_batch))

    def grad_hook(grad, module, parameter):
        if not found and not bool(torch.isfinite(grad).all()):
            found.append(Finding("backward", names[module], type(module).__name__, str(grad.dtype),
                                 input_max.get(module, float("nan")), parameter, micro_batch))

    grads = {p: p.grad for p in model.parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    now = get_rng_state(device)
    try:
        for module in names:
            if module is not model:  # the model's own forward runs unhooked below (it may be compiled)
                handles.append(module.register_forward_pre_hook(pre_hook))
                handles.append(module.register_forward_hook(forward_hook))
        for p, (module, pname) in owner.items():
            if p.requires_grad:
                handles.append(p.register_hook(lambda g, m=module, n=pname: grad_hook(g, m, n)))
        for p in grads:
            p.grad = None
        set_rng_state(rng, device)
        fields = to_device(list(batch), device)
        with torch.enable_grad():
            with autocast():
                outputs, loss = type(model).forward(model, *fields)  # eager, past a compiled forward
            if not found:
                input_max[model] = _max_abs(fields)
                bad = _non_finite((outputs, loss))
                if bad is not None:
                    found.append(Finding("forward", "", type(model).__name__, str(bad.dtype), input_max[model],
                                         micro_batch=micro_batch))
            if not found:
                (loss.float().mean() * loss_scale).backward()
    finally:
        for h in handles:
            h.remove()
        for p, g in grads.items():
            p.grad = g
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])
        set_rng_state(now, device)
    return found[0] if found else None


def _plain(value):
    """A batch as the weights-only unpickler can read it: tensors, lists, dicts, str, numbers."""
    if isinstance(value, Batch):
        return {"fields": [_plain(v) for v in value], "names": list(value.names)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    return value


def should_diagnose(scaler, scale_before: float, consecutive_skips: int, max_consecutive_skips: int) -> bool:
    """Whether a skipped step is worth a replay: always without loss scaling (fp32, bf16: a non-finite value
    there is never the loss-scale search); with fp16 once the skips in a row reach ``max_consecutive_skips``
    or the dynamic scale was already at its floor (a few skips early in training are that search)."""
    if not scaler.grad_scaler.is_enabled():
        return True
    floor = scaler.min_loss_scale if scaler.dynamic else None
    return consecutive_skips >= max_consecutive_skips or (floor is not None and scale_before <= floor)


class NonFiniteProbe:
    """Keeps what replays the micro-batches of the current accumulation group and diagnoses a bad step.

    Args:
        net: the trained module (DDP-wrapped or not).
        autocast: the step's autocast context factory.
        folder: the run folder (``nonfinite-step{N}.pt`` goes there); None: write nothing.
        task: the task's registry name (``tools/replay_step.py`` builds its model).
        dtype: the autocast dtype's name ('float32', 'float16', 'bfloat16'), written to the file.
        write: this process writes the file (rank 0).
    """

    def __init__(self, net, autocast: Callable, folder: Optional[str], task: str, dtype: str, write: bool = True):
        self.net, self.autocast, self.folder, self.task, self.dtype = net, autocast, folder, task, dtype
        self.write = write and folder is not None
        self.group = []  # (micro-batch index, host batch, RNG state) of the group so far
        self.finding: Optional[Finding] = None
        self.path: Optional[str] = None

    def capture(self, micro_batch: int, batch, group_start: bool, device: torch.device) -> None:
        """Before a micro-batch's forward: keep the batch reference and the RNG state (no copy of the batch)."""
        if group_start:
            self.group = []
        self.group.append((micro_batch, batch, get_rng_state(device)))

    def diagnose(self, step: int, loss_scale: float, device: torch.device) -> Optional[Finding]:
        """Replay the group's micro-batches in order; the first :class:`Finding` (also kept in ``finding``) or
        None. Writes ``nonfinite-step{step}.pt`` (its path in ``path``) when the probe writes files."""
        model = unwrap(self.net)
        finding, replayed = None, None
        for micro_batch, batch, rng in self.group:
            finding = replay(model, batch, rng, self.autocast, loss_scale, device, micro_batch)
            replayed = (micro_batch, batch, rng)
            if finding is not None:
                break
        self.finding = finding
        if self.write and replayed is not None:
            micro_batch, batch, rng = replayed
            self.path = os.path.normpath(os.path.join(self.folder, FILE_PATTERN.format(step)))
            saved = {"step": step, "micro_batch": micro_batch, "task": self.task, "dtype": self.dtype,
                     "loss_scale": loss_scale, "batch": _plain(batch), "rng": rng,
                     "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                     "finding": asdict(finding) if finding else None}
            atomic_write(self.path, lambda f: torch.save(saved, f))  # a kill mid-write leaves no torn file
        return finding

    def report(self) -> str:
        """The sentence the log and the divergence error carry."""
        where = ("the first non-finite value: " + self.finding.describe() if self.finding else
                 "a replay of the step's micro-batches stayed finite (a non-deterministic kernel, or another rank)")
        if self.path:
            where += "; replay it with: python tools/replay_step.py {}".format(self.path)
        return where


def batch_fields(saved):
    """The micro-batch of a ``nonfinite-step{N}.pt`` file as the list ``model(*fields)`` takes."""
    return saved["fields"] if isinstance(saved, dict) else saved
