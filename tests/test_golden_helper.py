"""tests/golden.py: floats within 1e-6 relative (1e-7 absolute floor), everything else exact, and a choice between
near-tied scores accepting either candidate."""
import pytest
import torch

from tests.golden import ATOL, RTOL, Choices, assert_json_close, assert_ranking_close, assert_text_close, close


def test_tolerance_is_relative_with_an_absolute_floor():
    assert (RTOL, ATOL) == (1e-6, 1e-7)
    assert close(0.25, 0.25 * (1 + 0.5e-6)) and not close(0.25, 0.25 * (1 + 2e-6))
    assert close(0.0, 0.9e-7) and not close(0.0, 1.1e-7)
    assert close(1e6, 1e6 + 1.0) and not close(1e6, 1e6 + 1.2)


def test_text_numbers_within_the_tolerance_the_rest_exact():
    golden = "annot_id,answer_0\r\nshapes-test-0,0.24999120831489563\r\n"
    assert_text_close("annot_id,answer_0\r\nshapes-test-0,0.2499912083\r\n", golden, "csv")
    for wrong in ("annot_id,answer_0\r\nshapes-test-0,0.2499942083\r\n",  # 1.2e-6 relative
                  "annot_id,answer_0\r\nshapes-test-1,0.24999120831489563\r\n",  # an id
                  "annot_id,answer_1\r\nshapes-test-0,0.24999120831489563\r\n",  # a column name
                  "annot_id,answer_0\nshapes-test-0,0.24999120831489563\n",  # line ends
                  "annot_id,answer_0\r\nshapes-test-0,0.24999120831489563\r\nx\r\n"):  # a line more
        with pytest.raises(AssertionError, match="csv"):
            assert_text_close(wrong, golden, "csv")


def test_text_counts_move_only_by_the_number_of_tied_choices():
    golden = "accuracy on val: 0.000000 (0 of 2 expressions)\n"
    moved = "accuracy on val: 0.500000 (1 of 2 expressions)\n"
    with pytest.raises(AssertionError):
        assert_text_close(moved, golden, "stdout")
    assert_text_close(moved, golden, "stdout", loose_counts=1)
    with pytest.raises(AssertionError):
        assert_text_close("accuracy on val: 1.000000 (2 of 2 expressions)\n", golden, "stdout", loose_counts=1)
    with pytest.raises(AssertionError):
        assert_text_close("accuracy on test: 0.500000 (1 of 2 expressions)\n", golden, "stdout", loose_counts=1)


def test_json_layout_keys_types_exact_floats_within_the_tolerance():
    golden = '[{"ref_id": 3, "box": [0.0, 18.947368621826172]}]'
    assert_json_close('[{"ref_id": 3, "box": [0.0, 18.9473686]}]', golden, "j")
    for wrong in ('[{"ref_id": 3, "box": [0.0, 18.9474]}]', '[{"ref_id": 4, "box": [0.0, 18.947368621826172]}]',
                  '[{"ref_id": 3.0, "box": [0.0, 18.947368621826172]}]', '[{"box": [0.0, 18.947368621826172], '
                  '"ref_id": 3}]', '[{"ref_id": 3, "box": [0.0,18.947368621826172]}]',
                  '[{"ref_id": 3, "box": [0.0, 18.947368621826172, 1.0]}]'):
        with pytest.raises(AssertionError, match="j"):
            assert_json_close(wrong, golden, "j")


def test_a_choice_between_near_tied_scores_accepts_either_candidate():
    choices = Choices()
    choices.record(torch.tensor([0.5, 0.5 * (1 - 0.5e-6), 0.1]), ["yes", "no", "two"])  # near tie
    choices.record(torch.tensor([0.2, 0.9, 0.1]), ["red", "blue", "green"])  # clear
    assert choices.ties == 1
    assert_json_close('[{"answer": "yes"}]', '[{"answer": "no"}]', "j", choices)
    for got, golden in (("yes", "two"), ("blue", "red")):
        with pytest.raises(AssertionError, match="j at"):
            assert_json_close('[{"answer": "%s"}]' % got, '[{"answer": "%s"}]' % golden, "j", choices)
    boxes = Choices()
    boxes.record(torch.tensor([0.3, 0.3]), [[0.0, 0.0, 39.0, 29.0], [3.0, 3.0, 13.0, 11.0]])
    assert_json_close('{"box": [0.0, 0.0, 39.0, 29.0]}', '{"box": [3.0, 3.0, 13.0, 11.0]}', "j", boxes)
    with pytest.raises(AssertionError):
        assert_json_close('{"box": [0.0, 0.0, 39.0, 29.0]}', '{"box": [3.0, 3.0, 14.0, 11.0]}', "j", boxes)


def test_a_ranking_may_swap_only_near_tied_scores():
    expected = [("box 1", 0.5), ("box 2", 0.5 * (1 - 0.5e-6)), ("box 3", 0.1)]
    assert_ranking_close([("box 2", 0.5), ("box 1", 0.5 * (1 - 0.5e-6)), ("box 3", 0.1)], expected, "r")
    assert_ranking_close([("box 1", 0.5), ("box 3", 0.5 * (1 - 0.5e-6))], [("box 1", 0.5), ("box 2", 0.4999999)],
                         "r")  # a top-2 whose second place ties a word the other top-2 left out
    for wrong in ([("box 1", 0.5), ("box 3", 0.4999999), ("box 2", 0.1)],  # a swap between scores that differ
                  [("box 1", 0.5), ("box 2", 0.5 * (1 - 2e-6)), ("box 3", 0.1)],  # a score outside the tolerance
                  [("box 3", 0.5), ("box 2", 0.4999998), ("box 1", 0.1)],  # a key whose own score differs
                  expected[:2]):
        with pytest.raises(AssertionError, match="r"):
            assert_ranking_close(wrong, expected, "r")
