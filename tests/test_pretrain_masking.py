"""Whole-word masked language modelling and masked RoI classification (pretrain/data/masking.py)."""
import random

import pytest
import torch

from common.data.samplers import SampleKey
from pretrain.data.masking import (IGNORE, WholeWordMasker, mask_regions, ordinary_piece_ids, region_pixel_mask,
                                   whole_image_feature)
from pretrain.data.truncation import truncate_text_and_regions
from tests.pretrain_fixtures import FILLER, SPECIALS, VOCAB, ordinary_ids, tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return tokenizer(tmp_path_factory.mktemp("vocab"))


def word_pieces(tok, words):
    return [tok.wordpiece_tokenizer.tokenize(w) for w in words]


def test_ordinary_piece_ids_exclude_every_bracketed_token(tok):
    assert ordinary_piece_ids(tok.vocab).tolist() == ordinary_ids()
    assert len(SPECIALS) == 25 and ordinary_ids()[0] == 25


def test_masking_statistics_on_a_fixed_seed(tok):
    """15% of words chosen; of those 80% [MASK], 10% random, 10% kept; whole words only."""
    masker = WholeWordMasker(tok)
    rng = random.Random(0)
    vocab_words = ["sunflowers", "dog", "station", "typical", "cafe", "xyzzy"] + FILLER[:200]
    mask_id = tok.vocab["[MASK]"]
    counts = {"words": 0, "chosen": 0, "mask": 0, "random": 0, "keep": 0}
    for index in range(400):
        words = [rng.choice(vocab_words) for _ in range(50)]
        ids, labels = (t.tolist() for t in masker(words, SampleKey(index, 3, 7).generator()))
        pieces_of_words = word_pieces(tok, words)
        assert len(ids) == len(labels) == sum(len(p) for p in pieces_of_words)
        start = 0
        for pieces in pieces_of_words:
            word_ids, word_labels = ids[start:start + len(pieces)], labels[start:start + len(pieces)]
            start += len(pieces)
            original_ids = tok.convert_tokens_to_ids(pieces)
            counts["words"] += 1
            if word_labels == [IGNORE] * len(pieces):
                assert word_ids == original_ids
                continue
            # every piece of a chosen word is predicted, with its own id
            assert word_labels == original_ids
            counts["chosen"] += 1
            if all(i == mask_id for i in word_ids):
                counts["mask"] += 1
            elif word_ids == original_ids:
                counts["keep"] += 1
            else:
                assert mask_id not in word_ids  # a word is masked whole or not at all
                counts["random"] += 1
    assert counts["words"] == 20000
    assert abs(counts["chosen"] / counts["words"] - 0.15) < 0.01  # binomial sd 0.0025
    for fate, share, tol in (("mask", 0.8, 0.03), ("random", 0.1, 0.02), ("keep", 0.1, 0.02)):
        assert abs(counts[fate] / counts["chosen"] - share) < tol, (fate, counts)


def test_random_replacements_are_ordinary_pieces_only(tok):
    masker = WholeWordMasker(tok, word_prob=1.0, mask_prob=0.0, random_prob=1.0)
    words = ["dog"] * 20000
    ids, labels = masker(words, SampleKey(0, 0, 1).generator())
    assert (labels == tok.vocab["dog"]).all()
    drawn = set(ids.tolist())
    assert drawn <= set(ordinary_ids())
    assert len(drawn) > 1900  # spread over the 2083 ordinary pieces, not a few
    assert not drawn & set(range(len(SPECIALS)))


def test_specials_are_never_masked(tok):
    """[CLS] / [SEP] around a caption, and literal special tokens in the text, keep their id and label -1."""
    masker = WholeWordMasker(tok, word_prob=1.0, mask_prob=1.0, random_prob=0.0)
    words = masker.words("the dog [SEP] sits [MASK] [PAD] on [CLS] [UNK]")
    ids, labels = masker.caption(words, SampleKey(0, 0, 0).generator())
    v = tok.vocab
    expected_ids = [v["[CLS]"]] + [v["[MASK]"], v["[MASK]"], v["[SEP]"], v["[MASK]"], v["[MASK]"], v["[PAD]"],
                                   v["[MASK]"], v["[CLS]"], v["[MASK]"]] + [v["[SEP]"]]
    expected_labels = [IGNORE] + [v["the"], v["dog"], IGNORE, v["sits"], IGNORE, IGNORE, v["on"], IGNORE,
                                  v["[UNK]"]] + [IGNORE]
    assert ids.tolist() == expected_ids
    assert labels.tolist() == expected_labels


def test_labels_line_up_with_word_pieces_for_unusual_text(tok):
    """Long words split into many pieces, unknown characters, accents, CJK, punctuation, a word over
    100 characters: label i is the id of word piece i of the reference tokenisation."""
    text = ("Sunflowers!! Zyxwvut's cafÉ -- dog🙂 猫 cat? " + "a" * 120 + " supercalifragilistic, the end.")
    expected = tok.convert_tokens_to_ids(tok.tokenize(text))
    assert tok.vocab["[UNK]"] in expected and len(expected) > 40
    for word_prob in (1.0, 0.15):
        masker = WholeWordMasker(tok, word_prob=word_prob, mask_prob=0.5, random_prob=0.3)
        for index in range(20):
            ids, labels = masker(masker.words(text), SampleKey(index, 0, 0).generator())
            assert len(ids) == len(labels) == len(expected)
            predicted = labels != IGNORE
            assert labels[predicted].tolist() == torch.tensor(expected)[predicted].tolist()
            assert ids[~predicted].tolist() == torch.tensor(expected)[~predicted].tolist()
            if word_prob == 1.0:
                assert predicted.all()


def test_masks_depend_only_on_the_sample_key(tok):
    masker = WholeWordMasker(tok)
    words = ["dog", "sits", "on", "the", "mat"] * 20
    a = masker(words, SampleKey(5, 2, 9).generator())
    b = masker(words, SampleKey(5, 2, 9).generator())
    c = masker(words, SampleKey(5, 3, 9).generator())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_max_pieces_cuts_ids_and_labels_together(tok):
    masker = WholeWordMasker(tok, word_prob=1.0, mask_prob=0.0, random_prob=0.0)
    ids, labels = masker(["sunflowers"] * 10, None, max_pieces=7)
    pieces = tok.convert_tokens_to_ids(["sun", "##flower", "##s"] * 3)[:7]
    assert ids.tolist() == pieces and labels.tolist() == pieces


def test_no_masking_gives_plain_ids(tok):
    masker = WholeWordMasker(tok, word_prob=0.0)
    ids, labels = masker.caption(masker.words("The sunflowers."), None)
    assert ids.tolist() == tok.convert_tokens_to_ids(["[CLS]", "the", "sun", "##flower", "##s", ".", "[SEP]"])
    assert labels.tolist() == [IGNORE] * 7
    assert masker(masker.words(""), None)[0].shape == (0,)


def test_masker_rejects_bad_probabilities(tok):
    with pytest.raises(ValueError, match="mask_prob \\+ random_prob"):
        WholeWordMasker(tok, mask_prob=0.8, random_prob=0.3)
    with pytest.raises(ValueError, match="word_prob"):
        WholeWordMasker(tok, word_prob=1.5)


# ---------------------------------------------------------------- masked RoI classification
def reference_mask_regions(u, cls_scores):
    """The reference's per-region rule on given uniform draws."""
    ops, labels = [], []
    for prob, scores in zip(u.tolist(), cls_scores):
        if prob < 0.15:
            ops.append(1 if prob / 0.15 < 0.9 else 0)
            labels.append(scores)
        else:
            ops.append(0)
            labels.append(torch.zeros_like(scores))
    return torch.tensor(ops), torch.stack(labels)


def test_mvrc_targets_follow_the_reference_rule():
    scores = torch.softmax(torch.randn(300, 1601, generator=torch.Generator().manual_seed(0)), dim=1)
    ops, labels = mask_regions(scores, SampleKey(4, 1, 3).generator())
    u = torch.rand(300, generator=SampleKey(4, 1, 3).generator(), dtype=torch.float64)  # one draw per region
    ref_ops, ref_labels = reference_mask_regions(u, scores)
    assert torch.equal(ops, ref_ops) and torch.equal(labels, ref_labels)
    chosen = labels.sum(1) > 0
    assert torch.allclose(labels[chosen].sum(1), torch.ones(int(chosen.sum())))  # soft targets, sum 1
    assert (ops[~chosen] == 0).all()


def test_mvrc_statistics():
    scores = torch.full((20000, 4), 0.25)
    ops, labels = mask_regions(scores, SampleKey(0, 0, 0).generator())
    chosen = labels.sum(1) > 0
    assert abs(chosen.float().mean().item() - 0.15) < 0.01
    assert abs(ops[chosen].float().mean().item() - 0.9) < 0.02
    assert ops.dtype == torch.int64 and labels.dtype == scores.dtype


def test_whole_image_feature_leaves_out_masked_regions():
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 9.0]])
    assert whole_image_feature(features, torch.tensor([0, 1, 0, 1])).tolist() == [3.0, 4.0]
    assert whole_image_feature(features, torch.tensor([0, 0, 0, 0])).tolist() == [4.0, 5.25]
    assert whole_image_feature(features, torch.tensor([1, 1, 1, 1])).tolist() == [0.0, 0.0]
    # the reference's formula: (mean * N - sum of masked) / (N - masked + 1e-5)
    feats = torch.rand(37, 2048, generator=torch.Generator().manual_seed(1))
    ops = (torch.rand(37, generator=torch.Generator().manual_seed(2)) < 0.3).long()
    ref = (feats.mean(0) * 37 - feats[ops == 1].sum(0)) / (37 - int(ops.sum()) + 1e-5)
    assert torch.allclose(whole_image_feature(feats, ops), ref, rtol=1e-4, atol=1e-5)


def test_region_pixel_mask_matches_the_reference_slices():
    boxes = torch.tensor([[1.7, 2.2, 3.9, 4.0], [0.0, 0.0, 7.0, 5.0], [6.5, 0.0, 7.0, 1.2]])
    ops = torch.tensor([1, 0, 1])
    mask = region_pixel_mask(boxes, ops, 6, 8)
    expected = torch.zeros(6, 8, dtype=torch.bool)
    expected[2:5, 1:4] = True  # rows int(2.2)..int(4.0), cols int(1.7)..int(3.9), far edge included
    expected[0:2, 6:8] = True
    assert torch.equal(mask, expected)
    image = torch.ones(3, 6, 8)
    image.masked_fill_(mask, 0)
    assert image.sum().item() == 3 * (48 - 13)
    assert not region_pixel_mask(boxes, torch.zeros(3, dtype=torch.long), 6, 8).any()


# ---------------------------------------------------------------- truncation
def reference_truncation(text, boxes, seq_len):
    """The reference's loop."""
    if text + boxes > seq_len:
        while text + boxes > seq_len and text > 0 and boxes > 0:
            if boxes > text:
                boxes -= 1
            else:
                text -= 1
        text, boxes = max(text, 2), max(boxes, 1)
    return text, boxes


def test_truncation_equals_the_reference_loop():
    for text in range(2, 30):
        for boxes in range(1, 30):
            for seq_len in range(0, 62):
                assert truncate_text_and_regions(text, boxes, seq_len) == reference_truncation(text, boxes, seq_len)
    assert truncate_text_and_regions(40, 101, 64) == (32, 32)
    assert truncate_text_and_regions(12, 101, 64) == (12, 52)
