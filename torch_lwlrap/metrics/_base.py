"""The base of every metric class: its options tag and the checkpoint check that reads it.

A metric declares, once and before any other state, the options that change what its states mean or their shapes
(:meth:`TaggedMetric._declare_options`). They become the constant ``options_tag`` state:

* ``MetricCollection`` shares states between metrics whose states are equal after the first update. Two metrics
  that differ in an option may agree on one batch (an empty one, say) and differ on the next, so the tag keeps them
  apart. torchmetrics before 1.7 compares only the *first* state, so the tag comes first. The comparison is
  ``torch.allclose``: every number is stored as 16-bit pieces, which no relative tolerance can confuse (seeds and
  large ``k`` or ``ignore_index`` would be "close" as whole numbers).
* ``load_state_dict`` (of the metric or of a module holding it, ``strict`` or not) refuses a checkpoint made with
  other options, in one line naming both. Options that only change :meth:`compute` (``average``, ``empty_target``)
  are not in the tag: the same sums serve each of their values.
* The tag also holds the metric's class (the package's own: a user's subclass makes and loads its base's
  checkpoints), so that a checkpoint of another class is refused naming the class that made it, not read as options
  of this one. Tags of the previous layout (``PREVIOUS_LAYOUT``, without the class) still load.

The tag never changes (a ``"max"`` reduction keeps it across processes and merges); processes whose tags hold
different options are refused at their sync (:meth:`TaggedMetric._sync_dist`).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.distributed import gather_all_tensors

from torch_lwlrap._checks import check_batch, check_flag
from torch_lwlrap._engine_config import eager_only
from torch_lwlrap.metrics._calls import _call_refusal, _check_device, _first_argument, _note_refusal
from torch_lwlrap.metrics._tags import (
    _SUM_DTYPES,
    PREVIOUS_LAYOUT,
    SETTINGS_MARK,
    TAG_LAYOUT,
    Option,
    _cast_tag_refusal,
    _decoded,
    _describe,
    _tagged_sum_dtype,
    _uncast_tag,
    _without_settings,
    class_code,
    encode_tag,
    tag_owner,
)

#: Options that may differ from process to process: a bootstrap seed drawn in each (``bootstrap_seed=None``, torch
#: not seeded alike) gives each its own weights, as the process rank in the key does anyway.
_PER_PROCESS_OPTIONS = ("bootstrap_seed",)

#: The fix a refusal names when the options differ.
_FIX = ": create the metric with the checkpoint's options"


class TaggedMetric(Metric):
    """A ``torchmetrics.Metric`` whose options are in its first state and checked when a checkpoint is loaded."""

    #: States an earlier version kept beside ``options_tag`` (read by :meth:`_legacy_options`, then dropped).
    _legacy_state_names: Tuple[str, ...] = ()

    _options: Tuple[Option, ...]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Each metric's constructor runs eagerly inside torch.compile, as its methods do: dynamo tracing it left the
        # object without its states ("no attribute '_defaults'" at the first update).
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            cls.__init__ = eager_only(cls.__dict__["__init__"])

    @property
    def validate_args(self) -> bool:
        """Whether ``update`` checks the values of its batches (one host-device sync). A run setting at the tag's
        end: changing it re-tags the metric, so that a ``MetricCollection`` never groups it with a metric that
        checks its batches differently."""
        # A metric an earlier version pickled holds the plain attribute.
        return self.__dict__.get("_validate_args", self.__dict__.get("validate_args", True))

    @validate_args.setter
    def validate_args(self, value: bool) -> None:
        self._validate_args = check_flag("validate_args", value)
        if "options_tag" in getattr(self, "_defaults", {}):
            self._retag()

    def _declare_options(self, *options: Optional[Option]) -> None:
        """The options that change the states' meaning or shape (None entries skipped); call before any
        ``add_state``, so that the tag is the first state."""
        if self._defaults:
            raise RuntimeError(f"{type(self).__name__} declares its options before its states")
        self._options = tuple(option for option in options if option is not None)
        self.add_state("options_tag", self._tag(torch.float64), dist_reduce_fx="max")

    def _sync_dist(self, dist_sync_fn: Callable = gather_all_tensors, process_group: Any = None) -> None:
        """torchmetrics' sync across processes, after one gather of every process's ``options_tag`` (tags of any
        length): processes whose options differ are refused, naming the options, before their sums are gathered
        (other options may even mean other states, whose gathers would not line up)."""
        if self.options_tag.device.type != "meta":  # shape-only tests of syncs: no values to compare
            self._check_same_options([tag.tolist() for tag in dist_sync_fn(self.options_tag, group=process_group)])
        super()._sync_dist(dist_sync_fn, process_group=process_group)

    def _check_same_options(self, tags: List[List[int]]) -> None:
        """Refuse tags of the processes (``tags[rank]``) whose options differ from process 0's (run settings and
        :data:`_PER_PROCESS_OPTIONS` aside): their sums mean different things, and adding them would give a wrong
        value without a word."""
        for rank, tag in enumerate(tags[1:], 1):
            if _without_settings(tag) == _without_settings(tags[0]):
                continue
            owners = [tag_owner(torch.tensor(values, dtype=torch.int64, device="cpu")) for values in (tags[0], tag)]
            if None not in owners and owners[0] != owners[1]:  # a collection computed in another order, say
                first, other = (_class_with_code(owner) or "another metric class" for owner in owners)
                raise ValueError(
                    f"{type(self).__name__}'s sync met a {first} on process 0 and a {other} on process {rank}: "
                    f"every process must sync the same metric at the same time (compute the metrics of a dict or "
                    f"collection in the same order on every process), or their sums would be added together."
                )
            mine, theirs = (
                _decoded(torch.tensor(values, dtype=torch.int64, device="cpu"), self._options)
                for values in (tags[0], tag)
            )
            if mine is not None and theirs is not None:
                differ = [name for name in mine if mine[name] != theirs[name] and name not in _PER_PROCESS_OPTIONS]
                if not differ:
                    continue
                what = (
                    f"{_describe({name: mine[name] for name in differ})} on process 0 and "
                    f"{_describe({name: theirs[name] for name in differ})} on process {rank}"
                )
            else:
                what = f"other options, or as another metric class, on process {rank} than on process 0"
            raise ValueError(
                f"{type(self).__name__} was created with {what}: their sums cannot be added. Create the metric with "
                f"the same options on every process."
            )
        dtypes = [_tagged_sum_dtype(tag) for tag in tags]
        for rank, dtype in enumerate(dtypes[1:], 1):
            if dtype != dtypes[0]:  # the gathers of sums in two dtypes would not line up (gloo aborts the process)
                raise ValueError(
                    f"{type(self).__name__} keeps its sums in {dtypes[0]} on process 0 and in {dtype} on process "
                    f"{rank} (metric.set_dtype): they cannot be gathered together. Call set_dtype with the same dtype "
                    f"on every process, or on none."
                )

    def _tag(self, sum_dtype: torch.dtype, device=None) -> Tensor:
        """This metric's options tag, its run settings at the end (:data:`SETTINGS_MARK`), on ``device`` (None: torch's
        default device, where the state is made as the others are)."""
        settings = [SETTINGS_MARK, int(self.validate_args), _SUM_DTYPES.index(sum_dtype)]
        return torch.tensor(encode_tag(_library_class(self), self._options) + settings, dtype=torch.int64,
                            device=device)

    def _current_tag(self) -> Tensor:
        """The tag of this metric's options and settings now, on the CPU (also for a metric on ``meta``)."""
        floats = [d.dtype for d in self._defaults.values() if isinstance(d, Tensor) and d.is_floating_point()]
        return self._tag(floats[0] if floats else torch.float64, "cpu")

    def _retag(self) -> None:
        """The tag made again from the options and settings (an option adopted from a checkpoint, set_dtype)."""
        tag = self._current_tag()
        self.options_tag = tag.to(self.options_tag.device)
        self._defaults["options_tag"] = tag.to(self._defaults["options_tag"].device)

    def _option_values(self) -> Dict[str, Any]:
        return {option.name: option.value for option in self._options}

    def _options_changed(self, options: Sequence[Option]) -> None:
        """Replace the declared options (a value adopted from a checkpoint): the tag follows."""
        self._options = tuple(options)
        self._retag()

    # One forward, one out-of-place update and one device move for every metric.

    def _check_batch(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        """Every check ``update`` runs on a batch, nothing changed: the input gate
        (:func:`torch_lwlrap._checks.check_batch`). Metrics whose batches are not scores and 0/1 targets override it."""
        check_batch(preds, target, self.num_labels, self.ignore_index, self.validate_args, sample_weight)

    def _forward_context(self) -> ContextManager[Any]:
        """Entered around torchmetrics' forward (the bootstrap metrics keep their positions in the stream there)."""
        return contextlib.nullcontext()

    def _wrap_update(self, update: Callable) -> Callable:
        # torchmetrics wraps update and compute per instance (again after unpickling): they, and forward below, run
        # eagerly inside torch.compile (a graph break; dynamo cannot trace the engines' compiled kernels).
        wrapped = super()._wrap_update(update)

        @functools.wraps(wrapped)
        def update(*args: Any, **kwargs: Any) -> None:  # named as the method: an error names the user's call by it
            # torchmetrics counts the update and drops its kept result before the batch is checked: a refused batch
            # changes nothing, its count included (a metric that refused every batch still warns before compute).
            count, computed = self._update_count, self._computed
            try:
                wrapped(*args, **kwargs)
            except BaseException as err:
                self._update_count, self._computed = count, computed
                if isinstance(err, TypeError):  # arguments update cannot take, or a TypeError of the input gate
                    refusal = _call_refusal(self, args, kwargs, "metric.update")
                    if refusal is not None:
                        raise refusal from None
                _note_refusal(self, err)
                raise

        return eager_only(update)

    def _wrap_compute(self, compute: Callable) -> Callable:
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(wrapped)
        def compute_on_any_rank(*args: Any, **kwargs: Any) -> Any:
            # torchmetrics warns that compute comes before update from its local count: a process that saw no batch
            # still computes the value over every process's sums (the DDP sampler may give it none). Its warning
            # would be false there, and an error on that process alone under -W error (while the others wait in
            # the gather). With no sums anywhere, each metric's own compute says so.
            if self._update_count or not _syncs_other_processes(self):
                return wrapped(*args, **kwargs)
            self._update_count = 1  # what torchmetrics reads for its warning (no process-wide warning filter)
            try:
                return wrapped(*args, **kwargs)
            finally:
                self._update_count = 0

        return eager_only(compute_on_any_rank)

    @eager_only
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Add a batch and return the value of this batch alone (``metric(preds, target)``, with the arguments of
        ``update``).

        torchmetrics' forward empties the states before it calls ``update``: the batch goes through the input gate
        first, so a rejected batch (or a call with the wrong arguments) raises before anything changes, and the
        accumulated states are kept.
        """
        refusal = _call_refusal(self, args, kwargs, "metric")  # a call with the wrong arguments raises here
        if refusal is not None:
            raise refusal
        name, first = _first_argument(self, args, kwargs)
        try:
            _check_device(self, first, name)
            self._check_batch(*args, **kwargs)
        except (TypeError, ValueError) as err:
            _note_refusal(self, err)
            raise
        if self.full_state_update or self.full_state_update is None or self.dist_sync_on_step:
            # That forward updates the accumulated states, keeps them aside and updates emptied ones: updates add
            # in place, and torchmetrics before 1.3 keeps the states by reference (in a compute group, shared by
            # every member), so each forward starts from states of its own.
            self._own_states()
        with _values_checked(self), self._forward_context():
            return super().forward(*args, **kwargs)

    def _add_sums(self, sums: Dict[str, Tensor]) -> None:
        """Add a batch's sums to the states in place (in the state's dtype; a training step's update then spends no
        time in ``Module.__setattr__``). A state made under ``torch.inference_mode()`` (a metric created, reset or
        used in a validation loop there) cannot be written outside it: it is replaced by the sum, once, after which
        it is a normal tensor."""
        inference = torch.is_inference_mode_enabled()
        for name, value in sums.items():
            state = getattr(self, name)
            if state.is_inference() and not inference:
                setattr(self, name, (state + value).to(state.dtype))
            else:
                state.add_(value)

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = (), recurse: bool = True) -> "TaggedMetric":
        # ``recurse``: what ``nn.Module.to_empty`` passes to the module it is called on (a metric's states are its
        # own, not a child module's, so it changes nothing here); torchmetrics' ``_apply`` does not take it.
        tensors = {name: d for name, d in self._defaults.items() if isinstance(d, Tensor)}
        if self._dtype_convert:  # set_dtype: the sums take its dtype; the options tag and the counts stay int64
            kept = tuple(name for name, d in tensors.items() if not d.is_floating_point())
        else:  # a module's cast (``model.to(torch.bfloat16)``) moves the sums, never casts them
            kept = tuple(name for name, d in tensors.items() if d.is_floating_point())
        return _apply_keeping_dtypes(self, fn, exclude_state, kept)

    def set_dtype(self, dst_type: Any) -> "TaggedMetric":
        """torchmetrics' ``set_dtype``, for float32 and float64 only: the floating sums take the dtype (float32 on a
        device without float64), the int64 counts and the options tag keep theirs, and every result is still
        computed and returned in float64. A sum of many samples in float16 or bfloat16 stops growing (past 2048 or
        256 in steps of one): those dtypes are refused."""
        dtype = _sum_dtype(dst_type)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(
                f"{type(self).__name__}.set_dtype({dst_type!r}): the states are sums over every sample seen, which "
                f"{dst_type} cannot hold (a float16 sum stops growing in steps of one past 2048, a bfloat16 sum past "
                f"256, an integer sum loses every fraction). Use torch.float32 (on a device without float64) or "
                f"torch.float64, the default; a module cast (model.to(torch.bfloat16)) leaves the states alone."
            )
        out = super().set_dtype(dtype)
        out._retag()  # the sums' dtype is a run setting: a cast metric never shares an uncast one's compute group
        return out

    @contextlib.contextmanager
    def sync_context(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        """torchmetrics' ``sync_context`` (``compute`` and the methods that read the synced states run inside it),
        with sums that ``set_dtype`` cast read as float64: results are computed and returned in float64."""
        with super().sync_context(*args, **kwargs):
            cast = {
                name: getattr(self, name) for name, default in self._defaults.items()
                if isinstance(default, Tensor) and default.is_floating_point() and default.dtype != torch.float64
            }
            for name, value in cast.items():
                setattr(self, name, value.double())
            try:
                yield
            finally:
                for name, value in cast.items():
                    setattr(self, name, value)

    def _legacy_refusal(self, saved: Callable[[str], Any]) -> Optional[str]:
        """Why a checkpoint of an earlier version cannot load here whatever the options (None: it may), with the
        fix."""
        return None

    def _legacy_options(self, saved: Callable[[str], Any]) -> Optional[Dict[str, Any]]:
        """The options a checkpoint of an earlier version records (``saved(state name)`` gives its states, or
        None); those it does not record are not compared. None: its tag is none an earlier version of this class
        wrote (a class new in this version has none)."""
        return None

    def _adoptable(self, name: str, value: Any) -> bool:
        """Whether a checkpoint's value of option ``name`` may replace this metric's (one the user did not choose,
        such as a drawn bootstrap seed)."""
        return False

    def _adopt(self, values: Dict[str, Any]) -> None:
        raise NotImplementedError

    def _checkpoint_check(
        self, saved: Callable[[str], Any], action: str = "load", fix: str = _FIX
    ) -> Tuple[Optional[str], Dict[str, Any]]:
        """``(refusal, adopted)``: why the checkpoint's states cannot be loaded here (None if they can), and the
        option values to take from it. ``action`` and ``fix`` word the refusal (:meth:`merge_state` merges, and
        names no fix for other options)."""
        ours = self._option_values()
        tag = saved("options_tag")
        if tag is None:  # this metric's sums without the record of what they mean
            if action == "merge":
                return (
                    f"records no options (the states have no 'options_tag', which every torch_lwlrap metric's "
                    f"`metric_state` carries), so nothing tells what their sums mean. Merge the other metric itself "
                    f"or its whole `metric_state`; if the states come from a metric with this one's options "
                    f"({_describe(ours)}), add the entry: states['options_tag'] = metric.options_tag"
                ), {}
            return (
                f"records no options (it has no 'options_tag' entry, which every checkpoint of a torch_lwlrap metric "
                f"carries), so nothing tells what its sums mean. If it was saved by a metric with this one's options "
                f"({_describe(ours)}), set the entry (under the metric's prefix in a module's state dict): "
                f"state_dict['options_tag'] = metric.options_tag"
            ), {}
        cast = isinstance(tag, Tensor) and tag.dtype != torch.int64
        if cast:  # set_dtype cast every state in earlier versions (it keeps the tag int64 now)
            tag = _uncast_tag(tag)
            if tag is None:
                return _cast_tag_refusal(saved("options_tag")), {}
        owner = tag_owner(tag)
        if owner is not None and owner != class_code(_library_class(self)):
            maker = _class_with_code(owner)
            if maker is None:
                return "was made by another metric class (not one of this version's)", {}
            return f"was made by {maker}: {action} it into a {maker}", {}
        unknown = "was made by another metric class or with other options (an unknown options_tag)" + fix
        theirs = _decoded(tag, self._options)
        if theirs is not None:
            differ = [name for name, value in theirs.items() if value != ours[name]]
        elif isinstance(tag, Tensor) and tag.ndim == 1 and tag.tolist()[:1] in ([TAG_LAYOUT], [PREVIOUS_LAYOUT]):
            return unknown, {}
        elif cast:  # no layout of this version's or the previous one's: the cast rounded it, or it is no tag
            return _cast_tag_refusal(saved("options_tag")), {}
        else:
            refusal = self._legacy_refusal(saved)
            if refusal is not None:
                return refusal, {}
            theirs = self._legacy_options(saved)
            if theirs is None:
                return unknown, {}
            differ = [name for name, value in theirs.items() if name in ours and value != ours[name]]
        adopted = {name: theirs[name] for name in differ if self._adoptable(name, theirs[name])}
        differ = [name for name in differ if name not in adopted]
        if differ:
            return (
                f"was made with {_describe({n: theirs[n] for n in differ})}; this metric has "
                f"{_describe({n: ours[n] for n in differ})}{fix}"
            ), {}
        return self._states_refusal(saved, action, fix), adopted  # the options agree: the states must be there

    def _states_refusal(self, saved: Callable[[str], Any], action: str = "load", fix: str = _FIX) -> Optional[str]:
        """Why the states ``saved(name)`` gives cannot be loaded or merged here whatever their options (None if they
        can): a state this metric keeps is missing, or has another shape."""
        for name, default in self._defaults.items():
            if name == "options_tag":
                continue
            value = saved(name)
            if value is None:
                whole = "the whole `state_dict()` the metric wrote" if action == "load" else "its whole `metric_state`"
                return (
                    f"has no state {name!r}, which this metric ({_describe(self._option_values())}) keeps with the "
                    f"others: the states are incomplete; {action} {whole}, every entry of it"
                )
            if not isinstance(value, Tensor) or value.shape != default.shape:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                return f"has state {name!r} of shape {shape}, this metric {tuple(default.shape)}{fix}"
        return None

    if hasattr(Metric, "merge_state"):  # a torchmetrics of late 2024 on; with an older one metrics have none

        def merge_state(self, incoming_state: Any) -> None:
            """torchmetrics' ``merge_state`` (another metric's states, or a dict of them, added into this one's),
            refusing states made by another class or with other options (or another drawn bootstrap seed), or
            tagged in an earlier version's layout: their sums mean something else, and adding them would give a
            value that is no metric's."""
            if isinstance(incoming_state, TaggedMetric):
                states = dict(incoming_state.metric_state)
                tag = incoming_state._current_tag()  # on the CPU, also for a shape-only metric on meta
            elif isinstance(incoming_state, dict):
                states, tag = incoming_state, incoming_state.get("options_tag")
            else:
                return super().merge_state(incoming_state)  # torchmetrics' refusal of anything else
            shape_only = isinstance(tag, Tensor) and tag.device.type == "meta"  # a dict of meta states: no values
            cast = isinstance(tag, Tensor) and tag.dtype != torch.int64
            own = self._current_tag().tolist()
            if not shape_only:  # the options, then every state in this metric's shape, before any state is added
                refusal, adopted = self._checkpoint_check(
                    lambda name: tag if name == "options_tag" else states.get(name), action="merge", fix=""
                )
                if refusal is None and (
                    cast or tag.numel() != len(own) or _without_settings(tag.tolist()) != _without_settings(own)
                ):
                    if adopted:  # a value a checkpoint would give this metric: not the same stream
                        values = self._option_values()
                        refusal = (f"was made with {_describe(adopted)}; this metric has "
                                   f"{_describe({name: values[name] for name in adopted})}")
                    else:  # the same options, in an earlier version's tag (or one cast by its set_dtype)
                        earlier = f"an options tag in {tag.dtype}" if cast else "an earlier version's options tag"
                        refusal = (f"has {earlier}: load its states into a metric of this version "
                                   f"(load_state_dict), then merge that metric")
            else:  # a dict of states on meta: no options to read, but every state this metric's, in its shape
                foreign = ", ".join(repr(name) for name in states if name not in self._defaults)
                refusal = (f"keeps states this metric does not ({foreign}): they are another metric's" if foreign
                           else self._states_refusal(states.get, action="merge", fix=""))
            if refusal is not None:
                raise ValueError(f"{type(self).__name__} cannot merge these states: their metric {refusal}.")
            if getattr(self, "num_bootstrap", 0):
                raise ValueError(
                    f"{type(self).__name__} with num_bootstrap={self.num_bootstrap} cannot merge another metric's "
                    f"states: a replicate's weights are drawn from the seed and each sample's position in its "
                    f"metric's stream, so two metrics of one process weigh their samples alike and the merged "
                    f"replicates would not be independent. Feed every batch to one metric (across processes, DDP "
                    f"keeps the ranks' weights apart)."
                )
            here = self.options_tag.device
            elsewhere = {value.device for value in states.values() if isinstance(value, Tensor)} - {here}
            if elsewhere and "meta" in {device.type for device in elsewhere | {here}}:
                ours, theirs = str(here), ", ".join(sorted(map(str, elsewhere)))
                raise ValueError(
                    f"{type(self).__name__} on {ours} cannot merge states on {theirs}: a metric on meta holds its "
                    f"states' shapes, not their values. Merge two metrics that hold values (a metric moved to meta "
                    f"gets fresh states on a device with `metric.to_empty(device=...)`), or two on meta."
                )
            # torchmetrics' merge (the class and options are checked above), on this metric's device
            super().merge_state({name: _moved(value, here) for name, value in states.items()})
            self._own_states()  # each state in its own dtype (a float64 sum added into a float32 one gives float64)
            self._states_changed(incoming_state._update_count if isinstance(incoming_state, Metric) else 1)
            if here.type != "meta":  # this metric's settings (the tags' maximum may mix the two metrics' settings)
                self.options_tag = torch.tensor(own, dtype=torch.int64, device=here)

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: List[str],
        unexpected_keys: List[str],
        error_msgs: List[str],
    ) -> None:
        def saved(name: str) -> Any:
            return state_dict.get(prefix + name)

        names = [*self._defaults, *self._legacy_state_names]
        if any(prefix + name in state_dict for name in names):
            refusal, adopted = self._checkpoint_check(saved)
            if refusal is None:
                if adopted:
                    self._adopt(adopted)
                self._states_changed(1)
                # This metric's tag stays: an earlier version's layout is never taken in.
                for name in ("options_tag", *self._legacy_state_names):
                    state_dict.pop(prefix + name, None)
            else:
                where = f" at {prefix[:-1]!r}" if prefix else ""
                error_msgs.append(f"{type(self).__name__} checkpoint{where} {refusal}")
                # Nothing is loaded; the checkpoint's states of this metric are consumed, not reported again.
                own = set(self._parameters) | set(self._buffers)
                for key in [k for k in state_dict if k.startswith(prefix)]:
                    rest = key[len(prefix) :]
                    if "." not in rest and rest not in own:
                        state_dict.pop(key)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        # Never into the checkpoint's own tensors (a state dict the caller still holds, or another metric loaded
        # from it), and on this metric's device (a checkpoint saved on the CPU, loaded into a metric on a GPU).
        self._own_states()

    def _states_changed(self, updates: int) -> None:
        """After states came from elsewhere (a checkpoint, a merge): ``compute()`` computes again (torchmetrics keeps
        its last result until the next ``update``), and counts them as ``updates`` more updates, so that it does not
        warn that it was called before any."""
        self._computed = None
        self._update_count += updates

    def _own_states(self) -> None:
        """Replace every tensor state by a copy of its own on this metric's device and in its dtype: updates add into
        the states in place (:meth:`_add_sums`), so no state may share its memory with a tensor held elsewhere, and a
        checkpoint's counts that an earlier version's ``set_dtype`` cast to floats are int64 counts again."""
        for name, default in self._defaults.items():
            value = getattr(self, name)
            if isinstance(value, Tensor):
                dtype = default.dtype if isinstance(default, Tensor) else value.dtype
                setattr(self, name, value.to(device=self.device, dtype=dtype, copy=True))


def _library_class(metric: "TaggedMetric") -> str:
    """The name of the metric's class in this package (a user's subclass of ``MultilabelLWLRAP`` makes and loads
    ``MultilabelLWLRAP`` checkpoints)."""
    return next(cls.__name__ for cls in type(metric).__mro__ if cls.__module__.startswith("torch_lwlrap."))


def _class_with_code(code: int) -> Optional[str]:
    """The name of this package's metric class whose tags carry ``code`` (:func:`class_code`), or None."""
    pending, seen = [TaggedMetric], set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if cls.__module__.startswith("torch_lwlrap.") and class_code(cls.__name__) == code:
            return cls.__name__
        pending.extend(cls.__subclasses__())
    return None


# Helpers every metric's update, forward and compute share.


@contextlib.contextmanager
def _values_checked(metric: "TaggedMetric") -> Iterator[None]:
    """Skip the value checks of ``update`` inside the block: the batch was checked already (the setting's value
    itself, not through its property: the tag stays as it is)."""
    validate_args = metric.validate_args
    metric._validate_args = False
    try:
        yield
    finally:
        metric._validate_args = validate_args


def _apply_keeping_dtypes(metric: Metric, fn: Callable, exclude_state: Sequence[str], names: Tuple[str, ...]):
    """``Metric._apply`` that moves the states ``names`` across devices but never changes their dtype, nor that of
    the results torchmetrics keeps (``_computed``, ``_forward_cache``: float64 values).

    torchmetrics guards its states against ``.half()`` or ``.float()`` but not against ``.to(dtype)``, which
    mixed-precision trainers call on whole models (``model.to(torch.bfloat16)``): cast sums would be rounded at
    every update, so the sums (float64, or float32 after ``set_dtype``) are kept then. Only an explicit
    ``set_dtype`` converts the sums; it converts every state in torchmetrics, so the options tag and the int64
    counts are kept then: a count in float32 stops at 2**24, and a rounded tag would no longer say which options a
    checkpoint was made with.
    """
    extra = (exclude_state,) if exclude_state else ()
    on_meta = metric.options_tag.device.type == "meta"
    saved = {name: (getattr(metric, name), metric._defaults[name]) for name in names if name not in exclude_state}
    results = {name: getattr(metric, name, None) for name in ("_computed", "_forward_cache")}
    this = Metric._apply(metric, fn, *extra)
    for name, (value, default) in saved.items():  # the states as they were, on the device fn moved them to
        setattr(this, name, _moved(value, getattr(this, name).device))
        this._defaults[name] = _moved(default, this._defaults[name].device)
    for name, value in results.items():
        if value is not None:
            setattr(this, name, _moved(value, this.device))
    if on_meta and this.options_tag.device.type != "meta":  # materialized (``to_empty``): a new metric's states
        _fresh_states(this)
    return this


def _fresh_states(metric: "TaggedMetric") -> None:
    """The states of a metric made on the meta device (``with torch.device("meta")``, as FSDP and large models
    initialize) and now given memory without data (``module.to_empty(device=...)``): what a new metric holds, every
    sum and count 0 and the options tag of its options. Nothing was accumulated on the meta device: it takes no
    batch."""
    for name, default in metric._defaults.items():
        if isinstance(default, Tensor):
            metric._defaults[name] = torch.zeros_like(default)
    metric._retag()
    metric.reset()


def _moved(value: Any, device: torch.device) -> Any:
    """``value`` (a tensor, or a dict, list or tuple of them) on ``device``, each tensor in its own dtype (from the
    meta device, memory without data: :func:`_fresh_states` fills the states)."""
    if isinstance(value, Tensor):
        return torch.empty_like(value, device=device) if value.is_meta and device.type != "meta" else value.to(device)
    if isinstance(value, dict):
        return {key: _moved(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(item, device) for item in value)
    return value


def _sum_dtype(dst_type: Any) -> Any:
    """The dtype ``set_dtype`` was given (a dtype, or its name as ``"float32"`` or ``"torch.float32"``), else the
    argument itself."""
    if isinstance(dst_type, str):
        legacy = {"torch.FloatTensor": torch.float32, "torch.DoubleTensor": torch.float64}  # Module.type's names
        found = legacy.get(dst_type) or getattr(torch, dst_type[len("torch."):] if dst_type.startswith("torch.")
                                                else dst_type, None)
        return found if isinstance(found, torch.dtype) else dst_type
    return dst_type


def _synced(metric: Metric):
    """The states synced across processes exactly as ``compute`` syncs them (same function and switches), for
    methods that read the states outside ``compute``."""
    return metric.sync_context(
        dist_sync_fn=metric.dist_sync_fn, should_sync=metric._to_sync, should_unsync=metric._should_unsync
    )


def _syncs_other_processes(metric: Metric) -> bool:
    """Whether the metric's ``compute`` adds other processes' sums to its own (DDP with more than one process and
    syncing on): a process that saw no batch still has a value then."""
    import torch.distributed as dist

    if not (metric._to_sync and dist.is_available() and dist.is_initialized()):
        return False
    available = getattr(metric, "distributed_available_fn", None)  # the switch torchmetrics' sync itself reads
    if available is not None and not available():
        return False
    return dist.get_world_size(metric.process_group) > 1


def _process_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
