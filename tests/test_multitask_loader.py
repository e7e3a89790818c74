"""The multi-task loader (common/data/multitask.py): epoch length, each loader's own epoch, exact resume,
and the per-data-set configs of a DATASET list."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from common.data.multitask import MultiTaskConfigError, MultiTaskDataLoader, dataset_configs
from common.data.samplers import make_batch_sampler, resolve_key
from pretrain.task import TASK as PRETRAIN_TASK
from tests.golden import close
from tests.tiny_pretrain import cfg_path


class Keys(Dataset):
    """Item = (index, epoch of its key, a draw from the key's generator): what a sample's randomness sees."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        index, generator = resolve_key(key)
        return torch.tensor([index, key.epoch, int(torch.randint(1000, (), generator=generator))])


def loader(size, batch, seed=3):
    dataset = Keys(size)
    sampler = make_batch_sampler(dataset, batch, True, shuffle=True, seed=seed, sample_keys=True)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=lambda items: (torch.stack(items),))


def multitask():
    # first: 7 samples / 2 = 4 batches per epoch; second: 5 / 2 = 3 batches (wraps inside an epoch);
    # third: 3 / 3 = 1 batch (a new epoch of its own every step)
    return MultiTaskDataLoader([loader(7, 2), loader(5, 2), loader(3, 3)])


def run(mt, epochs, start=(0, 0)):
    """{(epoch, batch): batch tuple as lists} from ``start`` on, as the trainer drives it."""
    out = {}
    for epoch in range(start[0], epochs):
        mt.batch_sampler.set_epoch(epoch)
        first = start[1] if epoch == start[0] else 0
        if first:
            mt.batch_sampler.skip(first)
        for b, batch in enumerate(mt, first):
            out[(epoch, b)] = [t.tolist() for t in batch]
    return out


def test_epoch_is_the_first_loaders_and_the_others_cycle_with_their_own_epochs():
    mt = multitask()
    assert len(mt) == 4
    got = run(mt, 3)
    assert sorted(got) == [(e, b) for e in range(3) for b in range(4)]
    for (epoch, b), (first, second, third) in got.items():
        step = epoch * 4 + b
        assert {row[1] for row in first} == {epoch}
        assert {row[1] for row in second} == {step // 3}  # 3 batches per epoch of the second loader
        assert {row[1] for row in third} == {step}
    # each epoch of the second loader covers its 5 samples once, shuffled by its own epoch
    for e2 in range(4):
        rows = [row[0] for (e, b), batch in got.items() if (e * 4 + b) // 3 == e2 for row in batch[1]]
        assert sorted(rows) == [0, 1, 2, 3, 4]
    orders = {tuple(r[0] for (e, b), batch in got.items() if (e * 4 + b) // 3 == e2 for r in batch[1])
              for e2 in range(4)}
    assert len(orders) > 1


@pytest.mark.parametrize("start", [(0, 1), (1, 0), (1, 3), (2, 2)])
def test_resume_at_any_batch_gives_the_uninterrupted_batches(start):
    full = run(multitask(), 3)
    resumed = run(multitask(), 3, start)
    assert resumed == {k: v for k, v in full.items() if k >= start}


def test_positions_and_errors():
    mt = multitask()
    assert mt.positions(2, 1) == [(2, 1), (3, 0), (9, 0)]
    with pytest.raises(ValueError, match="at least one"):
        MultiTaskDataLoader([])
    with pytest.raises(ValueError, match="negative"):
        mt.batch_sampler.skip(-1)


def test_dataset_configs_split_the_lists():
    cfg = PRETRAIN_TASK.load_config(cfg_path("base_prec_4x16G_fp32.yaml"), ["TRAIN.BATCH_IMAGES", "[3, 5]", "VAL.BATCH_IMAGES", 4])
    first, second = dataset_configs(cfg)
    assert (first.DATASET.DATASET, second.DATASET.DATASET) == ("conceptual_captions", "general_corpus")
    assert (first.TRAIN.BATCH_IMAGES, second.TRAIN.BATCH_IMAGES) == (3, 5)
    assert (first.VAL.BATCH_IMAGES, second.VAL.BATCH_IMAGES) == (4, 4)
    assert second.DATASET.SEQ_LEN == 64 and second.DATASET.MIN_SEQ_LEN == 64 and first.is_frozen()
    bad = PRETRAIN_TASK.load_config(cfg_path("base_prec_4x16G_fp32.yaml"), ["TRAIN.BATCH_IMAGES", "[3, 5, 7]"])
    with pytest.raises(MultiTaskConfigError, match=r"my.yaml: TRAIN.BATCH_IMAGES has 3 entries for 2 DATASET"):
        dataset_configs(bad, "my.yaml")


def test_the_step_record_counts_the_samples_of_every_data_set():
    """Throughput and TensorBoard count each step's samples of all data sets, not the first one's only."""
    from common.trainer import Trainer

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, *batch):
            return {}, self.w * sum(b.float().sum() for b in batch) * 0

    net = Net()
    trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1), multitask())
    trainer.train(0, 1)
    # 4 steps: first loader 2, 2, 2, 1 (7 samples); second 2, 2, 1, 2 (5 samples cycling); third 3 each
    assert trainer.ctx.record.total_samples == 7 + 7 + 4 * 3


def near_ties(outputs, suffix):
    """The predicted word pieces (label != -1) of ``mlm_logits<suffix>`` whose two best scores tie within
    tests/golden.py's tolerance: computed in batches of another composition (another process count), their
    argmax may go either way."""
    logits = outputs.get("mlm_logits" + suffix)
    if logits is None:
        return 0
    top = logits[outputs["mlm_label" + suffix] != -1].float().topk(2, dim=1).values
    return sum(close(a, b) for a, b in top.tolist())


def test_validation_reads_every_data_set_once_whatever_the_process_count(tiny_pretrain):
    """A DATASET list's validation (captions + text corpus of different lengths) on 1 and on 2 processes
    (each rank's shard in turn): every accuracy counts the same items, so every set is read once, in full, and
    the same right ones but for near ties (the batches differ, so their last bits may)."""
    from common.engine import build_loader
    from tests.tiny_pretrain import opts
    name = "base_e2e_16x16G_fp16.yaml"
    cfg = PRETRAIN_TASK.load_config(cfg_path(name), opts(name, tiny_pretrain))
    torch.manual_seed(0)
    model = PRETRAIN_TASK.build_model(cfg).eval()

    def counts(world):
        metrics = PRETRAIN_TASK.build_metrics(cfg, for_training=False)
        lengths, ties = [], 0
        for rank in range(world):
            loader = build_loader(PRETRAIN_TASK, cfg, "val", world, rank)
            lengths.append([len(sub) for sub in loader.loaders])
            with torch.no_grad():
                for batch in loader:
                    outputs = model(*batch)[0]
                    metrics.update(outputs)
                    ties += sum(near_ties(outputs, suffix) for suffix in ("_wvc", "_aux"))
        return {m.name: (int(m.num_inst), int(m.sum_metric)) for m in metrics.metrics}, lengths, ties

    one, lengths, ties = counts(1)
    assert lengths[0][0] != lengths[0][1]  # the sets differ in length: the shorter one is filled in
    two, _, _ = counts(2)
    accuracies = [name for name in one if "Acc" in name]
    assert accuracies
    for name in accuracies:  # items counted exactly; the right ones may differ only by the near-tied pieces
        (items, right), (items_two, right_two) = one[name], two[name]
        assert items == items_two and abs(right - right_two) <= ties, (name, one[name], two[name], ties)
    # the per-batch mean losses skip the filler batches (their losses are NaN): one count per real batch
    assert one["MLMLossWVC"][0] == lengths[0][0] and one["MLMLossAUX"][0] == lengths[0][1]
    corpus = build_loader(PRETRAIN_TASK, dataset_configs(cfg)[1], "val")
    assert one["MLMAccAUX"][0] == sum(int((labels != -1).sum()) for _, labels in corpus)  # each passage once
