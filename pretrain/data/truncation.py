"""Fitting a caption and its regions into ``DATASET.SEQ_LEN`` positions together."""


def truncate_text_and_regions(num_text, num_regions, seq_len):
    """How many text tokens and regions to keep so that together they fit ``seq_len``.

    The reference's rule: while too long, drop one from the longer side (text when they are
    equally long), so the longer side shrinks first and then both shrink in turn. At least 2
    text tokens (``[CLS]`` and ``[SEP]``) and 1 region are always kept, even past ``seq_len``.
    The kept text is its first ``keep_text - 1`` tokens plus the last one (``[SEP]``); the kept
    regions are the first ``keep_regions`` (the whole-image box and the most confident ones).

    Args:
        num_text (int): tokens of ``[CLS] caption [SEP]`` (>= 2).
        num_regions (int): regions, the whole-image box included (>= 1).
        seq_len (int): positions for both.
    Returns:
        (keep_text, keep_regions): ints.
    """
    text, regions = num_text, num_regions
    excess = text + regions - seq_len
    if excess > 0 and text > 0 and regions > 0:
        gap = min(excess, abs(text - regions))
        if text > regions:
            text -= gap
        else:
            regions -= gap
        excess -= gap
        text -= (excess + 1) // 2
        regions -= excess // 2
    return max(text, 2), max(regions, 1)
