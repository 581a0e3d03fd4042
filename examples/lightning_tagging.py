"""Multi-label tagging with PyTorch Lightning, scored with lwlrap and LRAP every validation epoch.

A small MLP learns to tag synthetic "clips" (feature vectors) with 1 to 3 of 20 classes, in the style of
audio tagging (Freesound Audio Tagging 2019). The validation metrics are ``torchmetrics`` objects from
``torch_lwlrap``, logged the way Lightning recommends: pass the *metric object* to ``self.log`` and Lightning
calls ``compute()`` at the end of the epoch (summing the states of all processes) and ``reset()`` afterwards.

Run it on whatever is available, or on two CPU processes with DDP (gloo)::

    python examples/lightning_tagging.py --quiet
    python examples/lightning_tagging.py --accelerator cpu --devices 2 --strategy ddp --quiet

At the end of every validation epoch the predictions and targets of all processes are gathered, and the value the
metric logged (its sum-only states reduced across processes) is set beside the value recomputed in one piece over
all the gathered predictions: the two are equal, with one process or many. Each epoch's pair is printed as an info
message (not with ``--quiet``); the last epoch's is printed at the end in any case.

The records stay in the process that trains: run it with one process or with ``--strategy ddp`` (a launcher that
starts the script again for each rank), not with a strategy that trains in spawned or forked child processes
(``ddp_spawn``, ``ddp_fork``, ``ddp_notebook``), which are refused.

The *trained model* differs between one process and two: under DDP each process trains on its half of the training
set, so an epoch takes half as many optimizer steps (each on the gradient averaged over both processes' batches),
and after the same number of epochs the model has trained less and scores lower. Compare DDP with one process over
the same validation predictions, as printed here, not across differently trained models.

``--out FILE`` writes (on rank 0) a JSON file with the logged per-epoch values, the recomputed ones, and the
validation predictions and targets of every epoch gathered from all processes, rank by rank (rank ``r`` holds the
samples ``r, r + world, ...``; each target row stays beside its prediction).

Needs ``lightning`` (``pip install lightning``, the ``examples`` extra).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import tempfile
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from torch_lwlrap import MultilabelLRAP, MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap

NUM_CLASSES = 20
NUM_FEATURES = 64


def make_dataset(split: str, num_samples: int, seed: int) -> TensorDataset:
    """Deterministic synthetic clips: the sum of the prototypes of 1 to 3 present classes, plus noise.

    The class prototypes depend only on ``seed`` (shared by both splits); the clips depend on ``seed`` and
    ``split`` (``"train"`` or ``"val"``).
    """
    prototypes = torch.randn(NUM_CLASSES, NUM_FEATURES, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + {"train": 1, "val": 2}[split] * 1_000_003)
    num_positives = torch.randint(1, 4, (num_samples,), generator=generator)
    order = torch.rand(num_samples, NUM_CLASSES, generator=generator).argsort(dim=1)
    target = torch.zeros(num_samples, NUM_CLASSES)
    for row, count in enumerate(num_positives.tolist()):
        target[row, order[row, :count]] = 1.0
    features = target @ prototypes + 1.5 * torch.randn(num_samples, NUM_FEATURES, generator=generator)
    return TensorDataset(features, target)


class StridedSampler(Sampler[int]):
    """Rank ``r`` of ``world`` reads samples ``r, r + world, r + 2 * world, ...``: every sample exactly once.

    Lightning's default ``DistributedSampler`` pads the shards to equal length by repeating samples, so a
    validation set whose size is not a multiple of the number of processes would have a few samples counted
    twice. The metrics only keep sums and need no equal shards: with this sampler (and
    ``use_distributed_sampler=False``) the value logged under DDP is exactly the value over the validation set.
    """

    def __init__(self, num_samples: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, num_samples, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class Tagger(L.LightningModule):
    """An MLP with one logit per class, trained with binary cross-entropy."""

    def __init__(self, num_train: int = 1024, num_val: int = 250, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES))
        self.loss = nn.BCEWithLogitsLoss()
        # The metric states are sums: they are reduced across processes when Lightning calls compute().
        self.val_lwlrap = MultilabelLWLRAP(num_labels=NUM_CLASSES)
        self.val_lrap = MultilabelLRAP(num_labels=NUM_CLASSES)

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

    def training_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        features, target = batch
        loss = self.loss(self(features), target)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        features, target = batch
        logits = self(features)  # ranked as given: no sigmoid needed
        self.val_lwlrap.update(logits, target)
        self.val_lrap.update(logits, target)
        # Pass the metric objects: Lightning computes (synced over processes) and resets them every epoch.
        self.log("val_lwlrap", self.val_lwlrap, on_step=False, on_epoch=True)
        self.log("val_lrap", self.val_lrap, on_step=False, on_epoch=True)
        return logits

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    # The trainer runs with use_distributed_sampler=False, so the samplers are set up here for each process.

    def train_dataloader(self) -> DataLoader:
        dataset = make_dataset("train", self.hparams.num_train, self.hparams.seed)
        sampler = DistributedSampler(
            dataset,
            num_replicas=self.trainer.world_size,
            rank=self.trainer.global_rank,
            shuffle=True,
            seed=self.hparams.seed,
        )
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler)

    def val_dataloader(self) -> DataLoader:
        dataset = make_dataset("val", self.hparams.num_val, self.hparams.seed)
        sampler = StridedSampler(len(dataset), self.trainer.global_rank, self.trainer.world_size)
        return DataLoader(dataset, batch_size=self.hparams.batch_size, sampler=sampler)


class EpochRecorder(Callback):
    """Keeps the logged validation values of every epoch, and the same values recomputed in one piece.

    The predictions and targets of all processes are gathered at the end of each validation epoch (uneven shards
    allowed) and scored with the functions; with ``keep_predictions`` they are kept in the records too.
    """

    def __init__(self, keep_predictions: bool = False) -> None:
        self.keep_predictions = keep_predictions
        self.records: List[Dict[str, Any]] = []
        self._batches: List[Tuple[Tensor, Tensor]] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batches = []

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._batches.append((outputs.detach().cpu(), batch[1].cpu()))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        # By now Lightning has computed the metrics of the epoch into `callback_metrics`.
        record: Dict[str, Any] = {"epoch": trainer.current_epoch}
        for name in ("val_lwlrap", "val_lrap"):
            record[name] = trainer.callback_metrics[name].item()
        preds = torch.cat([p for p, _ in self._batches]) if self._batches else torch.zeros(0, NUM_CLASSES)
        target = torch.cat([t for _, t in self._batches]) if self._batches else torch.zeros(0, NUM_CLASSES)
        shards = [(preds, target)]
        if dist.is_available() and dist.is_initialized():
            shards = [None] * dist.get_world_size()
            dist.all_gather_object(shards, (preds, target))
        all_preds = torch.cat([shard_preds for shard_preds, _ in shards]).double()
        all_target = torch.cat([shard_target for _, shard_target in shards])
        record["num_gathered"] = all_preds.shape[0]
        record["recomputed_lwlrap"] = multilabel_lwlrap(all_preds, all_target).item()
        record["recomputed_lrap"] = multilabel_lrap(all_preds, all_target).item()
        if self.keep_predictions:
            record["preds"] = all_preds.tolist()
            record["target"] = all_target.tolist()
        self.records.append(record)
        rank_zero_info(
            f"epoch {record['epoch']}: val_lwlrap={record['val_lwlrap']:.4f} val_lrap={record['val_lrap']:.4f} "
            f"(recomputed over all {record['num_gathered']} gathered predictions: "
            f"{record['recomputed_lwlrap']:.4f} and {record['recomputed_lrap']:.4f})"
        )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of 1 or more, but got {text!r}")
    return value


def _devices(text: str) -> Any:
    if text == "auto":
        return text
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f'expected a number of devices (processes) or "auto", but got {text!r}: pass a count, as in --devices 2'
        ) from None


#: Lightning strategies that train in child processes (spawned or forked): the records would stay there.
CHILD_PROCESS_STRATEGIES = ("spawn", "fork", "notebook")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=_positive, default=2, help="training epochs (default: 2)")
    parser.add_argument("--accelerator", default="auto", help='"auto", "cpu", "gpu", ... (default: auto)')
    parser.add_argument(
        "--devices", type=_devices, default=1, help='number of devices/processes, or "auto" (default: 1)'
    )
    parser.add_argument("--strategy", default="auto", help='"auto" or "ddp" (default: auto)')
    parser.add_argument("--num-train", type=_positive, default=1024, help="training clips (default: 1024)")
    parser.add_argument("--num-val", type=_positive, default=250, help="validation clips (default: 250)")
    parser.add_argument("--batch-size", type=_positive, default=32, help="batch size per process (default: 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model (default: 0)")
    parser.add_argument("--out", default=None, help="JSON file for the per-epoch values and predictions")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, model summary or info messages")
    args = parser.parse_args(argv)
    if any(word in args.strategy for word in CHILD_PROCESS_STRATEGIES):
        parser.error(
            f"--strategy {args.strategy} trains in child processes, which keep this example's records to "
            f"themselves (nothing would be printed or written): use --strategy ddp"
        )
    if isinstance(args.devices, int):
        for name in ("num_train", "num_val"):
            if getattr(args, name) < args.devices:
                parser.error(
                    f"--{name.replace('_', '-')} {getattr(args, name)} leaves a process of {args.devices} without a "
                    f"sample: give at least {args.devices}"
                )
    if args.out is not None:
        folder = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out):
            parser.error(f"--out {args.out} is a folder: name a file in it, as {os.path.join(args.out, 'run.json')}")
        if not os.path.isdir(folder):
            parser.error(f"--out {args.out}: the folder {folder} does not exist")
    return args


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    args = parse_args(argv)
    if args.quiet:
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)
        # Lightning's own use of an API that newer torch deprecates: nothing this script, or its user, can change
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
    L.seed_everything(args.seed, verbose=not args.quiet)
    model = Tagger(num_train=args.num_train, num_val=args.num_val, batch_size=args.batch_size, seed=args.seed)
    recorder = EpochRecorder(keep_predictions=args.out is not None)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = L.Trainer(
            max_epochs=args.epochs,
            accelerator=args.accelerator,
            devices=args.devices,
            strategy=args.strategy,
            callbacks=[recorder],
            use_distributed_sampler=False,  # our own samplers: see StridedSampler
            num_sanity_val_steps=0,
            logger=False,  # values still reach self.log / callback_metrics
            enable_checkpointing=False,
            enable_progress_bar=not args.quiet,
            enable_model_summary=not args.quiet,
            default_root_dir=tmp,
        )
        trainer.fit(model)
        if args.out is not None and trainer.is_global_zero:
            config = {k: v for k, v in vars(args).items() if k != "out"}
            config["world_size"] = trainer.world_size
            with open(args.out, "w") as file:
                json.dump({"config": config, "epochs": recorder.records}, file)
    if trainer.is_global_zero and recorder.records:
        last = recorder.records[-1]
        world = trainer.world_size
        print(
            f"final validation ({world} process{'es' if world > 1 else ''}, {last['num_gathered']} samples, "
            f"{trainer.global_step} optimizer steps):\n"
            f"          metric    recomputed over all gathered predictions\n"
            f"  lwlrap  {last['val_lwlrap']:.4f}    {last['recomputed_lwlrap']:.4f}\n"
            f"  LRAP    {last['val_lrap']:.4f}    {last['recomputed_lrap']:.4f}"
        )
        if world > 1:
            print(
                f"Each of the {world} processes trained on 1/{world} of the training set per epoch: "
                f"{trainer.global_step} optimizer steps, where one process takes "
                f"{args.epochs * math.ceil(args.num_train / args.batch_size)}. "
                f"The model trained less, so its score differs from a single-process run; the metric itself "
                f"equals the value over all predictions."
            )
    return recorder.records


if __name__ == "__main__":
    main()
