"""`kvferry bench autoscale`: the scaling policy (api/scale/policy.py) on a seeded bursty trace, in
a fleet model of simulated-engine workers, against static fleets."""
