"""How the batch runner shares free seats between tenants: one seat at a time to the tenant with
the fewest batch jobs running (and seats given so far) per unit of its weight, so a tenant with
weight 2 gets about twice the seats of one with weight 1, and a tenant that holds many already
gets few. Seats are jobs: a line with n choices of k prompts takes n x k of them."""

from __future__ import annotations


def shares(running: dict[str, int], weights: dict[str, float], slots: int) -> dict[str, int]:
    """running: each tenant's batch jobs running now; weights: positive (missing: 1)."""
    given = dict.fromkeys(running, 0)
    if not running:
        return given
    for _ in range(max(0, slots)):
        tenant = min(running, key=lambda t: ((running[t] + given[t]) / weights.get(t, 1.0), t))
        given[tenant] += 1
    return given
