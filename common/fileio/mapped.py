"""Which file a memory-mapped CPU tensor's bytes come from, so they can be read again later instead of held.

torch's loader with ``mmap=True`` and safetensors' reader map the whole file privately (``MAP_PRIVATE``) and
give each tensor a slice of that mapping: nothing is read until a page is touched. A sharded start
(:mod:`common.parallel.meta_init`) keeps, for each pretrained tensor its build copies into the model, only a
:class:`FileRegion` (file, byte offset, layout) and reads the bytes when the tensor's shard group is filled.

The mapping is found in ``/proc/self/maps`` (Linux). A private mapping's page written in place no longer equals
the file: :meth:`MappedFiles.written` finds such pages (``/proc/self/smaps``), however they were written.
"""
import os

import torch


class _File:
    """A mapped file, opened when first seen and kept open: a file replaced (renamed over) or deleted later is
    still read as it was; one changed in place since (its size or modification time) is refused."""
    __slots__ = ("path", "fd", "stat")

    def __init__(self, path):
        self.path, self.fd = path, os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.stat = self._stat()

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)

    def _stat(self):
        stat = os.fstat(self.fd)
        return stat.st_size, stat.st_mtime_ns

    def pread(self, nbytes, offset):
        """``nbytes`` bytes at ``offset``, as a ``bytearray`` (read in place: no second copy)."""
        if self._stat() != self.stat:
            raise OSError("{} was changed after the model's build read it (size, modification time)"
                          .format(self.path))
        data = bytearray(nbytes)
        view, done = memoryview(data), 0
        while done < nbytes:  # Linux reads at most 2 GiB - 4 KiB a call
            n = os.preadv(self.fd, [view[done:]], offset + done)
            if n == 0:
                raise OSError("{} is shorter than when it was read at the start ({} bytes at offset {} expected)"
                              .format(self.path, nbytes, offset))
            done += n
        return data


class FileRegion:
    """A tensor's bytes in a file: ``path``, ``offset`` and ``nbytes`` of the bytes the tensor reaches (not the
    whole storage: views of one big storage read only their own part), and its layout (``dtype``, ``size``,
    ``stride``)."""
    __slots__ = ("file", "path", "offset", "nbytes", "dtype", "size", "stride")

    def __init__(self, file, offset, tensor):
        """``offset``: the byte in ``file`` (a :class:`_File`) where the tensor's storage starts."""
        self.file, self.path = file, file.path
        self.dtype, self.size, self.stride = tensor.dtype, tuple(tensor.shape), tuple(tensor.stride())
        last = tensor.storage_offset() + sum((s - 1) * st for s, st in zip(self.size, self.stride))
        self.offset = offset + tensor.storage_offset() * tensor.element_size()
        self.nbytes = (last + 1 - tensor.storage_offset()) * tensor.element_size()

    def read(self):
        """The tensor, read from the file into new (anonymous) CPU memory.

        Raises:
            OSError: the file cannot be read, or was changed in place (or truncated) since it was mapped.
        """
        storage = torch.frombuffer(self.file.pread(self.nbytes, self.offset), dtype=torch.uint8).untyped_storage()
        return torch.empty(0, dtype=self.dtype).set_(storage, 0, self.size, self.stride)


class MappedFiles:
    """Looks up CPU tensors in this process's private file mappings (``/proc/self/maps``). A mapping where a tensor
    was found is pinned (a tensor of it held, so it stays mapped) until :meth:`release`: an address of a mapping
    found before is trusted only while pinned, since one unmapped may be reused by other memory. Not thread-safe;
    one per build."""

    def __init__(self):
        self._maps = []  # (start, end, file offset, path, inode)
        self._files = {}  # (path, inode) -> _File: a path loaded again after being replaced is another file
        self.pinned = {}  # (start, end) -> (a tensor of that mapping, path)

    def _read_maps(self):
        self._maps = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6 or fields[1][3] != "p" or not fields[5].startswith("/"):
                        continue  # shared (DataLoader shared memory), anonymous or special mappings
                    path = fields[5].rstrip("\n")
                    if path.endswith(" (deleted)") or not os.path.isfile(path):
                        continue
                    start, end = (int(a, 16) for a in fields[0].split("-"))
                    self._maps.append((start, end, int(fields[2], 16), path, fields[4]))
        except OSError:  # no /proc (not Linux): tensors are held as they are
            pass

    def _find(self, address):
        for found in self._maps:
            if found[0] <= address < found[1]:
                return found
        return None

    def region(self, tensor):
        """:class:`FileRegion` of a CPU tensor whose whole storage lies in a private mapping of a regular file
        (its mapping then pinned), or None for any other tensor (one without elements too)."""
        storage = tensor.untyped_storage()
        if tensor.device.type != "cpu" or storage.nbytes() == 0 or tensor.numel() == 0:
            return None
        address = storage.data_ptr()
        found = self._find(address)
        if found is None or found[:2] not in self.pinned:
            self._read_maps()
            found = self._find(address)
        if found is None:
            return None
        start, end, file_offset, path, inode = found
        if address + storage.nbytes() > end:
            return None
        if (path, inode) not in self._files:
            try:
                self._files[path, inode] = _File(path)
            except OSError:  # no longer readable by its path: held
                return None
        self.pinned.setdefault((start, end), (tensor, path))
        return FileRegion(self._files[path, inode], file_offset + address - start, tensor)

    def written(self):
        """Paths of the pinned mappings with a page written in place (``Anonymous`` in ``/proc/self/smaps``: a
        private mapping's page copied on its first write), by any means (an op, ``.numpy()``)."""
        paths, inside = set(), None
        try:
            with open("/proc/self/smaps") as f:
                for line in f:
                    fields = line.split()
                    if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                        start, end = (int(a, 16) for a in fields[0].split("-"))
                        inside = [path for (s, e), (_, path) in self.pinned.items() if s < end and start < e]
                    elif fields[:1] == ["Anonymous:"] and inside and int(fields[1]) > 0:
                        paths.update(inside)
        except OSError:
            pass
        return sorted(paths)

    def release(self):
        """Unpin the mappings (the files stay open for the regions found)."""
        self.pinned = {}
