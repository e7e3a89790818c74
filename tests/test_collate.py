import json

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from common.data.collate import BatchCollator, pad_stack
from tests.test_vcr_data import LINE, make_dataset, write_vcr


def test_pad_stack_values():
    out = pad_stack([torch.ones(2, 3), torch.full((1, 4), 2.0)], pad=-1)
    assert out.tolist() == [[[1, 1, 1, -1], [1, 1, 1, -1]], [[2, 2, 2, 2], [-1, -1, -1, -1]]]
    same = pad_stack([torch.zeros(2), torch.ones(2)])
    assert same.tolist() == [[0, 0], [1, 1]]


def test_list_fields_need_same_count():
    collate = BatchCollator(["answer_choices"])
    with pytest.raises(ValueError, match="field 'answer_choices'.*different numbers of entries \\[1, 2\\]"):
        collate([([torch.zeros(1, 3)],), ([torch.zeros(1, 3), torch.zeros(2, 3)],)])


def _two_item_dataset(tmp_path, task="Q2A"):
    # second line: shorter texts, one object fewer referenced; second image is taller
    short = dict(LINE, annot_id="val-1", question=["why", "?"],
                 answer_choices=[["yes"], ["no"], ["it"], ["red"]], answer_label=0,
                 rationale_choices=[["it"], ["no"], ["yes"], [[0], "runs"]], rationale_label=1,
                 img_fn="m/b.jpg", metadata_fn="m/b.json", objects=["dog"])
    root = write_vcr(str(tmp_path), lines=[LINE, short])
    Image.new("RGB", (40, 60), (1, 2, 3)).save(str(tmp_path / "vcr1images" / "m" / "b.jpg"))
    with open(str(tmp_path / "vcr1images" / "m" / "b.json"), "w") as f:
        json.dump({"boxes": [[1, 1, 9, 9, 1.0]], "segms": [[]], "width": 40, "height": 60}, f)
    return make_dataset(root, task=task)


def test_collate_vcr_q2a_shapes_and_pads(tmp_path):
    ds = _two_item_dataset(tmp_path)
    collate = BatchCollator(ds.data_names, append_ind=True)
    batch = dict(zip(ds.data_names + ["index"], collate([ds[0], ds[1]])))
    # images 80x40 and (resized to short side 40) 40x60 -> padded to H 60, W 80
    assert batch["image"].shape == (2, 3, 60, 80)
    assert (batch["image"][0, :, 40:] == 0).all() and (batch["image"][1, :, :, 40:] == 0).all()
    assert torch.equal(batch["image"][0, :, :40], ds[0][0])
    assert batch["boxes"].shape == (2, 5, 6) and batch["boxes"][1, 2:].eq(-1).all()
    assert batch["masks"].shape == (2, 5, 14, 14) and batch["masks"][1, 2:].eq(-1).all()
    assert batch["question"].shape == (2, 9, 3) and batch["question"].dtype == torch.int64
    assert batch["question"][1, 2:].eq(-2).all()
    assert batch["question_align_matrix"].shape == (2, 9, 9)
    assert batch["answer_choices"].shape == (2, 4, 3, 3)
    assert batch["answer_choices"][1, 0, 1:].eq(-2).all()
    assert batch["answer_align_matrix"].shape == (2, 4, 2, 3)
    assert batch["answer_align_matrix"][1, 0].tolist() == [[1, 0, 0], [0, 0, 0]]
    assert batch["answer_label"].tolist() == [2, 0]
    assert batch["im_info"].shape == (2, 5) and batch["im_info"][:, 4].tolist() == [0, 1]
    assert batch["index"].tolist() == [0, 1]


def test_collate_qa2r_in_dataloader_with_workers(tmp_path):
    ds = _two_item_dataset(tmp_path, task="QA2R")
    loader = DataLoader(ds, batch_size=2, num_workers=1, collate_fn=BatchCollator(ds.data_names))
    batch = dict(zip(ds.data_names, next(iter(loader))))
    assert batch["question"].shape == (2, 11, 3)  # question + right answer, longest of the two
    assert batch["rationale_choices"].shape == (2, 4, 3, 3)
    assert batch["rationale_label"].tolist() == [1, 1]
