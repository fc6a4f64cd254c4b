"""The forms of the ids the api hands out (batches, files, jobs). A path id of any other form names
nothing: a 404, as an unknown id, before it comes near a Redis key (a crafted id such as
`batch_x:running` once read another key's hash and answered 500)."""

from __future__ import annotations

import re

_BATCH = re.compile(r"batch_[0-9a-f]{32}")
_FILE = re.compile(r"file-[0-9a-f]{32}")
_JOB = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_batch_id(text: str) -> bool:
    return bool(_BATCH.fullmatch(text))


def is_file_id(text: str) -> bool:
    return bool(_FILE.fullmatch(text))


def is_job_id(text: str) -> bool:
    return bool(_JOB.fullmatch(text))
