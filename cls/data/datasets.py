"""Image-classification data sets: CIFAR-10/100 "python version" pickles and the ImageFolder layout (a folder,
or with ``DATASET.LMDB_MODE`` its LMDB store ``{split}.lmdb`` from ``tools/pack_lmdb.py``).

Every item is ``(image float32 [3, S, S], label int64, index int64)`` with ``S = DATASET.IMAGE_SIZE``; the
``index`` (dataset position) lets the test evaluator write the predictions in file order. Sources:
https://www.cs.toronto.edu/~kriz/cifar.html (file layout and keys), torchvision.datasets.ImageFolder (layout).
"""
import io
import os

import numpy as np
import torch
from PIL import Image

from common.data.samplers import resolve_key
from common.data.storage import list_dir, read_bytes, stored_folder, storage_of
from common.errors import UserInputError
from common.fileio.safe_load import load_pickle
from cls.data.augment import build_augment

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _image_set(cfg, mode):
    return {"train": cfg.DATASET.TRAIN_IMAGE_SET, "val": cfg.DATASET.VAL_IMAGE_SET,
            "test": cfg.DATASET.TEST_IMAGE_SET}[mode]


class ClassificationDataset(torch.utils.data.Dataset):
    """Base of the data sets: ``classes`` (names, label order) and ``image(i)`` (PIL RGB) from a subclass;
    ``__getitem__`` applies the split's augmentation (:func:`cls.data.augment.build_augment`) drawing from
    the sample's ``SampleKey`` generator."""
    data_names = ("image", "label", "index")

    def __init__(self, labels, classes, augment):
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.classes = list(classes)
        self.augment = augment

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """The split ``{MODE}_IMAGE_SET`` of ``DATASET.DATASET_PATH`` in the storage of ``DATASET.LMDB_MODE``
        (``transform`` of the shared builder is not used: the augmentation is the cls keys').

        Raises:
            UserInputError: a label is not below ``NETWORK.NUM_CLASSES`` (the loss would fail mid-run).
        """
        dataset = cls(cfg.DATASET.DATASET_PATH, _image_set(cfg, mode), build_augment(cfg, mode),
                      storage_of(cfg.DATASET))
        top = int(dataset.labels.max()) if len(dataset.labels) else -1
        if top >= cfg.NETWORK.NUM_CLASSES:
            raise UserInputError("NETWORK.NUM_CLASSES: expected more than the largest label {} of '{}' split '{}' "
                                 "({} classes), got {}".format(top, cfg.DATASET.DATASET_PATH, _image_set(cfg, mode),
                                                               len(dataset.classes), cfg.NETWORK.NUM_CLASSES))
        return dataset

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        epoch = getattr(key, "epoch", 0)
        return self.augment(self.image(index), generator, epoch), self.labels[index], torch.tensor(index)


class CIFAR(ClassificationDataset):
    """A CIFAR "python version" folder (``cifar-10-batches-py`` / ``cifar-100-python``): the split ``train``
    or ``test``, read with :func:`common.fileio.safe_load.load_pickle` (numpy arrays allowed, nothing else).

    Raises:
        FileNotFoundError: a batch file is missing. common.fileio.safe_load.UnreadableFileError: a file asks for any
        other callable, or is not a pickle. UserInputError: an unknown split, a file without the keys, or
        ``storage`` other than 'folder' (the pickles are read whole, not per image).
    """
    SPLIT_FILES = {}      # split -> batch file names
    META_FILE = ""
    LABEL_KEY = b""       # key of the labels in a batch
    NAMES_KEY = b""       # key of the class names in the meta file

    def __init__(self, root, split, augment, storage="folder"):
        if storage != "folder":
            raise UserInputError("DATASET.LMDB_MODE: CIFAR's pickles are read whole into memory; set it to false")
        if split not in self.SPLIT_FILES:
            raise UserInputError("DATASET.*_IMAGE_SET: a CIFAR split is one of {}, got {!r}".format(
                sorted(self.SPLIT_FILES), split))
        images, labels = [], []
        for name in self.SPLIT_FILES[split]:
            batch = self._read(os.path.join(root, name), (b"data", self.LABEL_KEY))
            images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(int(x) for x in batch[self.LABEL_KEY])
        names = self._read(os.path.join(root, self.META_FILE), (self.NAMES_KEY,))[self.NAMES_KEY]
        super().__init__(labels, [n.decode() if isinstance(n, bytes) else n for n in names], augment)
        self.images = np.concatenate(images).transpose(0, 2, 3, 1)  # N, 32, 32, 3 (RGB)

    @staticmethod
    def _read(path, keys):
        data = load_pickle(path, what="CIFAR file", encoding="bytes", numpy_arrays=True)
        missing = [k.decode() for k in keys if not isinstance(data, dict) or k not in data]
        if missing:
            raise UserInputError("{} is not a CIFAR file: it lacks {}".format(path, ", ".join(missing)))
        return data

    def image(self, index):
        return Image.fromarray(self.images[index])


class CIFAR10(CIFAR):
    __doc__ = CIFAR.__doc__
    SPLIT_FILES = {"train": ["data_batch_{}".format(i) for i in range(1, 6)], "test": ["test_batch"]}
    META_FILE, LABEL_KEY, NAMES_KEY = "batches.meta", b"labels", b"label_names"


class CIFAR100(CIFAR):
    __doc__ = CIFAR.__doc__
    SPLIT_FILES = {"train": ["train"], "test": ["test"]}
    META_FILE, LABEL_KEY, NAMES_KEY = "meta", b"fine_labels", b"fine_label_names"


class ImageFolder(ClassificationDataset):
    """``root/<split>/<class>/<image>``: classes are the sorted folder names of the split (labels in that
    order), images the files with an image extension, sorted. With ``storage`` 'lmdb' the same names are
    read from the store ``root/<split>.lmdb`` (``common.data.storage.stored_folder``), which holds files
    only: a class folder without files is no class there.

    Raises:
        UserInputError: the split folder (or store) is missing or holds no class folder with images.
    """

    def __init__(self, root, split, augment, storage="folder"):
        folder = stored_folder(os.path.join(root, split), storage)
        try:
            classes = list_dir(folder)[0]
        except FileNotFoundError:
            raise UserInputError("image folder {} does not exist (DATASET.DATASET_PATH / *_IMAGE_SET)".format(
                folder)) from None
        self.paths, labels = [], []
        for label, name in enumerate(classes):
            files = [f for f in list_dir("{}/{}".format(folder, name))[1] if f.lower().endswith(IMAGE_EXTENSIONS)]
            self.paths += ["{}/{}/{}".format(folder, name, f) for f in files]
            labels += [label] * len(files)
        if not self.paths:
            raise UserInputError("image folder {} holds no <class>/<image> files".format(folder))
        super().__init__(labels, classes, augment)

    def image(self, index):
        with Image.open(io.BytesIO(read_bytes(self.paths[index]))) as im:
            return im.convert("RGB")
