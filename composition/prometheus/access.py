"""Who may scrape ``/metrics``: a bearer token and/or a client address allowlist.

Both the web view and the worker's metrics server ask the same policy, read from settings at
each request (so ``override_settings`` applies): ``METRICS_TOKEN`` (None: no token needed) and
``METRICS_ALLOWED_NETWORKS`` (CIDRs; None or empty: any address). The address is the peer's
(``REMOTE_ADDR``): Prometheus scrapes directly, and a forwarded header could be forged.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from composition.conf import conf
from composition.prometheus.errors import MetricsAccessConfigurationError

__all__ = ["MetricsAccess", "Refusal", "parse_networks"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Refusal:
    """Why a scrape is refused: 401 (no or wrong token) or 403 (address not allowed)."""

    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)


def parse_networks(networks: Sequence[str] | None) -> tuple[Network, ...]:
    """CIDRs (a bare address is a /32 or /128) as networks; raises
    MetricsAccessConfigurationError naming a malformed one."""
    if networks is None:
        return ()
    if isinstance(networks, str):
        raise MetricsAccessConfigurationError(
            f"METRICS_ALLOWED_NETWORKS must be a list of CIDRs, not the string {networks!r}")
    parsed = []
    for network in networks:
        try:
            parsed.append(ipaddress.ip_network(str(network), strict=False))
        except ValueError as exc:
            raise MetricsAccessConfigurationError(f"METRICS_ALLOWED_NETWORKS: {network!r} is not a CIDR: {exc}") \
                from None
    return tuple(parsed)


@dataclass(frozen=True)
class MetricsAccess:
    """The policy: open when neither a token nor networks are set."""

    token: str | None = None
    networks: tuple[Network, ...] = ()

    @classmethod
    def from_settings(cls) -> MetricsAccess:
        token = conf.METRICS_TOKEN
        if token is not None and (not isinstance(token, str) or not token):
            raise MetricsAccessConfigurationError("METRICS_TOKEN must be a non-empty string or None")
        return cls(token=token, networks=parse_networks(conf.METRICS_ALLOWED_NETWORKS))

    def refusal(self, *, authorization: str | None, client_address: str | None) -> Refusal | None:
        """None when the scrape may go ahead; else why not. The address is checked first, so a
        caller from outside the allowlist learns nothing about the token."""
        if self.networks and not self._address_allowed(client_address):
            return Refusal(403, "client address not allowed")
        if self.token is not None and not self._token_matches(authorization):
            return Refusal(401, "bearer token required", {"WWW-Authenticate": 'Bearer realm="metrics"'})
        return None

    def _address_allowed(self, client_address: str | None) -> bool:
        try:
            address = ipaddress.ip_address((client_address or "").split("%")[0])
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
        return any(address in network for network in self.networks)

    def _token_matches(self, authorization: str | None) -> bool:
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or self.token is None:
            return False
        # Constant time, so the answer's timing does not leak how much of a guess was right.
        return hmac.compare_digest(presented.strip().encode(), self.token.encode())
