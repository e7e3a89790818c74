"""Read files that live inside zip archives, addressed as ``archive.zip@/inner/path``.

The VCR release ships its images as ``vcr1images.zip``; with ``DATASET.ZIP_MODE`` the
dataset reads images and metadata straight from the archive instead of an unpacked folder.
"""
import io
import os
import zipfile

from PIL import Image

ZIP_MARK = ".zip@"


def is_zip_path(path):
    """True when ``path`` points inside an archive (contains ``.zip@``)."""
    return ZIP_MARK in path


def split_zip_path(path):
    """Split ``"a/b.zip@/c/d.jpg"`` into ``("a/b.zip", "c/d.jpg")``.

    Raises:
        ValueError: ``path`` has no ``.zip@`` marker.
    """
    pos = path.find(ZIP_MARK)
    if pos < 0:
        raise ValueError("'{}' is not a zip path: expected 'archive.zip@/inner/path'".format(path))
    archive = path[:pos + len(".zip")]
    inner = path[pos + len(ZIP_MARK):].strip("/")
    return archive, inner


class ZipReader:
    """Per-process cache of open ``zipfile.ZipFile`` handles.

    A ``ZipFile`` shares one file descriptor and its seek position, so a handle opened in
    the parent and inherited by forked DataLoader workers would be read concurrently and
    return garbage. Handles are therefore keyed by ``(pid, archive)``: each worker opens
    its own on first use.
    """

    _handles = {}

    @classmethod
    def _archive(cls, archive):
        key = (os.getpid(), archive)
        handle = cls._handles.get(key)
        if handle is None:
            if not os.path.isfile(archive):
                raise FileNotFoundError("zip archive '{}' does not exist".format(archive))
            handle = zipfile.ZipFile(archive, "r")
            cls._handles[key] = handle
        return handle

    @classmethod
    def read(cls, path):
        """Bytes of the member named by ``archive.zip@/inner/path``.

        Raises:
            FileNotFoundError: the archive, or the member inside it, does not exist.
        """
        archive, inner = split_zip_path(path)
        try:
            return cls._archive(archive).read(inner)
        except KeyError:
            raise FileNotFoundError("'{}' is not inside zip archive '{}'".format(inner, archive)) from None

    @classmethod
    def imread(cls, path):
        """``PIL.Image`` (lazily decoded, as ``Image.open``) of an image inside an archive."""
        return Image.open(io.BytesIO(cls.read(path)))

    @classmethod
    def namelist(cls, archive):
        """Member names of ``archive`` (a plain ``.zip`` path)."""
        return cls._archive(archive).namelist()

    @classmethod
    def close_all(cls):
        """Close every handle this process opened (handy in tests that rewrite archives)."""
        pid = os.getpid()
        for key in [k for k in cls._handles if k[0] == pid]:
            cls._handles.pop(key).close()

