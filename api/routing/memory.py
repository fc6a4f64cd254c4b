"""RoutingMemory: what one api process remembers between routing decisions, kept on its context
(api/context.py) and handed to every decision (api/routing/router.py): the jobs it routed lately
and the prefixes of the session first turns it sent (api/routing/recent.py), the sessions between
turns by worker (api/routing/homed.py), and the round-robin turn. One per api process; a test or
a benchmark builds its own."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from api.routing.homed import HomedSessions
from api.routing.recent import RecentRoutes, RoutedPrefixes


@dataclass(slots=True)
class RoutingMemory:
    routes: RecentRoutes = field(default_factory=RecentRoutes)
    prefixes: RoutedPrefixes = field(default_factory=RoutedPrefixes)
    homes: HomedSessions = field(default_factory=HomedSessions)
    turns: itertools.count[int] = field(default_factory=itertools.count)  # routing = "round-robin"

    def prefilled(self, job_id: str) -> None:
        """The api saw the job's first token: its prefill no longer counts (RecentRoutes)."""
        self.routes.prefilled(job_id)

    def ended(self, job_id: str) -> None:
        """The api saw the job end: neither its prefill nor its seat counts any more (RecentRoutes)."""
        self.routes.ended(job_id)
        self.homes.ended(job_id)
