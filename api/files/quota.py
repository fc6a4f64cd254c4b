"""A tenant's quotas on what it stores: files (uploads and batch output), their bytes, and its
batches not yet ended (api/batches/quota.py). Passing one is a 429 in OpenAI's error shape whose
message names the limit, its value and the setting; nothing is written then.

An upload is checked before its body is read (a tenant at its cap is refused at once) and again,
atomically, as its record is saved (two uploads racing cannot both pass). A batch's output files
count but are never refused: a batch's answers are not lost to a quota."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from api.config import ApiConfig
from api.errors import ApiError
from api.files import records
from api.files.records import FileRecord, Quota

__all__ = ["over_quota", "precheck", "save_upload"]


def over_quota(message: str, code: str) -> ApiError:
    return ApiError(429, message, "rate_limit_error", code=code)


def _file_error(which: Quota, config: ApiConfig) -> ApiError:
    if which == "files":
        message = f"file quota reached: a tenant may store at most {config.tenant_max_files} files"
        return over_quota(f"{message} (KVFERRY_TENANT_MAX_FILES)", "tenant_file_limit")
    message = f"storage quota reached: a tenant's files may hold at most {config.tenant_max_file_bytes} bytes"
    return over_quota(f"{message} (KVFERRY_TENANT_MAX_FILE_BYTES)", "tenant_bytes_limit")


async def precheck(redis: Redis, tenant: str, config: ApiConfig) -> None:
    """429 when the tenant cannot store one more file (of any size)."""
    probe = FileRecord("", tenant, 0, int(time.time()), "", "")
    caps = (config.tenant_max_files, config.tenant_max_file_bytes)
    passed = await records.save(redis, probe, *caps, write=False)
    if passed is not None:
        raise _file_error(passed, config)


async def save_upload(redis: Redis, rec: FileRecord, config: ApiConfig) -> None:
    """Save an upload's record, or 429 (nothing saved) when it would pass a quota."""
    passed = await records.save(redis, rec, config.tenant_max_files, config.tenant_max_file_bytes)
    if passed is not None:
        raise _file_error(passed, config)
