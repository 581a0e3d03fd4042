"""The input gate of the learning-to-rank metrics: scores with graded relevance (NDCG), and two score tensors
compared with each other (rank correlation, Kendall distance at k).

As :mod:`torch_lwlrap._checks` does for 0/1 targets: every check runs before a metric touches its state, value
checks cost one host-device sync (none with ``validate_args=False``), and tensors come back as values only
(:func:`torch_lwlrap._checks.values_only`: scores that carry gradients never reach autograd). Extra dimensions
``(N, C, ...)`` become samples, and batches are cut into chunks of rows within :data:`torch_lwlrap._engine_config.INPUT_CHUNK_BYTES`.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap import _engine_config
from torch_lwlrap._checks import _check_sample_weight_args, nan_scores_error, values_only

__all__ = [
    "check_graded",
    "check_graded_ignore_index",
    "check_k",
    "check_pair",
    "flat_rows",
    "flat_weights",
    "row_chunks",
]

#: Bytes of workspace per score that the torch paths take at most (sort values and indices, ranks, counts).
_BYTES_PER_SCORE = 64

#: Relevance grades of ``gain="exponential"`` must stay below this: ``2**1024`` is not a float64.
MAX_EXPONENTIAL_RELEVANCE = 1024


def check_k(k, *, allow_none: bool = False) -> Optional[int]:
    """``k`` as given: a positive integer below ``2**63`` (or None where allowed)."""
    if k is None and allow_none:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        fix = "a positive integer (or None for every label)" if allow_none else "a positive integer"
        raise ValueError(f"Argument `k` must be {fix}, but got {k!r}.")
    if k >= 2**63:
        raise ValueError(f"Argument `k` must be below 2**63 (an int64), but got {k!r}.")
    return k


def check_graded_ignore_index(ignore_index: Optional[int]) -> Optional[int]:
    """A negative integer or None: every non-negative value is a relevance grade."""
    if ignore_index is None:
        return None
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int) or ignore_index >= 0:
        raise ValueError(
            f"Argument `ignore_index` must be a negative integer or None for graded relevance (every non-negative "
            f"value is a relevance grade), but got {ignore_index!r}: mark unknown labels with -1, say."
        )
    return ignore_index


def _check_scores(name: str, value, what: str) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"Argument `{name}` must be a torch.Tensor, but got {type(value).__name__}.")
    if not value.is_floating_point():
        raise TypeError(
            f"Argument `{name}` must be a floating point tensor of {what} (float16, bfloat16, float32 or float64), "
            f"but got dtype {value.dtype}. Rankings are read from the raw scores: convert them with `.float()`."
        )
    if value.ndim < 2:
        raise ValueError(
            f"Argument `{name}` must have at least 2 dimensions (N, C, ...), but got shape {tuple(value.shape)}."
        )
    if value.shape[1] == 0:
        raise ValueError(
            f"Argument `{name}` must have at least one label (dimension 1 of (N, C, ...)), but got shape "
            f"{tuple(value.shape)}."
        )


def _check_same(names: Tuple[str, str], first: Tensor, second: Tensor, num_labels: Optional[int]) -> None:
    if first.shape != second.shape:
        raise ValueError(
            f"Arguments `{names[0]}` and `{names[1]}` must have the same shape (N, C, ...), but got "
            f"{tuple(first.shape)} for `{names[0]}` and {tuple(second.shape)} for `{names[1]}`."
        )
    if first.device != second.device:
        raise ValueError(
            f"Arguments `{names[0]}` and `{names[1]}` must be on the same device, but got {first.device} for "
            f"`{names[0]}` and {second.device} for `{names[1]}`: move one with `.to(...)`."
        )
    if num_labels is not None and first.shape[1] != num_labels:
        raise ValueError(
            f"Expected {num_labels} labels (`num_labels`) in dimension 1 of `{names[0]}`, but got shape "
            f"{tuple(first.shape)}."
        )


def _nan_error(name: str, value: Tensor) -> ValueError:
    error = nan_scores_error(value)
    return ValueError(str(error).replace("Argument `preds`", f"Argument `{name}`", 1))


def check_pair(
    first: Tensor,
    second: Tensor,
    num_labels: Optional[int],
    validate_args: bool,
    names: Tuple[str, str] = ("preds_a", "preds_b"),
) -> Tuple[Tensor, Tensor]:
    """Two score tensors of one shape, checked; returned as values only."""
    first, second = values_only(first), values_only(second)
    for name, value in zip(names, (first, second)):
        _check_scores(name, value, "scores")
    _check_same(names, first, second, num_labels)
    if validate_args and first.numel():
        flags = torch.stack([torch.isnan(torch.aminmax(first)[0]), torch.isnan(torch.aminmax(second)[0])])
        if flags.any().item():  # the one sync
            for name, value in zip(names, (first, second)):
                if torch.isnan(value).any():
                    raise _nan_error(name, value)
    return first, second


def check_graded(
    preds: Tensor,
    relevance: Tensor,
    num_labels: Optional[int],
    ignore_index: Optional[int],
    gain: str,
    validate_args: bool,
    sample_weight: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Scores and graded relevance of one shape (and sample weights), checked; returned as values only."""
    preds, relevance, sample_weight = values_only(preds), values_only(relevance), values_only(sample_weight)
    _check_scores("preds", preds, "scores")
    if not isinstance(relevance, Tensor):
        raise TypeError(f"Argument `relevance` must be a torch.Tensor, but got {type(relevance).__name__}.")
    if relevance.is_complex():
        raise TypeError(f"Argument `relevance` must be a real-valued tensor, but got dtype {relevance.dtype}.")
    _check_same(("preds", "relevance"), preds, relevance, num_labels)
    if sample_weight is not None:
        _check_sample_weight_args(sample_weight, preds)
    if not validate_args:
        return preds, relevance, sample_weight
    flags = []
    if preds.numel():
        flags.append(torch.isnan(torch.aminmax(preds)[0]))
    if relevance.numel() and relevance.dtype != torch.bool:
        flags.append(_bad_relevance(relevance, ignore_index, gain).any())
    if sample_weight is not None and sample_weight.numel():
        flags.append(~torch.isfinite(sample_weight).all() | (sample_weight < 0).any())
    if not flags or not torch.stack(flags).any().item():  # the one sync
        return preds, relevance, sample_weight
    if torch.isnan(preds).any():
        raise _nan_error("preds", preds)
    bad = _bad_relevance(relevance, ignore_index, gain)
    if bad.any():
        found = relevance[bad][:5].tolist()
        where = tuple(bad.nonzero()[0].tolist())
        allowed = "non-negative and finite" if ignore_index is None else f"non-negative and finite, or {ignore_index}"
        if gain == "exponential":
            allowed += f', below {MAX_EXPONENTIAL_RELEVANCE} with gain="exponential" (2**rel - 1 must be a float64)'
        raise ValueError(
            f"Argument `relevance` must be {allowed}, but found {found} (first at index {where}). Relevance "
            f"grades are the graded targets: 0 for irrelevant labels, larger for more relevant ones."
        )
    found = sample_weight[~torch.isfinite(sample_weight) | (sample_weight < 0)][:5].tolist()
    raise ValueError(f"Argument `sample_weight` must be non-negative and finite, but found the values {found}.")


def _bad_relevance(relevance: Tensor, ignore_index: Optional[int], gain: str) -> Tensor:
    bad = ~(relevance >= 0) | (relevance == math.inf)  # NaN fails the first test
    if gain == "exponential":
        bad |= relevance >= MAX_EXPONENTIAL_RELEVANCE
    if ignore_index is not None:
        bad &= relevance != ignore_index
    return bad


def flat_rows(value: Optional[Tensor]) -> Optional[Tensor]:
    """``(N, C, d1, ...)`` as ``(N * d1 * ..., C)`` rows (each position of the extra dimensions a sample)."""
    if value is None or value.ndim == 2:
        return value
    return value.movedim(1, -1).reshape(-1, value.shape[1])


def flat_weights(sample_weight: Optional[Tensor], preds: Tensor) -> Optional[Tensor]:
    """Sample weights ``(N,)`` or ``(N, d1, ...)`` as one weight per row of :func:`flat_rows`."""
    if sample_weight is None or preds.ndim == 2:
        return sample_weight
    extra = preds.shape[2:]
    if sample_weight.ndim == 1:
        sample_weight = sample_weight.reshape((-1,) + (1,) * len(extra)).expand((-1,) + tuple(extra))
    return sample_weight.reshape(-1)


def row_chunks(num_rows: int, num_classes: int, max_elements: Optional[int]) -> Iterator[Tuple[int, int]]:
    """``(start, stop)`` of chunks of rows: about ``max_elements`` scores each when given (tests), else within
    :data:`torch_lwlrap._engine_config.INPUT_CHUNK_BYTES` of workspace."""
    if max_elements is None:
        step = max(1, _engine_config.INPUT_CHUNK_BYTES // (_BYTES_PER_SCORE * num_classes))
    else:
        step = max(1, max_elements // num_classes)
    for start in range(0, num_rows, step):
        yield start, min(start + step, num_rows)
