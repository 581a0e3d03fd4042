"""The ``torchmetrics.Metric`` classes: thin classes over one base (:mod:`._base`: the sum states, the options tag,
the checked ``forward`` and the checkpoint check) that accumulate what the functions of
:mod:`torch_lwlrap.functional` compute.
"""

from torch_lwlrap.metrics._ltr import MultilabelKendallDistanceAtK, MultilabelNDCG, MultilabelRankCorrelation
from torch_lwlrap.metrics._lwlrap import MultilabelLRAP, MultilabelLWLRAP, MultilabelTieReport
from torch_lwlrap.metrics._ranking_family import (
    MultilabelCoverageError,
    MultilabelOneError,
    MultilabelRankingLoss,
    MultilabelRankingMetrics,
    MultilabelRetrievalAtK,
)

__all__ = [
    "MultilabelCoverageError",
    "MultilabelKendallDistanceAtK",
    "MultilabelLRAP",
    "MultilabelLWLRAP",
    "MultilabelNDCG",
    "MultilabelOneError",
    "MultilabelRankCorrelation",
    "MultilabelRankingLoss",
    "MultilabelRankingMetrics",
    "MultilabelRetrievalAtK",
    "MultilabelTieReport",
]
