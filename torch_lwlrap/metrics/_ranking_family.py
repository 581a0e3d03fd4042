"""``torchmetrics.Metric`` classes of the ranking metrics beside lwlrap, and a collection that computes any of them
(lwlrap and LRAP included) from one ranking pass per batch.

Thin wrappers over :mod:`torch_lwlrap.functional._ranking_family`: every state is a float64 sum (int64 for label counts)
with ``dist_reduce_fx="sum"``, named after its metric so that a ``MetricCollection`` never merges two metrics.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from torch_lwlrap._user_frames import warn
from torch_lwlrap._checks import check_empty_target, check_ignore_index, check_num_labels
from torch_lwlrap._options import check_names
from torch_lwlrap._rank_reductions import (
    RANK_TIES,
    RANKING_METRICS,
    RETRIEVAL_METRICS,
    RankingSpec,
    check_ks,
    check_rank_ties,
    check_retrieval_metrics,
    finish,
    state_shapes,
)
from torch_lwlrap.metrics._base import TaggedMetric
from torch_lwlrap.metrics._calls import _check_device
from torch_lwlrap.metrics._tags import choice_option, int_option, ints_option, legacy_tag, names_option
from torch_lwlrap.plot import plot_values
from torch_lwlrap.functional._ranking_family import _ranking_update

__all__ = [
    "MultilabelCoverageError",
    "MultilabelRankingLoss",
    "MultilabelOneError",
    "MultilabelRetrievalAtK",
    "MultilabelRankingMetrics",
]


class _RankingMetric(TaggedMetric):
    """Accumulates the sums of a :class:`~torch_lwlrap._rank_reductions.RankingSpec`."""

    is_differentiable: bool = False
    full_state_update: bool = False

    # Earlier versions kept k and the chosen metrics in states of their own.
    _legacy_state_names = ("retrieval_k", "ranking_metrics_tag")

    def _setup(
        self,
        num_labels: int,
        spec: RankingSpec,
        ignore_index: Optional[int],
        validate_args: bool,
        empty_target: str = "zero",
    ) -> None:
        self.num_labels = check_num_labels(num_labels)
        self.ties = check_rank_ties(spec.ties)
        self.ignore_index = check_ignore_index(ignore_index)
        self.validate_args = validate_args
        self.empty_target = check_empty_target(empty_target)
        self._spec = spec
        self._sum_names = tuple(state_shapes(spec, num_labels))
        # empty_target only changes compute(): the same sums serve both.
        self._declare_options(
            choice_option("ties", self.ties, RANK_TIES),
            int_option("ignore_index", self.ignore_index),
            int_option("num_labels", self.num_labels),
            *self._spec_options(spec),
        )
        for name, (shape, dtype) in state_shapes(spec, num_labels).items():
            self.add_state(name, torch.zeros(shape, dtype=dtype), dist_reduce_fx="sum")

    def _spec_options(self, spec: RankingSpec):
        """The options of ``spec`` beside its tie rule (each class has its own)."""
        return ()

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        out = legacy_tag(saved, RANK_TIES)
        if out is None:
            return None
        lwlrap = saved("lwlrap_precision_sum")
        if isinstance(lwlrap, Tensor) and lwlrap.ndim == 1:
            out["num_labels"] = lwlrap.shape[0]
        return out

    def update(self, preds: Tensor, target: Tensor, sample_weight: Optional[Tensor] = None) -> None:
        """Add a batch, optionally with non-negative per-sample weights ``(N,)``.

        A rejected batch raises before anything changes: the state keeps the batches accumulated before it.
        """
        _check_device(self, preds)
        sums = _ranking_update(
            preds, target, self.num_labels, sample_weight, self._spec, self.ignore_index, self.validate_args
        )
        self._add_sums(sums)

    def plot(self, val: Optional[Any] = None, ax: Optional[Any] = None) -> Tuple[Any, Any]:
        """Plot what :meth:`compute` returns (the default ``val``): a dict of values as one bar per metric, each
        labelled with its value; a scalar, or a sequence of values from several steps (scalars or dicts), as
        torchmetrics plots them. Needs matplotlib (``pip install matplotlib``, the ``plot`` extra).

        Returns:
            ``(fig, ax)``.

        Example:
            >>> import torch
            >>> from torch_lwlrap import MultilabelRankingMetrics
            >>> metric = MultilabelRankingMetrics(num_labels=3, k=1)
            >>> metric.update(torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1], [0, 1, 1]]))
            >>> fig, ax = metric.plot()
        """
        if val is None:
            val = self.compute()
        if isinstance(val, dict):
            return plot_values(val, ax=ax, title=type(self).__name__)
        return self._plot(val, ax)

    def _scores(self) -> Dict[str, Tensor]:
        return finish(self._spec, {name: getattr(self, name) for name in self._sum_names}, self.empty_target)


class _ScalarRankingMetric(_RankingMetric):
    _name: str = ""

    def __init__(
        self,
        num_labels: int,
        *,
        ties: str = "max",
        ignore_index: Optional[int] = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._setup(num_labels, RankingSpec((self._name,), check_rank_ties(ties)), ignore_index, validate_args)

    def compute(self) -> Tensor:
        """The (weighted) mean over all accumulated samples, float64; NaN without samples."""
        return self._scores()[self._name]


def _legacy_retrieval(saved: Callable[[str], Any], name: str) -> Dict[str, Any]:
    """k and the retrieval metrics of an earlier version's checkpoint: a ``retrieval_k`` state and a sum per
    metric."""
    out: Dict[str, Any] = {name: tuple(m for m in RETRIEVAL_METRICS if saved(f"retrieval_{m}_sum") is not None)}
    ks = saved("retrieval_k")
    if isinstance(ks, Tensor) and ks.ndim == 1:
        out["k"] = tuple(ks.tolist())
    return out


class MultilabelCoverageError(_ScalarRankingMetric):
    r"""Coverage error (scikit-learn's ``coverage_error``), accumulated over batches.

    States ``coverage_error_sum`` and ``coverage_error_weight`` (float64 scalars). See
    :func:`torch_lwlrap.multilabel_coverage_error` for the definition and the arguments.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelCoverageError
        >>> metric = MultilabelCoverageError(num_labels=3)
        >>> metric.update(torch.tensor([[0.75, 0.5, 1.0]]), torch.tensor([[1, 0, 0]]))
        >>> metric.update(torch.tensor([[1.0, 0.2, 0.1]]), torch.tensor([[0, 0, 1]]))
        >>> metric.compute()
        tensor(2.5000, dtype=torch.float64)
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    _name = "coverage_error"


class MultilabelRankingLoss(_ScalarRankingMetric):
    r"""Label ranking loss (scikit-learn's ``label_ranking_loss``), accumulated over batches.

    States ``ranking_loss_sum`` and ``ranking_loss_weight`` (float64 scalars). See
    :func:`torch_lwlrap.multilabel_ranking_loss` for the definition and the arguments.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelRankingLoss
        >>> metric = MultilabelRankingLoss(num_labels=3)
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
        >>> metric.update(preds, torch.tensor([[1, 0, 0], [0, 0, 1]]), sample_weight=torch.tensor([1.0, 3.0]))
        >>> metric.compute()  # (1 * 1/2 + 3 * 1) / 4
        tensor(0.8750, dtype=torch.float64)
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    _name = "ranking_loss"


class MultilabelOneError(_ScalarRankingMetric):
    r"""One-error (share of samples whose top-ranked label is not positive), accumulated over batches.

    States ``one_error_sum`` and ``one_error_weight`` (float64 scalars). See
    :func:`torch_lwlrap.multilabel_one_error` for the definition, the tie rule and the arguments.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelOneError
        >>> metric = MultilabelOneError(num_labels=3)
        >>> metric.update(torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]]), torch.tensor([[0, 0, 1], [0, 0, 1]]))
        >>> metric.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    higher_is_better: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0
    _name = "one_error"


class MultilabelRetrievalAtK(_RankingMetric):
    r"""Label-retrieval metrics at one or several ``k`` (hit, precision, recall, AP, RR, NDCG), accumulated.

    States ``retrieval_<metric>_sum`` (float64, one entry per ``k``), ``retrieval_weight`` and
    ``retrieval_query_weight`` (the weight of samples with a positive). :meth:`compute` returns
    ``{"<metric>@<k>": float64 scalar}``, ready for ``self.log_dict``. See
    :func:`torch_lwlrap.multilabel_retrieval_at_k` for the definitions and the arguments.

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelRetrievalAtK
        >>> metric = MultilabelRetrievalAtK(num_labels=4, k=(1, 3), metrics=("hit", "recall"))
        >>> metric.update(torch.tensor([[0.9, 0.8, 0.7, 0.1]]), torch.tensor([[0, 1, 0, 1]]))
        >>> {name: value.item() for name, value in metric.compute().items()}
        {'hit@1': 0.0, 'hit@3': 1.0, 'recall@1': 0.0, 'recall@3': 0.5}
    """

    higher_is_better: bool = True
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    def _spec_options(self, spec: RankingSpec):
        return ints_option("k", spec.ks), names_option("metrics", spec.retrieval, RETRIEVAL_METRICS)

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        out = super()._legacy_options(saved)
        if out is not None:
            out.update(_legacy_retrieval(saved, "metrics"))
        return out

    def __init__(
        self,
        num_labels: int,
        k: Union[int, Sequence[int]],
        *,
        metrics: Sequence[str] = RETRIEVAL_METRICS,
        empty_target: str = "zero",
        ties: str = "max",
        ignore_index: Optional[int] = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        spec = RankingSpec(("retrieval",), check_rank_ties(ties), check_ks(k), check_retrieval_metrics(metrics))
        self._setup(num_labels, spec, ignore_index, validate_args, empty_target)

    def compute(self) -> Dict[str, Tensor]:
        """``{"<metric>@<k>": value}`` over all accumulated samples; NaN where no sample counts."""
        return self._scores()


#: The cut-offs ``MultilabelRankingMetrics`` computes the retrieval metrics at by default.
_DEFAULT_KS = (1, 5, 10)


class MultilabelRankingMetrics(_RankingMetric):
    r"""Any of lwlrap, LRAP, coverage error, ranking loss, one-error and the retrieval metrics at k, from one
    ranking pass per batch.

    Computing several of these with separate metric objects ranks every batch once per object; this one ranks it
    once and reduces the same per-positive counts into each metric's sums (the states of each metric, as in its
    own class, ``lwlrap_precision_sum``/``lwlrap_label_count`` and ``lrap_score_sum``/``lrap_weight`` for
    lwlrap and LRAP). :meth:`compute` returns a flat dict of float64 scalars: ``"lwlrap"``, ``"lrap"``,
    ``"coverage_error"``, ``"ranking_loss"``, ``"one_error"`` and ``"<metric>@<k>"``.

    Args:
        num_labels: the number of classes ``C``.
        metrics: a subset of ``("coverage_error", "ranking_loss", "one_error", "retrieval", "lwlrap", "lrap")``.
        k: the cut-offs of the retrieval metrics (with ``"retrieval"``).
        retrieval_metrics: a subset of ``("hit", "precision", "recall", "ap", "rr", "ndcg")``.
        empty_target: ``"zero"`` or ``"skip"``: retrieval metrics of samples without a positive.
        ties: ``"max"``, ``"index"`` or ``"expected"``, for every metric.
        ignore_index: target value marking unknown labels, removed from their sample's ranking.
        validate_args: check input values (one host-device sync per batch); with False, no value check.
        kwargs: passed to :class:`torchmetrics.Metric`.

    ``update(preds, target, sample_weight=None)``: the weights apply to every metric but lwlrap, which weighs
    each positive label equally (use LRAP with ``sample_weight=target.sum(1)`` for a weighted lwlrap).

    Example:
        >>> import torch
        >>> from torch_lwlrap import MultilabelRankingMetrics
        >>> metric = MultilabelRankingMetrics(num_labels=3, k=1, retrieval_metrics=("precision",))
        >>> metric.update(torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1], [0, 1, 1]]))
        >>> for name, value in metric.compute().items():
        ...     print(name, round(value.item(), 4))
        coverage_error 2.5
        ranking_loss 0.5
        one_error 0.5
        precision@1 0.5
        lwlrap 0.7917
        lrap 0.7917
    """

    higher_is_better: Optional[bool] = None

    def __init__(
        self,
        num_labels: int,
        *,
        metrics: Sequence[str] = RANKING_METRICS,
        k: Union[int, Sequence[int]] = _DEFAULT_KS,
        retrieval_metrics: Sequence[str] = RETRIEVAL_METRICS,
        empty_target: str = "zero",
        ties: str = "max",
        ignore_index: Optional[int] = None,
        validate_args: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        names = check_names("metrics", metrics, RANKING_METRICS)
        retrieval = "retrieval" in names
        ks, chosen = check_ks(k), check_retrieval_metrics(retrieval_metrics, "retrieval_metrics")
        ignored = [f"k={k!r}"] if ks != _DEFAULT_KS else []
        ignored += [f"retrieval_metrics={retrieval_metrics!r}"] if chosen != RETRIEVAL_METRICS else []
        ignored += [f"empty_target={empty_target!r}"] if check_empty_target(empty_target) != "zero" else []
        if ignored and not retrieval:
            warn(
                f"MultilabelRankingMetrics: {' and '.join(ignored)} apply to the 'retrieval' metrics, which `metrics` "
                f"does not include ({', '.join(names)}): ignored; add 'retrieval' to `metrics` to compute them."
            )
        spec = RankingSpec(names, check_rank_ties(ties), ks if retrieval else (), chosen if retrieval else ())
        self._setup(num_labels, spec, ignore_index, validate_args, empty_target)

    def _spec_options(self, spec: RankingSpec):
        return (
            names_option("metrics", spec.metrics, RANKING_METRICS),
            ints_option("k", spec.ks),
            names_option("retrieval_metrics", spec.retrieval, RETRIEVAL_METRICS),
        )

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        out = super()._legacy_options(saved)
        chosen = saved("ranking_metrics_tag")
        if out is not None and isinstance(chosen, Tensor) and chosen.shape == (len(RANKING_METRICS),):
            out["metrics"] = tuple(name for name, on in zip(RANKING_METRICS, chosen.tolist()) if on)
            if "retrieval" in out["metrics"]:
                out.update(_legacy_retrieval(saved, "retrieval_metrics"))
            else:
                out.update(k=(), retrieval_metrics=())
        return out

    def compute(self) -> Dict[str, Tensor]:
        """``{name: value}`` for every chosen metric over all accumulated samples; NaN where undefined."""
        return self._scores()
