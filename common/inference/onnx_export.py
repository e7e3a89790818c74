"""ONNX export of a task model, checked right after against the eager model with onnxruntime.

The order of timm's ``onnx_export.py`` + ``onnx_validate.py``: export, then run the file with onnxruntime on
inputs the export never saw and compare with the eager model. A task describes its graph as an
:class:`OnnxGraph` (:meth:`common.task.Task.onnx_graph`); a task that has none is refused by name with its
reason (:class:`common.errors.ExportRefused`).

The exporter is ``torch.onnx.export(dynamo=True)`` (``torch.export`` + onnxscript): the TorchScript exporter
(``dynamo=False``) traces Python ints read from tensors (the batch's longest text) as constants, which gives a
graph fixed to the traced input (for VL-BERT, one that onnxruntime refuses to load). Under ``torch.export`` the models size such tensors by the inputs' padded
shapes (:func:`common.modeling.module.exporting`).
"""
import importlib.util
import json
import os
import warnings
from typing import Callable, Dict, NamedTuple, Sequence, Tuple

import torch

from common.errors import UserInputError
from common.fileio.safe_write import atomic_write

# torch.onnx's dynamo exporter writes opset 18 natively; 17 goes through onnx's version converter.
DEFAULT_OPSET = 18
MIN_OPSET = 17
# The check's tolerance on max |onnx - eager| (the figure; fp32 graphs differ by ~1e-6).
TOLERANCE = 1e-4


class OnnxGraph(NamedTuple):
    """What a task exports: the inference forward as a function of named tensors.

    Fields:
        module: ``nn.Module`` in eval mode; ``module(*inputs)`` (in ``input_names`` order) returns a tuple of
            tensors in ``output_names`` order.
        input_names, output_names: the ONNX graph's names (documented per task in docs/export.md).
        dynamic: input name -> {axis: dimension name} of the axes left free (batch, text length, boxes).
        example: ``example(case)`` -> tuple of input tensors; case 0 is traced, cases 1..3 are the check's
            (different batch sizes and lengths where the graph has them).
        metadata: how to feed the graph (name -> JSON-able value), written JSON-encoded into the file's
            ``metadata_props`` with timm's ``pretrained_cfg`` names where they exist (docs/export.md).
    """
    module: torch.nn.Module
    input_names: Sequence[str]
    output_names: Sequence[str]
    dynamic: Dict[str, Dict[int, str]]
    example: Callable[[int], Tuple[torch.Tensor, ...]]
    metadata: Dict[str, object] = {}


class NamedOutputs(torch.nn.Module):
    """``model(*inputs)`` of a task model in eval mode, its outputs dict reduced to a tuple: ``forward(*inputs)``
    calls ``model.inference_forward`` with ``fixed`` (position -> value, e.g. ``None`` for an unused image)
    inserted and returns ``tuple(outputs[n] for n in names)``."""

    def __init__(self, model, names, fixed=None):
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.fixed = dict(fixed or {})

    def forward(self, *inputs):
        args = list(inputs)
        for position in sorted(self.fixed):
            args.insert(position, self.fixed[position])
        outputs = self.model.inference_forward(*args)
        return tuple(outputs[n] for n in self.names)


def check_packages():
    """Stop with the install command when onnx, onnxruntime or onnxscript is missing (requirements-export.txt).

    Raises:
        UserInputError: names the missing packages.
    """
    missing = [name for name in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise UserInputError("the ONNX export needs {} (pip install -r requirements-export.txt)".format(
            ", ".join(missing)))


def check_opset(opset):
    """``opset`` if it is at least :data:`MIN_OPSET`; UserInputError otherwise."""
    if opset < MIN_OPSET:
        raise UserInputError("--opset: expected {} or more (SDPA attention and LayerNorm need it), got {}".format(
            MIN_OPSET, opset))
    return opset


def export_onnx(graph, path, opset=DEFAULT_OPSET, metadata=None):
    """Write ``graph`` to the ONNX file ``path`` (weights inside the file, written atomically), with
    ``graph.metadata`` and ``metadata`` (name -> JSON-able value; ``metadata`` wins) as ``metadata_props``, each
    value JSON-encoded.

    Raises:
        UserInputError: ``opset`` below :data:`MIN_OPSET`. OutputWriteError: ``path`` cannot be written.
        torch.onnx errors: the model does not export (a bug to report: the task declared a graph).
    """
    from torch.export import Dim

    check_opset(opset)
    dims = {}
    # one entry per input of forward(*inputs), in order
    shapes = {"inputs": tuple({axis: dims.setdefault(label, Dim(label)) for axis, label in graph.dynamic.get(
        name, {}).items()} or None for name in graph.input_names)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and version-conversion notes
        program = torch.onnx.export(graph.module, graph.example(0), dynamo=True, opset_version=opset,
                                    input_names=list(graph.input_names), output_names=list(graph.output_names),
                                    dynamic_shapes=shapes, external_data=False, verbose=False)
    proto = program.model_proto
    for key, value in dict(graph.metadata, **(metadata or {})).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    data = proto.SerializeToString()
    atomic_write(path, lambda f: f.write(data), size_hint=len(data))
    return path


def check_onnx(graph, path, cases=(1, 2, 3)):
    """Run the ONNX file with onnxruntime (CPU) on the example ``cases`` and compare with the eager module.

    Returns:
        list of ``(shapes, max |onnx - eager|)`` per case, ``shapes`` the inputs' shapes, the difference over
        every output (float64 of fp32 values).
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    results = []
    for case in cases:
        inputs = graph.example(case)
        with torch.no_grad():
            eager = graph.module(*inputs)
        feed = {name: t.numpy() for name, t in zip(graph.input_names, inputs)}
        got = session.run(list(graph.output_names), feed)
        diff = max(float((torch.from_numpy(o).double() - e.double()).abs().max()) for o, e in zip(got, eager))
        results.append(([tuple(t.shape) for t in inputs], diff))
    return results
