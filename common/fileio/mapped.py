"""Which file a memory-mapped CPU tensor's bytes come from, so they can be read again later instead of held.

``torch.load(mmap=True)`` and safetensors' reader map the whole file privately (``MAP_PRIVATE``) and give each
tensor a slice of that mapping: nothing is read until a page is touched. A sharded start
(:mod:`common.parallel.meta_init`) keeps, for each pretrained tensor its build copies into the model, only a
:class:`FileRegion` (file, byte offset, layout) and reads the bytes when the tensor's shard group is filled.

The mapping is found in ``/proc/self/maps`` (Linux). A private mapping's page written in place no longer equals
the file: the caller must see the writes (:mod:`common.parallel.meta_init` watches every op of the build).
"""
import os

import torch


class FileRegion:
    """A tensor's storage as bytes of a file: ``path``, ``offset`` (bytes), ``nbytes``, and the tensor's layout in
    its storage (``dtype``, ``storage_offset`` in elements, ``size``, ``stride``)."""
    __slots__ = ("path", "offset", "nbytes", "dtype", "storage_offset", "size", "stride")

    def __init__(self, path, offset, tensor):
        self.path, self.offset, self.nbytes = path, offset, tensor.untyped_storage().nbytes()
        self.dtype, self.storage_offset = tensor.dtype, tensor.storage_offset()
        self.size, self.stride = tuple(tensor.shape), tuple(tensor.stride())

    def read(self):
        """The tensor, read from the file into new (anonymous) CPU memory.

        Raises:
            OSError: the file cannot be read, or is shorter than it was when mapped.
        """
        with open(self.path, "rb") as f:
            data = os.pread(f.fileno(), self.nbytes, self.offset)
        if len(data) != self.nbytes:
            raise OSError("{} is shorter than when it was read at the start ({} bytes at offset {} expected)"
                          .format(self.path, self.nbytes, self.offset))
        storage = torch.frombuffer(bytearray(data), dtype=torch.uint8).untyped_storage()
        return torch.empty(0, dtype=self.dtype).set_(storage, self.storage_offset, self.size, self.stride)


class MappedFiles:
    """Looks up CPU tensors in this process's private file mappings (``/proc/self/maps``, re-read when an address
    is not in the last reading). Not thread-safe; one per build."""

    def __init__(self):
        self._maps = []  # (start, end, file offset, path)

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
                    self._maps.append((start, end, int(fields[2], 16), path))
        except OSError:  # no /proc (not Linux): tensors are held as they are
            pass

    def _find(self, address):
        for start, end, offset, path in self._maps:
            if start <= address < end:
                return start, end, offset, path
        return None

    def region(self, tensor):
        """:class:`FileRegion` of a CPU tensor whose whole storage lies in a private mapping of a regular file,
        with the mapping's (start, end) addresses; (None, None) for any other tensor."""
        storage = tensor.untyped_storage()
        if tensor.device.type != "cpu" or storage.nbytes() == 0:
            return None, None
        address = storage.data_ptr()
        found = self._find(address)
        if found is None:
            self._read_maps()
            found = self._find(address)
        if found is None:
            return None, None
        start, end, file_offset, path = found
        if address + storage.nbytes() > end:
            return None, None
        return FileRegion(path, file_offset + address - start, tensor), (start, end)

