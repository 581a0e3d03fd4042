"""The public functions: each scores a batch (or two systems, or two rankings) in one call, through the one input
gate (:mod:`torch_lwlrap._checks`) and the one ranking engine.

* lwlrap and LRAP (:mod:`._lwlrap`), with their bootstrap intervals and paired comparisons (:mod:`._intervals`);
* the tie report (:mod:`._tie_report`);
* the ranking family beside them: coverage error, ranking loss, one-error, the retrieval metrics at k
  (:mod:`._ranking_family`), graded NDCG, the rank correlations and the Kendall distance at k (:mod:`._ltr`).
"""

from torch_lwlrap.functional._intervals import (
    Comparison,
    Interval,
    compare_lwlrap,
    multilabel_lrap_ci,
    multilabel_lwlrap_ci,
)
from torch_lwlrap.functional._ltr import multilabel_kendall_distance_at_k, multilabel_ndcg, multilabel_rank_correlation
from torch_lwlrap.functional._lwlrap import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class
from torch_lwlrap.functional._ranking_family import (
    multilabel_coverage_error,
    multilabel_one_error,
    multilabel_ranking_loss,
    multilabel_retrieval_at_k,
)
from torch_lwlrap.functional._tie_report import TieReport, tie_report

__all__ = [
    "Comparison",
    "Interval",
    "TieReport",
    "compare_lwlrap",
    "multilabel_coverage_error",
    "multilabel_kendall_distance_at_k",
    "multilabel_lrap",
    "multilabel_lrap_ci",
    "multilabel_lwlrap",
    "multilabel_lwlrap_ci",
    "multilabel_lwlrap_per_class",
    "multilabel_ndcg",
    "multilabel_one_error",
    "multilabel_rank_correlation",
    "multilabel_ranking_loss",
    "multilabel_retrieval_at_k",
    "tie_report",
]
