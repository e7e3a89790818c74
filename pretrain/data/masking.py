"""The two masking tasks of VL-BERT pretraining, with every random draw from one generator.

- Masked language modelling (MLM) with whole-word masking: a word (a BERT basic-tokenizer
  token) is chosen with probability ``word_prob`` (15%) and then every one of its word pieces
  is predicted. One uniform draw per word decides both, as in the reference release: with
  ``u < word_prob`` the word is chosen and ``u / word_prob`` picks the fate of *all* its pieces
  together: below ``mask_prob`` (80%) each piece becomes ``[MASK]``, below
  ``mask_prob + random_prob`` (90%) each piece becomes an independently drawn random word
  piece, otherwise the pieces stay. Unlike the reference (which draws from the whole vocab),
  random pieces come only from ordinary word pieces, never ``[PAD]``, ``[CLS]``, ``[unused7]``...
- Masked RoI classification (MVRC): a region is chosen with probability ``region_prob`` (15%);
  ``u / region_prob`` below ``replace_prob`` (90%) replaces its visual input (op 1), otherwise
  it is kept (op 0) but still predicted. The target of a chosen region is the detector's class
  distribution; other regions have an all-zero target (the loss ignores them).

Labels use ``IGNORE`` (-1) where nothing is predicted. Pass ``SampleKey.generator()`` as the
generator so that a sample's masks depend only on ``(seed, epoch, index)``.
"""
import re

import torch

IGNORE = -1

# Bracketed vocab entries are BERT's special and reserved tokens: [PAD] [UNK] [CLS] [SEP] [MASK] [unused0]...
_BRACKETED = re.compile(r"^\[[^\[\]\s]+\]$")


def ordinary_piece_ids(vocab):
    """Ids of ordinary word pieces: every vocab entry that is not a bracketed token.

    Args:
        vocab (dict str -> int): the tokenizer's vocab (``BertTokenizer.vocab``).
    Returns:
        int64 tensor ``(K,)``, sorted. For ``bert-base-uncased`` this is ids 999..30521.
    Raises:
        ValueError: the vocab has no ordinary piece.
    """
    ids = sorted(i for token, i in vocab.items() if not _BRACKETED.match(token))
    if not ids:
        raise ValueError("the vocab has no ordinary word piece (every entry is a bracketed special token)")
    return torch.tensor(ids, dtype=torch.int64)


def _token_id(vocab, token):
    if token not in vocab:
        raise ValueError("the vocab has no '{}' token; a BERT vocab.txt is expected".format(token))
    return vocab[token]


class WholeWordMasker:
    """Turns words into word-piece ids and MLM labels with whole-word masking (module docstring).

    Args:
        tokenizer: ``pytorch_pretrained_bert.BertTokenizer`` (``vocab``, ``basic_tokenizer``,
            ``wordpiece_tokenizer``).
        word_prob (float): share of words chosen (0.15; 0 gives plain ids and all-ignore labels).
        mask_prob (float): share of chosen words whose pieces become ``[MASK]`` (0.8).
        random_prob (float): share of chosen words whose pieces become random pieces (0.1);
            the rest (0.1) keep their pieces.
    Raises:
        ValueError: probabilities outside [0, 1] or ``mask_prob + random_prob > 1``; the vocab
            lacks ``[MASK]``, ``[CLS]`` or ``[SEP]``.

    A word whose pieces include a bracketed token other than ``[UNK]`` (a literal ``[SEP]`` in
    the text) is never chosen, so special tokens are never predicted. ``[UNK]`` pieces (unknown
    characters, words over 100 characters) are chosen like any word, with label ``[UNK]``, as in
    the reference.
    """

    def __init__(self, tokenizer, word_prob=0.15, mask_prob=0.8, random_prob=0.1):
        for name, p in (("word_prob", word_prob), ("mask_prob", mask_prob), ("random_prob", random_prob)):
            if not 0.0 <= p <= 1.0:
                raise ValueError("{} must be in [0, 1], got {}".format(name, p))
        if mask_prob + random_prob > 1.0:
            raise ValueError("mask_prob + random_prob must be <= 1, got {} + {}".format(mask_prob, random_prob))
        self.tokenizer = tokenizer
        self.word_prob = word_prob
        self.mask_prob = mask_prob
        self.random_prob = random_prob
        vocab = tokenizer.vocab
        self.mask_id = _token_id(vocab, "[MASK]")
        self.cls_id = _token_id(vocab, "[CLS]")
        self.sep_id = _token_id(vocab, "[SEP]")
        self.replacement_ids = ordinary_piece_ids(vocab)
        self._unmaskable = {t for t in vocab if _BRACKETED.match(t) and t != "[UNK]"}

    def words(self, text):
        """BERT basic-tokenizer words of ``text`` (str): lower-cased (per the tokenizer), split on
        white space and punctuation."""
        return self.tokenizer.basic_tokenizer.tokenize(text)

    def __call__(self, words, generator=None, max_pieces=None):
        """Mask a word sequence.

        Args:
            words (list of str): basic-tokenizer words (``self.words(text)``).
            generator (torch.Generator or None): source of every random draw (None: torch's
                global RNG).
            max_pieces (int or None): keep only the first ``max_pieces`` word pieces (a word
                may be cut); words past the cut are neither tokenised nor drawn for.
        Returns:
            (ids, labels): int64 tensors ``(L,)``, one entry per word piece. ``ids`` is the model
            input (with ``[MASK]`` / random pieces), ``labels[i]`` the original piece id where
            position ``i`` is predicted, else ``IGNORE`` (-1).
        """
        pieces, word_of_piece, eligible = [], [], []
        for word in words:
            if max_pieces is not None and len(pieces) >= max_pieces:
                break
            word_pieces = self.tokenizer.wordpiece_tokenizer.tokenize(word)
            word_of_piece.extend([len(eligible)] * len(word_pieces))
            pieces.extend(word_pieces)
            eligible.append(not any(p in self._unmaskable for p in word_pieces))
        original = torch.tensor(self.tokenizer.convert_tokens_to_ids(pieces), dtype=torch.int64)
        word_of_piece = torch.tensor(word_of_piece, dtype=torch.int64)

        u = torch.rand(len(eligible), generator=generator, dtype=torch.float64)
        chosen = (u < self.word_prob) & torch.tensor(eligible, dtype=torch.bool)
        fate = u / self.word_prob  # uniform in [0, 1) on chosen words (inf or nan when word_prob is 0: none chosen)
        to_mask = chosen & (fate < self.mask_prob)
        to_random = chosen & ~to_mask & (fate < self.mask_prob + self.random_prob)

        labels = torch.where(chosen[word_of_piece], original, torch.full_like(original, IGNORE))
        ids = original.clone()
        ids[to_mask[word_of_piece]] = self.mask_id
        random_pieces = to_random[word_of_piece]
        drawn = torch.randint(len(self.replacement_ids), (int(random_pieces.sum()),), generator=generator)
        ids[random_pieces] = self.replacement_ids[drawn]
        if max_pieces is not None:
            ids, labels = ids[:max_pieces], labels[:max_pieces]
        return ids, labels

    def caption(self, words, generator=None):
        """``[CLS] words [SEP]`` masked: as ``__call__``, with ``[CLS]`` and ``[SEP]`` added
        around the words (label ``IGNORE``, never masked). Returns ``(ids, labels)``, int64 ``(L + 2,)``."""
        ids, labels = self(words, generator)
        edge = torch.tensor([IGNORE])
        return (torch.cat([torch.tensor([self.cls_id]), ids, torch.tensor([self.sep_id])]),
                torch.cat([edge, labels, edge]))


def mask_regions(cls_scores, generator=None, region_prob=0.15, replace_prob=0.9):
    """Masked RoI classification: which regions to mask, and their soft targets.

    Args:
        cls_scores (float tensor ``(N, C)``): the detector's class distribution per region
            (``C`` = 1601 for the Visual Genome detector, column 0 = background).
        generator (torch.Generator or None): source of the N uniform draws (None: global RNG).
        region_prob (float): share of regions chosen (0.15).
        replace_prob (float): share of chosen regions whose visual input is replaced (0.9);
            the others keep it but are still predicted.
    Returns:
        (ops, labels): ``ops`` int64 ``(N,)``, 1 where the region's visual input is replaced
        (features by the model's mask embedding; in the end-to-end config its pixels are zeroed,
        see ``region_pixel_mask``), else 0; ``labels`` float ``(N, C)``, ``cls_scores`` rows of
        the chosen regions and zero rows elsewhere.
    """
    u = torch.rand(cls_scores.shape[0], generator=generator, dtype=torch.float64)
    chosen = u < region_prob
    ops = (chosen & (u / region_prob < replace_prob)).long()  # region_prob 0: nothing chosen, every op 0
    labels = torch.where(chosen[:, None], cls_scores, torch.zeros_like(cls_scores))
    return ops, labels


def whole_image_feature(features, ops):
    """Feature of the whole-image box from precomputed region features, without masked regions.

    The reference gives the whole-image box the mean of its regions' features and takes out the
    masked ones (``ops == 1``), so the image box does not leak what is masked.

    Args:
        features (float tensor ``(N, D)``): region features (D = 2048 for the Visual Genome detector).
        ops (int tensor ``(N,)``): ``mask_regions`` ops of these regions.
    Returns:
        float tensor ``(D,)``: mean of the rows with ``ops == 0``; zeros when every region is
        masked or there is none (the reference divides by ``1e-5`` there).
    """
    keep = (ops == 0).to(features.dtype)
    return (features * keep[:, None]).sum(0) / keep.sum().clamp(min=1.0)


def region_pixel_mask(boxes, ops, height, width):
    """Pixels of the regions whose visual input is replaced, for zeroing in the end-to-end config
    (``NETWORK.MASK_RAW_PIXELS``): ``image.masked_fill_(mask, 0)`` after normalisation, as the reference.

    Args:
        boxes (float tensor ``(N, 4)``): ``x1, y1, x2, y2`` in pixels of the (resized) image,
            inclusive corners, already clipped to the image.
        ops (int tensor ``(N,)``): 1 for the regions to zero.
        height, width (int): image size in pixels.
    Returns:
        bool tensor ``(height, width)``: True inside any box with op 1. Corners are truncated
        to ints and the far edge is included (rows ``int(y1)..int(y2)``), like the reference.
    """
    sel = boxes[ops == 1].clamp(min=0).long()
    if sel.numel() == 0:
        return torch.zeros(height, width, dtype=torch.bool)
    ys = torch.arange(height)[None, :]
    xs = torch.arange(width)[None, :]
    rows = (ys >= sel[:, 1:2]) & (ys <= sel[:, 3:4])
    cols = (xs >= sel[:, 0:1]) & (xs <= sel[:, 2:3])
    return (rows[:, :, None] & cols[:, None, :]).any(0)
