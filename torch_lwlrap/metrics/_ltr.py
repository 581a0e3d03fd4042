"""``torchmetrics.Metric`` classes of the learning-to-rank metrics of :mod:`torch_lwlrap.functional._ltr`: NDCG with
graded relevance, the rank correlation of two rankings and their Kendall distance at k.

Thin wrappers over the functional module's ``_*_update`` sums: every state is a float64 sum (int64 for sample
counts) with ``dist_reduce_fx="sum"``, named after its metric, after the constant ``options_tag``
(:class:`torch_lwlrap.metrics._base.TaggedMetric`).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap._engine_config import eager_only
from torch_lwlrap._checks import (
    check_empty_target,
    check_gain,
    check_graded,
    check_graded_ignore_index,
    check_k,
    check_method,
    check_num_labels,
    check_pair,
    check_ties,
)
from torch_lwlrap.metrics._base import TaggedMetric, _synced
from torch_lwlrap.metrics._calls import _check_device, _first_argument
from torch_lwlrap.metrics._tags import choice_option, int_option
from torch_lwlrap._options import CORRELATIONS, GAINS, TIES
from torch_lwlrap.functional._ltr import (
    _correlation_update,
    _distance_update,
    _ndcg_compute,
    _ndcg_update,
    _ratio,
)

__all__ = ["MultilabelNDCG", "MultilabelRankCorrelation", "MultilabelKendallDistanceAtK"]


class _SumMetric(TaggedMetric):
    """Accumulates the sums of a ``_*_update`` function; ``_float_sums`` name the float64 ones."""

    is_differentiable: bool = False
    full_state_update: bool = False
    _float_sums: Tuple[str, ...] = ()
    _int_sums: Tuple[str, ...] = ()

    def _add_states(self) -> None:
        for name in self._float_sums:
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        for name in self._int_sums:
            self.add_state(name, torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def _sums(self, *args: Any) -> Dict[str, Tensor]:
        raise NotImplementedError

    def _check_batch(self, *args: Any) -> None:
        raise NotImplementedError

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add a batch. A rejected batch raises before anything changes: the state keeps the batches accumulated
        before it."""
        name, first = _first_argument(self, args, kwargs)
        _check_device(self, first, name)
        self._add_sums(self._sums(*args, **kwargs))

    def plot(self, val: Optional[Any] = None, ax: Optional[Any] = None) -> Tuple[Any, Any]:
        """Plot a value (default: :meth:`compute`'s) or a sequence of values from several steps, as torchmetrics
        plots them. Needs matplotlib (``pip install matplotlib``, the ``plot`` extra).

        Returns:
            ``(fig, ax)``.
        """
        return self._plot(val, ax)


class MultilabelNDCG(_SumMetric):
    r"""NDCG at ``k`` with graded relevance, accumulated over batches.

    States ``ndcg_sum``, ``ndcg_weight`` and ``ndcg_query_weight`` (float64 scalars: the weighted sum of the
    per-sample NDCG, the total weight and the weight of samples whose ideal DCG is above 0). ``empty_target`` only
    changes :meth:`compute`. See :func:`torch_lwlrap.multilabel_ndcg` for the definition and the arguments;
    ``update(preds, relevance, sample_weight=None)``.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelNDCG
        >>> metric = MultilabelNDCG(num_labels=4, k=2)
        >>> metric.update(torch.tensor([[0.9, 0.8, 0.1, 0.4]]), torch.tensor([[0, 3, 1, 2]]))
        >>> metric.update(torch.tensor([[0.1, 0.8, 0.3, 0.4]]), torch.tensor([[0, 3, 1, 2]]))
        >>> metric.compute()  # (0.4966 + 1) / 2
        tensor(0.7483, dtype=torch.float64)
    """

    higher_is_better: bool = True
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    _float_sums = ("ndcg_sum", "ndcg_weight", "ndcg_query_weight")

    def __init__(
        self,
        num_labels: int,
        k: Optional[int] = None,
        *,
        gain: str = "exponential",
        ties: str = "max",
        ignore_index: Optional[int] = None,
        empty_target: str = "zero",
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.k = check_k(k, allow_none=True)
        self.gain = check_gain(gain)
        self.ties = check_ties(ties)
        self.ignore_index = check_graded_ignore_index(ignore_index)
        self.empty_target = check_empty_target(empty_target)
        self.validate_args = validate_args
        self._declare_options(
            choice_option("ties", self.ties, TIES),
            int_option("ignore_index", self.ignore_index),
            int_option("num_labels", self.num_labels),
            int_option("k", self.k),
            choice_option("gain", self.gain, GAINS),
        )
        self._add_states()

    def _sums(self, preds: Tensor, relevance: Tensor, sample_weight: Optional[Tensor] = None) -> Dict[str, Tensor]:
        return _ndcg_update(
            preds, relevance, self.num_labels, self.k, self.gain, self.ties, self.ignore_index, self.validate_args,
            sample_weight,
        )

    def _check_batch(self, preds: Tensor, relevance: Tensor, sample_weight: Optional[Tensor] = None) -> None:
        check_graded(preds, relevance, self.num_labels, self.ignore_index, self.gain, self.validate_args,
                     sample_weight)

    def update(self, preds: Tensor, relevance: Tensor, sample_weight: Optional[Tensor] = None) -> None:
        """Add a batch of scores and relevance grades, optionally with non-negative per-sample weights ``(N,)``.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.
        """
        super().update(preds, relevance, sample_weight)

    def compute(self) -> Tensor:
        """The (weighted) mean NDCG over all accumulated samples, float64; NaN when no sample counts."""
        return _ndcg_compute({name: getattr(self, name) for name in self._float_sums}, self.empty_target)


class MultilabelRankCorrelation(_SumMetric):
    r"""The per-sample rank correlation of two rankings (Spearman's rho or Kendall's tau-b), averaged over the
    accumulated samples.

    States ``rank_correlation_sum`` (float64), ``rank_correlation_count`` and ``rank_correlation_constant_count``
    (int64 scalars: the samples with a correlation, and those left out because a row is constant). :meth:`compute`
    is the mean over the first; :meth:`constant_rows` returns the second, over every process. See
    :func:`torch_lwlrap.multilabel_rank_correlation` for the definitions; ``update(preds, reference)``.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelRankCorrelation
        >>> metric = MultilabelRankCorrelation(num_labels=4, method="kendall")
        >>> metric.update(torch.tensor([[2.0, 1.0, 0.5, -1.0]]), torch.tensor([[3.0, 0.5, 1.0, -2.0]]))
        >>> metric.update(torch.tensor([[1.0, 1.0, 1.0, 1.0]]), torch.tensor([[3.0, 0.5, 1.0, -2.0]]))
        >>> metric.compute(), metric.constant_rows()  # the constant row is left out, and counted
        (tensor(0.6667, dtype=torch.float64), tensor(1))
    """

    higher_is_better: bool = True
    plot_lower_bound: float = -1.0
    plot_upper_bound: float = 1.0
    _float_sums = ("rank_correlation_sum",)
    _int_sums = ("rank_correlation_count", "rank_correlation_constant_count")

    def __init__(
        self, num_labels: int, *, method: str = "spearman", validate_args: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.method = check_method(method)
        self.validate_args = validate_args
        self._declare_options(
            int_option("num_labels", self.num_labels), choice_option("method", self.method, CORRELATIONS)
        )
        self._add_states()

    def _sums(self, preds: Tensor, reference: Tensor) -> Dict[str, Tensor]:
        return _correlation_update(preds, reference, self.num_labels, self.method, self.validate_args)

    def _check_batch(self, preds: Tensor, reference: Tensor) -> None:
        check_pair(preds, reference, self.num_labels, self.validate_args, ("preds", "reference"))

    def update(self, preds: Tensor, reference: Tensor) -> None:
        """Add a batch of scores and the reference scores they are compared with.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.
        """
        super().update(preds, reference)

    def compute(self) -> Tensor:
        """The mean correlation over the accumulated samples that have one, float64; NaN if none has."""
        return _ratio(self.rank_correlation_sum, self.rank_correlation_count)

    @eager_only
    def constant_rows(self) -> Tensor:
        """int64: the accumulated samples left out of the mean because a row is constant, over every process (synced
        as :meth:`compute` syncs)."""
        with _synced(self):
            return self.rank_correlation_constant_count.clone()


class MultilabelKendallDistanceAtK(_SumMetric):
    r"""The normalized Kendall distance at ``k`` between two rankings of each sample's labels, averaged over the
    accumulated samples.

    States ``kendall_distance_sum`` (float64) and ``kendall_distance_count`` (int64 scalar: the samples). See
    :func:`torch_lwlrap.multilabel_kendall_distance_at_k` for the definition; ``update(preds_a, preds_b)``.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelKendallDistanceAtK
        >>> metric = MultilabelKendallDistanceAtK(num_labels=5, k=3)
        >>> student = torch.tensor([[0.9, 0.8, 0.1, 0.4, 0.0]])
        >>> metric.update(student, torch.tensor([[0.8, 0.9, 0.3, 0.2, 0.1]]))
        >>> metric.update(student, student)
        >>> metric.compute()  # (2/6 + 0) / 2
        tensor(0.1667, dtype=torch.float64)
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    _float_sums = ("kendall_distance_sum",)
    _int_sums = ("kendall_distance_count",)

    def __init__(self, num_labels: int, k: int, *, validate_args: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_labels = check_num_labels(num_labels)
        self.k = check_k(k)
        self.validate_args = validate_args
        self._declare_options(int_option("num_labels", self.num_labels), int_option("k", self.k))
        self._add_states()

    def _sums(self, preds_a: Tensor, preds_b: Tensor) -> Dict[str, Tensor]:
        return _distance_update(preds_a, preds_b, self.num_labels, self.k, self.validate_args)

    def _check_batch(self, preds_a: Tensor, preds_b: Tensor) -> None:
        check_pair(preds_a, preds_b, self.num_labels, self.validate_args)

    def update(self, preds_a: Tensor, preds_b: Tensor) -> None:
        """Add a batch of two models' scores.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.
        """
        super().update(preds_a, preds_b)

    def compute(self) -> Tensor:
        """The mean distance over the accumulated samples, float64; NaN without samples."""
        return _ratio(self.kendall_distance_sum, self.kendall_distance_count)
