"""A model built on the meta device, then filled one FSDP shard group at a time with the weights the ordinary
build would give it (random draws included), so that no rank ever holds the whole model.

:func:`record_build` runs a model's build (construction, pretrained files, initialisations) with factory
functions on the meta device, recording each ATen op that touches a meta tensor: no memory, no random draw.
:func:`fill` then replays, for each shard group, only the recorded ops its weights depend on, on the CPU, and
keeps each rank's shard of them. Random ops replay the draws of the ordinary build exactly: one pass over the
recorded random ops on scratch tensors (one tensor at a time) finds the generator's state before each, so a
weight initialised by the build's 100th draw gets the 100th draw's numbers however many groups are filled
before it, and the generator ends where the ordinary build leaves it.

Tensors are tracked by storage, not by Python object: ``param.data``, views and ``.detach()`` alias the same
storage, and an op's arguments are kept as (storage, offset, size, stride, dtype). A real (CPU) tensor that
meets a meta one (a pretrained file's tensor copied into a weight) is kept as its place in the file when the file is
mapped (:mod:`common.fileio.mapped`: safetensors, and zip-format torch files, which
:func:`common.fileio.safe_load.load_tensors` maps on the meta device) and read again when its group is filled, so a
rank never holds a whole pretrained file; any other real tensor is kept by reference until the fill ends.
"""
import warnings

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from common.fileio.mapped import FileRegion, MappedFiles
from common.parallel.fsdp import shard_groups, shard_like


class _View:
    """A meta tensor's place in its storage: ``key`` (the storage), dtype, offset, size, stride."""
    __slots__ = ("key", "dtype", "offset", "size", "stride")

    def __init__(self, tensor):
        self.key = tensor.untyped_storage()._cdata
        self.dtype, self.offset = tensor.dtype, tensor.storage_offset()
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride())


def _is_meta(value):
    return isinstance(value, torch.Tensor) and value.is_meta


def _is_random(func):
    # randn, rand, randint, randperm, *_like have overloads without a generator argument: the tag marks them
    return torch.Tag.nondeterministic_seeded in func.tags or any(a.name == "generator" for a in func._schema.arguments)


def _written(func, args, kwargs):
    """The tensors ``func`` writes in place (its arguments marked ``(a!)`` in its schema, a tensor or a list)."""
    schema = func._schema.arguments
    values = list(args) + [kwargs.get(a.name) for a in schema[len(args):]]
    return [t for arg, value in zip(schema, values) if arg.alias_info is not None and arg.alias_info.is_write
            for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


class _Op:
    """One recorded op: the function, its arguments with meta tensors as :class:`_View` and real ones as
    ``keep(tensor)`` returns them, the storages it writes (in place, or new ones it returns) and the storages it
    reads."""
    __slots__ = ("func", "args", "kwargs", "out", "writes", "reads", "random")

    def __init__(self, func, args, kwargs, out, keep):
        self.func, self.random = func, _is_random(func)
        self.args, self.kwargs = tree_map(
            lambda v: _View(v) if _is_meta(v) else keep(v) if isinstance(v, torch.Tensor) else v, (args, kwargs))
        flat_out = [v for v in tree_flatten(out)[0] if _is_meta(v)]
        self.out = [_View(v) for v in flat_out]
        inputs = [v for v in tree_flatten((self.args, self.kwargs))[0] if isinstance(v, _View)]
        written = {_View(t).key for t in _written(func, args, kwargs) if _is_meta(t)}
        in_keys = {v.key for v in inputs}
        written |= {v.key for v in self.out if v.key not in in_keys}  # new storages
        self.writes, self.reads = written, in_keys


class _Recorder(TorchDispatchMode):
    def __init__(self, own):
        super().__init__()
        self.own = own  # the CPU generator's state: no draw of the build may move it (check_generator)
        self.ops = []
        self.alive = []  # every meta storage seen: a freed one's address (its key) would be reused
        self.nbytes = {}  # key -> size of the storage
        self.files = MappedFiles()  # pins the mappings of the files' tensors kept, until check_mappings

    def keep(self, tensor):
        """What an op keeps of a real tensor argument: its :class:`FileRegion` when its bytes are a mapped file's,
        else the tensor itself."""
        region = self.files.region(tensor)
        return tensor if region is None else region

    def check_generator(self):
        """Refuse a build that moved the CPU generator itself: its meta draws are replayed from the state it
        started at, which a reseed (``torch.manual_seed``, ``torch.set_rng_state``) would not be in the ordinary
        build."""
        if not torch.equal(torch.get_rng_state(), self.own):
            raise NotImplementedError(
                "the model's build set the CPU generator's state (torch.manual_seed, torch.set_rng_state): on the "
                "meta device (a sharded start) its draws are replayed from the state it started at; seed before it")

    def check_mappings(self):
        """Release the file mappings, after checking that nothing in the build wrote into them (their bytes would
        no longer be the file's)."""
        paths = self.files.written()
        self.files.release()
        if paths:
            raise NotImplementedError(
                "the model's build wrote into the tensors read from {} in place; on the meta device (a sharded "
                "start) a pretrained file's tensors are read again from the file when filled, so they must not be "
                "changed in place: use an out-of-place op".format(", ".join(paths)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tensors = [v for v in tree_flatten((args, kwargs, out))[0] if isinstance(v, torch.Tensor)]
        metas = [v for v in tensors if v.is_meta]
        random = _is_random(func) and kwargs.get("generator") is None
        if not metas:
            if random and any(v.device.type == "cpu" for v in tensors):
                # drawn now from a generator the meta draws before it have not moved: not the ordinary build's
                # numbers, and the weights drawn after it would miss its draws when replayed
                raise NotImplementedError(
                    "the model's build draws random numbers on the CPU ({}): on the meta device (a sharded start) "
                    "only draws into meta tensors are replayed; draw on the meta device (no device='cpu', no "
                    "*_like of a CPU tensor) or from a torch.Generator of its own".format(func))
        else:
            if _is_random(func) and kwargs.get("generator") is not None:
                raise NotImplementedError("a build drawing from its own torch.Generator ({}) cannot be built on the "
                                          "meta device".format(func))
            if random:
                self.check_generator()
            op = _Op(func, args, kwargs, out, self.keep)
            unknown = op.reads - op.writes - set(self.nbytes)
            if unknown:  # made by no recorded op (an op PyTorch runs below the dispatcher): its values are lost
                raise NotImplementedError(
                    "{} reads a meta tensor that no recorded op wrote: a tensor made from Python data on the meta "
                    "device (torch.tensor(list), an index given as a list) has no values; make it with "
                    "device='cpu'".format(func))
            self.ops.append(op)
            for v in metas:
                self.nbytes.setdefault(_View(v).key, v.untyped_storage().nbytes())
                self.alive.append(v.untyped_storage())
        return out


class Recording:
    """What :func:`record_build` returns: ``model`` (its parameters and buffers on the meta device), the ops,
    ``views`` (where each parameter and buffer, by qualified name, sits as the build leaves it) and ``states``
    (the generator's state before each random op, of the weights' draws)."""

    def __init__(self, model, ops, states, nbytes):
        self.model, self.ops, self.states, self.nbytes = model, ops, states, nbytes
        self.views = {name: _View(t) for name, t in _named_tensors(model)}


def _named_tensors(model):
    return list(model.named_parameters()) + list(model.named_buffers())


def record_build(build, weights_state=None):
    """``build()`` (returns an ``nn.Module``) run with factory functions on the meta device, its ops recorded; the
    CPU generator is then left where ``build()`` would have left it.

    Args:
        build: the function that builds the model.
        weights_state: the generator's state whose draws the weights take when filled (rank 0's: DDP gives every
            rank rank 0's weights); None: the current state.
    Returns:
        :class:`Recording`.
    Raises:
        NotImplementedError: the build draws from a ``torch.Generator`` of its own, draws on the CPU, reseeds the
            CPU generator, uses a tensor made from Python data on the meta device, or writes in place into a
            tensor of a mapped pretrained file. A build that reads the value of a weight (``.item()``, ``if tensor``)
            fails on the meta device.
    """
    own = torch.get_rng_state()
    recorder = _Recorder(own)
    with torch.device("meta"), recorder, warnings.catch_warnings():
        # load_state_dict warns that a file's tensor copied into a meta weight is a no-op: here it is recorded
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        model = build()
        _real_to_meta(model)
    recorder.check_mappings()
    recorder.check_generator()
    states, end = _random_states(recorder.ops, own if weights_state is None else weights_state)
    if weights_state is not None:
        _, end = _random_states(recorder.ops, own)
    torch.set_rng_state(end)
    return Recording(model, recorder.ops, states, recorder.nbytes)


@torch.no_grad()
def _real_to_meta(model):
    """Replace each real parameter and buffer the build left (a file's tensor made a parameter, ``torch.from_numpy``)
    by a meta tensor copied from it, recorded: fill gives it its value like any other (a tied one stays tied)."""
    made = {}  # id(real tensor) -> (its meta copy, the real tensor: kept alive, so that its id is not reused)
    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, tensor in tensors.items():
                if tensor is None or tensor.is_meta:
                    continue
                if id(tensor) not in made:
                    copy = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta").copy_(tensor)
                    made[id(tensor)] = (torch.nn.Parameter(copy, tensor.requires_grad)
                                        if isinstance(tensor, torch.nn.Parameter) else copy, tensor)
                tensors[name] = made[id(tensor)][0]


def _real(view, storages, device):
    """The real tensor of ``view`` over the materialised storage."""
    return torch.empty(0, dtype=view.dtype, device=device).set_(storages[view.key], view.offset, view.size,
                                                               view.stride)


def _extent(view):
    """Bytes of storage ``view`` reaches (from the storage's start)."""
    if 0 in view.size:
        return 0
    last = view.offset + sum((s - 1) * st for s, st in zip(view.size, view.stride))
    return (last + 1) * view.dtype.itemsize


@torch.no_grad()
def _random_states(ops, state):
    """The CPU generator's state before each random op of ``ops`` when the build starts at ``state`` (the draws
    made on scratch tensors of the op's layout, one op at a time), and the state after the last.

    The scratch tensors of every op share one buffer, allocated once: a new allocation per op, freed between
    ops of other sizes, grew the heap to twice a ViT-B's weights."""
    regions = {}  # op index -> {storage key: byte offset in the buffer}
    size = 0
    for i, op in enumerate(ops):
        if op.random:
            start, regions[i] = 0, {}
            for view in tree_flatten((op.args, op.kwargs))[0]:
                if isinstance(view, _View) and view.key not in regions[i]:
                    regions[i][view.key] = start
                    start += -(-_extent(view) // 64) * 64  # 64-byte aligned for any dtype
            size = max(size, start)
    buffer = torch.empty(size, dtype=torch.uint8)
    saved = torch.get_rng_state()
    torch.set_rng_state(state)
    states = {}
    try:
        for i, region in regions.items():
            states[i] = torch.get_rng_state()
            op = ops[i]

            def scratch(value):
                if isinstance(value, FileRegion):
                    return value.read()
                if not isinstance(value, _View):
                    return value
                base = buffer[region[value.key]:].view(value.dtype)
                return base.as_strided(value.size, value.stride, value.offset)

            args, kwargs = tree_map(scratch, (op.args, op.kwargs))
            if "device" in kwargs:
                kwargs = dict(kwargs, device=torch.device("cpu"))
            op.func(*args, **kwargs)
        return states, torch.get_rng_state()
    finally:
        torch.set_rng_state(saved)


@torch.no_grad()
def _materialise(recording, keys, device):
    """The storages ``keys`` as the build leaves them: the ops they depend on replayed on ``device``, each random
    op from its recorded generator state. Returns ``{key: UntypedStorage}`` (those and the ones they read)."""
    ops, states = recording.ops, recording.states
    needed, wanted = [], set(keys)
    for i in range(len(ops) - 1, -1, -1):
        if ops[i].writes & wanted:
            needed.append(i)
            wanted |= ops[i].reads
    storages, read = {}, {}  # read: the pretrained files' tensors of this group, each read once
    saved = torch.get_rng_state()

    def real(value):
        if isinstance(value, _View):
            return _real(value, storages, device)
        if isinstance(value, FileRegion):
            if id(value) not in read:
                read[id(value)] = value.read().to(device)
            return read[id(value)]
        return value

    try:
        for i in reversed(needed):
            op = ops[i]
            for key in op.writes & set(v.key for v in tree_flatten((op.args, op.kwargs))[0] if isinstance(v, _View)):
                if key not in storages:  # made below the dispatcher (torch.tensor's meta tensor), written here
                    storages[key] = torch.empty(recording.nbytes[key], dtype=torch.uint8,
                                                device=device).untyped_storage()
            args, kwargs = tree_map(real, (op.args, op.kwargs))
            if "device" in kwargs:
                kwargs = dict(kwargs, device=torch.device(device))
            if op.random:
                torch.set_rng_state(states[i])
            out = [v for v in tree_flatten(op.func(*args, **kwargs))[0] if isinstance(v, torch.Tensor)]
            for view, value in zip(op.out, out):
                storages.setdefault(view.key, value.untyped_storage())
    finally:
        torch.set_rng_state(saved)
    return storages


def fill(recording, device, others=()):
    """Give ``recording.model``, since sharded on the meta device (:func:`common.parallel.fsdp.shard_model`), the
    weights of its build: this rank's shards, on ``device``, one shard group materialised at a time (on the CPU).

    Args:
        recording: :class:`Recording` of the build.
        device: where the shards go.
        others: modules with the same parameter and buffer names, sharded as ``recording.model`` on the meta
            device (an EMA copy): given the same weights.
    Returns:
        ``recording.model``.
    """
    model = recording.model
    targets = [model] + list(others)
    for target in targets:
        target.to_empty(device=device)
    done = set()
    for prefix, _ in shard_groups(model):
        names = [n for n, _ in _named_tensors(model) if n not in done and (not prefix or n.startswith(prefix + "."))]
        done |= set(names)
        storages = _materialise(recording, {recording.views[n].key for n in names}, "cpu")
        with torch.no_grad():
            for name in names:
                full = _real(recording.views[name], storages, "cpu").to(device)
                for target in targets:
                    _local(_get(target, name)).copy_(_local(shard_like(full, _get(target, name))))
        del storages
    return model


def _get(model, name):
    module, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(module) if module else model, attr)


def _local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
