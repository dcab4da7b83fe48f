"""A ScaledObject as the simulator runs it: KEDA's settings, the HPA's, and the triggers.

The fields follow the ScaledObject CRD (keda.sh/v1alpha1); an unknown field of the spec, a
trigger of another scaler, or a setting the simulator does not model (``scalingModifiers``,
``podSelector``, ``...FromEnv`` keys) is refused with one line naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

from keda_gpu_scaler.app.simulate.inputs import BadInput, convert, read_yaml_documents
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.models.hpa import (
    Behavior,
    HpaSpec,
    PolicyType,
    RulesSpec,
    ScalingPolicy,
    SelectPolicy,
    TargetType,
)
from keda_gpu_scaler.models.kedaloop import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_POLLING_S,
    Fallback,
    FallbackBehavior,
    KedaSpec,
)

_E = TypeVar("_E", PolicyType, SelectPolicy, TargetType, FallbackBehavior)
_NonNegative = Annotated[int, msgspec.Meta(ge=0)]
_TOLERANCE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)m?")
_TRIGGER_TYPES = ("external", "external-push")


class _Policy(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    value: Annotated[int, msgspec.Meta(gt=0)]
    period_seconds: Annotated[int, msgspec.Meta(gt=0, le=1800)]


class _Rules(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    stabilization_window_seconds: Annotated[int, msgspec.Meta(ge=0, le=3600)] | None = None
    select_policy: str | None = None
    policies: list[_Policy] | None = None
    tolerance: int | float | str | None = None


class _Behavior(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    scale_up: _Rules | None = None
    scale_down: _Rules | None = None


class _HpaConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    behavior: _Behavior | None = None
    name: str | None = None


class _Advanced(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    horizontal_pod_autoscaler_config: _HpaConfig | None = None
    restore_to_original_replica_count: bool = False
    scaling_modifiers: dict[str, Any] | None = None


class _Fallback(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    failure_threshold: _NonNegative
    replicas: _NonNegative
    behavior: str = "static"


class _Trigger(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    type: str
    metadata: dict[str, Any]
    metric_type: str | None = None
    name: str | None = None
    use_cached_metrics: bool = False
    authentication_ref: dict[str, Any] | None = None


class _Spec(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    scale_target_ref: dict[str, Any]
    triggers: list[_Trigger]
    polling_interval: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_POLLING_S
    cooldown_period: _NonNegative = DEFAULT_COOLDOWN_S
    initial_cooldown_period: _NonNegative = 0
    idle_replica_count: _NonNegative | None = None
    min_replica_count: _NonNegative = 0
    max_replica_count: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MAX_REPLICAS
    fallback: _Fallback | None = None
    advanced: _Advanced | None = None


class _Metadata(msgspec.Struct, rename="camel"):
    name: str = "scaledobject"
    namespace: str = "default"


class _ScaledObject(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    api_version: str
    kind: str
    spec: _Spec
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    status: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Trigger:
    """One trigger of the ScaledObject, parsed by the scaler's own ``parse_trigger``."""

    index: int
    spec: TriggerSpec
    target_type: TargetType
    use_cached: bool = False
    push: bool = False

    @property
    def hpa_name(self) -> str:
        """The HPA's name of the metric: ``s<index>-<metricName>``."""
        return f"s{self.index}-{self.spec.metric_name}"


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything the simulation needs from the ScaledObject."""

    namespace: str
    name: str
    keda: KedaSpec
    hpa: HpaSpec
    triggers: tuple[Trigger, ...]
    notes: tuple[str, ...] = ()
    """What the simulator does differently (external-push), and trigger metadata warnings."""


def read_scaled_object(path: Path, *, name: str | None = None) -> Plan:
    """The ScaledObject of ``path``: its one document, or the one ScaledObject among several
    documents (a Deployment and its ScaledObject, say), or the one named ``name``."""
    docs = read_yaml_documents(path, what="ScaledObject")
    if len(docs) == 1 and name is None:
        obj = docs[0]
        if not isinstance(obj, dict):
            raise BadInput(f"{path}: not a ScaledObject (a mapping with apiVersion, kind, spec)")
        if not _is_scaled_object(obj):
            raise BadInput(
                f"{path}: apiVersion {obj.get('apiVersion')!r}, kind {obj.get('kind')!r}: only a "
                "ScaledObject (keda.sh/v1alpha1) is simulated"
            )
    else:
        obj = _pick(path, docs, name)
    return plan_of(convert(obj, _ScaledObject, origin=str(path)), origin=str(path))


def _is_scaled_object(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and doc.get("apiVersion") == "keda.sh/v1alpha1"
        and doc.get("kind") == "ScaledObject"
    )


def _name_of(doc: dict[str, Any]) -> str:
    metadata = doc.get("metadata")
    return str(metadata.get("name", "")) if isinstance(metadata, dict) else ""


def _pick(path: Path, docs: list[Any], name: str | None) -> dict[str, Any]:
    found = [d for d in docs if _is_scaled_object(d)]
    names = ", ".join(_name_of(d) or "(no name)" for d in found)
    if not found:
        kinds = ", ".join(str(d.get("kind")) if isinstance(d, dict) else "?" for d in docs)
        raise BadInput(
            f"{path}: no ScaledObject (keda.sh/v1alpha1) among its {len(docs)} documents ({kinds})"
        )
    if name is not None:
        named = [d for d in found if _name_of(d) == name]
        if not named:
            raise BadInput(f"{path}: no ScaledObject named {name!r}; there are: {names}")
        found = named
    if len(found) > 1:
        raise BadInput(f"{path}: {len(found)} ScaledObjects ({names}): choose one with --name")
    return found[0]  # type: ignore[no-any-return]


def plan_of(so: _ScaledObject, *, origin: str) -> Plan:
    spec = so.spec
    keda = _keda_spec(spec, origin)
    if spec.advanced is not None and spec.advanced.scaling_modifiers is not None:
        raise BadInput(f"{origin}: spec.advanced.scalingModifiers is not simulated")
    hpa = HpaSpec(keda.hpa_min_replicas, keda.max_replicas, _behavior(spec.advanced, origin))
    if not spec.triggers:
        raise BadInput(f"{origin}: spec.triggers: at least one trigger is needed")
    fallback = spec.fallback is not None
    triggers = tuple(
        _trigger(i, t, so.metadata.namespace, origin, fallback=fallback)
        for i, t in enumerate(spec.triggers)
    )
    if any(t.use_cached for t in triggers):
        keda = replace(keda, uses_cached_metrics=True)
    notes = [f"{t.hpa_name}: {w}" for t in triggers for w in t.spec.warnings]
    return Plan(so.metadata.namespace, so.metadata.name, keda, hpa, triggers, tuple(notes))


def _keda_spec(spec: _Spec, origin: str) -> KedaSpec:
    if spec.min_replica_count > spec.max_replica_count:
        raise BadInput(
            f"{origin}: spec.minReplicaCount {spec.min_replica_count} is above "
            f"maxReplicaCount {spec.max_replica_count}"
        )
    idle = spec.idle_replica_count
    if idle is not None and idle >= spec.min_replica_count:
        raise BadInput(
            f"{origin}: spec.idleReplicaCount {idle} must be less than minReplicaCount "
            f"{spec.min_replica_count}"
        )
    return KedaSpec(
        min_replicas=spec.min_replica_count,
        max_replicas=spec.max_replica_count,
        polling_s=spec.polling_interval,
        cooldown_s=spec.cooldown_period,
        initial_cooldown_s=spec.initial_cooldown_period,
        idle_replicas=idle,
        fallback=_fallback(spec.fallback, origin),
    )


def _fallback(raw: _Fallback | None, origin: str) -> Fallback | None:
    if raw is None:
        return None
    if raw.behavior == "scalingModifiers":
        raise BadInput(f"{origin}: spec.fallback.behavior scalingModifiers is not simulated")
    behavior = _choice(raw.behavior, FallbackBehavior, f"{origin}: spec.fallback.behavior")
    return Fallback(raw.failure_threshold, raw.replicas, behavior)


def _behavior(advanced: _Advanced | None, origin: str) -> Behavior | None:
    config = None if advanced is None else advanced.horizontal_pod_autoscaler_config
    if config is None or config.behavior is None:
        return None
    where = f"{origin}: spec.advanced.horizontalPodAutoscalerConfig.behavior"
    up = _rules(config.behavior.scale_up, f"{where}.scaleUp")
    down = _rules(config.behavior.scale_down, f"{where}.scaleDown")
    return Behavior.given(up, down)


def _rules(raw: _Rules | None, where: str) -> RulesSpec | None:
    if raw is None:
        return None
    policies = None
    if raw.policies is not None:
        if not raw.policies:
            raise BadInput(f"{where}.policies: give at least one policy, or leave it out")
        policies = tuple(
            ScalingPolicy(
                _choice(p.type, PolicyType, f"{where}.policies[{i}].type"),
                p.value,
                p.period_seconds,
            )
            for i, p in enumerate(raw.policies)
        )
    select = None
    if raw.select_policy is not None:
        select = _choice(raw.select_policy, SelectPolicy, f"{where}.selectPolicy")
    tolerance = None if raw.tolerance is None else _tolerance(raw.tolerance, f"{where}.tolerance")
    return RulesSpec(raw.stabilization_window_seconds, select, policies, tolerance)


def _tolerance(raw: int | float | str, where: str) -> float:
    """A quantity such as ``0.05`` or ``50m``, at least 0."""
    if isinstance(raw, int | float):
        value = float(raw)
    elif _TOLERANCE.fullmatch(raw):
        value = float(raw[:-1]) / 1000 if raw.endswith("m") else float(raw)
    else:
        raise BadInput(f"{where}: {raw!r} is not a quantity such as 0.05 or 50m")
    if not 0 <= value < float("inf"):
        raise BadInput(f"{where}: {raw!r} must be 0 or more")
    return value


_NO_FALLBACK = (
    "; the fallback would not replace it: KEDA builds the fallback value from the metric spec "
    "that GetMetricSpec refuses, so a trigger whose GetMetricSpec fails never falls back "
    "(kedacore/keda#8056)"
)


def _trigger(
    index: int, raw: _Trigger, namespace: str, origin: str, *, fallback: bool = False
) -> Trigger:
    where = f"{origin}: spec.triggers[{index}]"
    if raw.type not in _TRIGGER_TYPES:
        raise BadInput(
            f"{where}.type {raw.type!r}: only this scaler's triggers (external, external-push) "
            "are simulated"
        )
    target_type = TargetType.AVERAGE_VALUE
    if raw.metric_type is not None:
        if raw.metric_type == "Utilization":
            raise BadInput(f"{where}.metricType Utilization: KEDA refuses it for external triggers")
        target_type = _choice(raw.metric_type, TargetType, f"{where}.metricType")
    metadata = _metadata(raw.metadata, f"{where}.metadata")
    try:
        spec = parse_trigger(metadata, namespace)
    except InvalidTrigger as exc:
        why = _NO_FALLBACK if fallback else ""
        raise BadInput(f"{where}.metadata: {exc}{why}") from None
    if spec.pod_selector is not None:
        raise BadInput(
            f"{where}.metadata.podSelector: the simulator has no pods; leave it out (the GPUs "
            "of a load or a trace are the workload's)"
        )
    return Trigger(index, spec, target_type, raw.use_cached_metrics, raw.type == "external-push")


def _metadata(raw: dict[str, Any], where: str) -> dict[str, str]:
    for key, value in raw.items():
        if not isinstance(value, str):
            raise BadInput(f'{where}.{key}: must be a string (quote it: "{value}")')
        if key.endswith("FromEnv"):
            raise BadInput(
                f"{where}.{key}: needs the scale target's environment, which the simulator "
                f"does not have; give {key.removesuffix('FromEnv')} instead"
            )
    return raw


def _choice(raw: str, kind: type[_E], where: str) -> _E:
    try:
        return kind(raw)
    except ValueError:
        raise BadInput(f"{where} {raw!r}: must be one of {', '.join(kind)}") from None
