"""Tolerating a small share of broken files in web-scale data sets.

Image-caption data crawled from the web (Conceptual Captions) always has some images that are
missing, truncated or undecodable. A data set that tolerates them asks a ``SkipCounter``
before giving up on a file: the counter logs the first few by name and raises only when the
skips pass an allowed share of the files seen. Curated data sets (VCR) keep their strict errors.
"""
import logging

from common.errors import UserInputError

logger = logging.getLogger(__name__)


class TooManySkipsError(UserInputError):
    """More files were skipped than the configured share allows; the message lists the first ones."""


class SkipCounter:
    """Counts files seen and files skipped, in one process.

    The counter raises when ``skipped > max_share * max(seen, min_seen)``: ``min_seen`` keeps a
    couple of early failures from reading as a high share (pass the data set's length for small
    data sets, so that the share is of the whole set). ``max_share = 0`` makes the first skip an
    error; ``max_share >= 1`` never raises.

    Each DataLoader worker holds its own copy (counts are per worker process, and start again
    with fresh workers each epoch); the share is a statistic, so per-worker counts estimate it well.

    Args:
        what (str): what is counted, for messages (``'image'``).
        max_share (float): allowed share of skipped files, in [0, 1] (0.01 = 1%).
        min_seen (int): smallest denominator of the share (>= 1).
        log_first (int): how many skipped files to log (and to name in the error).
        setting (str): the config key that sets ``max_share``, named in the error.
    Raises:
        ValueError: ``max_share`` outside [0, 1] or ``min_seen < 1``.
    """

    def __init__(self, what="image", max_share=0.01, min_seen=1000, log_first=5, setting=None):
        if not 0.0 <= max_share <= 1.0:
            raise ValueError("the allowed share of skipped {}s must be in [0, 1], got {}".format(what, max_share))
        if min_seen < 1:
            raise ValueError("min_seen must be >= 1, got {}".format(min_seen))
        self.what = what
        self.max_share = max_share
        self.min_seen = min_seen
        self.log_first = log_first
        self.setting = setting
        self.seen = 0
        self.skipped = 0
        self.first = []

    def ok(self):
        """Count a file that was read."""
        self.seen += 1

    def skip(self, name, reason):
        """Count a file that could not be read: log it if among the first ``log_first``, then
        check the share.

        Args:
            name (str): the file, as the user would find it.
            reason (str or Exception): why it was skipped.
        Raises:
            TooManySkipsError: the skips now pass the allowed share; the message gives the counts
                and the first skipped files with their reasons.
        """
        self.seen += 1
        self.skipped += 1
        if len(self.first) < self.log_first:
            self.first.append("{} ({})".format(name, reason))
            logger.warning("skipped %s %s (%d skipped of %d seen): %s", self.what, name, self.skipped, self.seen,
                           reason)
        if self.skipped > self.max_share * max(self.seen, self.min_seen):
            raise TooManySkipsError(
                "{} of {} {}s could not be read ({:.2%}), more than the {:.2%} allowed{}; the first: {}".format(
                    self.skipped, self.seen, self.what, self.skipped / self.seen, self.max_share,
                    " by " + self.setting if self.setting else "", "; ".join(self.first)))


def read_or_skip(read, path, counter):
    """``read(path)``, or None after ``counter.skip`` when the file is missing or unreadable.

    Args:
        read (callable): loader such as ``common.data.loading.load_image``.
        path (str): the file (plain or ``archive.zip@/inner``).
        counter (SkipCounter): counts the read or the skip.
    Returns:
        what ``read`` returns, or None.
    Raises:
        TooManySkipsError: this skip passes the counter's allowed share.
    """
    try:
        value = read(path)
    except (OSError, UserInputError) as e:  # missing file or archive member, truncated or undecodable bytes
        counter.skip(path, e)
        return None
    counter.ok()
    return value
