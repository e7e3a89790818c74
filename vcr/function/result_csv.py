"""VCR leaderboard CSV files (format of the VCR leaderboard, as written by the reference release).

A Q2A file has the columns ``annot_id, answer_0..answer_3``; a QA2R file has ``annot_id`` and
``rationale_conditioned_on_a{i}_{j}`` (probability of rationale j given answer i, i, j in 0..3).
The submission merges both on ``annot_id``.
"""
import csv
import os

ANSWER_COLUMNS = ["answer_{}".format(i) for i in range(4)]
RATIONALE_COLUMNS = ["rationale_conditioned_on_a{}_{}".format(i, j) for i in range(4) for j in range(4)]


def columns_for(task):
    """Probability columns of a task's file: 4 for 'Q2A', 16 for 'QA2R'."""
    if task == "Q2A":
        return ANSWER_COLUMNS
    if task == "QA2R":
        return RATIONALE_COLUMNS
    raise ValueError("no leaderboard columns for task {!r}: expected 'Q2A' or 'QA2R'".format(task))


def write_result_csv(path, task, annot_ids, probs):
    """Write one task's test probabilities.

    Args:
        path (str): output file; its folder is created.
        task (str): 'Q2A' or 'QA2R'.
        annot_ids (list[str]): one id per row.
        probs (array-like): float, shape (rows, 4) for Q2A or (rows, 16) for QA2R, where QA2R row
            r holds the 4 rationale probabilities for answer 0, then for answer 1, ...
    Raises:
        ValueError: a row has the wrong number of probabilities or ids and rows differ in count.
    """
    columns = columns_for(task)
    probs = [list(map(float, row)) for row in probs]
    if len(probs) != len(annot_ids) or any(len(row) != len(columns) for row in probs):
        raise ValueError("{}: expected {} ids and {} probabilities per row for {}, got {} ids and rows of {}".format(
            path, len(probs), len(columns), task, len(annot_ids), sorted({len(r) for r in probs})))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["annot_id"] + columns)
        for annot_id, row in zip(annot_ids, probs):
            writer.writerow([annot_id] + row)
    return path


def read_result_csv(path):
    """Rows of a result file as ``{annot_id: {column: float}}``, in file order."""
    with open(path, newline="") as f:
        return {row.pop("annot_id"): {k: float(v) for k, v in row.items()} for row in csv.DictReader(f)}


def merge_results(q2a_path, qa2r_path, out_path):
    """Join a Q2A and a QA2R file on ``annot_id`` into the Q2AR submission file.

    Raises:
        ValueError: the two files do not hold the same annotation ids.
    """
    answers, rationales = read_result_csv(q2a_path), read_result_csv(qa2r_path)
    if set(answers) != set(rationales):
        only_a = sorted(set(answers) - set(rationales))[:5]
        only_r = sorted(set(rationales) - set(answers))[:5]
        raise ValueError("{} and {} hold different annot_ids (only in Q2A: {}, only in QA2R: {})".format(
            q2a_path, qa2r_path, only_a, only_r))
    with open(out_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["annot_id"] + ANSWER_COLUMNS + RATIONALE_COLUMNS)
        for annot_id, a in answers.items():
            r = rationales[annot_id]
            writer.writerow([annot_id] + [a[c] for c in ANSWER_COLUMNS] + [r[c] for c in RATIONALE_COLUMNS])
    return out_path
