"""Scaling operations: `kvferry worker --drain`, the local autoscaler of `kvferry serve --autoscale`."""
