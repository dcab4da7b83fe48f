"""A cluster scaler's view of the node agents: discovery (which agents there are)."""

from keda_gpu_scaler.sources.agents.discovery import (
    AgentDiscovery,
    AgentsSpec,
    DiscoveryStatistics,
    DnsAgents,
    DnsDiscovery,
    EndpointsAgents,
    EndpointSliceDiscovery,
    StaticAgents,
    StaticDiscovery,
    discovery_for,
    parse_agents,
)

__all__ = [
    "AgentDiscovery",
    "AgentsSpec",
    "DiscoveryStatistics",
    "DnsAgents",
    "DnsDiscovery",
    "EndpointSliceDiscovery",
    "EndpointsAgents",
    "StaticAgents",
    "StaticDiscovery",
    "discovery_for",
    "parse_agents",
]
