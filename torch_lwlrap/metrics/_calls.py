"""How a metric meets a call: the arguments its ``update`` takes, the refusal of a call that does not fit them, the
device check of a batch, and the note that names the metric (and a ``MetricCollection``'s member) in an error that
a batch raised. Used by the base (:mod:`torch_lwlrap.metrics._base`) and the metrics that check batches their own
way."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional, Tuple

from torch import Tensor
from torchmetrics import Metric, MetricCollection

from torch_lwlrap.metrics._tags import _describe


@functools.lru_cache(maxsize=None)
def _update_signature(cls: type) -> inspect.Signature:
    """The arguments ``update`` takes (the class's own function: torchmetrics wraps each instance's); where
    ``update`` passes ``*args`` on to ``_sums`` (the rank-agreement metrics), those of ``_sums``."""
    signature = inspect.signature(cls.update)
    passes_on = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
    return inspect.signature(cls._sums) if passes_on and hasattr(cls, "_sums") else signature


def _call_refusal(metric: Metric, args: tuple, kwargs: dict, call: str) -> Optional[TypeError]:
    """The error for a call (``call``: ``metric`` or ``metric.update``) whose arguments the metric's
    ``update`` cannot take: it names the metric (in a collection the user cannot tell which refused), the arguments
    ``update`` takes and a keyword it does not; None where the arguments fit."""
    signature = _update_signature(type(metric))
    try:
        signature.bind(metric, *args, **kwargs)
    except TypeError as err:
        parameters = [(name, p) for name, p in signature.parameters.items() if name != "self"]
        arguments = ", ".join(
            name if parameter.default is inspect.Parameter.empty else f"{name}={parameter.default!r}"
            for name, parameter in parameters
        )
        unknown = [f"`{name}`" for name in kwargs if name not in signature.parameters]
        reason = f"it names {', '.join(unknown)}, which `update` does not take" if unknown else str(err)
        takes = f"`metric.update({arguments})`"
        takes = takes if call == "metric.update" else f"the arguments of {takes}"
        message = f"{type(metric).__name__}: `{call}(...)` takes {takes}, but this call does not fit them ({reason})."
        second = parameters[1][0] if len(parameters) > 1 else "target"
        # `target` named, or no keyword at all (a MetricCollection passes on only the keywords update takes)
        if second != "target" and len(args) < 2 and second not in kwargs and ("target" in kwargs or not kwargs):
            message += (
                f" Its second argument is `{second}` (not torchmetrics' `target`): pass both by position, "
                f"`{call}(preds, y)` (in a MetricCollection, `collection(preds, y)`)."
            )
        return TypeError(message)
    return None


def _note_refusal(metric: Metric, err: BaseException) -> None:
    """Add to an error of a batch (a ``TypeError`` or ``ValueError``) a note of the metric that raised it, shown below
    the message in the traceback: in a ``MetricCollection`` the message alone does not tell which member refused the
    batch, and the members torchmetrics updated before it have added it."""
    if not isinstance(err, (TypeError, ValueError)) or any("raised by" in n for n in getattr(err, "__notes__", ())):
        return
    who = f"{type(metric).__name__}({_describe(metric._option_values())})"
    frame = inspect.currentframe()
    while frame is not None and not isinstance(frame.f_locals.get("self"), MetricCollection):
        frame = frame.f_back
    collection = frame.f_locals["self"] if frame is not None else None
    del frame
    # torchmetrics updates the members in turn; with compute groups only the first of each, the others share its
    # states: the members holding the batch are those of the groups before this metric's
    groups = list(getattr(collection, "_groups", {}).values()) if getattr(collection, "_groups_checked", False) else []
    if collection is not None and not groups:
        groups = [[name] for name in collection._modules]
    mine = [i for i, group in enumerate(groups) if any(collection._modules.get(name) is metric for name in group)]
    if not mine:
        err.add_note(f"(raised by {who})")
        return
    name = next(name for name in groups[mine[0]] if collection._modules.get(name) is metric)
    holding = ", ".join(f"{other!r}" for group in groups[: mine[0]] for other in group)
    note = f"(raised by the MetricCollection's member {name!r}, {who})"
    if holding:
        note += (f" The members updated before it ({holding}) have added the batch, so the members now hold "
                 f"different batches: reset the collection before computing from it, and give every member the "
                 f"options the batch needs.")
    err.add_note(note)


def _first_argument(metric: Metric, args: tuple, kwargs: dict) -> Tuple[str, Any]:
    """``(name, value)`` of the batch's first argument in a call of ``metric.update`` (``preds``, ``preds_a``);
    the arguments are not checked here (the input gate does that)."""
    names = [name for name in _update_signature(type(metric)).parameters if name != "self"]
    if not names:
        return "preds", None
    return names[0], args[0] if args else kwargs.get(names[0])


def _check_device(metric: Metric, preds: Any, name: str = "preds") -> None:
    """A batch's first tensor (argument ``name``) on the metric's device."""
    device = metric.device
    if isinstance(preds, Tensor) and preds.device != device:
        raise ValueError(
            f"Argument `{name}` is on {preds.device} but the state of {type(metric).__name__} is on {device}: "
            f"move the metric with `.to({str(preds.device)!r})` or the inputs with `.to({str(device)!r})`."
        )
