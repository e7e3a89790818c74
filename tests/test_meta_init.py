"""The meta-device build of a sharded start (common/parallel/meta_init.py) and the pretrained files it maps
(common/fileio/mapped.py): a file's tensors are kept as places in the file, read again when filled, never held.
The whole sharded start is tested through the launcher in tests/test_fsdp.py."""
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
