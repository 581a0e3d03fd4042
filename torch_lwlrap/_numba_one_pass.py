"""The numba backend's one pass over each row: a 2-D contiguous batch checked and ranked in one compiled call.

:func:`one_pass_sums` does what the gate's target helpers and :func:`torch_lwlrap._numba_kernel.ranking_sums_numba`
do in three passes (the target's values checked, its masks made, the rows ranked), while each row is in cache: the
target's values and the row's NaN scores are checked, its positives found a word at a time (a target that is not
bool is first written as a row of bytes, in L1 cache) and its ranks counted, with the row helpers of
:mod:`torch_lwlrap._numba_kernel`. No ``(N, C)`` mask is made. The class sums are added up per block of rows and then
block after block, as the passes add them: serial or threaded, the sums are those of the passes to the bit where
they rank the chunk in one call (a bool target, or any target without ``ignore_index``), and equal up to float64
rounding where they cut it into sub-chunks (a target with ignored labels beyond
:data:`~torch_lwlrap._engine_config.NUMBA_CONVERSION_CHUNK_ELEMENTS` scores).

At 20,000 x 527 with a float32 target (a ``BCEWithLogitsLoss`` loop's) the one pass takes about half the time of
the three; at 32 x 80 a training loop's ``update`` costs a fraction of what three compiled calls and their
conversions cost (``benchmarks/latency.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import KERNEL_TIES
from torch_lwlrap._numba_kernel import BLOCK_ROWS, TARGET_DTYPES, sort_min_positives
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel

if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from torch_lwlrap._numba_kernel import (
        _add_block_sums,
        _nonzero_columns,
        _row_sum,
    )

__all__ = ["ONE_PASS_OK", "ONE_PASS_BAD_TARGET", "ONE_PASS_NAN", "one_pass_sums", "takes_one_pass"]


def takes_one_pass(preds: Tensor, target: Tensor, ties: str) -> bool:
    """Whether :func:`one_pass_sums` takes this batch (on the CPU, where the numba path ranks it): a 2-D
    contiguous float32 or float64 ``preds``, a contiguous target of bool or :data:`TARGET_DTYPES`, and a tie rule
    the kernel applies itself. Other batches take :func:`ranking_sums_numba` after the gate's compiled target
    helpers."""
    return (
        ties in KERNEL_TIES
        and preds.ndim == 2
        and preds.dtype in (torch.float32, torch.float64)
        and (target.dtype == torch.bool or target.dtype in TARGET_DTYPES)
        and preds.is_contiguous()
        and target.is_contiguous()
    )


#: ``one_pass_sums``'s status codes: the batch was ranked; a target value is not 0, 1 or ``ignore``; a score is NaN.
ONE_PASS_OK, ONE_PASS_BAD_TARGET, ONE_PASS_NAN = 0, 1, 2


def one_pass_sums(preds: Tensor, target: Tensor, ignore, validate: bool, ties: str, *, block_rows: int = BLOCK_ROWS):
    """A batch ranked in one compiled pass over each row: target values checked, NaN scores found, positives
    found and ranks counted while the row is in cache, instead of a pass for the value check, one for the masks and
    one for the ranks. Training loops call ``update`` every step on batches of 32 to 2048 rows: there the three
    calls and their conversions cost more than the ranking itself. Rows are split into blocks of ``block_rows``
    spread over threads by the runner (:func:`~torch_lwlrap._numba_runtime.run`); the class sums are added up per
    block and then block after block, as :func:`~torch_lwlrap._numba_kernel.ranking_sums_numba` adds them (see the
    module's docstring for where the two agree to the bit).

    ``preds`` is a contiguous float32 or float64 ``(N, C)`` CPU tensor and ``target`` a contiguous ``(N, C)`` CPU
    tensor of bool or :data:`TARGET_DTYPES`; ``ignore`` is ``ignore_index`` where the target's dtype holds it, or
    None. With ``validate``, a target value other than 0, 1 and ``ignore`` and a NaN score stop the pass; without,
    other values are negatives, as on every path.

    Returns:
        ``(status, sums)``: :data:`ONE_PASS_OK` and the five :class:`~torch_lwlrap._types.RankingSums` tensors, or
        :data:`ONE_PASS_BAD_TARGET` or :data:`ONE_PASS_NAN` and None (nothing was added anywhere: the caller's
        full checks raise the error).

    Example:
        >>> import torch
        >>> status, sums = one_pass_sums(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1]]), None, True,
        ...                              "max")
        >>> status, sums[0].tolist()  # column 0: 2/3, column 2: 1/2
        (0, [0.6666666666666666, 0.0, 0.5])
        >>> one_pass_sums(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[1, 2, 1]]), None, True, "max")[0]
        1
    """
    num_samples, num_classes = preds.shape
    labels = target.numpy()
    has_ignore = ignore is not None
    # The kernel allocates its outputs: a training step's update pays for few arguments and no host allocations.
    status, *sums = run(
        _rank_batch,
        num_samples * num_classes,
        preds.numpy(),
        labels.view(np.uint8) if target.dtype == torch.bool else labels,
        labels.dtype.type(ignore if has_ignore else 0),  # in the target's dtype: any int ignore_index
        has_ignore,
        validate,
        target.dtype != torch.bool,
        ties == "index",
        sort_min_positives(num_classes),
        block_rows,
    )
    if status != ONE_PASS_OK:
        return int(status), None
    return ONE_PASS_OK, tuple(map(torch.from_numpy, sums))


if numba is not None:

    @serial_kernel(inline="always")
    def _row_labels(labels, row, ignore, has_ignore, validate, mask, krow):
        """``(bad, num_known)`` of a row of a target that is not bool, in one vectorized pass: ``mask[k] = labels[k]
        == 1``, with ``has_ignore`` ``krow[k] = labels[k] != ignore``, and with ``validate`` ``bad`` not 0 when a
        value is not 0, 1 or ``ignore`` or a score of ``row`` is NaN. The flags are fixed outside the loops: each
        loop is vectorized."""
        num_classes = labels.shape[0]
        bad = np.int32(0)
        num_known = np.int32(num_classes)
        if has_ignore:
            num_known = np.int32(0)
            if validate:
                for k in range(num_classes):
                    value = labels[k]
                    one = value == 1
                    known = value != ignore
                    allowed = (value == 0) | one | (not known)
                    bad = np.int32(bad | np.int32(not allowed) | np.int32(row[k] != row[k]))
                    mask[k] = np.uint8(one)
                    krow[k] = np.uint8(known)
                    num_known = np.int32(num_known + np.int32(known))
            else:
                for k in range(num_classes):
                    value = labels[k]
                    known = value != ignore
                    mask[k] = np.uint8(value == 1)
                    krow[k] = np.uint8(known)
                    num_known = np.int32(num_known + np.int32(known))
        elif validate:
            for k in range(num_classes):
                value = labels[k]
                one = value == 1
                allowed = (value == 0) | one
                bad = np.int32(bad | np.int32(not allowed) | np.int32(row[k] != row[k]))
                mask[k] = np.uint8(one)
        else:
            for k in range(num_classes):
                mask[k] = np.uint8(labels[k] == 1)
        return bad, num_known

    @parallel_and_serial
    def _rank_batch(
        scores, target, ignore, has_ignore, validate, check_target, index_ties, sort_above, block_rows
    ):
        """:func:`one_pass_sums`'s pass: ``(status, *sums)``, the status of the first block that stopped (0:
        none) and the five sums it allocates (zeros where a block stopped). ``target`` is bool as bytes
        (``check_target`` False: nothing to check, its words are scanned in place) or of another dtype. Divides as
        numpy does (every parallel kernel does): with ``validate`` False a NaN score's zero rank gives NaN instead
        of an error."""
        num_samples, num_classes = scores.shape
        num_blocks = (num_samples + block_rows - 1) // block_rows
        block_sums = np.zeros((num_blocks, num_classes), dtype=np.float64)
        block_counts = np.zeros((num_blocks, num_classes), dtype=np.int64)
        block_status = np.zeros(num_blocks, dtype=np.uint8)
        class_sums = np.zeros(num_classes, dtype=np.float64)
        class_counts = np.zeros(num_classes, dtype=np.int64)
        sample_sums = np.zeros(num_samples, dtype=np.float64)
        sample_label_counts = np.zeros(num_samples, dtype=np.int64)
        sample_known_counts = np.zeros(num_samples, dtype=np.int64)
        sums = (class_sums, class_counts, sample_sums, sample_label_counts, sample_known_counts)
        flat = target.reshape(-1).view(np.uint8)
        head = min(-flat.ctypes.data % 8, flat.size)
        words = flat[head : head + (flat.size - head) // 8 * 8].view(np.uint64)
        for block in prange(num_blocks):
            acc = block_sums[block]
            counts = block_counts[block]
            mask_words = np.zeros((num_classes + 7) // 8, dtype=np.uint64)  # a row's positives, as aligned bytes
            mask = mask_words.view(np.uint8)[:num_classes]
            columns = np.empty(num_classes, dtype=np.int64)
            values = np.empty(num_classes, dtype=scores.dtype)
            krow = np.ones(num_classes, dtype=np.uint8)
            for i in range(block * block_rows, min(num_samples, (block + 1) * block_rows)):
                row = scores[i]
                labels = target[i]
                if check_target:
                    # A target that is not bool: one vectorized pass over its row writes the bytes of its positives
                    # (a row that stays in L1 cache, scanned a word at a time below) and of its known labels, and
                    # checks its values and the row's scores.
                    bad, num_known = _row_labels(labels, row, ignore, has_ignore, validate, mask, krow)
                    num_positives = _nonzero_columns(mask, mask_words, 0, 0, num_classes, columns)
                else:
                    bad = np.int32(0)
                    if validate:
                        for k in range(num_classes):
                            bad = np.int32(bad | np.int32(row[k] != row[k]))
                    num_known = np.int32(num_classes)
                    num_positives = _nonzero_columns(flat, words, head, i * num_classes, num_classes, columns)
                if bad:
                    block_status[block] = 1
                    for k in range(num_classes):  # which check failed: a NaN score first, as the gate reports it
                        if row[k] != row[k]:
                            block_status[block] = 2
                    break
                sample_label_counts[i] = num_positives
                sample_known_counts[i] = num_known
                sample_sums[i] = _row_sum(
                    row, krow, has_ignore, index_ties, columns, num_positives, sort_above, values, acc, counts
                )
        for block in range(num_blocks):
            if block_status[block]:
                return (np.int64(block_status[block]),) + sums
        _add_block_sums(block_sums, block_counts, class_sums, class_counts)
        return (np.int64(0),) + sums
