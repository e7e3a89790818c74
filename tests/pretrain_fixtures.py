"""Shared fixtures of the pretraining data tests: a small vocab in BERT's layout."""
import os
import string

from common.data.tokenizer import build_tokenizer

# BERT's layout in small: [PAD], reserved [unused*] ids around [UNK] [CLS] [SEP] [MASK], then
# punctuation, whole words, word pieces, single letters (so any ascii word splits into pieces)
# and 2000 filler words (so a random replacement rarely equals the original piece).
SPECIALS = (["[PAD]"] + ["[unused{}]".format(i) for i in range(10)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            + ["[unused{}]".format(i) for i in range(10, 20)])
WORDS = [".", ",", "!", "?", "'", "-", "the", "dog", "cat", "sits", "on", "mat", "sun", "##flower",
         "red", "bus", "station", "cafe", "very", "typical", "of", "and", "in", "is", "blue", "sky", "man"]
LETTERS = list(string.ascii_lowercase) + ["##" + c for c in string.ascii_lowercase]
FILLER = ["w{}".format(i) for i in range(2000)]
VOCAB = SPECIALS + WORDS + LETTERS + FILLER


def write_vocab(folder):
    """Write VOCAB as ``{folder}/vocab.txt``; returns the folder."""
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(VOCAB) + "\n")
    return folder


def tokenizer(folder):
    """Lower-casing BertTokenizer on VOCAB (written into ``folder``)."""
    return build_tokenizer(write_vocab(str(folder)), do_lower_case=True)


def ordinary_ids():
    """Ids of the non-bracketed entries of VOCAB, by construction."""
    return list(range(len(SPECIALS), len(VOCAB)))
