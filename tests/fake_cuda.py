"""A CUDA device without a GPU, for checking the engine's device and dtype handling on a CPU-only machine.

Design: a hybrid of fake and real tensors. A tensor on the simulated device is a :class:`CudaTensor`: to
PyTorch's dispatcher it is a meta tensor whose backend keys are CUDA's (the construction of
``torch._subclasses.fake_tensor.FakeTensor``: ``device`` says ``cuda:0``, autocast applies its CUDA rules,
autograd records the graph), and it carries the real CPU tensor of its values beside. Every op (under
:class:`FakeCuda`, a ``TorchDispatchMode``) is checked, then run on the real CPU values, and its results are
wrapped again on the device the op gives on a GPU (an explicit ``device=``, else that of its inputs). So values
are real: ``.item()``, ``nonzero``, boolean masks and the loss scaler's inf check run as they would, in the
dtypes autocast picks, on the CPU's kernels. Backward is not: autograd's engine asks the driver for a device
context, so :func:`synthetic_backward` gives every weight the loss reaches a fixed pattern times the loss.

The checks are CUDA's rules:

* a CPU tensor with one element or more met in an op with a CUDA tensor (CUDA accepts 0-dim CPU tensors as
  scalars, CPU indices in indexing and copies between devices) raises :class:`DeviceError`;
* a float64 tensor made on the device by our code (not by a library's, e.g. GradScaler's) raises
  :class:`DeviceError` (a GPU's float64 is 30-60x slower; no code of ours means to use it);
* a CPU op's own error, such as fp16 meeting fp32 where autocast does not cast, is raised as :class:`DeviceError`.

Each message names the op and the ``file:line`` of the first project frame (not torch, not this file) that ran
it and, for a CPU tensor made while the mode was on, the ``file:line`` that made it; a CPU tensor made before
(a batch field the data loader made and nobody moved), or derived from one, is reported as such.

Around the mode, :func:`fake_cuda` patches what a CUDA build asks the driver for: ``torch.cuda.is_available``
(True, so autocast, ``GradScaler``, the loader's pinned memory and the engine's device choice take their CUDA
paths), bf16 support, lazy init, device count, index and name, cuDNN's version (None), memory figures, pinning (a no-op), CUDA generators
(CPU ones) and ``tolist``; ``Module.to`` swaps parameters (tied weights stay tied). What it cannot do: real
gradients, CUDA kernels (fused, flash, cuBLAS and cuDNN choices), streams, timing, NCCL. See docs/gpu_suite.md.
"""
import contextlib
import os
import sys
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
aten = torch.ops.aten

# Ops that take tensors of two devices on a GPU too.
_CROSS_DEVICE = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default,
                 aten._copy_from_and_resize.default, aten.lift_fresh.default, aten.set_.source_Tensor}
# Ops whose index tensors may stay on the CPU (PyTorch moves them).
_CPU_INDICES = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


class DeviceError(RuntimeError):
    """A tensor on the wrong device or of the wrong dtype; the message says which op and where."""


class CudaTensor(torch.Tensor):
    """A tensor on the simulated ``cuda:0``: a meta tensor with CUDA's dispatch keys, its values in ``cpu_value``
    (a CPU tensor of the same shape, strides and dtype, never requiring grad)."""

    @staticmethod
    def __new__(cls, real, requires_grad=False):
        meta = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="meta")
        self = torch.Tensor._make_subclass(cls, meta, requires_grad, dispatch_device=True,
                                           device_for_backend_keys=CUDA)
        self.cpu_value = real
        return self

    def __repr__(self, **kwargs):
        return "CudaTensor({}, device='cuda:0')".format(self.cpu_value)

    def __reduce_ex__(self, protocol):
        # torch.save of a CUDA tensor: its values, loaded back on the CPU (our loaders map to the CPU anyway)
        return self.cpu_value.detach().clone().__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default:
            return CUDA
        mode = FakeCuda.active
        if mode is None:
            raise DeviceError("a simulated CUDA tensor used outside fake_cuda() ({})".format(func))
        with mode:
            return mode.__torch_dispatch__(func, types, args, kwargs)


def _is_cuda(x):
    return isinstance(x, CudaTensor)


def project_frame(skip=()):
    """``file:line`` of the innermost frame of this project's code that is not in torch, not in this file
    and not in ``skip`` (file names); '?' when there is none."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if (path.startswith(ROOT) and path != __file__ and "site-packages" not in path
                and os.path.basename(path) not in skip):
            return "{}:{}".format(os.path.relpath(path, ROOT), frame.f_lineno)
        frame = frame.f_back
    return "?"


_DISPATCH_FILES = tuple(os.path.join("torch", f) for f in ("_ops.py", "overrides.py", "_tensor.py", "_compile.py",
                                                          os.path.join("utils", "_python_dispatch.py"),
                                                          os.path.join("utils", "_pytree.py"),  # wraps results
                                                          os.path.join("_dynamo", "eval_frame.py")))


def _issued_by_project():
    """Whether the op was called by this project's code itself (not by a library such as GradScaler)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if path != __file__ and not path.endswith(_DISPATCH_FILES):
            return path.startswith(ROOT) and "site-packages" not in path
        frame = frame.f_back
    return False


_BEFORE = "made before the check started"


class FakeCuda(TorchDispatchMode):
    """The mode that checks and runs every op (see the module docstring); a CPU tensor made under it carries
    the ``file:line`` that made it in ``_fake_cuda_origin``."""

    active = None

    @staticmethod
    def _origin(t):
        where = getattr(t, "_fake_cuda_origin", None)
        return "made at " + where if where else _BEFORE + " (e.g. by the data loader)"

    def _check_devices(self, func, args, tensors):
        if func in _CROSS_DEVICE:
            return
        if func in _CPU_INDICES:
            tensors = [args[0]] + [x for x in tree_flatten(args[2:])[0] if isinstance(x, torch.Tensor)]
        for t in tensors:
            if not _is_cuda(t) and t.dim() > 0 and t.device.type != "meta":
                raise DeviceError("{}: {} meets a CPU tensor of shape {} ({}) and a CUDA tensor at {}".format(
                    "device mismatch", func, tuple(t.shape), self._origin(t), project_frame()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return CUDA if _is_cuda(args[0]) else args[0].device
        flat, spec = tree_flatten((args, kwargs))
        tensors = [x for x in flat if isinstance(x, torch.Tensor)]
        cuda_in = any(_is_cuda(t) for t in tensors)
        if cuda_in:
            self._check_devices(func, args, tensors)
        device = kwargs.get("device")
        to_cuda = device is not None and torch.device(device).type == "cuda"
        real_args, real_kwargs = tree_unflatten([x.cpu_value if _is_cuda(x) else x for x in flat], spec)
        if to_cuda:
            real_kwargs = dict(real_kwargs, device=CPU)
        try:
            out = func(*real_args, **real_kwargs)
        except RuntimeError as e:
            raise DeviceError("{} at {}: {}".format(func, project_frame(), e)) from None
        if func is aten._local_scalar_dense.default:
            return out
        # Where the results live on a GPU: an explicit device= wins, else that of the inputs.
        on_cuda = to_cuda if device is not None else cuda_in
        if on_cuda:
            if isinstance(out, torch.Tensor):  # most ops: no flattening
                return self._wrap_cuda(func, out, args)
            return tree_map(lambda x: self._wrap_cuda(func, x, args), out)
        # A CPU result (rare on a GPU run): remember the line that made it, and whether its data predates the check.
        origin = project_frame()
        if any(isinstance(x, torch.Tensor) and _BEFORE in self._origin(x) for x in flat):
            origin += " from a tensor " + _BEFORE
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                x._fake_cuda_origin = origin
        return out

    @staticmethod
    def _wrap_cuda(func, x, args):
        if not isinstance(x, torch.Tensor):
            return x
        if func._schema.is_mutable:
            for a in args:  # in-place: the same tensor (a CPU one stays on the CPU: cpu_tensor.copy_(cuda_tensor))
                if a is x or _is_cuda(a) and a.cpu_value is x:
                    return a
        # a 0-dim float64 (a metric's exact running sum) costs nothing; an array of them is 30-60x slower
        if x.dtype == torch.float64 and x.dim() > 0 and _issued_by_project():
            raise DeviceError("float64 tensor made on the GPU by {} at {}".format(func, project_frame()))
        return CudaTensor(x)

    def __enter__(self):
        self._outer, FakeCuda.active = FakeCuda.active, self
        return super().__enter__()

    def __exit__(self, *exc):
        FakeCuda.active = self._outer
        return super().__exit__(*exc)


def _leaves(root):
    """The tensors requiring grad that autograd's graph from ``root`` reaches (its AccumulateGrad nodes)."""
    seen, todo, leaves = set(), [root.grad_fn], []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        todo.extend(n for n, _ in node.next_functions)
    return leaves


def synthetic_backward(loss, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """``Tensor.backward`` of a :class:`CudaTensor`: autograd's engine would ask the driver for a context, so
    every leaf the graph reaches gets ``loss * w`` added to its ``.grad`` (created on the leaf's device, in its
    dtype), ``w`` a fixed pattern of magnitude <= 1e-3 (deterministic, so two runs or a resume agree). The
    loss's value scales it: a scaled loss gives scaled gradients and a non-finite loss non-finite ones, as the
    loss scaler expects. Leaves the loss does not reach keep ``.grad`` None."""
    if not _is_cuda(loss):
        return _TENSOR_BACKWARD(loss, gradient, retain_graph, create_graph, inputs)
    value = loss.detach().float().sum()
    for leaf in _leaves(loss):
        pattern = torch.linspace(-1e-3, 1e-3, leaf.numel(), device=leaf.device).reshape(leaf.shape)
        grad = (pattern * value).to(leaf.dtype)
        leaf.grad = grad if leaf.grad is None else leaf.grad + grad


_TENSOR_BACKWARD = torch.Tensor.backward
_TENSOR_TOLIST = torch.Tensor.tolist


def _tolist(t):
    """``Tensor.tolist`` (a synchronising copy to the host on a GPU; PyTorch refuses it on a subclass)."""
    return t.cpu_value.tolist() if _is_cuda(t) else _TENSOR_TOLIST(t)


class _Generator(torch._C.Generator):
    """``torch.Generator(device='cuda')`` (timm's EMA keeps one): a CPU generator, the CUDA one needs the
    driver."""

    def __new__(cls, device="cpu"):
        return torch._C.Generator.__new__(cls, "cpu" if torch.device(device).type == "cuda" else device)

    def __init__(self, device="cpu"):
        pass


def _index_cuda(x):
    if isinstance(x, str) and x == "cuda" or isinstance(x, torch.device) and x.type == "cuda" and x.index is None:
        return CUDA
    return x


class _CudaIndex(TorchFunctionMode):
    """'cuda' -> 'cuda:0' in every torch call's arguments (positional or keyword, where a device is given:
    ``.to('cuda')``, ``device='cuda'``): without an index the C++ side asks the driver for the current device.
    Nested containers are left as they are (no torch call takes its device inside one; flattening every
    call's arguments doubled the run time, and would copy deepcopy's memo dict)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.device:
            args = tuple(_index_cuda(a) for a in args)
            kwargs = {k: _index_cuda(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


SIMULATED_DEVICE_NAME = "simulated CUDA device (tests/fake_cuda.py)"


@contextlib.contextmanager
def fake_cuda():
    """Within it, ``torch.cuda.is_available()`` is True and tensors made or moved on ``'cuda'`` are
    :class:`CudaTensor`; yields the :class:`FakeCuda` mode. Not thread-safe (the loader must run without
    worker processes, ``NUM_WORKERS_PER_GPU 0``)."""
    mode = FakeCuda()
    patches = [
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.is_bf16_supported", return_value=True),
        mock.patch("torch.cuda._lazy_init", return_value=None),
        mock.patch("torch.cuda.device_count", return_value=1),
        mock.patch("torch.cuda.current_device", return_value=0),
        mock.patch("torch.cuda.get_device_name", return_value=SIMULATED_DEVICE_NAME),
        mock.patch("torch.backends.cudnn.version", return_value=None),  # it would ask the device's capability
        mock.patch("torch.cuda.set_device", return_value=None),
        mock.patch("torch.cuda.synchronize", return_value=None),
        mock.patch("torch.cuda.max_memory_allocated", return_value=0),
        mock.patch("torch.cuda.reset_peak_memory_stats", return_value=None),
        mock.patch("torch.cuda.get_rng_state_all", return_value=[]),
        # the simulated device draws from the CPU generator: its own state is empty
        mock.patch("torch.cuda.get_rng_state", lambda device=None: torch.empty(0, dtype=torch.uint8)),
        mock.patch("torch.cuda.set_rng_state", lambda state, device=None: None),
        mock.patch("torch.Tensor.pin_memory", lambda self, *a, **k: self),
        mock.patch("torch.Tensor.backward", synthetic_backward),
        mock.patch("torch.Tensor.tolist", _tolist),
        mock.patch("torch.Generator", _Generator),
    ]
    # Module.to swaps each param with its CudaTensor (tied weights stay tied) instead of setting .data (which
    # would keep the Parameter class and lose the values)
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    # Autograd asks the device guard for the current stream: without a driver, FakeTensorMode's no-op guard
    # (set once for the process, and only when no GPU is usable).
    torch._C._ensureCUDADeviceGuardSet()
    # torch.tensor(data, device='cuda') (and indexing with a list) builds on the CPU, then moves through the
    # dispatcher, as under FakeTensorMode
    lift = torch._C._only_lift_cpu_tensors()
    torch._C._set_only_lift_cpu_tensors(True)
    with contextlib.ExitStack() as stack:
        stack.callback(torch._C._set_only_lift_cpu_tensors, lift)
        stack.callback(torch.__future__.set_swap_module_params_on_conversion, swap)
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(_CudaIndex())
        stack.enter_context(mode)
        yield mode
