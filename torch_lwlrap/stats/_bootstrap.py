"""Poisson bootstrap statistics: resampling weights, weighted replicate sums, percentile intervals, p-values.

Nothing here knows how ranks or precisions are computed: the callers hand over per-sample (or per-positive) values
and the sample each belongs to.

**Weights.** Replicate ``b`` gives each sample an independent Poisson(1) integer weight, the number of times the
sample is drawn; a sum over samples weighted this way is a bootstrap replicate of the sum, and sums of replicates
over batches and processes are replicates of the whole sum. The weights come from a counter-based generator: a
32-bit integer hash (a "lowbias32" finalizer) of ``(seed, process rank)``, the stream's key, then of the sample's
position in its process's stream and of the replicate, turned into Poisson(1) by the inverse of its distribution
function. It needs no generator state, draws only the weights that are used (the samples with a positive label,
say), and gives the same weights on every device for the same inputs: the replicates do not depend on how the
stream was cut into batches, a run is reproducible for a given seed, world size and sample order, and different
ranks draw independent weights. The position of a batch's first sample may be a tensor on the device (a metric's
sample counter), so drawing costs no host-device sync.

**Workspace.** Weights are drawn and reduced a block of ``(samples, replicates)`` at a time, within
:data:`~torch_lwlrap._engine_config.BOOTSTRAP_BLOCK_ELEMENTS` weights, so temporaries stay bounded (a few times
8 MiB) whatever the number of replicates
and samples.
"""

from __future__ import annotations

import math
import numbers
from decimal import Decimal
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from torch_lwlrap import _bootstrap_kernel, _dispatch
from torch_lwlrap._engine_config import chunk_elements
from torch_lwlrap._user_frames import warn
from torch_lwlrap._options import MAX_REPLICATES, whole_number
from torch_lwlrap._poisson import POISSON_THRESHOLDS

_M32 = 0xFFFFFFFF
#: Odd multipliers below 2**31, so products of 32-bit values fit in int64 without overflow (lowbias32, 2022 form).
_MUL1, _MUL2 = 0x21F0AAAD, 0x735A2D97
_GOLDEN = 0x61C88647  # 2**32 - golden ratio * 2**32, below 2**31
_REPLICATE_SALT = 0x2545F491


def _mix(x: Union[int, Tensor]) -> Union[int, Tensor]:
    """32-bit integer hash of a value in ``[0, 2**32)`` (a Python int or an int64 tensor, never in place)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _M32
    return x ^ (x >> 15)


def _mix_(x: Tensor) -> Tensor:
    """:func:`_mix` in place on an int64 tensor (fewer temporaries)."""
    x.bitwise_xor_(x >> 16).mul_(_MUL1).bitwise_and_(_M32)
    x.bitwise_xor_(x >> 15).mul_(_MUL2).bitwise_and_(_M32)
    return x.bitwise_xor_(x >> 15)


def check_num_bootstrap(num_bootstrap: int, name: str = "num_bootstrap") -> int:
    value = whole_number(num_bootstrap)
    if value is None or value < 0:
        raise ValueError(
            f"Argument `{name}` must be a non-negative integer (0 turns the bootstrap off), but got "
            f"{num_bootstrap!r}."
        )
    if value > MAX_REPLICATES:
        raise ValueError(
            f"Argument `{name}` takes at most 2**24 ({MAX_REPLICATES}) bootstrap replicates (torch.nanquantile's "
            f"limit for the bounds), but got {value}: use fewer (1000 is usual; 100000 bounds the Monte Carlo error "
            f"far below the interval's width)."
        )
    return value


def check_seed(seed: Optional[int], name: str = "bootstrap_seed") -> int:
    """The seed as an int in ``[0, 2**63)``; None derives one from the state of torch's default generator without
    advancing it: seeding torch repeats it, and a metric or interval never changes the random numbers a training
    run draws after it (a model's initialization, say)."""
    if seed is None:
        with torch.random.fork_rng(devices=[]):  # the CPU generator, whatever torch's default device
            return int(torch.randint(0, 2**62, (), dtype=torch.int64, device="cpu"))
    value = whole_number(seed)
    if value is None or not 0 <= value < 2**63:
        raise ValueError(f"Argument `{name}` must be an integer in [0, 2**63) or None, but got {seed!r}.")
    return value


def check_level(level: float) -> float:
    """The level as a float (any real number type: a numpy float32 too); refused unless strictly between 0 and 1."""
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise ValueError(
            f"Argument `level` must be a number strictly between 0 and 1 (0.95 for a 95% interval), but got "
            f"{level!r}{' (pass float(level))' if isinstance(level, Tensor) else ''}."
        )
    return float(level)


def stream_key(seed: int, rank: int, device=None) -> Tensor:
    """The key of a process's stream of weights: an int64 scalar on ``device``, hashed from the seed and the process
    rank. Filled on the device from a scalar: no copy from host memory, which would wait for the device."""
    key = _mix(seed & _M32)
    key = _mix(key ^ ((seed >> 32) & _M32))
    key = _mix(key ^ (rank & _M32))
    return torch.full((), key, dtype=torch.int64, device=device)


def _replicate_hashes(key: Tensor, first: int, last: int) -> Tensor:
    replicate = torch.arange(first, last, dtype=torch.int64, device=key.device)
    return _mix_(((replicate * _GOLDEN) & _M32) ^ ((key + _REPLICATE_SALT) & _M32))


def _sample_hashes(key: Tensor, sample: Tensor) -> Tensor:
    # Positions from 2**32 on (long frame-level streams) fold their high bits in, so that a position and the one
    # 2**32 later draw independent weights; below 2**32 the high part is 0 and mixes to 0.
    low = ((sample & _M32) * _GOLDEN + key) & _M32
    return _mix_(low ^ _mix(((sample >> 32) * _GOLDEN) & _M32))


def _weights(sample_hash: Tensor, replicate_hash: Tensor, thresholds: Tensor) -> Tensor:
    """``(m, b)`` int32 Poisson(1) weights of ``m`` samples in ``b`` replicates, from their hashes."""
    u = _mix_(sample_hash.unsqueeze(1) ^ replicate_hash.unsqueeze(0))
    return torch.bucketize(u, thresholds, out_int32=True, right=True)


def _thresholds(device) -> Tensor:
    device = torch.device(device)
    if device.type == "cpu":
        return torch.tensor(POISSON_THRESHOLDS, dtype=torch.int64, device=device)
    # Filled on the device from scalars: a tensor copied from host memory would wait for the device.
    return torch.stack([torch.full((), t, dtype=torch.int64, device=device) for t in POISSON_THRESHOLDS])


def poisson_weights(key: Tensor, sample: Tensor, num_bootstrap: int) -> Tensor:
    """``(num_bootstrap, m)`` int64 Poisson(1) weights of the samples with indices ``sample`` ``(m,)``.

    The weight of a sample in a replicate depends only on ``key``, the sample's index and the replicate: the same
    index always gets the same weight, whichever other samples are drawn with it. (All at once: for tests and small
    inputs; the reductions below draw a block at a time.)
    """
    sample = sample.to(torch.int64)
    weights = _weights(_sample_hashes(key, sample), _replicate_hashes(key, 0, num_bootstrap), _thresholds(key.device))
    return weights.t().to(torch.int64)


def _blocks(num_rows: int, num_bootstrap: int, width: int = 1):
    """``(first, last, start, stop)``: replicates ``first:last`` of rows ``start:stop``, with at most
    :data:`~torch_lwlrap._engine_config.BOOTSTRAP_BLOCK_ELEMENTS` weights and as many sums (``width`` per replicate)
    per block."""
    budget = chunk_elements("BOOTSTRAP_BLOCK_ELEMENTS")
    per_block = max(1, min(num_bootstrap, budget // max(1, width)))
    rows = max(1, budget // per_block)
    for first in range(0, num_bootstrap, per_block):
        last = min(first + per_block, num_bootstrap)
        for start in range(0, num_rows, rows):
            yield first, last, start, min(start + rows, num_rows)


def add_class_sums_(
    total: Tensor, count: Tensor, key: Tensor, sample: Tensor, group: Tensor, value: Tensor
) -> None:
    """Add bootstrap replicates of per-group sums and counts of values to ``total`` ``(B, G)`` float64 and
    ``count`` ``(B, G)`` int64 (in place; a ``total`` of another floating dtype gets the batch's float64 sums).

    Item ``p`` (a positive label, say) belongs to sample ``sample[p]`` and group ``group[p]`` (its class) and carries
    ``value[p]``; in replicate ``b`` it counts ``w[b, sample[p]]`` times: ``total[b, g] += sum_p w[b, sample[p]]
    value[p]`` over the items of group ``g``, and ``count[b, g]`` the same sum of weights. The items of a sample must
    be adjacent (``sample`` sorted, as row-major positions are). On the CPU with numba, a compiled pass draws and
    adds the weights (:mod:`torch_lwlrap._bootstrap_kernel`, the same weights); elsewhere torch draws them a block at
    a time. Either way the temporaries stay within a few times
    :data:`~torch_lwlrap._engine_config.BOOTSTRAP_BLOCK_ELEMENTS` elements.
    """
    num_bootstrap, num_groups = total.shape
    device = value.device
    if num_bootstrap == 0 or value.numel() == 0:
        return
    if total.dtype != torch.float64:  # a metric's sums cast with set_dtype: the batch's sums in float64, added once
        batch = torch.zeros(total.shape, dtype=torch.float64, device=total.device)
        add_class_sums_(batch, count, key, sample, group, value)
        total.add_(batch.to(total.dtype))
        return
    thresholds = _thresholds(device)
    value = value.to(torch.float64)
    sample = sample.to(torch.int64)
    if _dispatch.compiled_cpu_pass("bootstrap", device):  # the same weights either way
        # Items grouped by sample: one weight per (sample, replicate), drawn and added in one compiled pass, into
        # (G, replicates) sums for a group of replicates at a time.
        runs, items = torch.unique_consecutive(sample, return_counts=True)
        item_start = torch.zeros(runs.numel() + 1, dtype=torch.int64, device=device)
        torch.cumsum(items, 0, out=item_start[1:])
        sample_hash = _sample_hashes(key, runs)
        group = group.to(torch.int64).contiguous()
        value = value.contiguous()
        # The compiled pass adds onto the running (B, G) sums in place, each sum's items one after the other in
        # stream order, however the stream was cut into batches (the same bits for any batching).
        _bootstrap_kernel.class_sums_numba(
            sample_hash, item_start, group, value, _replicate_hashes(key, 0, num_bootstrap), thresholds,
            total, count,
        )
        return
    sample_hash = _sample_hashes(key, sample)
    for first, last, start, stop in _blocks(value.numel(), num_bootstrap):
        weight = _weights(sample_hash[start:stop], _replicate_hashes(key, first, last), thresholds)
        where = group[start:stop]
        count[first:last].index_add_(1, where, weight.t().to(torch.int64))
        weighted = weight.to(torch.float64).mul_(value[start:stop].unsqueeze(1))
        total[first:last].index_add_(1, where, weighted.t())
        del weight, weighted


def class_sums(
    key: Tensor, sample: Tensor, group: Tensor, value: Tensor, num_groups: int, num_bootstrap: int
) -> Tuple[Tensor, Tensor]:
    """``(sum (B, G) float64, count (B, G) int64)``: :func:`add_class_sums_` into zeros."""
    total = torch.zeros((num_bootstrap, num_groups), dtype=torch.float64, device=value.device)
    count = torch.zeros((num_bootstrap, num_groups), dtype=torch.int64, device=value.device)
    add_class_sums_(total, count, key, sample, group, value)
    return total, count


def add_weighted_sums_(key: Tensor, first_sample: Union[int, Tensor], pairs) -> None:
    """For each ``(out (B, k), values (m, k))`` of ``pairs``, add the bootstrap replicates of the sums over the rows
    of ``values``, row ``s`` being sample ``first_sample + s``: ``out[b] += sum_s w[b, first_sample + s] values[s]``
    (in place; an integer ``out`` gets the rounded sums, exact for integer values).

    A dense reduction (a product with each block of weights, drawn once for all pairs): no host-device sync, for any
    device and for rows that are mostly not zero; temporaries within a few times
    :data:`~torch_lwlrap._engine_config.BOOTSTRAP_BLOCK_ELEMENTS` elements.
    """
    pairs = [(out, values.to(torch.float64)) for out, values in pairs]
    num_bootstrap = pairs[0][0].shape[0]
    num_rows = pairs[0][1].shape[0]
    width = max(values.shape[1] for _, values in pairs)
    if num_bootstrap == 0 or num_rows == 0:
        return
    device = pairs[0][1].device
    # first_sample may be a tensor on the device (a metric's sample counter): added, never read on the host.
    sample = torch.arange(num_rows, dtype=torch.int64, device=device) + first_sample
    if device.type == "cpu":
        # Each sample's k values are k items of groups 0 .. k-1, added by add_class_sums_ (the compiled pass, or torch's
        # index_add_): sums built one addition after another in stream order, the same bits however the stream was
        # cut into batches. (The product below adds a block at a time: elsewhere, where no sync is wanted.)
        for out, values in pairs:
            k = values.shape[1]
            items = sample.repeat_interleave(k)
            group = torch.arange(k, device=device).repeat(num_rows)
            ignored_count = torch.zeros(out.shape, dtype=torch.int64, device=device)
            if out.is_floating_point():  # added onto the running sums in stream order, as add_class_sums_ does
                add_class_sums_(out, ignored_count, key, items, group, values.reshape(-1))
                continue
            total = torch.zeros(out.shape, dtype=torch.float64, device=device)
            add_class_sums_(total, ignored_count, key, items, group, values.reshape(-1))
            out += total.round().to(out.dtype)
        return
    thresholds = _thresholds(device)
    sample_hash = _sample_hashes(key, sample)
    for first, last, start, stop in _blocks(num_rows, num_bootstrap, width):
        weight = _weights(sample_hash[start:stop], _replicate_hashes(key, first, last), thresholds)
        weight = weight.to(torch.float64).t()
        for out, values in pairs:
            sums = weight @ values[start:stop]
            out[first:last] += sums.to(out.dtype) if out.is_floating_point() else sums.round_().to(out.dtype)
            del sums
        del weight


def weighted_sums(key: Tensor, first_sample: int, values: Tensor, num_bootstrap: int) -> Tensor:
    """``(B, k)`` float64: :func:`add_weighted_sums_` of ``values`` ``(m, k)`` into zeros."""
    out = torch.zeros((num_bootstrap, values.shape[1]), dtype=torch.float64, device=values.device)
    add_weighted_sums_(key, first_sample, [(out, values)])
    return out


def percentile_interval(replicates: Tensor, level: float) -> Tuple[Tensor, Tensor]:
    """``(low, high)`` percentile bounds over the first dimension (the replicates), ignoring NaN replicates.

    The interval holds the central ``level`` share of the replicates (linear interpolation between them). NaN
    where every replicate is NaN (a class without a positive label).
    """
    level = check_level(level)
    replicates = replicates.to(torch.float64)
    tail = (1.0 - level) / 2.0
    needed = min_replicates(level)
    if 0 < replicates.shape[0] < needed:
        if needed <= MAX_REPLICATES:
            fix = (
                f"Use at least {needed} replicates (num_bootstrap, or --bootstrap/--ci on the command line); 1000 or "
                f"more is usual."
            )
        else:
            fix = (
                f"Its tails need at least {needed} replicates, more than the 2**24 ({MAX_REPLICATES}) that can be "
                f"drawn: use a level of at most {_MAX_LEVEL} (level, or --level on the command line)."
            )
        warn(
            f"A {float(level)!r} percentile interval from {replicates.shape[0]} bootstrap replicate(s) is degenerate: each "
            f"tail holds {replicates.shape[0] * tail:.3g} of a replicate, so the bounds are interpolated between the "
            f"most extreme replicates (one replicate gives an interval of width 0). {fix}"
        )
    q = torch.tensor([tail, 1.0 - tail], dtype=torch.float64, device=replicates.device)
    if replicates.shape[0] == 0:
        nan = torch.full(replicates.shape[1:], math.nan, dtype=torch.float64, device=replicates.device)
        return nan, nan.clone()
    bounds = torch.nanquantile(replicates, q, dim=0)
    return bounds[0], bounds[1]


def min_replicates(level: float) -> int:
    """The fewest replicates whose tails each hold a whole replicate at ``level``: ``ceil(2 / (1 - level))``.

    Example:
        >>> min_replicates(0.95), min_replicates(0.9), min_replicates(0.99), min_replicates(0.9999999)
        (40, 20, 200, 20000000)

    The level is read as the decimal it was written as (``repr``), so that ``1 - 0.9999999`` is ``1e-7``, not the
    float just below it.
    """
    return math.ceil(2 / (1 - Decimal(repr(float(level)))))


#: The highest level, to 7 decimals, whose tails each hold a whole replicate of :data:`MAX_REPLICATES`.
_MAX_LEVEL = "0.9999998"


def paired_p_value(difference_replicates: Tensor) -> Tensor:
    """Two-sided bootstrap p-value of "no difference" from replicates of a difference (first dimension).

    ``p = min(1, 2 (min(#{d <= 0}, #{d >= 0}) + 1) / (B + 1))`` over the replicates that are not NaN: twice the
    smaller tail beyond zero, with the usual +1 so that a finite number of replicates never gives 0. A difference
    that is 0 in every replicate (identical systems) gets 1.
    """
    d = difference_replicates.to(torch.float64)
    valid = ~torch.isnan(d)
    below = ((d <= 0) & valid).sum(0).to(torch.float64)
    above = ((d >= 0) & valid).sum(0).to(torch.float64)
    num = valid.sum(0).to(torch.float64)
    p = 2.0 * (torch.minimum(below, above) + 1.0) / (num + 1.0)
    return torch.where(num > 0, p.clamp(max=1.0), math.nan)
