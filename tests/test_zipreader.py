import multiprocessing as mp
import os
import zipfile

import numpy as np
import pytest
from PIL import Image

from common.data.storage import read_bytes
from common.data.zipreader import ZipReader, is_zip_path, split_zip_path


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "images.zip"
    img = Image.fromarray(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3))
    png = tmp_path / "a.png"
    img.save(png)
    with zipfile.ZipFile(path, "w") as z:
        z.write(png, "images/sub/a.png")
        z.writestr("images/meta.json", b'{"k": 1}')
    yield str(path)
    ZipReader.close_all()


def test_split_zip_path():
    assert split_zip_path("/d/vcr1images.zip@/vcr1images/m/x.jpg") == ("/d/vcr1images.zip", "vcr1images/m/x.jpg")
    assert is_zip_path("a.zip@/b") and not is_zip_path("a/b.jpg")
    with pytest.raises(ValueError, match="archive.zip@/inner/path"):
        split_zip_path("/d/plain/x.jpg")


def test_read_member_and_image(archive):
    assert read_bytes(archive + "@/images/meta.json") == b'{"k": 1}'
    im = ZipReader.imread(archive + "@/images/sub/a.png")
    assert np.array_equal(np.asarray(im), np.arange(72, dtype=np.uint8).reshape(4, 6, 3))
    assert sorted(ZipReader.namelist(archive)) == ["images/meta.json", "images/sub/a.png"]


def test_missing_member_and_archive(archive, tmp_path):
    with pytest.raises(FileNotFoundError, match="'images/nope.jpg' is not inside zip archive"):
        read_bytes(archive + "@/images/nope.jpg")
    with pytest.raises(FileNotFoundError, match="zip archive '.*other.zip' does not exist"):
        read_bytes(str(tmp_path / "other.zip") + "@/x")


def _child_read(path, queue):
    queue.put(read_bytes(path))


def test_forked_worker_opens_its_own_handle(archive):
    path = archive + "@/images/meta.json"
    read_bytes(path)  # parent opens and caches a handle before forking
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child_read, args=(path, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=20) for _ in procs]
    for p in procs:
        p.join()
    assert results == [b'{"k": 1}'] * 2
    assert {pid for pid, _ in ZipReader._handles} == {os.getpid()}
