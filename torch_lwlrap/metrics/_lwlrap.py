"""``torchmetrics.Metric`` classes: thin wrappers that accumulate the sums of :mod:`torch_lwlrap.functional`.

States are sums only (float64 precision sums, int64 counts), reduced with ``"sum"`` across processes: no
predictions are kept or gathered, and ``forward`` needs no full state update.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from torch_lwlrap._engine_config import eager_only
from torch_lwlrap._user_frames import warn
from torch_lwlrap._checks import (
    TIES,
    check_average,
    check_ignore_index,
    check_num_labels,
    check_ties,
)
from torch_lwlrap.stats import _bootstrap
from torch_lwlrap.metrics._base import (
    TaggedMetric,
    _process_rank,
    _synced,
    _syncs_other_processes,
)
from torch_lwlrap.metrics._calls import _check_device
from torch_lwlrap.metrics._tags import choice_option, int_option, legacy_tag
from torch_lwlrap._ranking import TIE_SUM_RULES, TieSums
from torch_lwlrap.functional._tie_report import TieReport, tie_sums_update
from torch_lwlrap.stats._bootstrap import check_level, check_num_bootstrap, check_seed
from torch_lwlrap.functional._lwlrap import (
    _lrap_compute,
    _lrap_update,
    _lwlrap_compute,
    _lwlrap_per_class,
    _lwlrap_update,
)
from torch_lwlrap.plot import plot_per_class, plot_values
from torch_lwlrap.functional._intervals import (
    _class_interval,
    _lrap_bootstrap_update,
    _lrap_replicates,
    _lwlrap_bootstrap_update,
    _lwlrap_replicates,
)

__all__ = ["MultilabelLWLRAP", "MultilabelLRAP", "MultilabelTieReport"]


class _Bootstrap:
    """The bootstrap side of a metric: its replicate states, the position of each sample in the stream, the interval.

    A metric with ``num_bootstrap = B > 0`` keeps ``B`` weighted copies of its sums (see
    :mod:`torch_lwlrap.stats._bootstrap`) and a sample counter ``<prefix>_samples``: the weight of a sample is drawn from
    ``(bootstrap_seed, process rank, the sample's position in its process's stream)``, so the replicates do not
    depend on how the samples were split into batches (the function on all of them gives the same interval), a run
    is reproducible for a given seed, world size and sample order, and a checkpoint carries where the stream stands.
    """

    #: The state whose first dimension is the number of replicates (read from an earlier version's checkpoint).
    _replicate_state: str = ""

    def _bootstrap_options(self, num_bootstrap: int, bootstrap_seed: Optional[int], counter: str):
        """Check and keep the bootstrap options; their tag entries (the seed only with replicates)."""
        self.num_bootstrap = check_num_bootstrap(num_bootstrap)
        # A seed given without replicates is checked too: a wrong one is refused where it is written.
        self.bootstrap_seed = check_seed(bootstrap_seed) if self.num_bootstrap or bootstrap_seed is not None else None
        # A drawn seed was not the user's choice: a checkpoint's seed replaces it, so the run resumes its stream.
        self._seed_drawn = bootstrap_seed is None
        self._counter_name = counter
        self._counter_offset: Optional[Tensor] = None
        self._forward_base: Optional[Dict[str, Tensor]] = None
        seed = self.bootstrap_seed if self.num_bootstrap else None
        return int_option("num_bootstrap", self.num_bootstrap), int_option("bootstrap_seed", seed)

    def _add_bootstrap_counter(self) -> None:
        if self.num_bootstrap:
            self.add_state(self._counter_name, torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def _legacy_refusal(self, saved: Callable[[str], Any]) -> Optional[str]:
        # Earlier versions drew the weights per update (an update counter), not per sample position: their
        # replicates cannot go on in this stream, whatever the options.
        old_counter = self._counter_name.replace("_samples", "_updates")
        if saved(old_counter) is None:
            return None
        return (
            f"was made by an earlier version of torch_lwlrap, whose bootstrap weights were drawn per update rather "
            f"than per sample position: its replicates cannot continue here. Load it into a metric without "
            f"num_bootstrap after dropping the checkpoint's {old_counter!r} and replicate entries, or start the "
            f"interval anew"
        )

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        # Earlier tags held ties, ignore_index and num_labels; the replicates tell num_bootstrap (not the seed).
        out = legacy_tag(saved, TIES)
        if out is None:
            return None
        replicates = saved(self._replicate_state)
        out["num_bootstrap"] = replicates.shape[0] if isinstance(replicates, Tensor) and replicates.ndim else 0
        return out

    def _adoptable(self, name: str, value: Any) -> bool:
        return name == "bootstrap_seed" and self._seed_drawn and self.num_bootstrap > 0 and value is not None

    def _adopt(self, values: Dict[str, Any]) -> None:
        self.bootstrap_seed = values["bootstrap_seed"]
        self._options_changed(
            [int_option(o.name, self.bootstrap_seed) if o.name == "bootstrap_seed" else o for o in self._options]
        )

    def _stream(self) -> Tuple[Tensor, Tensor]:
        """``(key, first_sample)`` of this update's weights: the key of this process's stream and the position of
        the batch's first sample in it, int64 scalars on the metric's device (no sync)."""
        counter = getattr(self, self._counter_name)
        if self._counter_offset is not None:  # inside forward: the state was emptied, the offset is its old count
            counter = counter + self._counter_offset
        return _bootstrap.stream_key(self.bootstrap_seed, _process_rank(), device=counter.device), counter

    def _count_samples(self, preds: Tensor) -> None:
        """The batch's samples drawn: called once the batch is accepted (a rejected batch changes nothing).
        Extra dimensions ``(N, C, ...)`` are samples too, as everywhere."""
        samples = preds.shape[0] * math.prod(preds.shape[2:])
        setattr(self, self._counter_name, getattr(self, self._counter_name) + samples)

    def _writable_states(self, *names: str) -> Tuple[Tensor, ...]:
        """The replicate states, to add to in place: a state made under ``torch.inference_mode()`` is copied once
        into a normal tensor when updated outside it (it cannot be written there)."""
        states = []
        for name in names:
            state = getattr(self, name)
            base = None if self._forward_base is None else self._forward_base.get(name)
            if base is not None:
                # Inside forward: this batch is added onto a copy of the accumulated replicates (and
                # _reduce_states keeps it as it is), so every replicate's sum stays one addition after another in
                # stream order: forward draws what update draws, to the bit.
                state = base
                setattr(self, name, state)
            elif state.is_inference() and not torch.is_inference_mode_enabled():
                state = state.clone()
                setattr(self, name, state)
            states.append(state)
        return tuple(states)

    @contextlib.contextmanager
    def _forward_context(self) -> Iterator[None]:
        # torchmetrics' forward empties the states (the counter too) before update and adds the batch's states
        # back after: the batch's weights must still be those the next update would draw.
        # Only on the path that empties the states: with dist_sync_on_step (or a full state update) torchmetrics
        # first updates the accumulated states as they are, then a throwaway copy, and keeps the first.
        full_state = self.full_state_update or self.full_state_update is None or self.dist_sync_on_step
        if self.num_bootstrap and not full_state:
            self._counter_offset = getattr(self, self._counter_name).clone()
            self._forward_base = {name: getattr(self, name).clone() for name in self._replicate_names()}
        try:
            yield
        finally:
            self._counter_offset = None
            self._forward_base = None

    def _replicate_names(self) -> Tuple[str, ...]:
        return tuple(n for n in self._defaults if n.startswith("bootstrap_") and n != self._counter_name)

    def _reduce_states(self, incoming_state: Dict[str, Any]) -> None:
        # torchmetrics' forward adds the accumulated states to the batch's; the replicates already hold both (see
        # _writable_states), so they are added to zeros: the same bits.
        if self._forward_base is not None:
            incoming_state = dict(incoming_state)
            for name in self._replicate_names():
                incoming_state[name] = torch.zeros_like(getattr(self, name))
        super()._reduce_states(incoming_state)

    def _check_bootstrap(self, level: Optional[float] = None) -> None:
        if level is not None:
            check_level(level)
        if not self.num_bootstrap:
            raise ValueError(
                f"{type(self).__name__} was created without bootstrap replicates (`num_bootstrap=0`): create it "
                f"with `num_bootstrap=1000` (and a `bootstrap_seed` to repeat the interval) to get an interval."
            )

    @eager_only
    def bootstrap_samples(self) -> Tensor:
        """The ``B`` bootstrap replicates of :meth:`compute` (synced across processes as ``compute`` is):
        ``(B,)``, or ``(B, C)`` where ``compute`` is per class (lwlrap with ``average="none"``). A replicate that
        drew no positive label (of a class, per class; for LRAP, no sample of non-zero weight) is NaN; with lwlrap's
        ``average="macro"`` a class it drew no positive of counts at its score on the whole set."""
        self._check_bootstrap()
        with _synced(self):
            return self._replicates()

    @eager_only
    def confidence_interval(self, level: float = 0.95) -> Tuple[Tensor, Tensor]:
        """``(low, high)``: the bootstrap percentile interval of :meth:`compute` at ``level``; per class where
        ``compute`` is (lwlrap with ``average="none"``): NaN for a class with fewer than two positive labels, whose
        replicates would all be one number.

        It describes the sampling variability of the evaluation set (another set drawn the same way would score
        within it ``level`` of the time), not the variability of training.
        """
        self._check_bootstrap(level)
        with _synced(self):
            replicates = self._replicates()
            class_counts = self._class_counts()
        if replicates.numel() and bool(torch.isnan(replicates).all()):
            warn(
                f"{type(self).__name__}.confidence_interval() is undefined, (nan, nan): no bootstrap replicate holds "
                f"a positive label (or a sample) yet. Call it after `update` has seen batches with positive labels, "
                f"as for `compute()`."
            )
        if class_counts is None:
            return _bootstrap.percentile_interval(replicates, level)
        return _class_interval(replicates, class_counts, level)

    def _class_counts(self) -> Optional[Tensor]:
        """Each class's positive labels where :meth:`compute` is per class (its interval then needs two), else
        None."""
        return None


class MultilabelLWLRAP(_Bootstrap, TaggedMetric):
    r"""Label-weighted label-ranking average precision (lwlrap), accumulated over batches.

    The state is two ``(C,)`` tensors, ``precision_sum`` (float64) and ``label_count`` (int64), summed across
    processes. See :func:`torch_lwlrap.multilabel_lwlrap` for the definition and the arguments.

    Args:
        num_labels: the number of classes ``C``.
        average: ``"weighted"`` (the challenge metric), ``"macro"`` or ``"none"`` (per-class scores).
        ties: ``"max"`` (scikit-learn's rule), ``"index"`` (lower column first among tied scores) or
            ``"expected"`` (the expectation over random orders of tied scores).
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check input values (one host-device sync per batch); with False, ``update`` never syncs.
        num_bootstrap: ``B > 0`` keeps ``B`` Poisson bootstrap replicates of the sums, ``(B, C)``
            ``bootstrap_precision_sum`` and ``bootstrap_label_count``, for :meth:`confidence_interval` and
            :meth:`bootstrap_samples`; the batch is still ranked once. 0 (the default): no replicates. The states
            take ``16 B C`` bytes, and torchmetrics keeps as much again for ``reset``.
        bootstrap_seed: seed of the replicates' weights (with the process rank and each sample's position in the
            stream); None derives one from torch's default generator without advancing it (seed torch to repeat).
        kwargs: passed to :class:`torchmetrics.Metric` (``compute_on_cpu``, ``sync_on_compute``, ...).

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelLWLRAP
        >>> metric = MultilabelLWLRAP(num_labels=3)
        >>> metric.update(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1]]))
        >>> metric.update(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[0, 1, 1]]))
        >>> metric.compute()
        tensor(0.7917, dtype=torch.float64)
        >>> per_class, weights = metric.per_class()
        >>> per_class
        tensor([0.6667, 1.0000, 0.7500], dtype=torch.float64)
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    plot_legend_name: str = "Class"

    precision_sum: Tensor
    label_count: Tensor

    _replicate_state = "bootstrap_precision_sum"

    def __init__(
        self,
        num_labels: int,
        *,
        average: Optional[str] = "weighted",
        ties: str = "max",
        ignore_index: Optional[int] = None,
        validate_args: bool = True,
        num_bootstrap: int = 0,
        bootstrap_seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.average = check_average(average)
        self.ties = check_ties(ties)
        self.ignore_index = check_ignore_index(ignore_index)
        self.validate_args = validate_args
        # average only changes compute(): the same sums serve every average.
        self._declare_options(
            choice_option("ties", self.ties, TIES),
            int_option("ignore_index", self.ignore_index),
            int_option("num_labels", self.num_labels),
            *self._bootstrap_options(num_bootstrap, bootstrap_seed, "bootstrap_lwlrap_samples"),
        )
        self.add_state("precision_sum", torch.zeros(num_labels, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("label_count", torch.zeros(num_labels, dtype=torch.int64), dist_reduce_fx="sum")
        self._add_bootstrap_counter()
        if self.num_bootstrap:
            shape = (self.num_bootstrap, num_labels)
            self.add_state("bootstrap_precision_sum", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("bootstrap_label_count", torch.zeros(shape, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch: ``preds`` floating scores and ``target`` 0/1 labels, both ``(N, C)`` or ``(N, C, ...)``.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLWLRAP
            >>> metric = MultilabelLWLRAP(num_labels=3)
            >>> metric.update(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1]]))
            >>> metric.label_count
            tensor([1, 0, 1])
            >>> metric.update(torch.tensor([[0.1, 0.7]]), torch.tensor([[1, 0]]))
            Traceback (most recent call last):
            ...
            ValueError: Expected 3 labels (`num_labels`) in dimension 1 of `preds`, but got shape (1, 2).
            (raised by MultilabelLWLRAP(ties='max', ignore_index=None, num_labels=3, num_bootstrap=0, bootstrap_seed=None))
            >>> metric.label_count
            tensor([1, 0, 1])
        """
        _check_device(self, preds)
        if self.num_bootstrap:
            # The replicates are added to the states in place, after the whole batch is checked.
            precision_sum, label_count = _lwlrap_bootstrap_update(
                preds, target, self.num_labels, self.ties, self.ignore_index, self.validate_args,
                *self._stream(), *self._writable_states("bootstrap_precision_sum", "bootstrap_label_count"),
            )
            self._count_samples(preds)
        else:
            precision_sum, label_count = _lwlrap_update(
                preds, target, self.num_labels, self.ties, self.ignore_index, self.validate_args
            )
        self._add_sums({"precision_sum": precision_sum, "label_count": label_count})

    def _replicates(self) -> Tensor:
        return _lwlrap_replicates(
            self.bootstrap_precision_sum, self.bootstrap_label_count, self.average, self.precision_sum, self.label_count
        )

    def _class_counts(self) -> Optional[Tensor]:
        return self.label_count if self.average == "none" else None

    def compute(self) -> Tensor:
        """lwlrap of all accumulated batches (float64; ``(C,)`` with ``average="none"``).

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLWLRAP
            >>> metric = MultilabelLWLRAP(num_labels=3, average="macro")
            >>> metric.update(torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1], [0, 1, 1]]))
            >>> metric.compute()  # (2/3 + 1 + 3/4) / 3
            tensor(0.8056, dtype=torch.float64)
        """
        return _lwlrap_compute(self.precision_sum, self.label_count, self.average)

    @eager_only
    def per_class(self) -> Tuple[Tensor, Tensor]:
        """``(per_class, weights)``: per-class lwlrap (NaN without positive) and each class's share of labels, over
        every process's batches (synced as :meth:`compute` is; before any update, NaN and 0 with compute's warning).

        Whatever ``average`` is; ``(per_class * weights).nansum()`` is the weighted (overall) lwlrap.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLWLRAP
            >>> metric = MultilabelLWLRAP(num_labels=4)
            >>> metric.update(torch.tensor([[0.1, 0.7, 0.2, 0.0], [0.1, 0.7, 0.2, 0.0]]),
            ...               torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0]]))
            >>> per_class, weights = metric.per_class()
            >>> per_class  # class 3 has no positive label
            tensor([0.6667, 1.0000, 0.7500,    nan], dtype=torch.float64)
            >>> weights
            tensor([0.2500, 0.2500, 0.5000, 0.0000], dtype=torch.float64)
            >>> (per_class * weights).nansum()
            tensor(0.7917, dtype=torch.float64)
        """
        if self._update_count == 0 and not _syncs_other_processes(self):  # else the other processes' sums count
            warn(
                f"The ``per_class`` method of metric {type(self).__name__} was called before the ``update`` method: "
                f"no class has a positive label yet (NaN per class)."
            )
        with _synced(self):
            return _lwlrap_per_class(self.precision_sum, self.label_count)

    def plot(
        self,
        val: Optional[Union[Tensor, Sequence[Tensor]]] = None,
        ax: Optional[Any] = None,
        class_names: Optional[Sequence[str]] = None,
    ) -> Tuple[Any, Any]:
        """Plot a value (default: :meth:`compute`) as torchmetrics does; per-class values as a bar chart.

        A scalar or a sequence of scalars is drawn like any torchmetrics metric. A per-class tensor
        (``average="none"``) is drawn as horizontal bars of per-class lwlrap labelled with the optional
        ``class_names`` and, for the default value, with the accumulated label weights (a ``val`` passed in, say one
        kept from before a ``reset()``, is drawn without them: the metric's state need not be the one behind it).
        Without ``ax``, more than 110 classes are split into side-by-side panels (as
        :func:`~torch_lwlrap.plot.plot_per_class` does). Needs matplotlib (``pip install matplotlib``, the ``plot``
        extra).

        Returns:
            ``(fig, ax)``; with several panels, ``ax`` is the list of their axes.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLWLRAP
            >>> metric = MultilabelLWLRAP(num_labels=3, average="none")
            >>> metric.update(torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1], [0, 1, 1]]))
            >>> fig, ax = metric.plot(class_names=["dog", "cat", "bird"])
        """
        weights = None
        passed = val is not None
        val = self.compute() if val is None else val
        # Per-class values: (C,), or 0-dim with one label (torchmetrics squeezes a one-element compute()).
        per_class = isinstance(val, Tensor) and val.numel() == self.num_labels and (
            val.ndim == 1 or (val.ndim == 0 and self.average == "none"))
        if per_class:
            weights = None if passed else self.per_class()[1]
            return plot_per_class(val.reshape(-1), weights, class_names=class_names, ax=ax, title=type(self).__name__)
        return self._plot(val, ax)


class MultilabelLRAP(_Bootstrap, TaggedMetric):
    r"""Label-ranking average precision (LRAP), accumulated over batches; equals scikit-learn's score.

    The state is two float64 scalars, ``lrap_sum`` (weighted sum of per-sample scores) and ``weight_sum``, summed
    across processes. See :func:`torch_lwlrap.multilabel_lrap` for the definition and the arguments, and
    :class:`MultilabelLWLRAP` for ``num_bootstrap`` and ``bootstrap_seed`` (replicates ``(B,)``
    ``bootstrap_lrap_sum`` and ``bootstrap_weight_sum``).

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelLRAP
        >>> metric = MultilabelLRAP(num_labels=3)
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1], [0.9, 0.7, 0.6]])
        >>> target = torch.tensor([[1, 0, 0], [1, 0, 1], [1, 1, 0]])
        >>> metric.update(preds[:2], target[:2])
        >>> metric.update(preds[2:], target[2:])
        >>> metric.compute()
        tensor(0.7778, dtype=torch.float64)
    """

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    lrap_sum: Tensor
    weight_sum: Tensor

    _replicate_state = "bootstrap_lrap_sum"

    def __init__(
        self,
        num_labels: int,
        *,
        ties: str = "max",
        ignore_index: Optional[int] = None,
        validate_args: bool = True,
        num_bootstrap: int = 0,
        bootstrap_seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.ties = check_ties(ties)
        self.ignore_index = check_ignore_index(ignore_index)
        self.validate_args = validate_args
        self._declare_options(
            choice_option("ties", self.ties, TIES),
            int_option("ignore_index", self.ignore_index),
            int_option("num_labels", self.num_labels),
            *self._bootstrap_options(num_bootstrap, bootstrap_seed, "bootstrap_lrap_samples"),
        )
        self.add_state("lrap_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight_sum", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self._add_bootstrap_counter()
        if self.num_bootstrap:
            shape = (self.num_bootstrap,)
            self.add_state("bootstrap_lrap_sum", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("bootstrap_weight_sum", torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, sample_weight: Optional[Tensor] = None) -> None:
        """Add a batch, optionally with non-negative per-sample weights ``(N,)``.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLRAP
            >>> metric = MultilabelLRAP(num_labels=3)
            >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
            >>> metric.update(preds, torch.tensor([[1, 0, 0], [0, 0, 1]]), sample_weight=torch.tensor([1.0, 3.0]))
            >>> metric.compute()  # (1 * 1/2 + 3 * 1/3) / 4
            tensor(0.3750, dtype=torch.float64)
        """
        _check_device(self, preds)
        if self.num_bootstrap:
            lrap_sum, weight_sum = _lrap_bootstrap_update(
                preds, target, self.num_labels, sample_weight, self.ties, self.ignore_index, self.validate_args,
                *self._stream(), *self._writable_states("bootstrap_lrap_sum", "bootstrap_weight_sum"),
            )
            self._count_samples(preds)
        else:
            lrap_sum, weight_sum = _lrap_update(
                preds, target, self.num_labels, sample_weight, self.ties, self.ignore_index, self.validate_args
            )
        self._add_sums({"lrap_sum": lrap_sum, "weight_sum": weight_sum})

    def _replicates(self) -> Tensor:
        return _lrap_replicates(self.bootstrap_lrap_sum, self.bootstrap_weight_sum)

    def compute(self) -> Tensor:
        """LRAP of all accumulated samples (float64 scalar); NaN with a warning when there are none.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLRAP
            >>> metric = MultilabelLRAP(num_labels=3)
            >>> metric.update(torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]]), torch.tensor([[1, 0, 1], [0, 0, 1]]))
            >>> metric.compute()  # per sample: (1/1 + 2/2) / 2 and 1/3
            tensor(0.6667, dtype=torch.float64)
        """
        return _lrap_compute(self.lrap_sum, self.weight_sum)

    def plot(self, val: Optional[Union[Tensor, Sequence[Tensor]]] = None, ax: Optional[Any] = None) -> Tuple[Any, Any]:
        """Plot a value or a sequence of values (default: :meth:`compute`) as torchmetrics does.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelLRAP
            >>> metric = MultilabelLRAP(num_labels=3)
            >>> values = [metric(torch.rand(8, 3), torch.randint(2, (8, 3))) for _ in range(5)]
            >>> fig, ax = metric.plot(values)
        """
        return self._plot(val, ax)


class MultilabelTieReport(TaggedMetric):
    r"""The tie report of :func:`torch_lwlrap.tie_report`, accumulated over batches: how much tied scores can move
    lwlrap.

    The state is sums only, summed across processes: ``label_count`` and ``tied_label_count`` (int64 scalars) and
    ``precision_sum`` (float64, one sum of precisions per rule: ``"max"``, ``"expected"``, and the best and worst
    orders of tied scores). Each batch is ranked once for all of them.

    :meth:`compute` gives float64 scalars to log (``self.log_dict(metric.compute())``): ``tied_share``, the share of
    positive labels whose score equals another label's in their sample, and lwlrap under ``"max"``, under
    ``"expected"`` and in the best and worst orders. :meth:`report` gives the :class:`~torch_lwlrap.TieReport`.

    Args:
        num_labels: the number of classes ``C``.
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check input values (one host-device sync per batch); with False, ``update`` never syncs.
        kwargs: passed to :class:`torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelTieReport
        >>> metric = MultilabelTieReport(num_labels=4)
        >>> metric.update(torch.tensor([[1.0, 1.0, 1.0, 0.2]]), torch.tensor([[1, 0, 1, 0]]))
        >>> metric.update(torch.tensor([[0.9, 0.1, 0.4, 0.3]]), torch.tensor([[0, 0, 1, 0]]))
        >>> values = metric.compute()  # 2 of 3 positives tied with a negative at 1.0
        >>> round(values["tied_share"].item(), 4), round(values["lwlrap_max"].item(), 4)  # (2/3 + 2/3 + 1/2) / 3
        (0.6667, 0.6111)
        >>> round(values["lwlrap_worst"].item(), 4), round(values["lwlrap_best"].item(), 4)  # 1/2 + 2/3, or 1 + 1
        (0.5556, 0.8333)
        >>> round(values["lwlrap_expected"].item(), 4)  # 29/36 for each tied positive
        0.7037
        >>> metric.report().tied_label_count
        2
    """

    is_differentiable: bool = False
    higher_is_better: Optional[bool] = None
    full_state_update: bool = False

    label_count: Tensor
    tied_label_count: Tensor
    precision_sum: Tensor

    def __init__(
        self, num_labels: int, *, ignore_index: Optional[int] = None, validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.ignore_index = check_ignore_index(ignore_index)
        self.validate_args = validate_args
        self._declare_options(int_option("ignore_index", self.ignore_index), int_option("num_labels", self.num_labels))
        self.add_state("label_count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("tied_label_count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("precision_sum", torch.zeros(len(TIE_SUM_RULES), dtype=torch.float64), dist_reduce_fx="sum")

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        # Earlier tags held a tie rule here too, which the report (every rule at once) does not compare.
        out = legacy_tag(saved, TIES)
        if out is not None:
            del out["ties"]
        return out

    def update(self, preds: Tensor, target: Tensor) -> None:
        """Add a batch: ``preds`` floating scores and ``target`` 0/1 labels, both ``(N, C)`` or ``(N, C, ...)``.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.
        """
        _check_device(self, preds)
        sums = tie_sums_update(preds, target, self.num_labels, self.ignore_index, self.validate_args)
        self._add_sums(sums._asdict())

    def compute(self) -> Dict[str, Tensor]:
        """``tied_share`` and lwlrap under ``"max"``, ``"expected"``, the best and the worst order of tied scores,
        as float64 scalars on the metric's device (NaN without positive label; no host-device sync)."""
        count = self.label_count.to(torch.float64)
        values = {"tied_share": self.tied_label_count / count}
        for rule, total in zip(TIE_SUM_RULES, self.precision_sum.unbind()):
            values[f"lwlrap_{rule}"] = total / count
        return values

    def plot(self, val: Optional[Any] = None, ax: Optional[Any] = None) -> Tuple[Any, Any]:
        """Plot what :meth:`compute` returns (the default ``val``): a bar per value, with lwlrap's range over tie
        orders (worst to best) shaded; a sequence of such dicts (several steps) as torchmetrics plots it. Needs
        matplotlib (``pip install matplotlib``, the ``plot`` extra).

        Returns:
            ``(fig, ax)``.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelTieReport
            >>> metric = MultilabelTieReport(num_labels=4)
            >>> metric.update(torch.tensor([[1.0, 1.0, 1.0, 0.2]]), torch.tensor([[1, 0, 1, 0]]))
            >>> fig, ax = metric.plot()
        """
        if val is None:
            val = self.compute()
        if isinstance(val, dict):
            return plot_values(
                val, ax=ax, title=type(self).__name__, span=("lwlrap_worst", "lwlrap_best"),
                span_label="lwlrap over tie orders, worst to best", span_rows=[n for n in val if n != "tied_share"],
            )
        return self._plot(val, ax)

    @eager_only
    def report(self) -> TieReport:
        """The :class:`~torch_lwlrap.TieReport` of all accumulated batches (synced across processes as
        :meth:`compute` is; reads the values on the host)."""
        with _synced(self):
            return TieReport.from_sums(TieSums(self.label_count, self.tied_label_count, self.precision_sum))
