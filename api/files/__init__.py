"""The files API's parts: where contents live (store.py), their metadata in Redis (records.py),
and reading an upload as it streams in (upload.py)."""
