"""Argument checking and input formatting: the one home of every user-facing error.

Everything here runs *before* a metric touches its state, so a rejected batch
leaves the state exactly as it was.
"""

from __future__ import annotations

import math
import re
from typing import Iterator, Optional, Tuple, Union

import torch
from torch import Tensor

from torch_lwlrap import _dispatch, _engine_config
from torch_lwlrap._gate_messages import (
    MAX_EXPONENTIAL_RELEVANCE,
    bad_relevance_error,
    bad_target_error,
    bad_weights_error,
    float_holds,
    nan_scores_error,
    user_call,
)
from torch_lwlrap._kernel_contract import KERNEL_TIES, SCORE_DTYPES, check_kernel_args  # noqa: F401 - re-exported
from torch_lwlrap._options import (  # noqa: F401 - the option checks, re-exported: every layer imports them from here
    AVERAGES,
    _check_int64_ignore_index,
    check_average,
    check_choice,
    check_empty_target,
    check_flag,
    check_gain,
    check_graded_ignore_index,
    check_ignore_index,
    check_k,
    check_method,
    check_num_labels,
    check_ties,
    whole_number,
)
from torch_lwlrap._tie_rules import TIES  # noqa: F401 - re-exported

#: Bytes per row assumed for the per-sample sums and their reductions (three 8-byte sums, the LRAP scores).
_SAMPLE_BYTES = 64


def rows_per_chunk(value: Tensor, bytes_per_cell: int) -> int:
    """Rows of ``value`` ``(N, C, ...)`` per chunk, so that temporaries of ``bytes_per_cell`` bytes per cell of a
    chunk stay within :data:`~torch_lwlrap._engine_config.INPUT_CHUNK_BYTES` (at least one row)."""
    cells_per_row = max(1, math.prod(value.shape[1:]))
    return max(1, _engine_config.INPUT_CHUNK_BYTES // (bytes_per_cell * cells_per_row))


def values_only(value):
    """A tensor argument's values without its autograd history (``value.detach()``, no copy); anything else as is.

    Scores straight from a training step carry gradients. Ranking reads values only: it must never build an
    autograd graph or touch ``.grad``, and the numba path reads tensors as numpy arrays, which torch refuses for a
    tensor that requires grad, or one whose negation or conjugation torch keeps as a lazy bit (``x.conj().imag``,
    resolved here: a copy only for such a tensor).
    """
    if not isinstance(value, Tensor):
        return value
    value = value.detach()
    return value.resolve_neg().resolve_conj() if value.is_neg() or value.is_conj() else value


def _check_kind(name: str, value: Tensor) -> None:
    """A dense tensor, floating only in a dtype of ``SCORE_DTYPES`` (torch has no sorts or comparisons for the
    float8 ones yet: it would fail deep inside a metric)."""
    if value.is_nested:  # either layout: a strided nested tensor reports torch.strided, and has no sizes to check
        raise TypeError(
            f"Argument `{name}` must be a dense tensor, but got a nested tensor: join its parts into one tensor, "
            f"`torch.cat({name}.unbind())` when each part holds several samples, `torch.stack({name}.unbind())` when "
            f"each part is one sample."
        )
    if value.layout != torch.strided:
        raise TypeError(
            f"Argument `{name}` must be a dense tensor, but got layout {value.layout}: convert it with "
            f"`{name}.to_dense()`."
        )
    if value.is_floating_point() and value.dtype not in SCORE_DTYPES:
        raise TypeError(
            f"Argument `{name}` has dtype {value.dtype}, which torch cannot sort or compare yet: convert it with "
            f"`{name}.float()` (float16, bfloat16, float32 and float64 are taken as they are)."
        )


#: Integer dtypes torch has no comparisons or reductions for (``>=``, ``amax``) yet.
_UNSIGNED_WITHOUT_COMPARISONS = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64")
                                      if hasattr(torch, name))


def _check_comparable(name: str, value: Tensor, what: str, fix: str, taken: str) -> None:
    """Labels, grades or weights in a dtype torch cannot compare yet (``uint16`` to ``uint64``) are refused with
    the conversion, rather than failing inside a check with torch's "not implemented for 'UInt16'"."""
    if value.dtype in _UNSIGNED_WITHOUT_COMPARISONS:
        raise TypeError(
            f"Argument `{name}` has dtype {value.dtype}, which torch cannot compare or reduce yet: convert {what} "
            f"with `{name}.{fix}()` ({taken} are taken as they are)."
        )


def _check_tensor_args(preds: Tensor, target: Tensor, num_labels: Optional[int], validate_args: bool = True) -> None:
    """Checks that need no look at the values, hence no host-device sync: always run; but the unsigned dtypes
    torch cannot compare are refused only with ``validate_args``, whose value checks would fail on them."""
    for name, value in (("preds", preds), ("target", target)):
        _check_is_tensor(name, value)
        _check_kind(name, value)
    _check_not_swapped(preds, "target", target, "the 0/1 labels", "labels", "target=labels")
    if not preds.is_floating_point():
        raise TypeError(
            f"Argument `preds` must be a floating point tensor of scores (float16, bfloat16, float32 or "
            f"float64), but got dtype {preds.dtype}. Ranking is done on the raw scores: convert them with "
            f"`preds.float()`."
        )
    if target.is_complex():
        raise TypeError(f"Argument `target` must be a bool, integer or float tensor, but got dtype {target.dtype}.")
    if validate_args:
        _check_comparable("target", target, "the labels", "long", "bool, uint8, the signed integer dtypes and floats")
    _check_layout("preds", preds)
    _check_same(("preds", "target"), preds, target, num_labels)


def _check_not_swapped(preds: Tensor, name: str, second: Tensor, what: str, holds: str, keyword: str) -> None:
    """Integer or bool ``preds`` beside floating ``second`` (the argument ``name``): the arguments look swapped, and
    the usual fix for integer scores (``preds.float()``) would rank ``what`` by the scores. The fix names the
    user's call (:func:`user_call`, ``keyword``: how the second argument is passed), read only when raising: it
    walks the stack."""
    if preds.is_floating_point() or preds.is_complex() or not second.is_floating_point():
        return
    call = user_call(keyword)
    thresholded = (
        " If it holds thresholded predictions, pass the scores before the threshold (probabilities or logits): a "
        "ranking needs them." if name == "target" else ""
    )
    raise TypeError(
        f"Argument `preds` must be a floating point tensor of scores, but got dtype {preds.dtype}, and `{name}` has "
        f"the floating dtype {second.dtype}. If `preds` holds the {holds}, the arguments look swapped: pass the "
        f"scores first and {what} second, {call}.{thresholded}"
    )


def _check_is_tensor(name: str, value) -> None:
    if not isinstance(value, Tensor):
        how = f"`torch.as_tensor({name})`" if hasattr(value, "__len__") or hasattr(value, "__array__") else None
        raise TypeError(
            f"Argument `{name}` must be a torch.Tensor, but got {type(value).__name__}"
            + (f": convert it with {how}." if how else ".")
        )


def _check_layout(name: str, value: Tensor) -> None:
    """``(N, C, ...)`` with at least one class: every metric here ranks the classes of each sample."""
    if value.ndim < 2:
        one = f": for a single sample, pass `{name}.unsqueeze(0)`" if value.ndim == 1 else ""
        raise ValueError(
            f"Argument `{name}` must have at least 2 dimensions (N, C, ...), but got shape {tuple(value.shape)}{one}."
        )
    if value.shape[1] == 0:
        raise ValueError(
            f"Argument `{name}` must have at least one class (dimension 1 of (N, C, ...)), but got shape "
            f"{tuple(value.shape)}: every metric here ranks the classes of each sample."
        )


def _check_sample_weight_args(sample_weight: Tensor, preds: Tensor, validate_args: bool = True) -> None:
    if not isinstance(sample_weight, Tensor):
        raise TypeError(f"Argument `sample_weight` must be a torch.Tensor or None, but got {type(sample_weight).__name__}.")
    _check_kind("sample_weight", sample_weight)
    if sample_weight.dtype == torch.bool:
        raise TypeError(
            "Argument `sample_weight` must be a real-valued tensor, but got dtype torch.bool. For a mask of the "
            "samples to count, pass `sample_weight.double()` (weight 1, or 0 to leave a sample out)."
        )
    if sample_weight.is_complex():
        raise TypeError(f"Argument `sample_weight` must be a real-valued tensor, but got dtype {sample_weight.dtype}.")
    if validate_args:
        _check_comparable(
            "sample_weight", sample_weight, "the weights", "double", "uint8, the signed integer dtypes and floats"
        )
    n = preds.shape[0]
    if sample_weight.shape not in ((n,), preds.shape[:1] + preds.shape[2:]):
        extra = f" or {tuple(preds.shape[:1] + preds.shape[2:])}" if preds.ndim > 2 else ""
        raise ValueError(
            f"Argument `sample_weight` must have shape ({n},){extra} to match `preds` of shape "
            f"{tuple(preds.shape)}, but got shape {tuple(sample_weight.shape)}."
        )
    if sample_weight.device != preds.device:
        raise ValueError(
            f"Argument `sample_weight` must be on the device of `preds` ({preds.device}), but got "
            f"{sample_weight.device}."
        )


def _ignore_value(target: Tensor, ignore_index: Optional[int]) -> Optional[int]:
    """``ignore_index`` where ``target``'s dtype can hold it exactly, else None.

    Comparing an integer tensor with a value outside its dtype's range wraps the value around (``-1`` equals ``255``
    in ``uint8``), and comparing a float tensor with a value its dtype cannot hold rounds the value (``16777217``
    equals ``16777216.0`` in float32, ``70000`` equals ``inf`` in float16): such a target cannot contain
    ``ignore_index`` at all, and a value that merely rounds to it is not a mark.
    """
    if ignore_index is None or target.dtype == torch.bool:
        return None
    if target.is_floating_point():
        if not float_holds(target.dtype, ignore_index):
            return None
    else:
        info = torch.iinfo(target.dtype)
        if not info.min <= ignore_index <= info.max:
            return None
    return ignore_index


def _target_is_bad(
    target: Tensor, ignore_index: Optional[int], compiled: bool = False
) -> Union[None, bool, Tensor]:
    """True (a 0-dim bool tensor, or a Python bool) when ``target`` holds a value other than 0, 1 and
    ``ignore_index``.

    None for a bool target (always valid). Fast paths, each exact: with ``compiled`` (the numba path ranks the
    batch), one compiled pass over a CPU target (:func:`torch_lwlrap._numba_kernel.target_is_bad`), whose answer is
    already on the host (a Python bool, no tensor made); an integer
    target whose allowed values form a range needs only its minimum and maximum (one read); otherwise every
    non-zero value must be 1 or ``ignore_index`` (NaN is non-zero and equals nothing).
    """
    if target.dtype == torch.bool:
        return None
    ignore = _ignore_value(target, ignore_index)
    helpers = _dispatch.target_helpers(target) if compiled else None
    if helpers is not None:
        return bool(helpers.target_is_bad(target, ignore))
    allowed = {0, 1} if ignore is None else {0, 1, ignore}
    if not target.is_floating_point() and max(allowed) - min(allowed) + 1 == len(allowed):
        low, high = torch.aminmax(target)
        return (low < min(allowed)) | (high > max(allowed))
    # Counted a chunk of samples at a time: the comparisons' bool masks stay within INPUT_CHUNK_BYTES.
    step = rows_per_chunk(target, 2)
    nonzero = expected = torch.zeros((), dtype=torch.int64, device=target.device)
    for start in range(0, target.shape[0], step):
        chunk = target[start : start + step]
        nonzero = nonzero + torch.count_nonzero(chunk)
        expected = expected + torch.count_nonzero(chunk == 1)
        if ignore is not None:
            expected = expected + torch.count_nonzero(chunk == ignore)
    return nonzero != expected


def _any_set(flag: Tensor) -> bool:
    """A 0-dim bool of the value checks read on the host (their one sync); on the ``meta`` device, which holds shapes
    without values, an error that says how to follow shapes there."""
    try:
        return bool(flag.item())
    except RuntimeError:
        if flag.device.type != "meta":
            raise
        raise ValueError(
            "The value checks (`validate_args=True`) read the inputs' values, but tensors on the `meta` device "
            "have shapes without values: pass `validate_args=False` (to the metric's constructor, or to the "
            "function) to follow shapes on `meta`, or materialize the metric and its inputs on a real device "
            "(`metric.to_empty(device=...)`, or the module's, gives new states there)."
        ) from None


def _check_values(
    preds: Tensor,
    target: Tensor,
    ignore_index: Optional[int],
    sample_weight: Optional[Tensor],
    check_scores: bool = True,
    compiled: bool = False,
) -> None:
    """Value checks with exactly one host-device sync; details are only looked up when something is wrong.

    ``check_scores=False`` leaves NaN scores to the ranking engine's own pass, and ``compiled`` checks the target
    with the numba path's helper (see :func:`torch_lwlrap._ranking.takes_numba_path`).
    """
    flags = []
    if preds.numel() and check_scores:
        # The minimum is NaN exactly when a score is NaN: one vectorized read of the scores.
        flags.append(torch.isnan(torch.aminmax(preds)[0]))
    bad_on_host = False
    if target.numel():
        bad_target = _target_is_bad(target, ignore_index, compiled)
        if isinstance(bad_target, bool):
            bad_on_host = bad_target
        elif bad_target is not None:
            flags.append(bad_target)
    if sample_weight is not None and sample_weight.numel():
        flags += [torch.isnan(sample_weight).any(), (sample_weight < 0).any(), torch.isinf(sample_weight).any()]
    if not bad_on_host:
        if not flags:
            return
        if not _any_set(flags[0] if len(flags) == 1 else torch.stack(flags).any()):  # the one sync
            return
    if check_scores and torch.isnan(preds).any():
        raise nan_scores_error(preds)
    bad_target = (target != 0) & (target != 1)
    if _ignore_value(target, ignore_index) is not None:
        bad_target &= target != ignore_index
    if bad_target.any():
        raise bad_target_error(preds, target, bad_target, ignore_index)
    assert sample_weight is not None
    raise bad_weights_error(sample_weight)


def check_inputs(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    ignore_index: Optional[int],
    validate_args: bool,
    sample_weight: Optional[Tensor] = None,
    check_scores: bool = True,
    compiled: bool = False,
) -> None:
    """Every check of a batch: raises on a bad one, else does nothing.

    Shape, dtype and device checks always run; value checks run when ``validate_args`` (one host-device sync).
    ``check_scores=False`` skips the NaN check of the scores, for a caller whose ranking engine does it;
    ``compiled=True`` checks a CPU target with the numba path's compiled helper.
    """
    validate_args = check_flag("validate_args", validate_args)
    _check_tensor_args(preds, target, num_labels, validate_args)
    if sample_weight is not None:
        _check_sample_weight_args(sample_weight, preds, validate_args)
    if validate_args:
        _check_values(preds, target, ignore_index, sample_weight, check_scores, compiled)


def check_batch(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    ignore_index: Optional[int],
    validate_args: bool,
    sample_weight: Optional[Tensor] = None,
    *,
    nan_later: bool = False,
) -> Tuple[bool, Tensor, Tensor, Optional[Tensor]]:
    """The input gate: every check of a batch (:func:`check_inputs`), for every public function and metric.

    Returns whether the numba path ranks it, and ``preds``, ``target`` and ``sample_weight`` as values only
    (:func:`values_only`): every public entry checks its batch here, so scores that carry
    gradients are accepted everywhere and never reach autograd. On the numba path its compiled helpers check the
    target, and with ``nan_later`` NaN scores are left to its ranking pass (``ranking_sums(check_nan=True)``).

    It is :func:`check_batch_structure` then :func:`check_batch_values`: a caller whose compiled pass checks the
    values itself (:func:`torch_lwlrap._ranking.one_pass_chunks`) calls the first, and the second only when that
    pass hands the batch back.
    """
    gated = check_batch_structure(preds, target, num_labels, sample_weight, validate_args)
    check_batch_values(*gated, ignore_index, validate_args, nan_later=nan_later)
    return gated


def check_batch_structure(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int],
    sample_weight: Optional[Tensor] = None,
    validate_args: bool = True,
) -> Tuple[bool, Tensor, Tensor, Optional[Tensor]]:
    """The gate's checks that need no look at the values (types, shapes, devices, the ``validate_args`` flag):
    ``(numba path, preds, target, sample_weight)`` as :func:`check_batch` returns them."""
    validate_args = check_flag("validate_args", validate_args)
    preds, target, sample_weight = values_only(preds), values_only(target), values_only(sample_weight)
    _check_tensor_args(preds, target, num_labels, validate_args)
    if sample_weight is not None:
        _check_sample_weight_args(sample_weight, preds, validate_args)
    numba_path = _dispatch.ranking_backend(preds.device, preds.dtype) == "numba"
    return numba_path, preds, target, sample_weight


def check_batch_values(
    numba_path: bool,
    preds: Tensor,
    target: Tensor,
    sample_weight: Optional[Tensor],
    ignore_index: Optional[int],
    validate_args: bool,
    *,
    nan_later: bool = False,
) -> None:
    """The gate's value checks of a batch that passed :func:`check_batch_structure` (with ``validate_args``: one
    host-device sync; the flag itself was checked by :func:`check_batch_structure`)."""
    if validate_args:
        _check_values(preds, target, ignore_index, sample_weight, not (nan_later and numba_path), numba_path)


def chunk_samples(
    preds: Tensor, target: Tensor, ignore_index: Optional[int], max_elements: Optional[int] = None
) -> int:
    """Samples (first dimension of ``preds``) formatted and ranked at a time: within
    :data:`~torch_lwlrap._engine_config.INPUT_CHUNK_BYTES` (the label masks of a non-bool target, the copies that
    flatten extra dimensions into samples, the per-sample sums), or, when
    ``max_elements`` is given (tests), about that many scores."""
    num_classes = preds.shape[1]
    rows_per_sample = max(1, math.prod(preds.shape[2:]))
    if max_elements is not None:
        return max(1, max_elements // max(1, num_classes * rows_per_sample))
    row_bytes = _SAMPLE_BYTES
    if target.dtype != torch.bool:
        row_bytes += num_classes  # the mask of positives
        if _ignore_value(target, ignore_index) is not None:
            row_bytes += num_classes  # the mask of known labels
    if preds.ndim > 2:
        row_bytes += num_classes * (preds.element_size() + target.element_size())  # the flattened copies
    return max(1, _engine_config.INPUT_CHUNK_BYTES // (row_bytes * rows_per_sample))


def formatted_chunks(
    preds: Tensor,
    target: Tensor,
    ignore_index: Optional[int],
    sample_weight: Optional[Tensor] = None,
    max_elements: Optional[int] = None,
    compiled: bool = False,
) -> Iterator[Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]]:
    """Checked inputs as ranking inputs, a chunk of samples at a time (see :func:`chunk_samples`); with
    ``compiled`` (the numba path ranks them), a CPU target's masks come from one compiled pass.

    Yields ``(scores (M, C), positive (M, C) bool, known (M, C) bool or None, weight (M,) or None)``. Extra
    dimensions ``(N, C, d1, ...)`` become samples: ``M`` rows per chunk of ``N``. ``known`` is None when no label
    is ignored. Nothing is checked here: call :func:`check_inputs` first. The split depends only on the shapes and
    dtypes, so it costs no host-device sync.
    """
    num_samples = preds.shape[0]
    step = chunk_samples(preds, target, ignore_index, max_elements)
    for start in range(0, max(num_samples, 1), step):  # a batch without samples is one empty chunk
        stop = min(start + step, num_samples)
        weight = None if sample_weight is None else sample_weight[start:stop]
        yield _format(preds[start:stop], target[start:stop], ignore_index, weight, compiled)


def _format(
    preds: Tensor, target: Tensor, ignore_index: Optional[int], sample_weight: Optional[Tensor], compiled: bool
) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    num_classes = preds.shape[1]
    if preds.ndim > 2:
        extra = preds.shape[2:]
        preds = preds.movedim(1, -1).reshape(-1, num_classes)
        target = target.movedim(1, -1).reshape(-1, num_classes)
        if sample_weight is not None and sample_weight.ndim == 1:
            sample_weight = sample_weight.reshape((-1,) + (1,) * len(extra)).expand((-1,) + tuple(extra))
        if sample_weight is not None:
            sample_weight = sample_weight.reshape(-1)

    if target.dtype == torch.bool:
        return preds, target, None, sample_weight
    ignore = _ignore_value(target, ignore_index)
    helpers = _dispatch.target_helpers(target) if compiled else None
    if helpers is not None:  # one compiled pass instead of one per mask
        positive, known = helpers.target_masks(target, ignore)
        return preds, positive, known, sample_weight
    positive = target == 1
    known = None if ignore is None else target != ignore
    return preds, positive, known, sample_weight


# ---------------------------------------------------------------------------------------------------------------
# Scores compared with scores (rank correlation, Kendall distance) and graded relevance (NDCG): the same gate for
# inputs that are not 0/1 targets. Extra dimensions ``(N, C, ...)`` become samples, and batches are cut into chunks
# of rows within INPUT_CHUNK_BYTES.

#: Bytes of workspace per score that the torch paths take at most (sort values and indices, ranks, counts).
_BYTES_PER_SCORE = 64

def _check_scores(name: str, value, what: str) -> None:
    _check_is_tensor(name, value)
    _check_kind(name, value)
    if not value.is_floating_point():
        raise TypeError(
            f"Argument `{name}` must be a floating point tensor of {what} (float16, bfloat16, float32 or float64), "
            f"but got dtype {value.dtype}. Rankings are read from the raw scores: convert them with `{name}.float()`."
        )
    _check_layout(name, value)


def _check_same(names: Tuple[str, str], first: Tensor, second: Tensor, num_labels: Optional[int]) -> None:
    if first.shape != second.shape:
        indices = ""
        if second.shape == first.shape[:1] + first.shape[2:] and not second.is_floating_point():
            move = ".movedim(-1, 1)" if first.ndim > 2 else ""
            indices = (
                f": `{names[1]}` looks like one class index per sample, but these metrics take a multi-hot "
                f"`{names[1]}` of 0/1 per class, as `torch.nn.functional.one_hot({names[1]}, {first.shape[1]}){move}` "
                f"makes"
            )
        raise ValueError(
            f"Arguments `{names[0]}` and `{names[1]}` must have the same shape (N, C, ...), but got "
            f"{tuple(first.shape)} for `{names[0]}` and {tuple(second.shape)} for `{names[1]}`{indices}."
        )
    if first.device != second.device:
        raise ValueError(
            f"Arguments `{names[0]}` and `{names[1]}` must be on the same device, but got {first.device} for "
            f"`{names[0]}` and {second.device} for `{names[1]}`: move one with `.to(...)`."
        )
    if num_labels is not None and (type(num_labels) is not int or num_labels < 1):  # a metric's own passes
        num_labels = check_num_labels(num_labels)  # a bool, a float: refused as the metric classes refuse them
    if num_labels is not None and first.shape[1] != num_labels:
        last = ""
        if first.ndim > 2 and first.shape[-1] == num_labels:
            last = (
                f": the classes look like the last dimension, move them to dimension 1 with "
                f"`{names[0]}.movedim(-1, 1)` and `{names[1]}.movedim(-1, 1)`"
            )
        raise ValueError(
            f"Expected {num_labels} labels (`num_labels`) in dimension 1 of `{names[0]}`, but got shape "
            f"{tuple(first.shape)}{last}."
        )


def _nan_error(name: str, value: Tensor) -> ValueError:
    return renamed_error(nan_scores_error(value), name)


def renamed_error(error: Exception, name: str) -> Exception:
    """``error``, one of the gate's errors about ``preds``, of the same type but about the argument ``name``
    (``preds_a``, say), for a function that takes several score tensors and checks each as ``preds``."""
    return type(error)(re.sub(r"(?<=[`(])preds\b", name, str(error)))


def check_batches(
    named_preds: Tuple[Tuple[str, Tensor], ...],
    target: Tensor,
    num_labels: Optional[int],
    ignore_index: Optional[int],
    validate_args: bool,
) -> Tuple[Tensor, ...]:
    """:func:`check_batch` of several systems' scores against one ``target``, each error naming its argument: the
    scores as values only, and ``target`` as :func:`check_batch` returns it (last)."""
    checked = []
    for name, preds in named_preds:
        try:
            _, preds, target, _ = check_batch(preds, target, num_labels, ignore_index, validate_args)
        except (TypeError, ValueError) as error:
            raise renamed_error(error, name) from None
        checked.append(preds)
    return (*checked, target)


def check_pair(
    first: Tensor,
    second: Tensor,
    num_labels: Optional[int],
    validate_args: bool,
    names: Tuple[str, str] = ("preds_a", "preds_b"),
    *,
    nan_later: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Two score tensors of one shape, checked; returned as values only. With ``nan_later`` the NaN check is left to
    the caller's compiled pass, which reads every score anyway and raises :func:`pair_nan_error` on a NaN."""
    first, second = values_only(first), values_only(second)
    validate_args = check_flag("validate_args", validate_args)
    for name, value in zip(names, (first, second)):
        _check_scores(name, value, "scores")
    _check_same(names, first, second, num_labels)
    if validate_args and not nan_later and first.numel():
        flags = torch.stack([torch.isnan(torch.aminmax(first)[0]), torch.isnan(torch.aminmax(second)[0])])
        if _any_set(flags.any()):  # the one sync
            raise pair_nan_error(first, second, names)
    return first, second


def pair_nan_error(first: Tensor, second: Tensor, names: Tuple[str, str] = ("preds_a", "preds_b")) -> ValueError:
    """The error for a pair of score tensors of which one holds a NaN: the first such tensor, by its argument name,
    and the index of its first NaN."""
    for name, value in zip(names, (first, second)):
        if torch.isnan(value).any():
            return _nan_error(name, value)
    raise AssertionError("pair_nan_error called on scores without NaN")


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
    validate_args = check_flag("validate_args", validate_args)
    _check_is_tensor("preds", preds)
    _check_is_tensor("relevance", relevance)
    _check_not_swapped(preds, "relevance", relevance, "the grades", "relevance grades", "relevance=grades")
    _check_scores("preds", preds, "scores")
    _check_kind("relevance", relevance)
    if relevance.is_complex():
        raise TypeError(f"Argument `relevance` must be a real-valued tensor, but got dtype {relevance.dtype}.")
    _check_comparable("relevance", relevance, "the grades", "long", "bool, uint8, the signed integer dtypes and floats")
    _check_same(("preds", "relevance"), preds, relevance, num_labels)
    if sample_weight is not None:
        _check_sample_weight_args(sample_weight, preds, validate_args)
    if not validate_args:
        return preds, relevance, sample_weight
    flags = []
    if preds.numel():
        flags.append(torch.isnan(torch.aminmax(preds)[0]))
    if relevance.numel() and relevance.dtype != torch.bool:
        step = rows_per_chunk(relevance, 4)  # a chunk's bool masks: up to four at once
        flags += [_bad_relevance(relevance[start : start + step], ignore_index, gain).any()
                  for start in range(0, relevance.shape[0], step)]
    if sample_weight is not None and sample_weight.numel():
        flags.append(~torch.isfinite(sample_weight).all() | (sample_weight < 0).any())
    if not flags or not _any_set(torch.stack(flags).any()):  # the one sync
        return preds, relevance, sample_weight
    if torch.isnan(preds).any():
        raise _nan_error("preds", preds)
    bad = _bad_relevance(relevance, ignore_index, gain)
    if bad.any():
        raise bad_relevance_error(relevance, bad, ignore_index, gain)
    raise bad_weights_error(sample_weight)


def _bad_relevance(relevance: Tensor, ignore_index: Optional[int], gain: str) -> Tensor:
    bad = ~(relevance >= 0)  # NaN fails it
    if relevance.is_floating_point():  # (an integer tensor compared with inf would be copied into floats first)
        bad |= relevance == math.inf
    # Compared only where the dtype holds the bound: an integer tensor compared with a value beyond its range sees
    # it wrapped around (1024 is 0 in uint8), and no grade of such a dtype can reach it.
    if gain == "exponential" and (relevance.is_floating_point()
                                  or torch.iinfo(relevance.dtype).max >= MAX_EXPONENTIAL_RELEVANCE):
        bad |= relevance >= MAX_EXPONENTIAL_RELEVANCE
    ignore = _ignore_value(relevance, ignore_index)
    if ignore is not None:
        bad &= relevance != ignore
    return bad


def graded_known(relevance: Tensor, ignore_index: Optional[int]) -> Optional[Tensor]:
    """Where ``relevance`` holds a grade, not ``ignore_index`` (None: everywhere, also where its dtype cannot hold
    ``ignore_index``, which a comparison would see wrapped around: ``-1`` equals the grade ``255`` in ``uint8``)."""
    ignore = _ignore_value(relevance, ignore_index)
    return None if ignore is None else relevance != ignore


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
