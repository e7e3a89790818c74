"""The meta-device build of a sharded start (common/parallel/meta_init.py) and the pretrained files it maps
(common/fileio/mapped.py): a file's tensors are kept as places in the file, read again when filled, never held.
The whole sharded start is tested through the launcher in tests/test_fsdp.py."""
import mmap
import os

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch.utils._pytree import tree_flatten

from common.fileio.mapped import FileRegion
from common.fileio.safe_load import load_tensors
from common.parallel.meta_init import fill, record_build


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 3)


def pretrained_file(folder, suffix):
    torch.manual_seed(7)
    weights = {"a.weight": torch.randn(5, 6), "a.bias": torch.randn(5), "b.weight": torch.randn(3, 5).half()}
    path = str(folder / ("weights" + suffix))
    if suffix == ".safetensors":
        save_file(weights, path)
    else:  # ".bin": torch's legacy format (before PyTorch 1.6), which cannot be mapped
        torch.save(weights, path, _use_new_zipfile_serialization=suffix == ".pt")
    return path, weights


def build_from(path, change=None):
    def build():
        net = Net()
        weights = load_tensors(path)
        if change:
            change(weights)
        net.a.load_state_dict({k[2:]: v for k, v in weights.items() if k.startswith("a.")})
        with torch.no_grad():
            net.b.weight.copy_(weights["b.weight"].float() * 2)  # computed at the build, on real values: held
        return net
    return build


def mapped_files():
    with open("/proc/self/maps") as f:
        return {line.split(maxsplit=5)[5].strip() for line in f if len(line.split(maxsplit=5)) == 6}


@pytest.mark.parametrize("suffix, mapped", [(".pt", True), (".safetensors", True), (".bin", False)])
def test_a_pretrained_files_tensors_are_kept_as_places_in_the_file_and_fill_equals_the_ordinary_build(
        tmp_path, suffix, mapped):
    path, weights = pretrained_file(tmp_path, suffix)
    torch.manual_seed(0)
    ordinary = build_from(path)()
    torch.manual_seed(0)  # as the engine seeds before its build
    recording = record_build(build_from(path))
    kept = [v for op in recording.ops for v in tree_flatten((op.args, op.kwargs))[0]]
    assert sum(isinstance(v, FileRegion) and v.path == path for v in kept) == (2 if mapped else 0)  # a.*
    held = [v for v in kept if isinstance(v, torch.Tensor) and not v.is_meta]
    assert len(held) == (1 if mapped else 3) and torch.equal(held[-1], weights["b.weight"].float() * 2)
    assert path not in mapped_files()  # the mapping is released once the build is recorded
    model = fill(recording, "cpu")
    # the same ops on the same values: one computation reproducing itself, exactly
    for (name, value), (_, expected) in zip(model.state_dict().items(), ordinary.state_dict().items()):
        assert torch.equal(value, expected), name
    assert torch.equal(model.b.weight, weights["b.weight"].float() * 2)
    assert torch.equal(model.b.bias, ordinary.b.bias)  # a random draw, replayed


def test_a_build_that_changes_a_pretrained_files_tensor_in_place_is_refused_naming_the_file(tmp_path):
    path, _ = pretrained_file(tmp_path, ".pt")
    with pytest.raises(NotImplementedError, match="wrote into the tensors read from {} in place".format(path)):
        record_build(build_from(path, change=lambda w: w["a.bias"].add_(1)))


def test_a_file_replaced_or_deleted_between_the_recording_and_the_fill_still_gives_its_weights(tmp_path):
    path, weights = pretrained_file(tmp_path, ".pt")
    recording = record_build(build_from(path))
    other = str(tmp_path / "other.pt")
    torch.save({k: v + 1 for k, v in weights.items()}, other)
    os.replace(other, path)  # an atomic rewrite of the same name: the file kept open is the one the build read
    assert torch.equal(fill(recording, "cpu").a.weight, weights["a.weight"])
    recording = record_build(build_from(path))
    os.remove(path)
    assert torch.equal(fill(recording, "cpu").a.bias, weights["a.bias"] + 1)


def test_a_file_rewritten_in_place_between_the_recording_and_the_fill_is_refused_naming_it(tmp_path):
    path, weights = pretrained_file(tmp_path, ".pt")
    recording = record_build(build_from(path))
    torch.save({k: v + 1 for k, v in weights.items()}, path)  # same file, same layout, other values
    with pytest.raises(OSError, match="{} was changed after".format(path)):
        fill(recording, "cpu")


def test_a_write_into_a_files_tensor_outside_torchs_ops_is_refused(tmp_path):
    path, _ = pretrained_file(tmp_path, ".safetensors")
    with pytest.raises(NotImplementedError, match="wrote into the tensors read from {} in place".format(path)):
        record_build(build_from(path, change=lambda w: w["a.bias"].numpy().__setitem__(0, 5.0)))


def test_a_view_of_a_big_storage_reads_only_its_own_bytes(tmp_path):
    path = str(tmp_path / "views.pt")
    big = torch.randn(1000, 6)
    torch.save({"weight": big[10:15], "bias": big[20, 1:]}, path)  # views: the file holds all of big

    def build():
        net = Net()
        net.a.load_state_dict(load_tensors(path))
        return net
    recording = record_build(build)
    regions = [v for op in recording.ops for v in tree_flatten((op.args, op.kwargs))[0] if isinstance(v, FileRegion)]
    assert sorted(r.nbytes for r in regions) == [5 * 4, 30 * 4]
    model = fill(recording, "cpu")
    assert torch.equal(model.a.weight, big[10:15]) and torch.equal(model.a.bias, big[20, 1:])


def test_a_files_tensor_made_a_parameter_and_a_buffer_from_numpy_are_filled(tmp_path):
    path, weights = pretrained_file(tmp_path, ".pt")

    def build():
        net = Net()
        net.a.weight = torch.nn.Parameter(load_tensors(path)["a.weight"])
        net.register_buffer("table", torch.from_numpy(np.arange(4.0)))
        return net
    torch.manual_seed(0)
    ordinary = build()
    torch.manual_seed(0)
    recording = record_build(build)
    assert all(t.is_meta for t in recording.model.state_dict().values())
    for (name, value), (_, expected) in zip(fill(recording, "cpu").state_dict().items(), ordinary.state_dict().items()):
        assert torch.equal(value, expected), name


class Drawn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.pos = torch.nn.Parameter(torch.randn(3, 4) * .02)  # randn/rand/randint overloads name no generator
        self.order = torch.nn.Buffer(torch.randperm(7))
        self.b = torch.nn.Linear(4, 4)


def test_random_factory_functions_are_replayed_as_draws():
    torch.manual_seed(0)
    ordinary, after = Drawn(), torch.rand(3)
    torch.manual_seed(0)
    recording = record_build(Drawn)
    assert torch.equal(torch.rand(3), after)  # the generator is left where the ordinary build leaves it
    for (name, value), (_, expected) in zip(fill(recording, "cpu").state_dict().items(), ordinary.state_dict().items()):
        assert torch.equal(value, expected), name


@pytest.mark.parametrize("draw, message", [
    (lambda: torch.randn(3, device="cpu"), "draws random numbers on the CPU"),
    (lambda: torch.manual_seed(3), "set the CPU generator's state")])
def test_a_build_moving_the_cpu_generator_itself_is_refused(draw, message):
    def build():
        first = torch.nn.Linear(4, 4)
        draw()
        return torch.nn.Sequential(first, torch.nn.Linear(4, 4))
    with pytest.raises(NotImplementedError, match=message):
        record_build(build)


def test_an_anonymous_tensor_at_the_addresses_of_a_file_unmapped_since_is_held(tmp_path):
    small, _ = pretrained_file(tmp_path, ".pt")
    big = str(tmp_path / "big.pt")
    torch.save({"x": torch.randn(1 << 18)}, big)
    landed = []

    def build():
        net = build_from(small)()
        net.register_buffer("x", torch.zeros(1 << 12))
        mapped = load_tensors(big)
        start = mapped["x"].untyped_storage().data_ptr()
        net.a.weight.data.copy_(load_tensors(small)["a.weight"])  # a new mapping: /proc/self/maps read, big's in it
        del mapped  # big unmapped: its addresses free
        kept = []
        for _ in range(4096):  # anonymous memory, highest free addresses first, until it takes big's
            kept.append(mmap.mmap(-1, 1 << 14))
            values = torch.frombuffer(kept[-1], dtype=torch.float32)
            if start <= values.data_ptr() < start + (1 << 20) - (1 << 14):
                landed.append(True)
                break
        values.numpy()[:] = 3.0
        net.x.copy_(values)
        return net
    recording = record_build(build)
    if not landed:
        pytest.skip("no anonymous mapping took the unmapped file's addresses")
    assert torch.equal(fill(recording, "cpu").x, torch.full((1 << 12,), 3.0))
