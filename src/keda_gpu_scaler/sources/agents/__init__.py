"""A cluster scaler's view of the node agents: discovery (which agents there are)."""

from keda_gpu_scaler.sources.agents.discovery import (
    AgentDiscovery,
    AgentsSpec,
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
    "DnsAgents",
    "DnsDiscovery",
    "EndpointSliceDiscovery",
    "EndpointsAgents",
    "StaticAgents",
    "StaticDiscovery",
    "discovery_for",
    "parse_agents",
]

# The link to each agent's NodeAgent.WatchNode stream: ``link`` the actor (on ``h2call``,
# one HTTP/2 gRPC call read in its protocol's callbacks, and ``pump``, which hands each
# message over as it arrives and watches for silence),
# ``updates`` the stream's rules and its updates as samples (sans-I/O), ``tls`` the client
# side of TLS to the agents.
from keda_gpu_scaler.sources.agents.link import (
    DEFAULT_MAX_MESSAGE_BYTES,
    AgentLink,
    LinkFailed,
)
from keda_gpu_scaler.sources.agents.tls import (
    AgentTlsConfig,
    AgentTlsConfigError,
    build_agent_client_context,
)
from keda_gpu_scaler.sources.agents.updates import (
    BadUpdate,
    StreamReader,
    attribution_source,
    readings_source,
)

__all__ += [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "AgentLink",
    "AgentTlsConfig",
    "AgentTlsConfigError",
    "BadUpdate",
    "LinkFailed",
    "StreamReader",
    "attribution_source",
    "build_agent_client_context",
    "readings_source",
]
