"""Comparison of outputs with golden files written on another machine: floats within a stated tolerance,
everything else exact.

Why a tolerance: PyTorch picks its CPU kernels at run time (``ATEN_CPU_CAPABILITY``: default, avx2, avx512),
and the kernels of one processor sum in another order than those of another; on fixed weights and inputs the
outputs differ by about 1e-7 relative between processors (issue 28: the 8th significant digit of the VCR
probabilities; at most 1.2e-7, one float32 step, between the default, avx2 and avx512 kernels of one
processor). :data:`RTOL` (1e-6 relative, ten times that) with the floor :data:`ATOL` (1e-7, for values near 0)
passes those differences; a change of model or data code moves these outputs by far more.

A choice differs too where scores nearly tie: the tiny RefCOCO+ run gives three boxes one score under the
avx512 kernels, and under the default kernels the first of them one float32 step less, so it picks another box.

What stays exact: ids, order, file names, keys, layout, formatting, integers; and a choice (an answer, a box),
unless its two best scores are within the tolerance: then either is accepted (:class:`Choices`).
"""
import json
import re

RTOL = 1e-6
ATOL = 1e-7

# A decimal number as Python, json and csv write it; an integer is a number without '.' or exponent.
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def close(a, b):
    """Whether floats ``a`` and ``b`` agree within ``ATOL + RTOL * max(|a|, |b|)``."""
    return abs(a - b) <= ATOL + RTOL * max(abs(a), abs(b))


def _is_int(token):
    return not any(c in token for c in ".eE")


def _numbers_close(a, b):
    """Tokens ``a``, ``b`` of :data:`_NUMBER`: integers equal, floats :func:`close`."""
    if _is_int(a) or _is_int(b):
        return a == b
    return close(float(a), float(b))


def _split(text):
    """``(text between numbers, numbers)`` of ``text``."""
    return _NUMBER.split(text), _NUMBER.findall(text)


def _line_close(actual, expected, loose_counts):
    (words, numbers), (golden_words, golden_numbers) = _split(actual), _split(expected)
    if words != golden_words:
        return False
    if all(_numbers_close(a, b) for a, b in zip(numbers, golden_numbers)):
        return True
    # choices between near-tied scores change what is counted from them, each count by at most one per choice
    return loose_counts > 0 and all(abs(int(a) - int(b)) <= loose_counts
                                    for a, b in zip(numbers, golden_numbers) if _is_int(a) and _is_int(b))


def assert_text_close(actual, expected, name, loose_counts=0):
    """``actual`` equals the golden text ``expected`` line by line: the text between numbers exact, integers
    exact, floats within the tolerance (:func:`close`).

    Args:
        actual, expected: str (CSV, printed lines).
        name: the golden file's name, for the failure message.
        loose_counts: the number of choices of the run made between near-tied scores (:attr:`Choices.ties`);
            where it is > 0, a line whose numbers differ is accepted when its text is the golden's and its
            integers differ by at most that number (accuracies and counts reported from those choices).
    Raises:
        AssertionError: names the file, the line and both versions.
    """
    lines, golden = actual.splitlines(keepends=True), expected.splitlines(keepends=True)
    assert len(lines) == len(golden), "{}: {} lines, golden {}".format(name, len(lines), len(golden))
    for number, (line, want) in enumerate(zip(lines, golden), 1):
        assert _line_close(line, want, loose_counts), "{} line {}:\n  got    {!r}\n  golden {!r}".format(
            name, number, line, want)


def _layout(text):
    """The JSON text with string literals and numbers blanked: separators, brackets and whitespace."""
    return _NUMBER.sub("0", _STRING.sub('""', text))


def _values_close(a, b):
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)):
        return type(a) is type(b) and a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return isinstance(a, float) and isinstance(b, float) and close(a, b)


def values_close(a, b):
    """Parsed JSON values ``a`` and ``b`` agree: same types, keys in the same order, strings and integers
    equal, floats :func:`close`."""
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(values_close(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(values_close(x, y) for x, y in zip(a, b))
    return _values_close(a, b)


def _compare(actual, expected, path, choices):
    if isinstance(actual, dict) and isinstance(expected, dict) and list(actual) == list(expected):
        for key in actual:
            yield from _compare(actual[key], expected[key], path + (key,), choices)
    elif (isinstance(actual, list) and isinstance(expected, list) and len(actual) == len(expected)
          and not values_close(actual, expected) and not (choices and choices.accepts(actual, expected))):
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _compare(a, e, path + (i,), choices)
    elif not values_close(actual, expected) and not (choices and choices.accepts(actual, expected)):
        yield path, actual, expected


def assert_json_close(actual, expected, name, choices=None):
    """The JSON text ``actual`` equals the golden ``expected``: the same layout (separators, whitespace),
    keys and order, strings and integers equal, floats within the tolerance (:func:`close`); a value that
    differs is accepted where ``choices`` accepts it (a choice between near-tied scores).

    Args:
        actual, expected: str, JSON text.
        name: the golden file's name, for the failure message.
        choices: :class:`Choices` of the run, or None (every choice exact).
    Raises:
        AssertionError: names the file and the first differing value's path.
    """
    assert _layout(actual) == _layout(expected), "{}: layout differs:\n  got    {}\n  golden {}".format(
        name, _layout(actual)[:300], _layout(expected)[:300])
    for path, got, want in _compare(json.loads(actual), json.loads(expected), (), choices):
        raise AssertionError("{} at {}: got {!r}, golden {!r}".format(name, list(path), got, want))


class Choices:
    """The choices a run made by argmax over scores, and which of them were between near-tied scores.

    ``record(scores, candidates)`` for each scored row: ``scores`` float ``(K,)``, ``candidates`` the K values the
    row can output (answers, boxes as lists of floats), in score order. A row's choice may differ between
    machines where another score is within the tolerance of the best one (:func:`close`); the golden value is
    then accepted when it is one of those candidates.
    """

    def __init__(self):
        self.rows = []

    def record(self, scores, candidates):
        """Keep one row: ``scores`` ``(K,)`` float tensor, ``candidates`` a list of K JSON-like values."""
        scores = [float(s) for s in scores.detach().float().cpu()]
        best = max(range(len(scores)), key=scores.__getitem__)
        tied = [c for s, c in zip(scores, candidates) if close(s, scores[best])]
        self.rows.append((candidates[best], tied))

    @property
    def ties(self):
        """The number of rows whose two best scores are within the tolerance."""
        return sum(len(tied) > 1 for _, tied in self.rows)

    def accepts(self, actual, expected):
        """Whether a row that output ``actual`` had ``expected`` among its near-tied candidates."""
        return any(len(tied) > 1 and values_close(actual, chosen) and any(values_close(expected, c) for c in tied)
                   for chosen, tied in self.rows)



def assert_ranking_close(actual, expected, name):
    """Two rankings of one input by two computations (batched and alone, two code paths, other kernels) agree:
    scores position by position within the tolerance (:func:`close`), and keys in the same order except where
    near-tied scores swap them.

    Args:
        actual, expected: lists of ``(key, score)`` pairs, best first (a top-k); key any comparable value
            (a label, an index, a box), score float.
        name: what is compared, for the failure message.
    Raises:
        AssertionError: names the position and both pairs: lengths differ, a score outside the tolerance, or
            keys in another order where their scores do not tie. A key that only one side's top-k kept is
            accepted where its score ties the other side's last one.
    """
    assert len(actual) == len(expected), "{}: {} ranked, expected {}".format(name, len(actual), len(expected))
    got, want = dict(actual), dict(expected)
    for i, ((key, score), (want_key, want_score)) in enumerate(zip(actual, expected)):
        swapped_tie = (key != want_key and close(score, want.get(key, expected[-1][1]))
                       and close(want_score, got.get(want_key, actual[-1][1])))
        assert close(score, want_score) and (key == want_key or swapped_tie), \
            "{} at rank {}: got {!r}, expected {!r}".format(name, i, (key, score), (want_key, want_score))
