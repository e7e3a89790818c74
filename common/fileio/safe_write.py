"""Writing a run's files (checkpoints, the effective config): atomic, with ``open()``'s permissions, and
OS failures turned into one message that says which folder, what went wrong and how much space was needed.

The temporary file + ``os.replace`` write follows timm ``utils/checkpoint_saver.py``.
"""
import errno
import os
import shutil
import tempfile

from common.errors import UserInputError

MB = 1e6
_NO_SPACE = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded"}
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


class OutputWriteError(UserInputError):
    """A file of the run could not be written (disk full, folder not writable, ...); the message names
    the folder and the cause. Nothing was replaced: the previous file of that name, if any, is intact."""


def current_umask():
    """The process's umask (read by setting it and setting it back, the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _os_error_in(error):
    """The first ``OSError`` with an errno in ``error``'s chain (torch's writer wraps the OSError that a
    failed ``write`` raised into a RuntimeError and keeps it as ``__context__``), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error
        error = error.__cause__ or error.__context__
    return None


def _size(n):
    return "{:.1f} MB".format(n / MB) if n >= 0.1 * MB else "{:.1f} kB".format(n / 1e3)


def _free_bytes(folder):
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def describe_write_failure(path, error, size_hint=None):
    """One sentence on why ``path`` could not be written, or None when ``error`` is not an OS failure.

    Args:
        path: the file being written.
        error: the exception raised while writing.
        size_hint: bytes the file needs (an estimate), for the disk-full message.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os_error = _os_error_in(error)
    free = _free_bytes(folder)
    if os_error is None:
        if size_hint is None or free is None or free >= size_hint:
            return None
        code = errno.ENOSPC  # the writer lost the errno, but the space is visibly missing
    else:
        code = os_error.errno
    if code in _NO_SPACE:
        need = "needed about {}".format(_size(size_hint)) if size_hint is not None else "size unknown"
        have = ", {} free".format(_size(free)) if free is not None else ""
        cause = "{} ({}{})".format(_NO_SPACE[code], need, have)
    elif code in _NOT_WRITABLE:
        cause = "the folder is not writable ({})".format(os.strerror(code))
    else:
        cause = os.strerror(code)
    return "cannot write {} in folder {}: {}".format(os.path.basename(path), folder, cause)


def atomic_write(path, write, binary=True, size_hint=None):
    """Write ``path`` through ``write(f)`` on a temporary file in the same folder, then rename it over ``path``.

    A crash at any moment leaves either the old ``path`` or the new one, never a torn file (a stale
    ``.{name}.*.tmp`` may remain after a SIGKILL). The file gets the permissions ``open()`` would
    give it (``0o666`` minus the umask), not ``mkstemp``'s ``0o600``. The data and the rename are
    fsynced.

    Args:
        path: destination file; its folder is created if needed.
        write: callable taking the open file object.
        binary: open the temporary file in ``'wb'`` (else ``'w'``) mode.
        size_hint: bytes the file needs (an estimate), for the disk-full message.
    Raises:
        OutputWriteError: an OS failure (disk full, quota, permission, read-only file system, I/O
            error); the message names the file, the folder and the cause. Other errors of
            ``write`` propagate unchanged. The temporary file is removed in both cases.
    """
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(folder, os.O_RDONLY)  # make the rename itself durable
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except Exception as e:
        message = describe_write_failure(path, e, size_hint)
        if message is None:
            raise
        raise OutputWriteError(message) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
