"""Compiled CPU path of :func:`torch_lwlrap.stats._bootstrap.class_sums`: weights drawn and reduced in one pass, with numba.

On the CPU, torch's elementwise integer operations cost tens of nanoseconds per weight (shifts and xors are not
vectorized), so a hash per weight in torch would cost far more than ranking the batch. This kernel draws each weight
with the same hash as the torch code (the results are identical) and adds it straight into the replicate sums: no
``(items, replicates)`` temporary at all. It runs through the one runner,
:func:`torch_lwlrap._numba_runtime.run`, as every parallel kernel does (fork, thread and thread-count guards).
Threads (numba's ``prange``) own blocks of :data:`REPLICATES_PER_BLOCK`
replicates, so no two write the same sum, and each sum is added in item order: the result does not depend on the
number of threads.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap import _numba_runtime
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel
from torch_lwlrap._poisson import POISSON_THRESHOLDS

#: Replicates per thread's block: one block's sums of a group stay in a few cache lines.
REPLICATES_PER_BLOCK = 64


def unavailable_reason(device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the compiled pass cannot draw the weights of tensors on ``device`` (None: it can)."""
    return _numba_runtime.unavailable_reason(device)


def class_sums_numba(
    sample_hash: Tensor,
    item_start: Tensor,
    group: Tensor,
    value: Tensor,
    replicate_hash: Tensor,
    thresholds: Tensor,
    total: Tensor,
    count: Tensor,
) -> None:
    """Add to ``total`` ``(B, G)`` float64 and ``count`` ``(B, G)`` int64 (contiguous) the weighted items.

    Sample ``s`` (hash ``sample_hash[s]``) owns the items ``item_start[s]:item_start[s + 1]``; item ``p`` adds
    ``w value[p]`` to ``total[b, group[p]]`` and ``w`` to ``count[b, group[p]]`` with ``w`` the sample's Poisson
    weight in replicate ``b`` (hash ``replicate_hash[b]``). Each sum gets its items added one after the other, in
    item order, onto what it held: the same bits however the items were cut into calls.
    """
    run(
        _class_sums,
        (sample_hash.numel() + value.numel()) * replicate_hash.numel(),
        sample_hash.numpy(),
        item_start.numpy(),
        group.numpy(),
        value.numpy(),
        replicate_hash.numpy(),
        thresholds.numpy(),
        total.numpy(),
        count.numpy(),
        REPLICATES_PER_BLOCK,
    )


if numba is not None:

    @serial_kernel(inline="always")
    def _mix(x):
        # The hash of torch_lwlrap.stats._bootstrap._mix on int64 values in [0, 2**32): products stay below 2**63.
        mask = np.int64(0xFFFFFFFF)
        x = x ^ (x >> np.int64(16))
        x = (x * np.int64(0x21F0AAAD)) & mask
        x = x ^ (x >> np.int64(15))
        x = (x * np.int64(0x735A2D97)) & mask
        return x ^ (x >> np.int64(15))

    # The Poisson thresholds as literal constants (12 of them: the rest equal 2**32, which u never reaches), so the
    # weight is a branch-free sum of comparisons that the compiler vectorizes over replicates.
    _T = tuple(t for t in POISSON_THRESHOLDS if t < 2**32)
    assert len(_T) == 12
    (_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7, _T8, _T9, _T10, _T11) = (np.int64(t) for t in _T)

    @serial_kernel(inline="always")
    def _poisson(u):
        return (
            np.int64(u >= _T0) + np.int64(u >= _T1) + np.int64(u >= _T2) + np.int64(u >= _T3)
            + np.int64(u >= _T4) + np.int64(u >= _T5) + np.int64(u >= _T6) + np.int64(u >= _T7)
            + np.int64(u >= _T8) + np.int64(u >= _T9) + np.int64(u >= _T10) + np.int64(u >= _T11)
        )

    @parallel_and_serial
    def _class_sums(sample_hash, item_start, group, value, replicate_hash, thresholds, total, count, per_block):
        num_samples = sample_hash.shape[0]
        num_groups = total.shape[1]
        num_replicates = replicate_hash.shape[0]
        num_blocks = (num_replicates + per_block - 1) // per_block
        for block in prange(num_blocks):
            b0 = block * per_block
            width = min(per_block, num_replicates - b0)
            hashes = replicate_hash[b0 : b0 + width].copy()
            weight = np.empty(width, dtype=np.int64)
            weight_f = np.empty(width, dtype=np.float64)
            # The block's running sums, group-major in a thread-local buffer (a group's replicates in adjacent
            # words, so the adds below vectorize), read from and written back to the (B, G) states in place.
            block_total = np.empty((num_groups, width), dtype=np.float64)
            block_count = np.empty((num_groups, width), dtype=np.int64)
            for b in range(width):
                for g in range(num_groups):
                    block_total[g, b] = total[b0 + b, g]
                    block_count[g, b] = count[b0 + b, g]
            for s in range(num_samples):
                hs = sample_hash[s]
                for b in range(width):
                    w = _poisson(_mix(hs ^ hashes[b]))
                    weight[b] = w
                    weight_f[b] = w
                for p in range(item_start[s], item_start[s + 1]):
                    g = group[p]
                    v = value[p]
                    row_total = block_total[g]
                    row_count = block_count[g]
                    for b in range(width):
                        row_total[b] += weight_f[b] * v
                        row_count[b] += weight[b]
            for b in range(width):
                for g in range(num_groups):
                    total[b0 + b, g] = block_total[g, b]
                    count[b0 + b, g] = block_count[g, b]
