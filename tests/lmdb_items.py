"""A data set reading LMDB keys, in a module of its own: spawned DataLoader workers import it (a light import)."""
import os

import torch

from common.data.lmdbreader import LmdbReader
from common.data.storage import read_bytes


class StoreItems(torch.utils.data.Dataset):
    """Item i: (pid of the reading process, bytes of key i of ``store`` as a uint8 tensor, ids of the
    environments this process holds)."""

    def __init__(self, store, keys):
        self.store, self.keys = store, keys

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        data = read_bytes("{}@/{}".format(self.store, self.keys[i]))
        return (os.getpid(), torch.frombuffer(bytearray(data), dtype=torch.uint8),
                [id(env) for env, _ in LmdbReader._envs.values()])
