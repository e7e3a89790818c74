"""Text-only corpus for the auxiliary masked language modelling task (``general_corpus``).

The reference pretrains on English Wikipedia and BooksCorpus next to Conceptual Captions so that
the model keeps its grasp of long, plain text. A corpus file is plain UTF-8 text with one
passage per line; ``DATASET.TRAIN_ANNOTATION_FILE`` names one file or several joined by ``+``.
"""
import os

from torch.utils.data import Dataset

from common.data.samplers import resolve_key
from common.data.tokenizer import build_tokenizer
from common.errors import UserInputError

from .masking import IGNORE, WholeWordMasker


class CorpusDataError(UserInputError):
    """A text corpus file is missing, unreadable or empty; the message names it."""


def read_passages(ann_file, encoding="utf-8"):
    """Passages of one or more corpus files, in order.

    Args:
        ann_file (str): a path, or several joined by ``+`` (``'bc1g.doc+wiki.doc'``).
        encoding (str): text encoding of the files.
    Returns:
        list of str: every line with surrounding white space removed; blank lines dropped.
    Raises:
        CorpusDataError: a file is missing or not valid text in ``encoding`` (names the file
            and line), or no file has a passage.
    """
    passages = []
    for path in ann_file.split("+"):
        if not os.path.isfile(path):
            raise CorpusDataError("text corpus file '{}' not found (DATASET.*_ANNOTATION_FILE of the "
                                  "general_corpus data set; see data/PREPARE_DATA.md)".format(path))
        with open(path, "rb") as f:
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode(encoding).strip()
                except UnicodeDecodeError as e:
                    raise CorpusDataError("{} line {}: not valid {} text ({})".format(path, line_no, encoding, e)) \
                        from None
                if line:
                    passages.append(line)
    if not passages:
        raise CorpusDataError("text corpus '{}' has no passage (every line is blank)".format(ann_file))
    return passages


class GeneralCorpus(Dataset):
    """Masked-language-modelling samples from a plain-text corpus, one per passage.

    Sample ``i`` starts with the words (BERT basic tokens) of passage ``i``; while it has fewer
    than ``min_seq_len`` words, the words of the following passages are appended (wrapping
    round to the first passage). The words are then masked as whole words
    (``masking.WholeWordMasker``) and the word pieces cut to ``seq_len`` (a word may be cut).
    As in the reference, the sequence has no ``[CLS]`` / ``[SEP]``: the model reads it as
    text without image.

    Args:
        ann_file (str): corpus file(s), ``+``-joined (``read_passages``).
        tokenizer: ``pytorch_pretrained_bert.BertTokenizer``.
        seq_len (int): word pieces per sample at most (``DATASET.SEQ_LEN``, 64).
        min_seq_len (int): words per sample at least, before the cut (``DATASET.MIN_SEQ_LEN``;
            the paper configs use 64, the default 0 keeps passages as they are).
        with_mlm (bool): mask (``NETWORK.WITH_MLM_LOSS``); False gives all-ignore labels.
        encoding (str): text encoding of the files.

    Items: ``dataset[key]`` with an int or a ``SampleKey`` (masks drawn from ``key.generator()``)
    is ``(text, mlm_labels)`` in ``data_names`` order: int64 ``(L,)`` word-piece ids and int64
    ``(L,)`` labels (original id where predicted, -1 elsewhere), ``L <= seq_len``.

    Raises:
        CorpusDataError: see ``read_passages``; ``seq_len < 1``.
    """

    data_names = ["text", "mlm_labels"]
    ignored_labels = {"mlm_labels": IGNORE}  # what the MLM metric and loss skip (see common.data.multitask)

    def __init__(self, ann_file, tokenizer, seq_len=64, min_seq_len=0, with_mlm=True, encoding="utf-8"):
        if seq_len < 1:
            raise CorpusDataError("DATASET.SEQ_LEN of the general_corpus data set must be >= 1, got {}".format(seq_len))
        self.passages = read_passages(ann_file, encoding)
        self.seq_len = seq_len
        self.min_seq_len = min_seq_len
        self.masker = WholeWordMasker(tokenizer, word_prob=0.15 if with_mlm else 0.0)

    @classmethod
    def from_config(cls, cfg, mode, transform=None):
        """Corpus of split ``mode`` from ``DATASET.{MODE}_ANNOTATION_FILE``, ``SEQ_LEN``, ``MIN_SEQ_LEN``,
        ``NETWORK.WITH_MLM_LOSS`` and the vocab of ``NETWORK.BERT_MODEL_NAME`` (``transform`` unused: no image)."""
        d = cfg.DATASET
        return cls(d["{}_ANNOTATION_FILE".format(mode.upper())], build_tokenizer(cfg.NETWORK.BERT_MODEL_NAME),
                   seq_len=d.SEQ_LEN, min_seq_len=d.MIN_SEQ_LEN, with_mlm=cfg.NETWORK.WITH_MLM_LOSS)

    def __len__(self):
        return len(self.passages)

    def words(self, index):
        """Basic-tokenizer words of sample ``index``: its passage, then following passages until
        there are ``min_seq_len`` words, going round the corpus again if it is shorter than that."""
        words = self.masker.words(self.passages[index])
        j = index
        while len(words) < self.min_seq_len:
            j = (j + 1) % len(self.passages)
            words.extend(self.masker.words(self.passages[j]))
            if j == index and not words:
                break  # a full round found no word at all
        return words

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        return self.masker(self.words(index), generator, max_pieces=self.seq_len)
