"""The namespaces a cluster scaler's pod watch covers (``--pod-namespaces``): the demand
triggers raise, the reasons a trigger of a namespace not covered gets, and the decider's
one wait for a namespace's first list, in virtual time."""

from __future__ import annotations

import logging
import re

import anyio
import pytest
from trio.testing import MockClock

from keda_gpu_scaler.domain.attribution import pods_coverage_reason, pods_unavailable_reason
from keda_gpu_scaler.domain.decision import TriggerKey
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.samples import (
    PODS_SOURCE,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    Sample,
)
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.podnamespaces import MAX_POD_NAMESPACES, PodNamespaces
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.testing import snapshot_of

# -- the demand ----------------------------------------------------------------------------


def test_triggers_start_with_none_and_grow_never_shrinking() -> None:
    demand = PodNamespaces.triggers()
    assert demand.names == frozenset()
    assert demand.on_demand
    assert not demand.watches("ml")
    demand.require("ml")
    demand.require("serving")
    demand.require("ml")
    assert demand.names == frozenset({"ml", "serving"})
    assert demand.version == 2  # a namespace named again changes nothing
    assert demand.watches("ml")
    assert str(demand) == "triggers"


def test_a_name_that_is_not_a_namespace_is_never_watched() -> None:
    demand = PodNamespaces.triggers()
    for bad in ("Upper", "../etc", "a" * 64, "", "ml/x"):
        demand.require(bad)
    assert demand.names == frozenset()
    assert demand.version == 0


def test_a_fixed_choice_stays_as_it_is() -> None:
    listed = PodNamespaces.listed(["serving", "ml"])
    listed.require("other")
    assert listed.names == frozenset({"ml", "serving"})
    assert not listed.on_demand
    assert not listed.watches("other")
    assert str(listed) == "ml,serving"
    every = PodNamespaces.every()
    every.require("other")
    assert every.names is None
    assert every.watches("anything")
    assert str(every) == "all"


def test_past_the_limit_it_becomes_every_namespace_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    demand = PodNamespaces.triggers(limit=3)
    for ns in ("a", "b", "c"):
        demand.require(ns)
    assert demand.names == frozenset({"a", "b", "c"})
    demand.require("d")
    demand.require("e")
    assert demand.names is None
    assert demand.watches("zzz")
    assert demand.version == 4
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.getMessage() == "pod watch covers every namespace from now on"
    assert "more than 3 namespaces named by triggers" in warning.__dict__["detail"]
    assert MAX_POD_NAMESPACES == 1024


@pytest.mark.trio
async def test_the_watch_is_woken_by_a_change(autojump_clock: MockClock) -> None:
    demand = PodNamespaces.triggers()
    woken: list[float] = []

    async def wait() -> None:
        await demand.wait_changed(0)
        woken.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.sleep(5.0)
        assert woken == []
        demand.require("ml")
    assert woken == [5.0]
    await demand.wait_changed(0)  # past it already: at once


@pytest.mark.parametrize(
    ("text", "names", "on_demand"),
    [
        ("triggers", frozenset(), True),
        (" triggers ", frozenset(), True),
        ("all", None, False),
        ("ml", frozenset({"ml"}), False),
        ("serving, ml,,ml", frozenset({"ml", "serving"}), False),
    ],
)
def test_parse(text: str, names: frozenset[str] | None, on_demand: bool) -> None:
    parsed = PodNamespaces.parse(text)
    assert parsed.names == names
    assert parsed.on_demand is on_demand


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "'': give triggers, all, or namespaces separated by commas"),
        (" , ", "give triggers, all, or namespaces"),
        ("ml,Serving", "'Serving' is not a namespace name (RFC 1123 label)"),
        ("ml/x", "'ml/x' is not a namespace name"),
        ("a" * 64, "is not a namespace name"),
        ("triggers,ml", "'triggers,ml': triggers stands alone, not in a list of namespaces"),
        ("ml,all", "'ml,all': all stands alone"),
        (",".join(f"ns-{i}" for i in range(1025)), "1025 namespaces: at most 1024"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PodNamespaces.parse(text)


# -- the reasons ---------------------------------------------------------------------------

NOW = 1000.0


def _pods(
    namespaces: tuple[str, ...] | None, *, on_demand: bool = True, taken_at: float = NOW
) -> PodsReading:
    return PodsReading(
        source=PODS_SOURCE,
        taken_at=taken_at,
        period_s=10.0,
        node="",
        namespaces=namespaces,
        on_demand=on_demand,
    )


def test_a_namespace_not_listed_yet_is_not_watched_yet() -> None:
    reading = _pods(("serve",))
    assert pods_coverage_reason(reading, "serve") is None
    assert pods_coverage_reason(reading, "late") == (
        "pods of namespace late are not watched yet (the cluster scaler started watching it "
        "when a trigger first named it, and the Kubernetes API has not listed its pods)"
    )
    assert pods_coverage_reason(_pods(None), "late") is None  # every namespace
    assert pods_coverage_reason(None, "late") is None  # pods_unavailable_reason says why


def test_a_namespace_outside_a_fixed_list_is_named_with_the_flag() -> None:
    reading = _pods(("ml", "serve"), on_demand=False)
    assert pods_coverage_reason(reading, "other") == (
        "pods of namespace other are not watched: not among --pod-namespaces ml,serve"
    )
    many = _pods(tuple(f"ns-{i:02}" for i in range(25)), on_demand=False)
    reason = pods_coverage_reason(many, "other")
    assert reason is not None
    assert reason.endswith(
        "--pod-namespaces ns-00,ns-01,ns-02,ns-03,ns-04,ns-05,ns-06,ns-07,ns-08,ns-09 and 15 more"
    )


def test_the_pods_reason_of_a_namespace() -> None:
    covered = snapshot_of(pods=_pods(("serve",)))
    assert pods_unavailable_reason(covered, NOW) is None
    assert pods_unavailable_reason(covered, NOW, "serve") is None
    reason = pods_unavailable_reason(covered, NOW, "late")
    assert reason is not None
    assert reason.startswith("pods of namespace late are not watched yet")
    # Stale says stale, whatever the namespace.
    stale = snapshot_of(pods=_pods(("serve",), taken_at=NOW - 31))
    assert str(pods_unavailable_reason(stale, NOW, "late")).startswith("pod labels are stale")
    # A node agent's reading holds every namespace of its node.
    node = snapshot_of(pods=_pods(None, on_demand=False))
    assert pods_unavailable_reason(node, NOW, "anything") is None


# -- the decider's wait --------------------------------------------------------------------


def _cluster_samples(now: float, namespaces: tuple[str, ...]) -> list[Sample]:
    """node-a: GPU 0 (70 %) held by late/vllm-0, GPU 1 (20 %) by serve/web-0; the pods of
    ``namespaces`` listed."""
    readings: list[Sample] = [
        GpuReading(
            source="agent/node-a",
            key=DeviceKey(f"node-a/GPU-a-{i}"),
            index=i,
            uuid=f"GPU-a-{i}",
            name="H200",
            taken_at=now,
            period_s=1.0,
            gpu_utilization=util,
            node="node-a",
        )
        for i, util in enumerate((70.0, 20.0))
    ]
    holders = tuple(
        DeviceHolder(
            namespace=ns,
            pod=pod,
            container="engine",
            resource="nvidia.com/gpu",
            device_id=f"GPU-a-{i}",
        )
        for i, (ns, pod) in enumerate((("late", "vllm-0"), ("serve", "web-0")))
    )
    pods = tuple(
        PodInfo(namespace=ns, name=pod, labels={"app": pod.split("-")[0]}, phase="Running")
        for ns, pod in (("late", "vllm-0"), ("serve", "web-0"))
        if ns in namespaces
    )
    return [
        *readings,
        PodResourcesReading(
            source="agent/node-a/pod-resources",
            taken_at=now,
            period_s=5.0,
            node="node-a",
            holders=holders,
        ),
        PodsReading(
            source=PODS_SOURCE,
            taken_at=now,
            period_s=10.0,
            node="",
            pods=pods,
            namespaces=namespaces,
            on_demand=True,
        ),
    ]


def _publish(hub: SnapshotHub, namespaces: tuple[str, ...]) -> None:
    now = anyio.current_time()
    hub.publish(fold(hub.current, _cluster_samples(now, namespaces), now))


LATE = {"podSelector": "app=vllm", "cooldownSeconds": "0"}


@pytest.mark.trio
async def test_a_namespace_named_late_is_waited_for_and_answered_once_listed(
    autojump_clock: MockClock,
) -> None:
    hub = SnapshotHub()
    demand = PodNamespaces.triggers()
    decider = Decider(hub, pod_namespaces=demand)
    _publish(hub, ("serve",))
    spec = decider.parse(LATE, "late", "so")  # GetMetricSpec: the watch starts on it
    assert demand.names == frozenset({"late"})
    started = anyio.current_time()

    async def list_late() -> None:
        await anyio.sleep(1.5)  # the namespace's first list answers
        _publish(hub, ("late", "serve"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(list_late)
        snapshot = await decider.snapshot_for(spec)
    assert anyio.current_time() - started == 1.5
    decision = decider.decide(TriggerKey("late", "so", spec), snapshot, "GetMetrics")
    assert decision.value == 70.0


@pytest.mark.trio
async def test_a_namespace_never_listed_is_waited_for_once_then_unavailable_never_0(
    autojump_clock: MockClock,
) -> None:
    hub = SnapshotHub()
    decider = Decider(hub, pod_namespaces=PodNamespaces.triggers())
    spec = decider.parse(LATE, "late", "so")

    async def others() -> None:
        # The other namespaces' readings go on meanwhile; none covers late.
        while True:
            _publish(hub, ("serve",))
            await anyio.sleep(0.5)

    async with anyio.create_task_group() as tg:
        tg.start_soon(others)
        started = anyio.current_time()
        with pytest.raises(NoData) as first:
            await decider.snapshot_for(spec)
        waited = anyio.current_time() - started
        # The wait was the first-sample wait, once: the next call answers at once.
        again_at = anyio.current_time()
        with pytest.raises(NoData) as again:
            await decider.snapshot_for(spec)
        assert anyio.current_time() == again_at
        tg.cancel_scope.cancel()
    assert waited == 2.0
    assert str(first.value).startswith("pods of namespace late are not watched yet")
    assert str(again.value) == str(first.value)


@pytest.mark.trio
async def test_the_wait_counts_from_the_call_not_from_each_wait(
    autojump_clock: MockClock,
) -> None:
    """No snapshot at all, then none covering: the two waits together last 2 s."""
    hub = SnapshotHub()
    decider = Decider(hub, pod_namespaces=PodNamespaces.triggers())
    spec = decider.parse(LATE, "late", "so")

    async def first_sample() -> None:
        await anyio.sleep(1.0)
        _publish(hub, ("serve",))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_sample)
        started = anyio.current_time()
        with pytest.raises(NoData, match="not watched yet"):
            await decider.snapshot_for(spec)
    assert anyio.current_time() - started == 2.0


@pytest.mark.trio
async def test_outside_a_fixed_list_there_is_no_wait(autojump_clock: MockClock) -> None:
    hub = SnapshotHub()
    decider = Decider(hub, pod_namespaces=PodNamespaces.listed(["serve"]))
    hub.publish(
        fold(
            hub.current,
            [
                PodsReading(
                    source=PODS_SOURCE,
                    taken_at=anyio.current_time(),
                    period_s=10.0,
                    node="",
                    namespaces=("serve",),
                )
            ],
            anyio.current_time(),
        )
    )
    spec = decider.parse(LATE, "late", "so")
    started = anyio.current_time()
    with pytest.raises(NoData) as caught:
        await decider.snapshot_for(spec)
    assert anyio.current_time() == started
    assert str(caught.value) == (
        "pods of namespace late are not watched: not among --pod-namespaces serve"
    )


@pytest.mark.trio
async def test_a_covered_namespace_and_a_node_agent_never_wait(
    autojump_clock: MockClock,
) -> None:
    hub = SnapshotHub()
    _publish(hub, ("late", "serve"))
    started = anyio.current_time()
    cluster = Decider(hub, pod_namespaces=PodNamespaces.triggers())
    snapshot = await cluster.snapshot_for(cluster.parse(LATE, "late", "so"))
    assert snapshot is hub.current
    # A node agent has no demand: its watch of its node holds every namespace.
    agent = Decider(hub)
    await agent.snapshot_for(agent.parse(LATE, "elsewhere", "so"))
    assert anyio.current_time() == started
