import json
import os
import warnings

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from common.data.collate import BatchCollator, pad_stack
from tests.conftest import ROOT
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


def _two_item_dataset(tmp_path, task="Q2A", **kw):
    # second line: shorter texts, one object fewer referenced; second image is taller
    short = dict(LINE, annot_id="val-1", question=["why", "?"],
                 answer_choices=[["yes"], ["no"], ["it"], ["red"]], answer_label=0,
                 rationale_choices=[["it"], ["no"], ["yes"], [[0], "runs"]], rationale_label=1,
                 img_fn="m/b.jpg", metadata_fn="m/b.json", objects=["dog"])
    root = write_vcr(str(tmp_path), lines=[LINE, short])
    Image.new("RGB", (40, 60), (1, 2, 3)).save(str(tmp_path / "vcr1images" / "m" / "b.jpg"))
    with open(str(tmp_path / "vcr1images" / "m" / "b.json"), "w") as f:
        json.dump({"boxes": [[1, 1, 9, 9, 1.0]], "segms": [[]], "width": 40, "height": 60}, f)
    return make_dataset(root, task=task, **kw)


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


def test_canvas_follows_the_image_orientation_and_a_mixed_batch_is_long_by_long():
    collate = BatchCollator(["image"], scales=(96, 160))
    landscape, portrait = torch.ones(3, 80, 160), torch.full((3, 150, 90), 2.0)
    assert collate([(landscape,)])[0].shape == (1, 3, 96, 160)
    alone = collate([(portrait,)])[0]
    assert alone.shape == (1, 3, 160, 96) and alone[0, :, 150:].eq(0).all() and alone[0, :, :, 90:].eq(0).all()
    assert collate([(landscape,), (portrait,)])[0].shape == (2, 3, 160, 160)
    with pytest.raises(ValueError, match="image of 100x160 \\(HxW\\) does not fit the SCALES canvas 96x160"):
        collate([(torch.zeros(3, 100, 160),)])


def _logits_of_first_item(cfg, batch_images, dataset, model):
    from common.data.build import make_dataloader
    cfg = cfg.clone()
    cfg.defrost()
    cfg.VAL.BATCH_IMAGES = batch_images
    batch = list(next(iter(make_dataloader(cfg, "val", dataset=dataset))))
    batch.pop(cfg.DATASET.LABEL_INDEX_IN_BATCH)
    with torch.no_grad():
        return model(*batch)["label_logits"][0]


@pytest.mark.parametrize("pad_to_batch_max", [False, True])
def test_an_images_logits_do_not_depend_on_a_larger_image_in_its_batch(tmp_path, pad_to_batch_max):
    from common.data.build import build_transforms
    from common.engine import build_model
    from vcr.task import TASK as VCR_TASK
    from vcr.task import TASK
    cfg = VCR_TASK.load_config(os.path.join(ROOT, "cfgs", "vcr", "demo_q2a_cpu.yaml"), [
        "NETWORK.PARTIAL_PRETRAIN", "", "NETWORK.IMAGE_PRETRAINED", "", "NETWORK.BERT_MODEL_NAME", "",
        "TRAIN.FP16", "false", "NUM_WORKERS_PER_GPU", "0", "SCALES", "[96, 160]",
        "DATASET.PAD_TO_BATCH_MAX", str(pad_to_batch_max)])
    ds = _two_item_dataset(tmp_path, transform=build_transforms(cfg, "val"),
                           mask_size=(cfg.DATASET.MASK_SIZE, cfg.DATASET.MASK_SIZE))
    # a.jpg 80x40 -> 160x80 (long side capped); a second landscape image 60x40 -> 144x96: taller
    Image.new("RGB", (60, 40), (200, 10, 90)).save(str(tmp_path / "vcr1images" / "m" / "b.jpg"))
    assert [tuple(ds[i][0].shape[1:]) for i in range(2)] == [(80, 160), (96, 144)]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(TASK, cfg, "cpu").eval()
    alone, batch = (_logits_of_first_item(cfg, n, ds, model) for n in (1, 2))
    gap = (alone - batch).abs().max().item()
    if pad_to_batch_max:  # the opt-in trade-off: the 16 rows of padding below image 0 move its logits
        assert gap > 1e-4
    else:
        assert gap <= 1e-6
