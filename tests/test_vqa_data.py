"""vqa/data/vqa.py on a tiny data folder in the reference layout (data/coco)."""
import json
import os
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from common.data import transforms as T
from common.data.build import build_dataset, make_dataloader
from common.data.feature_cache import write_feature_cache
from common.data.region_features import RegionFeatures, feature_json_dict, iter_feature_folder, write_feature_json
from common.data.tokenizer import build_tokenizer
from common.data.zipreader import ZipReader
from vqa.data.answers import AnswerVocabError
from vqa.data.vqa import VQADataError, VQADataset
from vqa.data.vqa_files import VqaFileError
from vqa.task import TASK as VQA_TASK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "left", "right", "of", "the", "dog", "?",
         "how", "many", "cats", "color"]
ANSWERS = ["<unk>", "2", "3", "left", "right", "red", "yes"]
FEATURES_36 = "trainval_resnet101_faster_rcnn_genome_36"
# question_id -> (split, image_id, question, ten answers)
QUESTIONS = {
    91: ("train2014", 9, "What is left of the dog?", ["left"] * 3 + ["right"] * 6 + ["zebra"]),
    92: ("train2014", 9, "How many cats?", ["two", "Two.", "2", "3", "3", "3", "3", "4", "4", "4"]),
    421: ("val2014", 42, "What color?", ["red"] * 10),
}
IMAGES = {9: (40, 30, 3), 42: (24, 36, 2)}  # image_id -> width, height, boxes


def regions(image_id, image_box=True):
    w, h, n = IMAGES[image_id]
    rng = np.random.default_rng(image_id)
    boxes = np.array([[1, 2, 10, 12], [5, 5, w + 10, h - 1], [0, 0, 3, 3]][:n], np.float32)
    return RegionFeatures(image_id, w, h, boxes, rng.normal(size=(n, 2048)).astype(np.float32),
                          rng.normal(size=2048).astype(np.float32) if image_box else None)


def write_data(root, image_box=True):
    """data/coco with train2014 and val2014 questions, annotations, 36-box features and images."""
    coco = root / "coco"
    for sub in ("vqa", "vgbua_res101_precomputed/" + FEATURES_36, "train2014", "val2014"):
        (coco / sub).mkdir(parents=True, exist_ok=True)
    for split in ("train2014", "val2014"):
        qs = [(qid, v) for qid, v in QUESTIONS.items() if v[0] == split]
        (coco / "vqa" / "v2_OpenEnded_mscoco_{}_questions.json".format(split)).write_text(json.dumps(
            {"questions": [{"question_id": qid, "image_id": v[1], "question": v[2]} for qid, v in qs]}))
        (coco / "vqa" / "v2_mscoco_{}_annotations.json".format(split)).write_text(json.dumps({"annotations": [
            {"question_id": qid, "image_id": v[1], "question_type": "what", "answer_type": "other",
             "multiple_choice_answer": v[3][0],
             "answers": [{"answer": a, "answer_id": i + 1} for i, a in enumerate(v[3])]}
            for qid, v in qs]}))
    (coco / "vqa" / "answers_vqa.txt").write_text("\n".join(ANSWERS) + "\n")
    rng = np.random.default_rng(0)
    for image_id, split in ((9, "train2014"), (42, "val2014")):
        write_feature_json(str(coco / "vgbua_res101_precomputed" / FEATURES_36 / "{}.json".format(image_id)),
                           regions(image_id, image_box))
        w, h, _ = IMAGES[image_id]
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
            str(coco / split / "COCO_{}_{:012d}.jpg".format(split, image_id)))
    (root / "bert").mkdir(exist_ok=True)
    (root / "bert" / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return coco


def make(root, image_set="train2014+val2014", **kw):
    args = dict(data_path=str(root / "coco"), answer_vocab_file=str(root / "coco" / "vqa" / "answers_vqa.txt"),
                tokenizer=build_tokenizer(str(root / "bert")))
    args.update(kw)
    return VQADataset(image_set, **args)


def ids(root, text):
    tok = build_tokenizer(str(root / "bert"))
    return tok.convert_tokens_to_ids(tok.tokenize(text))


def test_precomputed_items_have_image_box_regions_question_and_soft_scores(tmp_path):
    write_data(tmp_path)
    ds = make(tmp_path)
    assert (len(ds), ds.question_ids, ds.data_names) == (3, [91, 92, 421], ["image", "boxes", "im_info", "question",
                                                                            "label"])
    image, boxes, im_info, question, label = ds[0]
    r = regions(9)
    assert image is None
    assert boxes.shape == (4, 4 + 2048)
    # Whole-image box first, then the file's boxes clipped to the image (x2 = 50 -> 39).
    np.testing.assert_array_equal(boxes[:, :4].numpy(), [[0, 0, 39, 29], [1, 2, 10, 12], [5, 5, 39, 29], [0, 0, 3, 3]])
    np.testing.assert_array_equal(boxes[0, 4:].numpy(), r.image_box_feature)
    np.testing.assert_array_equal(boxes[1:, 4:].numpy(), r.features)
    np.testing.assert_array_equal(im_info.numpy(), [40, 30, 1, 1, 0])
    assert question.dtype == torch.int64 and question.tolist() == ids(tmp_path, "what is left of the dog ?")
    # left: 3 of 10 annotators -> 0.9, right: 6 -> 1.0, zebra is outside the vocabulary.
    np.testing.assert_allclose(label.numpy(), [0, 0, 0, 0.9, 1.0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(ds[1][4].numpy(), [0, 0.9, 1.0, 0, 0, 0, 0], atol=1e-6)  # "two", "Two." -> "2"
    assert ds[2][1].shape == (3, 4 + 2048) and ds[2][4][5] == 1.0


def test_without_image_box_feature_the_whole_image_gets_the_mean(tmp_path):
    write_data(tmp_path, image_box=False)
    boxes = make(tmp_path, "val2014")[0][1]
    np.testing.assert_allclose(boxes[0, 4:].numpy(), regions(42).features.mean(0), rtol=1e-6)


def test_feature_cache_is_read_when_present(tmp_path):
    coco = write_data(tmp_path)
    folder = coco / "vgbua_res101_precomputed" / FEATURES_36
    expected = [t for t in make(tmp_path)[0]][1:]
    write_feature_cache(iter_feature_folder(str(folder)), str(folder) + ".cache")
    for path in folder.iterdir():
        path.unlink()  # from now on only the cache can answer
    ds = make(tmp_path)
    assert ds._caches[0] is not None
    for a, b in zip(ds[0][1:], expected):
        assert torch.equal(a, b)


def test_cache_of_other_features_is_an_error_with_precomputed_features(tmp_path):
    coco = write_data(tmp_path)
    small = RegionFeatures(9, 40, 30, np.zeros((1, 4), np.float32), np.zeros((1, 8), np.float32))
    write_feature_cache([small], str(coco / "vgbua_res101_precomputed" / FEATURES_36) + ".cache")
    with pytest.raises(VQADataError, match=r"_36\.cache: features of width 8, IMAGE_FEAT_PRECOMPUTED needs 2048"):
        make(tmp_path)
    assert len(make(tmp_path, with_precomputed_visual_feat=False)) == 3  # end to end only its boxes are used


def test_end_to_end_flip_swaps_left_and_right_in_question_and_answers(tmp_path):
    write_data(tmp_path)
    transform = T.Compose([T.Resize(60, 1000), T.RandomHorizontalFlip(1.0), T.ToTensor(),
                           T.Normalize([102.9801, 115.9465, 122.7717], [1.0, 1.0, 1.0])])
    ds = make(tmp_path, "train2014", with_precomputed_visual_feat=False, transform=transform)
    image, boxes, im_info, question, label = ds[0]
    assert image.shape == (3, 60, 80)
    np.testing.assert_allclose(im_info.numpy(), [80, 60, 2, 2, 0])
    assert boxes.shape == (4, 4)
    # Box [1, 2, 10, 12] at scale 2 is [2, 4, 20, 24]; mirrored in a 80-pixel-wide image: [59, 4, 77, 24].
    np.testing.assert_allclose(boxes[1].numpy(), [59, 4, 77, 24])
    assert question.tolist() == ids(tmp_path, "what is right of the dog ?")
    np.testing.assert_allclose(label.numpy(), [0, 0, 0, 1.0, 0.9, 0, 0], atol=1e-6)


def test_zip_mode_and_test_mode(tmp_path):
    coco = write_data(tmp_path)
    folder = coco / "vgbua_res101_precomputed" / FEATURES_36
    with zipfile.ZipFile(str(folder) + ".zip", "w") as z:
        for path in folder.iterdir():
            z.write(str(path), "{}/{}".format(FEATURES_36, path.name))
            path.unlink()
    folder.rmdir()
    ZipReader.close_all()
    ds = make(tmp_path, "val2014", storage="zip", test_mode=True)
    assert ds.data_names == ["image", "boxes", "im_info", "question"]
    item = ds[0]
    assert len(item) == 4 and item[1].shape == (3, 4 + 2048)


def test_data_errors_name_the_file_and_the_question(tmp_path):
    coco = write_data(tmp_path)
    folder = coco / "vgbua_res101_precomputed" / FEATURES_36
    (folder / "42.json").unlink()
    ds = make(tmp_path)
    with pytest.raises(VQADataError, match=r"question_id 421 \(image_id 42\): no feature file .*{}/42\.json".format(
            FEATURES_36)):
        ds[2]
    record = feature_json_dict(regions(9))
    record["num_boxes"] = 5
    (folder / "9.json").write_text(json.dumps(record))
    with pytest.raises(VQADataError, match=r"question_id 91 \(image_id 9\): .*9\.json \(image_id 9\): num_boxes is 5"):
        ds[0]
    with pytest.raises(AnswerVocabError, match=r"DATASET.ANSWER_VOCAB_SIZE is 3129 but the answer vocabulary .* "
                                               r"\(DATASET.ANSWER_VOCAB_FILE\) has 7 answers; set .* to 7"):
        make(tmp_path, answer_vocab_size=3129)
    with pytest.raises(VQADataError, match=r"unknown VQA split\(s\) \['val2015'\]"):
        make(tmp_path, "train2014+val2015")
    with pytest.raises(VQADataError, match="test splits are for test mode only"):
        make(tmp_path, "test2015")
    with pytest.raises(FileNotFoundError, match=r"VQA data missing .*v2_OpenEnded_mscoco_test2015_questions\.json, "
                       r".*test2015_resnet101_faster_rcnn_genome_36; see data/PREPARE_DATA\.md"):
        make(tmp_path, "test2015", test_mode=True)
    (coco / "vqa" / "v2_mscoco_val2014_annotations.json").write_text(json.dumps({"annotations": []}))
    with pytest.raises(VqaFileError, match="are not the same split: question_id 421 is in only one of them"):
        make(tmp_path, "val2014")


def test_shipped_config_builds_the_dataset_and_a_loader(tmp_path):
    write_data(tmp_path)
    opts = ["DATASET.DATASET_PATH", str(tmp_path / "coco"), "DATASET.ANSWER_VOCAB_FILE",
            str(tmp_path / "coco" / "vqa" / "answers_vqa.txt"), "DATASET.ANSWER_VOCAB_SIZE", "7",
            "DATASET.BOXES", "'36'",
            "NETWORK.BERT_MODEL_NAME", str(tmp_path / "bert"), "TRAIN.BATCH_IMAGES", "3", "NUM_WORKERS_PER_GPU", "0"]
    cfg = VQA_TASK.load_config(os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml"), opts)
    assert len(build_dataset(cfg, "train")) == 3  # TRAIN_IMAGE_SET 'train2014+val2014'
    image, boxes, im_info, question, label = next(iter(make_dataloader(cfg, "train")))
    assert image == [None, None, None]
    assert (boxes.shape, im_info.shape, label.shape) == ((3, 4, 4 + 2048), (3, 5), (3, 7))
    assert question.shape[0] == 3
    bad = VQA_TASK.load_config(os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml"), opts + ["DATASET.USE_IMDB", "true"])
    with pytest.raises(VQADataError, match="USE_IMDB: true reads Pythia's imdb"):
        build_dataset(bad, "train")


def test_padded_boxes_are_outside_the_model_box_mask(tmp_path):
    """A batch of images with 3 and 2 regions (4 and 3 boxes with the whole image): the padded row
    gets -2 and the VQA model's mask keeps exactly the real rows (a -1 pad passed its > -1.5 test)."""
    from vqa.modules.resnet_vlbert_for_vqa import box_mask

    write_data(tmp_path)
    opts = ["DATASET.DATASET_PATH", str(tmp_path / "coco"), "DATASET.ANSWER_VOCAB_FILE",
            str(tmp_path / "coco" / "vqa" / "answers_vqa.txt"), "DATASET.ANSWER_VOCAB_SIZE", "7",
            "DATASET.BOXES", "'36'", "NETWORK.BERT_MODEL_NAME", str(tmp_path / "bert"),
            "TRAIN.BATCH_IMAGES", "3", "TRAIN.SHUFFLE", "false", "NUM_WORKERS_PER_GPU", "0"]
    cfg = VQA_TASK.load_config(os.path.join(ROOT, "cfgs", "vqa", "base_4x16G_fp32.yaml"), opts)
    boxes = next(iter(make_dataloader(cfg, "train")))[1]
    assert boxes.shape == (3, 4, 4 + 2048)
    assert box_mask(boxes).tolist() == [[True] * 4, [True] * 4, [True] * 3 + [False]]
    assert (boxes[2, 3] == -2).all()


def test_end_to_end_image_rotated_by_exif_is_read_in_the_orientation_of_its_regions(tmp_path):
    """Stored 24 x 36 with EXIF orientation 6 (36 x 24 upright); the regions were made on the stored pixels."""
    from common.data.loading import ImageOrientationWarning

    coco = write_data(tmp_path)
    path = str(coco / "val2014" / "COCO_val2014_000000000042.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.open(path).save(path, exif=exif)
    ds = make(tmp_path, "val2014", with_precomputed_visual_feat=False)
    with pytest.warns(ImageOrientationWarning, match=r"COCO_val2014_000000000042\.jpg has EXIF orientation 6: 36x24 "
                                                     r"pixels upright, 24x36 as stored, the size in the regions of "
                                                     r"question_id 421 \(image_id 42\); it is used as stored"):
        item = ds[0]
    assert item[2][:2].tolist() == [24, 36]