"""VQA answers: the official normalisation, the official accuracy, soft-score targets, the vocabulary.

The rules are those of the VQA evaluation code (github GT-Vision-Lab/VQA, ``vqaEval.py``; Antol et
al., ICCV 2015, and Goyal et al., CVPR 2017, for VQA v2):

1. whitespace: tabs and newlines become spaces, the ends are stripped;
2. punctuation: each of ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !`` is deleted when the text has it
   next to a space or has a comma between two digits (``"1,000"``), and becomes a space otherwise;
   a period not followed by a digit is deleted (``"Two."`` -> ``"Two"``, ``"2.5"`` kept);
3. words: lower case, number words ``none``, ``zero`` .. ``ten`` become digits (``none`` -> ``0``),
   the articles ``a an the`` are dropped, apostrophe-less contractions get their apostrophe
   (``dont`` -> ``don't``).

An answer's accuracy against the (usually 10) annotators' answers is the average, over the subsets
that leave one annotator out, of ``min(1, matches / 3)``; with ``n`` matching annotators out of 10
that is 0, 0.3, 0.6, 0.9, 1.0 for ``n`` = 0, 1, 2, 3, >= 4.

One quirk of the official evaluation is kept in :func:`vqa_accuracy` so that our numbers are its
numbers: rules 2 and 3 are applied (to the prediction and to the annotators' answers) only when the
annotators do not all give the same answer. Training targets (:func:`soft_scores`) always normalise.
"""
import re
from collections import Counter

import numpy as np

from common.data.storage import read_bytes
from common.errors import UserInputError

__all__ = ["UNK", "AnswerVocab", "AnswerVocabError", "clean_whitespace", "leave_one_out_accuracy",
           "normalize_answer", "process_digit_article", "process_punctuation", "soft_scores", "vqa_accuracy"]

UNK = "<unk>"

PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",",
               "?", "!")
# The official pattern "(?!<=\d)(\.)(?!\d)" has a look-behind typo that makes its first part always true:
# it deletes every period not followed by a digit.
_PERIOD = re.compile(r"\.(?!\d)")
# The official code passes re.UNICODE (32) where re.sub takes its count: at most 32 periods go.
_PERIOD_COUNT = 32
_COMMA_BETWEEN_DIGITS = re.compile(r"\d,\d")
ARTICLES = frozenset(("a", "an", "the"))
NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
# Contractions written without their apostrophe, one "written proper" pair a line. Entries of the
# official table that cannot change a lower-cased word (capitalised keys such as "Im", identities
# such as "let's") are left out; "somebody'd -> somebodyd" is the official table's own (reversed) entry.
_CONTRACTION_PAIRS = """
aint ain't|arent aren't|cant can't|couldve could've|couldnt couldn't|couldn'tve couldn't've
couldnt've couldn't've|didnt didn't|doesnt doesn't|dont don't|hadnt hadn't|hadnt've hadn't've
hadn'tve hadn't've|hasnt hasn't|havent haven't|hed he'd|hed've he'd've|he'dve he'd've|hes he's
howd how'd|howll how'll|hows how's|isnt isn't|itd it'd|itd've it'd've|it'dve it'd've|itll it'll
maam ma'am|mightnt mightn't|mightnt've mightn't've|mightn'tve mightn't've|mightve might've
mustnt mustn't|mustve must've|neednt needn't|notve not've|oclock o'clock|oughtnt oughtn't
ow's'at 'ow's'at|'ows'at 'ow's'at|'ow'sat 'ow's'at|shant shan't|shed've she'd've|she'dve she'd've
shouldve should've|shouldnt shouldn't|shouldnt've shouldn't've|shouldn'tve shouldn't've
somebody'd somebodyd|somebodyd've somebody'd've|somebody'dve somebody'd've|somebodyll somebody'll
somebodys somebody's|someoned someone'd|someoned've someone'd've|someone'dve someone'd've
someonell someone'll|someones someone's|somethingd something'd|somethingd've something'd've
something'dve something'd've|somethingll something'll|thats that's|thered there'd
thered've there'd've|there'dve there'd've|therere there're|theres there's|theyd they'd
theyd've they'd've|they'dve they'd've|theyll they'll|theyre they're|theyve they've|twas 'twas
wasnt wasn't|wed've we'd've|we'dve we'd've|weve we've|werent weren't|whatll what'll|whatre what're
whats what's|whatve what've|whens when's|whered where'd|wheres where's|whereve where've|whod who'd
whod've who'd've|who'dve who'd've|wholl who'll|whos who's|whove who've|whyll why'll|whyre why're
whys why's|wont won't|wouldve would've|wouldnt wouldn't|wouldnt've wouldn't've
wouldn'tve wouldn't've|yall y'all|yall'll y'all'll|y'allll y'all'll|yall'd've y'all'd've
y'alld've y'all'd've|y'all'dve y'all'd've|youd you'd|youd've you'd've|you'dve you'd've|youll you'll
youre you're|youve you've
"""
CONTRACTIONS = dict(pair.split(" ") for pair in _CONTRACTION_PAIRS.replace("\n", "|").split("|") if pair)


def clean_whitespace(text):
    """Rule 1: tabs and newlines -> spaces, ends stripped."""
    return text.replace("\n", " ").replace("\t", " ").strip()


def process_punctuation(text):
    """Rule 2 (the official ``processPunctuation``): ``"yes!"`` -> ``"yes "``, ``"t-shirt"`` ->
    ``"t shirt"``, ``"1,000"`` -> ``"1000"``, ``"Two."`` -> ``"Two"``; case is kept."""
    # The choice between deleting and spacing looks at the input text, for every mark.
    delete = _COMMA_BETWEEN_DIGITS.search(text) is not None
    out = text
    for mark in PUNCTUATION:
        gone = delete or (mark + " ") in text or (" " + mark) in text
        out = out.replace(mark, "" if gone else " ")
    return _PERIOD.sub("", out, count=_PERIOD_COUNT)


def process_digit_article(text):
    """Rule 3 (the official ``processDigitArticle``): lower case, split on whitespace, number words to
    digits, articles dropped, contractions fixed, joined by single spaces (``"The Two dogs"`` ->
    ``"2 dogs"``)."""
    words = [NUMBER_WORDS.get(w, w) for w in text.lower().split()]
    return " ".join(CONTRACTIONS.get(w, w) for w in words if w not in ARTICLES)


def normalize_answer(text):
    """The full official normalisation (rules 1-3): ``"Two."`` -> ``"2"``, ``"the dog"`` -> ``"dog"``,
    ``"none"`` -> ``"0"``."""
    return process_digit_article(process_punctuation(clean_whitespace(text)))


def leave_one_out_accuracy(answer, gt_answers):
    """Average over the ``len(gt_answers)`` subsets that leave one annotator out of
    ``min(1, matches / 3)``, comparing strings exactly (no normalisation here).

    Args:
        answer: a string.
        gt_answers: the annotators' answers (strings), usually 10.
    Returns:
        float in [0, 1]: 0, 0.3, 0.6, 0.9, 1.0 for 0, 1, 2, 3, >=4 matches out of 10.
    Raises:
        ValueError: ``gt_answers`` is empty.
    """
    if not gt_answers:
        raise ValueError("leave_one_out_accuracy: no ground-truth answers")
    matches = sum(gt == answer for gt in gt_answers)
    # Same float operations in the same order as the official code, so sums agree to the last bit.
    accs = [min(1, (matches - (gt == answer)) / 3) for gt in gt_answers]
    return float(sum(accs)) / len(accs)


def vqa_accuracy(prediction, gt_answers):
    """The official accuracy of one predicted answer for one question (float in [0, 1]).

    Whitespace is cleaned on all strings; the rest of the normalisation is applied to the prediction
    and the annotators' answers only when the annotators' answers are not all the same string (the
    official code's rule: with ten times ``"yes"``, ``"Yes"`` scores 0).
    """
    gts = [clean_whitespace(a) for a in gt_answers]
    prediction = clean_whitespace(prediction)
    if len(set(gts)) > 1:
        gts = [process_digit_article(process_punctuation(a)) for a in gts]
        prediction = process_digit_article(process_punctuation(prediction))
    return leave_one_out_accuracy(prediction, gts)


def soft_scores(gt_answers):
    """Training targets of one question: ``{normalised answer: leave-one-out accuracy}``.

    Every annotator answer is normalised (:func:`normalize_answer`); an answer given by n of 10
    annotators scores 0.3, 0.6, 0.9 or 1.0 for n = 1, 2, 3, >= 4.
    """
    normalized = [normalize_answer(a) for a in gt_answers]
    return {answer: leave_one_out_accuracy(answer, normalized) for answer in dict.fromkeys(normalized)}


class AnswerVocabError(UserInputError):
    """An answer vocabulary file is unusable (no ``<unk>``, duplicate answers)."""


class AnswerVocab:
    """The classifier's answers, one per output unit, with ``<unk>`` for everything else.

    Args:
        answers: answer strings in output order; each is normalised (:func:`normalize_answer`) except
            ``<unk>``, so a file written with other conventions still matches normalised targets.
        source: name used in error messages (the file name).
    Raises:
        AnswerVocabError: no ``<unk>`` entry, or two entries equal after normalisation (names both).
    """

    def __init__(self, answers, source="answer list"):
        self.answers = [a if a == UNK else normalize_answer(a) for a in answers]
        self.source = source
        if UNK not in self.answers:
            raise AnswerVocabError("{}: no '{}' line; the answer vocabulary needs one for answers outside "
                                   "it (the reference's answers_vqa.txt has it on the first line)".format(source, UNK))
        self._index = {}
        for i, answer in enumerate(self.answers):
            if answer in self._index:
                raise AnswerVocabError("{}: answers {} and {} are both '{}' after normalisation".format(
                    source, self._index[answer] + 1, i + 1, answer))
            self._index[answer] = i
        self.unk_index = self._index[UNK]

    @classmethod
    def from_file(cls, path):
        """Read ``answers_vqa.txt``: one answer a line (UTF-8), lower-cased and stripped like the
        reference; blank lines are skipped (line numbers in errors count only answer lines).

        Raises:
            FileNotFoundError: no such file (or ``archive.zip@/member``).
            AnswerVocabError: see the class.
        """
        lines = read_bytes(path).decode("utf-8").splitlines()
        return cls([a for a in (line.strip().lower() for line in lines) if a], source=path)

    def __len__(self):
        return len(self.answers)

    def check_size(self, size):
        """Stop unless the vocabulary has ``size`` answers (``DATASET.ANSWER_VOCAB_SIZE``, the classifier's
        outputs).

        Raises:
            AnswerVocabError: another number of answers (names both numbers and the file).
        """
        if len(self) != size:
            raise AnswerVocabError("DATASET.ANSWER_VOCAB_SIZE is {} but the answer vocabulary {} "
                                   "(DATASET.ANSWER_VOCAB_FILE) has {} answers; set DATASET.ANSWER_VOCAB_SIZE to {} "
                                   "(the classifier has one output per answer)".format(size, self.source, len(self),
                                                                                       len(self)))

    def __contains__(self, answer):
        return answer in self._index

    def index(self, answer):
        """Output index of a normalised answer, ``unk_index`` when it is not in the vocabulary."""
        return self._index.get(answer, self.unk_index)

    def soft_target(self, gt_answers):
        """``float32 [len(self)]`` soft scores of one question (:func:`soft_scores`) at the answers'
        indices; answers outside the vocabulary add nothing (``<unk>`` stays 0, as in the reference)."""
        target = np.zeros(len(self.answers), dtype=np.float32)
        for answer, score in soft_scores(gt_answers).items():
            i = self._index.get(answer)
            if i is not None and i != self.unk_index:
                target[i] = score
        return target


def count_answers(annotations):
    """``Counter`` of normalised ``multiple_choice_answer`` over questions (one count per question),
    the count the answer vocabulary is built from."""
    return Counter(normalize_answer(a["multiple_choice_answer"]) for a in annotations)
