"""A ScalableTopic's status changes as pure functions on core's typed status.

Each change the operator makes to ``status`` (record a layout or an operation's intent, commit
or roll back an operation, remember or reject a manual request, set the conditions, show the
resolved auto-scale policy) is a function here that takes a
:class:`~scalable_topics.core.resources.ScalableTopicStatus` and returns the new one. The
controller reads the status once, applies the functions inside its compare-and-swap, and writes
the result with :func:`write_status`.

The status is written by several components (the consumer hub, the recommender, the
auto-scaler) and read back by older and newer operators, so the round trip must lose nothing it
does not own: :func:`write_status` is a three-way merge that changes only what the typed status
changed, and keeps everything else exactly as it was written (fields the models do not know, a
field that does not validate, the spelling of a timestamp it did not touch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .dagview import render_dag
from .layout import SegmentLayout
from .operation import Operation, OperationKind
from .policy import Resolution
from .rebuild import request_after_rebuild
from .resources import (
    REQUEST_HISTORY,
    AutoScaleDecision,
    AutoScaleEvaluation,
    AutoScaleStatus,
    Condition,
    ConditionType,
    ControllerRef,
    LastRequest,
    ManualRequestOp,
    OperationStatus,
    Reason,
    RequestResult,
    ScalableTopicStatus,
    SubscriptionStatus,
    condition,
    format_time,
    layout_status,
    set_condition,
)

JSON = dict[str, Any]

_M = TypeVar("_M", bound=BaseModel)

StatusChange = Callable[[ScalableTopicStatus], ScalableTopicStatus]


class StatusConflict(ValueError):
    """The status does not allow the change (another operation is in flight, the layout moved
    on, the operation is gone): the caller rejects what it was about to do."""


# -- reading and writing -----------------------------------------------------------------------


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)


def read_model(model: type[_M], raw: Mapping[str, Any] | None) -> _M:
    """The typed view of ``raw`` (an object's ``status``). Lenient: a top-level field that does
    not validate is left out of the view (and :func:`write_status` keeps it as written unless a
    change sets it), so one bad field written by another component stops no status change."""
    data = dict(raw or {})
    while True:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
            if not bad & set(data):
                raise
            for key in bad:
                data.pop(key, None)


def read_status(raw: Mapping[str, Any] | None) -> ScalableTopicStatus:
    """A ScalableTopic's ``status``, typed (:func:`read_model`)."""
    return read_model(ScalableTopicStatus, raw)


def _merge(raw: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> JSON:
    merged = dict(raw)
    for key in {*old, *new}:
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if after is None:
            merged.pop(key, None)
        elif isinstance(after, dict) and isinstance(before, dict):
            current = raw.get(key)
            merged[key] = _merge(current if isinstance(current, dict) else {}, before, after)
        else:
            merged[key] = after
    return merged


def write_status(raw: Mapping[str, Any] | None, before: BaseModel, after: BaseModel) -> JSON:
    """``raw`` with what changed from ``before`` (read from ``raw``) to ``after``: a field (or
    an object's key, recursively) whose typed value did not change is kept exactly as written;
    one set to ``None`` is removed; a changed list is written whole."""
    return _merge(raw or {}, _dump(before), _dump(after))


def apply_change(raw: Mapping[str, Any] | None, change: StatusChange) -> JSON:
    """Read ``raw``, apply ``change``, write the result back onto ``raw`` (a new dict)."""
    before = read_status(raw)
    return write_status(raw, before, change(before))


def _update(status: ScalableTopicStatus, **fields: Any) -> ScalableTopicStatus:
    return status.model_copy(update=fields)


# -- layout ------------------------------------------------------------------------------------


def layout_from(status: ScalableTopicStatus) -> SegmentLayout | None:
    """``status.layout`` as a layout (``None`` when absent or unreadable)."""
    if not status.layout:
        return None
    try:
        return SegmentLayout.from_metadata(status.layout)
    except (ValueError, TypeError, AttributeError):
        return None


def with_layout(status: ScalableTopicStatus, layout: SegmentLayout) -> ScalableTopicStatus:
    """``layout`` as the topic's DAG: ``status.layout`` and the fields derived from it
    (``epoch``, ``nextSegmentId``, ``activeSegments``, ``dag``)."""
    return _update(
        status,
        layout=layout_status(layout),
        epoch=layout.epoch,
        next_segment_id=layout.next_segment_id,
        active_segments=len(layout.active()),
        dag=render_dag(layout),
    )


def without_layout(status: ScalableTopicStatus) -> ScalableTopicStatus:
    """Nothing exists for the topic: no layout, no epoch, no DAG, 0 active segments."""
    return _update(
        status, layout=None, epoch=None, next_segment_id=None, dag=None, active_segments=0
    )


# -- conditions --------------------------------------------------------------------------------

ConditionState = tuple[bool, str, str]
"""A condition's (status, reason, message)."""


def put_condition(conditions: Sequence[Condition], new: Condition) -> list[Condition]:
    """``new`` in place of the condition of its type (appended if absent). Strimzi style: the
    ``lastTransitionTime`` is kept while the status stays the same, so a re-asserted condition
    is no change and moves no time."""
    merged = set_condition([_dump(c) for c in conditions], _dump(new))
    return [Condition.model_validate(c) for c in merged]


def with_conditions(
    status: ScalableTopicStatus,
    states: Mapping[str, ConditionState],
    *,
    generation: int | None,
    now: float,
) -> ScalableTopicStatus:
    """Each condition type of ``states`` set to its (status, reason, message), observed at
    ``generation``; ``observedGeneration`` follows."""
    conditions = list(status.conditions)
    for type_, (value, reason, message) in states.items():
        new = condition(type_, value, reason, message, generation, now)
        conditions = put_condition(conditions, Condition.model_validate(new))
    return _update(status, conditions=conditions, observed_generation=generation)


def not_ready(
    status: ScalableTopicStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: float,
    stalled: bool = False,
    unbuilt: bool = False,
) -> ScalableTopicStatus:
    """Ready=False with ``reason``; Stalled=True with it when a person has to act
    (``stalled``), else Reconciling=True (the operator retries). ``unbuilt``: nothing exists
    for the topic, and the status says so whatever an earlier pass wrote."""
    status = with_conditions(
        status,
        {
            ConditionType.READY: (False, reason, message),
            ConditionType.STALLED: (
                stalled,
                reason if stalled else Reason.IDLE,
                message if stalled else "",
            ),
            ConditionType.RECONCILING: (
                not stalled,
                Reason.IDLE if stalled else Reason.CREATING,
                "" if stalled else message,
            ),
        },
        generation=generation,
        now=now,
    )
    return without_layout(status) if unbuilt else status


_RECONCILING_REASONS = {
    OperationKind.SPLIT: Reason.SPLITTING,
    OperationKind.MERGE: Reason.MERGING,
    OperationKind.REBUCKET: Reason.REBUCKETING,
}


def reconciling_state(
    operation: OperationStatus | None, leftovers: Sequence[int]
) -> ConditionState:
    """Reconciling: an operation in flight, else pruned segments waiting for their broker pods
    (``leftovers``), else idle."""
    if operation is not None:
        return (
            True,
            _RECONCILING_REASONS[operation.kind],
            f"{operation.kind.value} {operation.id} at phase {operation.phase.value}",
        )
    if leftovers:
        return (
            True,
            Reason.PRUNING,
            f"segments {list(leftovers)} left the DAG and wait for their broker pods to be "
            "deleted there",
        )
    return (False, Reason.IDLE, "")


def reconciled(
    status: ScalableTopicStatus,
    layout: SegmentLayout,
    *,
    generation: int | None,
    now: float,
    controller: ControllerRef,
    leftovers: Sequence[int] = (),
    problem: tuple[str, str] | None = None,
) -> ScalableTopicStatus:
    """The level-based status at the end of a pass: the conditions (``problem``, a (reason,
    message) that needs a person, makes Ready=False and Stalled=True), the layout's derived
    fields, the leader, and the request history caught up."""
    active = len(layout.active())
    if problem is None:
        ready: ConditionState = (
            True,
            Reason.RECONCILED,
            f"{active} active segment(s) at epoch {layout.epoch}",
        )
        stalled: ConditionState = (False, Reason.IDLE, "")
    else:
        ready = (False, problem[0], problem[1])
        stalled = (True, problem[0], problem[1])
    status = with_conditions(
        status,
        {
            ConditionType.READY: ready,
            ConditionType.RECONCILING: reconciling_state(status.operation, leftovers),
            ConditionType.STALLED: stalled,
        },
        generation=generation,
        now=now,
    )
    status = _update(
        status,
        epoch=layout.epoch,
        next_segment_id=layout.next_segment_id,
        active_segments=active,
        dag=render_dag(layout),
    )
    return remember_request(with_controller(status, controller, now))


def with_controller(
    status: ScalableTopicStatus, controller: ControllerRef, now: float
) -> ScalableTopicStatus:
    """The leader of the topic; ``since`` moves only when the leading pod changes (or was
    never set)."""
    previous = status.controller or ControllerRef()
    fields = {k: v for k, v in controller.model_dump().items() if k in controller.model_fields_set}
    new = previous.model_copy(update=fields)
    if previous.pod != controller.pod or not previous.since:
        new = new.model_copy(update={"since": format_time(now)})
    return _update(status, controller=new)


# -- manual requests ---------------------------------------------------------------------------


def find_handled(status: ScalableTopicStatus, request_id: str) -> LastRequest | None:
    """The recorded outcome of request ``request_id`` if the topic already handled it
    (``lastRequest`` or one of ``recentRequests``)."""
    if status.last_request is not None and status.last_request.id == request_id:
        return status.last_request
    return next((e for e in status.recent_requests if e.id == request_id), None)


def remember_request(
    status: ScalableTopicStatus, limit: int = REQUEST_HISTORY
) -> ScalableTopicStatus:
    """``lastRequest`` folded into ``recentRequests``: appended when its id is not there yet
    (message cut to 256 characters), the oldest entries dropped beyond ``limit``. Whoever
    records an outcome in ``lastRequest`` only (the operation's commit) is caught up by the
    next call, which the leader makes before it starts any other request."""
    last = status.last_request
    if last is None or not last.id or any(e.id == last.id for e in status.recent_requests):
        return status
    entry = last.model_copy(update={"message": last.message[:256]})
    return _update(status, recent_requests=[*status.recent_requests, entry][-limit:])


def with_request_outcome(status: ScalableTopicStatus, outcome: LastRequest) -> ScalableTopicStatus:
    """``outcome`` as ``lastRequest``, the previous one kept in the history first."""
    status = remember_request(status)
    return _update(
        status, last_request=outcome.model_copy(update={"message": outcome.message[:1024]})
    )


def reject_request(
    status: ScalableTopicStatus, request_id: str, op: str, message: str, now: float
) -> ScalableTopicStatus:
    """A request that is not executed: ``lastRequest`` says Rejected and why, and it joins the
    history at once (an id listed there is never executed again). ``op`` outside split, merge
    and move is recorded as split (the status schema knows no other)."""
    outcome = LastRequest(
        id=request_id,
        op=ManualRequestOp(op) if op in set(ManualRequestOp) else ManualRequestOp.SPLIT,
        result=RequestResult.REJECTED,
        message=message,
        completed_at=format_time(now),
    )
    return remember_request(with_request_outcome(status, outcome))


def report_handled(status: ScalableTopicStatus, handled: LastRequest) -> ScalableTopicStatus:
    """A request id found in the history was applied again: ``lastRequest`` reports it with its
    original outcome and says it is not executed again."""
    result = handled.result.value
    when = handled.completed_at or "an unknown time"
    note = f"already handled ({result} at {when}), not executed again"
    message = f"{note}: {handled.message}".rstrip(": ")
    status = remember_request(status)
    return _update(status, last_request=handled.model_copy(update={"message": message[:1024]}))


# -- operations --------------------------------------------------------------------------------


def record_intent(status: ScalableTopicStatus, operation: Operation) -> ScalableTopicStatus:
    """Step 1 of the protocol: ``operation`` as ``status.operation``. :class:`StatusConflict`
    while another operation is in flight or the layout is no longer the one it was planned
    on."""
    if status.operation is not None and status.operation.id != operation.id:
        raise StatusConflict(f"operation {status.operation.id} is in flight")
    layout = layout_from(status)
    if layout is None or layout.epoch != operation.base_epoch:
        raise StatusConflict(
            f"layout moved on (epoch {layout.epoch if layout else None}, "
            f"planned on {operation.base_epoch})"
        )
    return _update(status, operation=OperationStatus.model_validate(operation.to_status()))


def record_phase(status: ScalableTopicStatus, operation: Operation) -> ScalableTopicStatus:
    """The phase ``operation`` reached; :class:`StatusConflict` when it is no longer in
    flight."""
    if status.operation is None or status.operation.id != operation.id:
        raise StatusConflict(f"operation {operation.id} is no longer in status")
    return _update(status, operation=OperationStatus.model_validate(operation.to_status()))


def commit_operation(
    status: ScalableTopicStatus, operation: Operation, now: float, message: str
) -> ScalableTopicStatus:
    """The layout commit: the layout after ``operation``, the intent cleared, ``lastSplitAt`` or
    ``lastMergeAt``, and a manual request's outcome (Succeeded, ``message``) in ``lastRequest``.
    Unchanged when it was committed already (the layout is past its base epoch);
    :class:`StatusConflict` when the operation is gone otherwise or the topic has no layout."""
    layout = layout_from(status)
    if status.operation is None or status.operation.id != operation.id:
        if layout is not None and layout.epoch > operation.base_epoch:
            return status
        raise StatusConflict(f"operation {operation.id} is no longer in status")
    if layout is None:
        raise StatusConflict("the topic has no layout")
    status = _update(with_layout(status, operation.apply(layout)), operation=None)
    when = format_time(now)
    if operation.kind is OperationKind.SPLIT:
        status = _update(status, last_split_at=when)
    elif operation.kind is OperationKind.MERGE:
        status = _update(status, last_merge_at=when)
    if operation.request_id:
        status = _update(
            status,
            last_request=_operation_outcome(operation, RequestResult.SUCCEEDED, message, when),
        )
    return status


def _operation_outcome(
    operation: Operation, result: RequestResult, message: str, when: str
) -> LastRequest:
    """``lastRequest`` for the manual request that ``operation`` carried out."""
    return LastRequest.model_validate(
        {
            "id": operation.request_id,
            "op": operation.kind.value,
            "result": result,
            "message": message,
            "completedAt": when,
        }
    )


def roll_back_operation(
    status: ScalableTopicStatus, operation: Operation, why: str, now: float
) -> ScalableTopicStatus:
    """The intent cleared (if it is still ``operation``'s) and a manual request's outcome
    (Failed, rolled back: ``why``) in ``lastRequest``."""
    if status.operation is not None and status.operation.id == operation.id:
        status = _update(status, operation=None)
    if operation.request_id:
        outcome = _operation_outcome(
            operation, RequestResult.FAILED, f"rolled back: {why}", format_time(now)
        )
        status = _update(status, last_request=outcome)
    return status


# -- a rebuilt layout --------------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    """The status with a rebuilt layout, the id of the interrupted operation it resumes and the
    id of the request it reports as not run again (``None`` each when there is none)."""

    status: ScalableTopicStatus
    resumed: str | None = None
    unrun: str | None = None


def restore_layout(
    status: ScalableTopicStatus,
    layout: SegmentLayout,
    *,
    subscriptions: Sequence[Mapping[str, Any]],
    operation: Operation | None,
    request_annotation: str | None,
    now: float,
) -> Restored | None:
    """A layout rebuilt from the Segments and the brokers (``core.rebuild``) written into a
    status that lost it; ``None`` when the status has a layout (another writer came first).

    ``subscriptions`` (``rebuild.subscription_entries``) are written only where the status has
    none: they are what the consumer hub restores from, and without them a new leader would
    count every sealed segment drained. An operation still in the status (only the layout went)
    is rebased on the rebuilt epoch and wins over ``operation``, the one found interrupted in the
    records. The request annotation is matched against it (``rebuild.request_after_rebuild``):
    a request that is not that operation is reported as not run again, unless ``lastRequest``
    already says something."""
    if status.layout:
        return None
    status = with_layout(status, layout)
    if not status.subscriptions:
        status = _update(
            status, subscriptions=[SubscriptionStatus.model_validate(e) for e in subscriptions]
        )
    if status.operation is not None:
        try:
            found = Operation.from_status(_dump(status.operation))
            operation = replace(found, base_epoch=layout.epoch)
        except ValueError:
            pass
    operation, last = request_after_rebuild(request_annotation, operation, format_time(now))
    resumed = unrun = None
    if operation is not None:
        status = _update(status, operation=OperationStatus.model_validate(operation.to_status()))
        resumed = operation.id
    if last is not None and status.last_request is None:
        status = _update(status, last_request=LastRequest.model_validate(last))
        unrun = str(last["id"])
    return Restored(status, resumed, unrun)


def with_new_subscriptions(
    status: ScalableTopicStatus, entries: Sequence[Mapping[str, Any]]
) -> ScalableTopicStatus:
    """``entries`` added to ``status.subscriptions`` for the subscriptions it has no entry of
    (an entry there is newer: the consumer hub wrote it), the list kept sorted by name as the
    hub writes it."""
    have = {s.name for s in status.subscriptions}
    added = [SubscriptionStatus.model_validate(e) for e in entries if e.get("name") not in have]
    if not added:
        return status
    merged = sorted([*status.subscriptions, *added], key=lambda s: s.name)
    return _update(status, subscriptions=merged)


# -- auto-scale policy -------------------------------------------------------------------------


def with_policy(
    status: ScalableTopicStatus, resolution: Resolution | None, problem: str | None
) -> ScalableTopicStatus:
    """``status.autoScale``'s effective policy and each knob's source (none while the levels do
    not combine: ``problem`` says why), leaving the auto-scaler's own keys as they are."""
    auto = status.auto_scale or AutoScaleStatus()
    if resolution is None:
        kept = {k: v for k, v in _dump(auto).items() if k not in ("mode", "policy", "sources")}
        auto = AutoScaleStatus.model_validate(kept)
    else:
        auto = auto.model_copy(
            update={
                "mode": resolution.mode.value,
                "policy": resolution.shown(),
                "sources": resolution.shown_sources(),
            }
        )
    auto = auto.model_copy(update={"problem": problem or None})
    return _update(status, auto_scale=auto)


def with_evaluation(
    status: ScalableTopicStatus, result: str, reasons: Sequence[str], message: str, now: float
) -> ScalableTopicStatus:
    """The auto-scaler's latest outcome (``autoScale.lastEvaluation``); unchanged while the
    result, reasons and message are the same, so ``since`` is when this outcome began."""
    auto = status.auto_scale or AutoScaleStatus()
    previous = auto.last_evaluation
    if (
        previous is not None
        and previous.result == result
        and list(previous.reasons) == list(reasons)
        and previous.message == message
    ):
        return status
    evaluation = AutoScaleEvaluation(
        result=result, reasons=list(reasons), message=message, since=format_time(now)
    )
    return _update(status, auto_scale=auto.model_copy(update={"last_evaluation": evaluation}))


def with_decision(status: ScalableTopicStatus, decision: AutoScaleDecision) -> ScalableTopicStatus:
    """The auto-scaler's last decision (``autoScale.lastDecision``)."""
    auto = status.auto_scale or AutoScaleStatus()
    return _update(status, auto_scale=auto.model_copy(update={"last_decision": decision}))
