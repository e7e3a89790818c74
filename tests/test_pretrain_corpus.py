"""Text corpus for the auxiliary MLM task (pretrain/data/general_corpus.py) and the demo corpus script."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from common.data.samplers import SampleKey
from pretrain.data.general_corpus import CorpusDataError, GeneralCorpus, read_passages
from pretrain.data.masking import IGNORE
from tests.pretrain_fixtures import tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSAGES = ["The dog sits.",            # 4 words: the dog sits .
            "",
            "   The red bus,   ",       # 4 words: the red bus ,
            "A cat on the mat!",        # 6 words
            "Sunflowers"]               # 1 word, 3 pieces


@pytest.fixture
def tok(tmp_path):
    return tokenizer(tmp_path)


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "a.doc"
    path.write_text("\n".join(PASSAGES) + "\n", encoding="utf-8")
    return str(path)


def plain(tok, text):
    return tok.convert_tokens_to_ids(tok.tokenize(text))


def test_read_passages_strips_and_drops_blank_lines(corpus_file, tmp_path):
    assert read_passages(corpus_file) == ["The dog sits.", "The red bus,", "A cat on the mat!", "Sunflowers"]
    other = tmp_path / "b.doc"
    other.write_text("\n\nblue sky\n", encoding="utf-8")
    assert read_passages(corpus_file + "+" + str(other))[-2:] == ["Sunflowers", "blue sky"]


def test_passages_as_they_are_without_min_len(corpus_file, tok):
    ds = GeneralCorpus(corpus_file, tok, seq_len=64, min_seq_len=0, with_mlm=False)
    assert len(ds) == 4 and ds.data_names == ["text", "mlm_labels"]
    for i, passage in enumerate(read_passages(corpus_file)):
        text, labels = ds[i]
        assert text.dtype == labels.dtype == torch.int64
        assert text.tolist() == plain(tok, passage)
        assert labels.tolist() == [IGNORE] * len(text)


def test_short_passages_are_joined_up_to_min_len_then_cut_to_seq_len(corpus_file, tok):
    ds = GeneralCorpus(corpus_file, tok, seq_len=64, min_seq_len=8, with_mlm=False)
    # passage 0 (4 words) + passage 1 (4) = 8 words
    assert ds[0][0].tolist() == plain(tok, "The dog sits. The red bus,")
    # passage 1 (4) + 2 (6) = 10 words
    assert ds[1][0].tolist() == plain(tok, "The red bus, A cat on the mat!")
    # passage 3 (1 word) wraps round: + 0 (4) + 1 (4) = 9 words
    assert ds[3][0].tolist() == plain(tok, "Sunflowers The dog sits. The red bus,")
    cut = GeneralCorpus(corpus_file, tok, seq_len=5, min_seq_len=8, with_mlm=False)
    assert cut[3][0].tolist() == plain(tok, "Sunflowers The dog")[:5]  # sun ##flower ##s the dog
    assert len(plain(tok, "Sunflowers The dog")) == 5


def test_a_corpus_shorter_than_min_len_goes_round_again(tmp_path, tok):
    path = tmp_path / "c.doc"
    path.write_text("the dog\nthe cat\n", encoding="utf-8")
    ds = GeneralCorpus(str(path), tok, seq_len=64, min_seq_len=7, with_mlm=False)
    assert ds[1][0].tolist() == plain(tok, "the cat the dog the cat the dog")
    path.write_text("\x07\n", encoding="utf-8")  # a passage the tokenizer reduces to nothing
    assert GeneralCorpus(str(path), tok, min_seq_len=7)[0][0].shape == (0,)


def test_masked_sample_labels_line_up_and_follow_the_key(corpus_file, tok):
    ds = GeneralCorpus(corpus_file, tok, seq_len=12, min_seq_len=30)
    for index in range(4):
        expected = torch.tensor(plain(tok, " ".join(ds.words(index)))[:12])
        for epoch in range(30):
            text, labels = ds[SampleKey(index, epoch, 0)]
            assert len(text) == len(labels) == 12
            predicted = labels != IGNORE
            assert torch.equal(labels[predicted], expected[predicted])
            assert torch.equal(text[~predicted], expected[~predicted])
        a, b = ds[SampleKey(index, 1, 0)], ds[SampleKey(index, 1, 0)]
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_corpus_errors_name_the_file(tmp_path, tok):
    missing = str(tmp_path / "missing.doc")
    with pytest.raises(CorpusDataError, match="missing.doc' not found"):
        GeneralCorpus(missing, tok)
    blank = tmp_path / "blank.doc"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(CorpusDataError, match="no passage"):
        GeneralCorpus(str(blank), tok)
    bad = tmp_path / "bad.doc"
    bad.write_bytes(b"fine\nnot \xff utf-8\n")
    with pytest.raises(CorpusDataError, match="bad.doc line 2: not valid utf-8"):
        GeneralCorpus(str(bad), tok)
    assert issubclass(CorpusDataError, ValueError)


def _demo_module():
    spec = importlib.util.spec_from_file_location("make_demo_corpus", os.path.join(ROOT, "demo", "make_demo_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_corpus_from_the_standard_library(tmp_path, tok):
    demo = _demo_module()
    zen = demo.zen_of_python()
    assert len(zen) == 19
    assert zen[0] == "Beautiful is better than ugly."
    assert zen[-1] == "Namespaces are one honking great idea -- let's do more of those!"
    out = str(tmp_path / "en_corpus" / "demo.doc")
    subprocess.run([sys.executable, os.path.join(ROOT, "demo", "make_demo_corpus.py"), "--out", out],
                   check=True, capture_output=True)
    passages = read_passages(out)
    assert passages == demo.demo_passages() and passages[:19] == zen
    if os.path.isfile(demo.stdlib_file(os.path.join("test", "test_zlib.py"))):
        hamlet = demo.hamlet_scene()
        assert len(passages) == 57 and len(hamlet) == 38
        assert hamlet[0] == "O, fear me not." and hamlet[-1] == "Farewell."
        assert "This above all: to thine ownself be true," in hamlet
        assert not any(p.isupper() or p.startswith("Enter ") for p in hamlet)  # no speaker or stage line
    ds = GeneralCorpus(out, tok, seq_len=64, min_seq_len=64)
    assert len(ds) == len(passages) and len(ds[0][0]) == 64


def test_padding_of_a_batch_is_never_predicted(corpus_file, tok):
    from common.data.collate import BatchCollator
    from pretrain.data.padding import PAD_VALUES

    ds = GeneralCorpus(corpus_file, tok, seq_len=64, min_seq_len=0)
    items = [ds[SampleKey(i, 0, 0)] for i in range(4)]
    text, labels = BatchCollator(ds.data_names, pad_values=PAD_VALUES)(items)
    lengths = [len(t) for t, _ in items]
    assert text.shape == labels.shape == (4, max(lengths))
    for row, (t, l), n in zip(range(4), items, lengths):
        assert torch.equal(text[row, :n], t) and torch.equal(labels[row, :n], l)
        assert (text[row, n:] == 0).all() and (labels[row, n:] == IGNORE).all()
    assert (labels[text == 0] == IGNORE).all()
