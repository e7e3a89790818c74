"""VCR leaderboard CSV: columns, values, Q2A + QA2R merge."""
import csv

import pytest

from vcr.function.result_csv import merge_results, read_result_csv, write_result_csv


def test_q2a_qa2r_files_and_merge(tmp_path):
    ids = ["test-0", "test-1"]
    q2a = write_result_csv(str(tmp_path / "a.csv"), "Q2A", ids, [[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])
    r_probs = [[i / 100 + j / 1000 for i in range(4) for j in range(4)], [0.25] * 16]
    qa2r = write_result_csv(str(tmp_path / "r.csv"), "QA2R", ids[::-1], r_probs[::-1])
    with open(q2a) as f:
        assert next(csv.reader(f)) == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3"]
    merged = merge_results(q2a, qa2r, str(tmp_path / "q2ar.csv"))
    with open(merged) as f:
        rows = list(csv.reader(f))
    assert rows[0][:6] == ["annot_id", "answer_0", "answer_1", "answer_2", "answer_3",
                           "rationale_conditioned_on_a0_0"]
    assert rows[0][-1] == "rationale_conditioned_on_a3_3" and len(rows[0]) == 21
    assert rows[1][0] == "test-0" and [float(v) for v in rows[1][1:5]] == [0.1, 0.2, 0.3, 0.4]
    values = read_result_csv(merged)
    assert values["test-0"]["rationale_conditioned_on_a2_1"] == pytest.approx(0.021)
    assert values["test-1"]["rationale_conditioned_on_a3_3"] == 0.25


def test_bad_rows_and_mismatched_ids(tmp_path):
    with pytest.raises(ValueError, match="expected 1 ids and 16 probabilities per row for QA2R"):
        write_result_csv(str(tmp_path / "r.csv"), "QA2R", ["a"], [[0.25] * 4])
    a = write_result_csv(str(tmp_path / "a.csv"), "Q2A", ["x"], [[0.25] * 4])
    r = write_result_csv(str(tmp_path / "r.csv"), "QA2R", ["y"], [[0.25] * 16])
    with pytest.raises(ValueError, match=r"different annot_ids \(only in Q2A: \['x'\], only in QA2R: \['y'\]\)"):
        merge_results(a, r, str(tmp_path / "m.csv"))
