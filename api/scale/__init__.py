"""Horizontal scaling: the one policy (policy.py) and the figures it reads (signal.py), exposed on
/metrics as kvferry_desired_workers for KEDA and for `kvferry serve --autoscale`."""
