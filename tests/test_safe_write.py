"""Atomic writes of checkpoints and config.yaml: open()'s permissions under the umask, and OS failures
(disk full, folder not writable) as one message naming the folder, the cause and the last good file."""
import collections
import errno
import io
import os
import re
import tempfile

import pytest
import torch
from yacs.config import CfgNode

from common.checkpoint import checkpointer as ck
from common.config import dump_config
from common.errors import UserInputError
from common.fileio import safe_write
from common.fileio.safe_write import OutputWriteError, atomic_write


def model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 300)  # 361 kB of fp32 weights
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o027, 0o640), (0o002, 0o664), (0o077, 0o600)])
def test_checkpoint_and_config_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    model, optimizer = model_and_optimizer()
    path = str(tmp_path / "out" / "m-0000.model")
    ck.save_checkpoint(path, model, optimizer)
    dump_config(CfgNode({"A": 1}), str(tmp_path / "out" / "config.yaml"))
    with open(tmp_path / "plain", "w"):
        pass
    assert os.stat(tmp_path / "plain").st_mode & 0o777 == mode  # what open() gives
    assert os.stat(path).st_mode & 0o777 == mode
    assert os.stat(tmp_path / "out" / "config.yaml").st_mode & 0o777 == mode
    assert torch.equal(ck.load_checkpoint_file(path)["state_dict"]["weight"], model.weight)


class FullDisk(io.FileIO):
    """A file on a device that fills up after ``room`` bytes, as a real full disk does (ENOSPC from write)."""
    room = 10_000

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def full_disk_fdopen(fd, mode="r", *args, **kwargs):
    return io.BufferedWriter(FullDisk(fd, "wb")) if "w" in mode else os.fdopen(fd, mode, *args, **kwargs)


def listing(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def test_disk_full_names_folder_sizes_and_last_good_checkpoint(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()
    prefix = str(tmp_path / "m")
    ck.save_checkpoint(ck.epoch_checkpoint_path(prefix, 0), model, optimizer)
    before = listing(tmp_path)
    monkeypatch.setattr(safe_write.os, "fdopen", full_disk_fdopen)
    with pytest.raises(OutputWriteError) as info:
        ck.save_checkpoint([ck.epoch_checkpoint_path(prefix, 1), ck.best_checkpoint_path(prefix)], model, optimizer)
    message = str(info.value)
    assert isinstance(info.value, UserInputError)  # common.cli.run_main: one error line, exit code 2
    sizes = re.search(r"needed about ([\d.]+) MB, ([\d.]+) MB free", message)
    # the estimate (the tensors' bytes) is about the size of the good file of the same state
    assert sizes and float(sizes.group(1)) == pytest.approx(len(before["m-0000.model"]) / 1e6, abs=0.06)
    assert message.startswith("cannot write m-0001.model in folder {}: no space left on the device"
                              .format(tmp_path))
    assert message.endswith("the last good checkpoint, m-0000.model, is intact: free the space or fix the folder "
                            "and run again, TRAIN.AUTO_RESUME continues from it")
    assert "\n" not in message and ".tmp" not in message and "enforce fail" not in message
    assert listing(tmp_path) == before  # no partial file, no temporary file, the old one untouched


def test_unwritable_folder_without_earlier_checkpoint(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()

    def denied(dir=None, prefix="", suffix="", **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(dir, prefix + "abc" + suffix))
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(OutputWriteError) as info:
        ck.save_checkpoint(str(tmp_path / "m-0000-b0000004.model"), model, optimizer)
    assert str(info.value) == ("cannot write m-0000-b0000004.model in folder {}: the folder is not writable "
                               "(Permission denied); no earlier checkpoint of this run exists".format(tmp_path))
    with pytest.raises(OutputWriteError, match=r"cannot write config.yaml in folder .*: the folder is not writable"):
        dump_config(CfgNode({"A": 1}), str(tmp_path / "config.yaml"))
    assert os.listdir(tmp_path) == []


def test_lost_errno_is_diagnosed_from_free_space(tmp_path, monkeypatch):
    """A writer that reports only 'write failed' on a disk with less room than the file needs."""
    def failing(f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . file write failed")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(safe_write.shutil, "disk_usage", lambda folder: usage(10 ** 9, 10 ** 9 - 2_000_000, 2_000_000))
    with pytest.raises(OutputWriteError, match=r"no space left on the device \(needed about 5.0 MB, 2.0 MB free\)"):
        atomic_write(str(tmp_path / "x.bin"), failing, size_hint=5_000_000)
    with pytest.raises(RuntimeError, match="enforce fail"):  # room enough: not a disk problem, passed on
        atomic_write(str(tmp_path / "x.bin"), failing, size_hint=1_000_000)
    assert os.listdir(tmp_path) == []


def test_other_errors_pass_unchanged_and_old_file_stays(tmp_path):
    path = tmp_path / "x.bin"
    atomic_write(str(path), lambda f: f.write(b"old"))

    def bad(f):
        f.write(b"half")
        raise TypeError("cannot pickle this")
    with pytest.raises(TypeError, match="cannot pickle this"):
        atomic_write(str(path), bad)
    assert listing(tmp_path) == {"x.bin": b"old"}
