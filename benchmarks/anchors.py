"""Reference implementations timed next to torch_lwlrap, and the hardware floors.

* :func:`sklearn_lwlrap`: scikit-learn's ``label_ranking_average_precision_score`` weighted by the number of positive
  labels of each sample, which equals the overall (label-weighted) lwlrap.
* :func:`challenge_lwlrap`: the per-sample algorithm of the DCASE 2019 task 2 reference, written in numpy from its
  description: sort each row's scores, count hits cumulatively, precision at each hit is the hits so far over the
  rank, then accumulate per class. Its ``argsort`` gives a strict order, so it matches torch_lwlrap's
  ``ties="index"`` only on data without tied scores.
* :func:`torchmetrics_lrap`: torchmetrics' ``multilabel_ranking_average_precision`` (LRAP, a loop over samples), to
  be compared with :func:`torch_lwlrap.multilabel_lrap`.
* :func:`read_inputs` and :func:`copy_bandwidth`: the floors. On CPU the floor is one read of the inputs; on CUDA it
  is the input bytes over the device-copy bandwidth.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["sklearn_lwlrap", "challenge_lwlrap", "torchmetrics_lrap", "read_inputs", "copy_bandwidth"]


def sklearn_lwlrap(preds: np.ndarray, target: np.ndarray) -> float:
    """Overall lwlrap through scikit-learn: LRAP with each sample weighted by its number of positive labels.

    Args:
        preds: ``(N, C)`` scores.
        target: ``(N, C)`` 0/1 labels.

    Example:
        >>> import numpy as np
        >>> preds = np.array([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
        >>> target = np.array([[1, 0, 1], [0, 1, 1]])
        >>> round(sklearn_lwlrap(preds, target), 4)
        0.7917
    """
    from sklearn.metrics import label_ranking_average_precision_score

    target = np.asarray(target)
    weight = target.sum(axis=1)
    return float(label_ranking_average_precision_score(target, preds, sample_weight=weight))


def challenge_lwlrap(preds: np.ndarray, target: np.ndarray) -> float:
    """Overall lwlrap by the challenge's per-sample algorithm (strict order: ties broken by ``argsort``).

    For each sample: order the classes by decreasing score, count the positive labels met so far along that order,
    and give each positive label the precision ``hits so far / rank``. Precisions are summed per class; the overall
    lwlrap is the sum of all precisions over the number of positive labels.

    Args:
        preds: ``(N, C)`` scores.
        target: ``(N, C)`` 0/1 labels.

    Example:
        >>> import numpy as np
        >>> preds = np.array([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
        >>> target = np.array([[1, 0, 1], [0, 1, 1]])
        >>> round(challenge_lwlrap(preds, target), 4)
        0.7917
    """
    scores = np.asarray(preds)
    truth = np.asarray(target).astype(bool)
    num_classes = scores.shape[1]
    precision_sum = np.zeros(num_classes)
    label_count = np.zeros(num_classes, dtype=np.int64)
    positions = np.arange(num_classes)
    for row_scores, row_truth in zip(scores, truth):
        positives = np.flatnonzero(row_truth)
        if positives.size == 0:
            continue
        retrieved = np.argsort(row_scores)[::-1]  # classes from the highest score to the lowest
        rank_of_class = np.empty(num_classes, dtype=np.int64)
        rank_of_class[retrieved] = positions  # 0-based rank of each class
        hits_so_far = np.cumsum(row_truth[retrieved])
        ranks = rank_of_class[positives]
        precision_sum[positives] += hits_so_far[ranks] / (1 + ranks)
        label_count[positives] += 1
    return float(precision_sum.sum() / label_count.sum())


def torchmetrics_lrap(preds: Tensor, target: Tensor) -> float:
    """LRAP through torchmetrics' ``multilabel_ranking_average_precision``, on the device of the inputs.

    Args:
        preds: ``(N, C)`` scores in ``[0, 1]`` (torchmetrics applies a sigmoid to other values).
        target: ``(N, C)`` 0/1 labels.

    Example:
        >>> import torch
        >>> preds = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
        >>> round(torchmetrics_lrap(preds, torch.tensor([[1, 0, 0], [0, 0, 1]])), 4)
        0.4167
    """
    from torchmetrics.functional.classification import multilabel_ranking_average_precision

    value = multilabel_ranking_average_precision(preds, target.long(), num_labels=preds.shape[1])
    return float(value)


def read_inputs(preds: Tensor, target: Tensor) -> tuple:
    """One read of every input byte with vectorized reductions: the operation timed as the CPU floor.

    ``target`` is read as 8-byte words where its layout allows (reducing bools one byte at a time is several times
    slower than reading them), so the floor is a read at memory speed, not the cost of a slow kernel.

    Returns:
        ``(sum of preds, checksum of the bytes of target)``.

    Example:
        >>> import torch
        >>> preds, target = torch.ones(4, 6), torch.ones(4, 6, dtype=torch.bool)
        >>> read_inputs(preds, target)[0]
        tensor(24.)
    """
    flat = target.reshape(-1).view(torch.uint8)
    head = min((-flat.storage_offset()) % 8, flat.numel())
    stop = head + (flat.numel() - head) // 8 * 8
    checksum = flat[:head].sum() + flat[stop:].sum()
    if stop > head:
        checksum = checksum + flat[head:stop].view(torch.int64).sum()
    return preds.sum(), checksum


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-copy bandwidth in bytes per second (bytes read + written), measured with a copy of ``nbytes``.

    Times ``dst.copy_(src)`` with :class:`torch.utils.benchmark.Timer` (which synchronizes CUDA), median of the runs.

    Example:
        >>> import torch
        >>> copy_bandwidth(torch.device("cpu"), nbytes=1 << 20) > 0
        True
    """
    from torch.utils.benchmark import Timer

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    dst.copy_(src)
    timer = Timer("dst.copy_(src)", globals={"dst": dst, "src": src}, num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=0.5).median
    return 2 * src.numel() * src.element_size() / seconds
