"""The options tag every metric keeps as its first state: its layout, how options are written into it and read
back, and the tags of earlier versions. :mod:`torch_lwlrap.metrics._base` says what the tag is for (compute groups,
checkpoints, syncs) and checks it.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: First entry of a tag in this layout, ``[TAG_LAYOUT, class (4 pieces), number of options, options...]``. The
#: tags of the previous version (``PREVIOUS_LAYOUT``) had no class; those of earlier versions start with a tie-rule
#: index (0, 1 or 2).
TAG_LAYOUT = 1003
PREVIOUS_LAYOUT = 1002

#: Marks the run settings at a tag's end, ``[SETTINGS_MARK, validate_args, sums dtype (0: float64, 1: float32)]``.
#: torchmetrics puts metrics whose states are equal into one compute group of a ``MetricCollection``, where only the
#: group's first member sees the batches: metrics that check their batches differently, or keep their sums in
#: another dtype, must not share one. Checkpoints and merges never compare the settings; a sync compares the sums'
#: dtypes (sums in two dtypes cannot be gathered together).
SETTINGS_MARK = 1999
_SUM_DTYPES = (torch.float64, torch.float32)

_PIECE = 1 << 16
_PIECES = 4  # an int64 as four 16-bit pieces of its two's complement


def _pieces(value: int) -> Tuple[int, ...]:
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} does not fit an int64")
    value &= (1 << 64) - 1
    return tuple((value >> (16 * i)) & (_PIECE - 1) for i in range(_PIECES))


def _join(pieces: Sequence[int]) -> int:
    value = sum(int(piece) << (16 * i) for i, piece in enumerate(pieces))
    return value - (1 << 64) if value >= 1 << 63 else value


class Option(NamedTuple):
    """One option of a metric: its name, its value, the tag entries that encode it and how to read them back
    (``kind``, with the ``choices`` of a named option). Plain data: metrics stay picklable."""

    name: str
    value: Any
    codes: Tuple[int, ...]
    kind: str
    choices: Tuple[str, ...] = ()

    def decode(self, codes: Tuple[int, ...]) -> Any:
        """The value that ``codes`` (of a tag of this option) encode."""
        if self.kind == "choice":
            return self.choices[codes[0]]
        if self.kind == "int":
            return None if codes[0] == 0 else _join(codes[1:])
        if self.kind == "ints":
            return tuple(_join(codes[i : i + _PIECES]) for i in range(0, len(codes), _PIECES))
        return tuple(self.choices[i] for i in codes)  # "names"


def choice_option(name: str, value: str, choices: Sequence[str]) -> Option:
    return Option(name, value, (list(choices).index(value),), "choice", tuple(choices))


def int_option(name: str, value: Optional[int]) -> Option:
    """An integer (any int64) or None."""
    return Option(name, value, (0,) if value is None else (1,) + _pieces(value), "int")


def ints_option(name: str, values: Sequence[int]) -> Option:
    """A tuple of integers, in order."""
    return Option(name, tuple(values), tuple(piece for value in values for piece in _pieces(value)), "ints")


def names_option(name: str, values: Sequence[str], universe: Sequence[str]) -> Option:
    """A tuple of names out of ``universe``, in order."""
    return Option(name, tuple(values), tuple(list(universe).index(v) for v in values), "names", tuple(universe))


def class_code(name: str) -> int:
    """The number that stands for a metric class (its name's CRC-32) in the tags it makes."""
    return zlib.crc32(name.encode())


def encode_tag(owner: str, options: Sequence[Option]) -> List[int]:
    """The tag of a metric of class ``owner`` (its name) with these options."""
    tag = [TAG_LAYOUT, *_pieces(class_code(owner)), len(options)]
    for option in options:
        tag += [len(option.codes), *option.codes]
    return tag


def tag_owner(tag: Any) -> Optional[int]:
    """The class code of a tag in this layout (:func:`class_code`), else None (the previous layouts had none)."""
    if not isinstance(tag, Tensor) or tag.ndim != 1 or tag.dtype != torch.int64:
        return None
    values = tag.tolist()
    return _join(values[1 : 1 + _PIECES]) if len(values) > _PIECES and values[0] == TAG_LAYOUT else None


def decode_tag(tag: Any, options: Sequence[Option]) -> Optional[Dict[str, Tuple[int, ...]]]:
    """``{option name: codes}`` of a tag in this layout or the previous one with the same options as ``options``,
    else None (the class is :func:`tag_owner`'s to check)."""
    if not isinstance(tag, Tensor) or tag.ndim != 1 or tag.dtype != torch.int64:
        return None
    values = tag.tolist()
    if values[:1] == [TAG_LAYOUT]:
        values = values[:1] + values[1 + _PIECES :]
    elif values[:1] != [PREVIOUS_LAYOUT]:
        return None
    if len(values) < 2 or values[1] != len(options):
        return None
    out, at = {}, 2
    for option in options:
        if at >= len(values) or at + 1 + values[at] > len(values):
            return None
        out[option.name] = tuple(values[at + 1 : at + 1 + values[at]])
        at += 1 + values[at]
    rest = values[at:]
    return out if not rest or (len(rest) == 3 and rest[0] == SETTINGS_MARK) else None


def _tagged_sum_dtype(values: List[int]) -> Optional[torch.dtype]:
    """The dtype of the sums a tag's run settings name (None for a tag without them)."""
    if len(values) >= 3 and values[-3] == SETTINGS_MARK and 0 <= values[-1] < len(_SUM_DTYPES):
        return _SUM_DTYPES[values[-1]]
    return None


def _without_settings(values: List[int]) -> List[int]:
    """A tag's entries less its run settings (:data:`SETTINGS_MARK`), if it has them."""
    return values[:-3] if len(values) >= 3 and values[-3] == SETTINGS_MARK else values


def _decoded(tag: Any, options: Sequence[Option]) -> Optional[Dict[str, Any]]:
    """``{option name: value}`` of a tag in this layout with the same options as ``options``, else None."""
    codes = decode_tag(tag, options)
    try:
        return None if codes is None else {option.name: option.decode(codes[option.name]) for option in options}
    except IndexError:  # entries these options cannot hold
        return None


def _uncast_tag(tag: Tensor) -> Optional[Tensor]:
    """An options tag that ``set_dtype`` cast to float32 or float64, which hold each of its entries (below 2**16)
    exactly, as the int64 tag it was; else None (float16 and bfloat16 round entries to other whole numbers)."""
    if tag.device.type == "meta" or tag.dtype not in (torch.float32, torch.float64) or tag.ndim != 1:
        return None
    values = tag.double()
    if not bool(torch.isfinite(values).all()) or not bool((values == values.round()).all()):
        return None
    return values.to(torch.int64)


def _cast_tag_refusal(tag: Tensor) -> str:
    return (
        f"has its options_tag in {tag.dtype}, not int64 (metric.set_dtype in earlier versions cast every state, and "
        f"{tag.dtype} can round a tag's entries): its options cannot be checked. If it was made with this metric's "
        f"options, set its 'options_tag' entry to this metric's (state_dict['options_tag'] = metric.options_tag, "
        f"under the metric's prefix) and load it again"
    )


def _describe(values: Dict[str, Any]) -> str:
    return ", ".join(f"{name}={value!r}" for name, value in values.items())


def legacy_tag(saved: Callable[[str], Any], ties: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The options in the tag of earlier versions, ``[tie rule, has ignore_index, ignore_index(, num_labels)]``,
    the rule an index into ``ties``; None for a tag no earlier version wrote (another length, a flag other than 0
    or 1, an ignore_index beside a flag saying there is none, a tie rule or a label count out of range)."""
    tag = saved("options_tag")
    if not isinstance(tag, Tensor) or tag.ndim != 1 or len(tag) not in (3, 4):
        return None
    values = tag.tolist()
    if (not 0 <= values[0] < len(ties) or values[1] not in (0, 1) or (values[1] == 0 and values[2] != 0)
            or (len(values) == 4 and values[3] < 1)):
        return None
    out: Dict[str, Any] = {"ties": ties[values[0]], "ignore_index": values[2] if values[1] else None}
    if len(values) == 4:
        out["num_labels"] = values[3]
    return out
