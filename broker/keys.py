"""Every queue name and Redis key format kvferry uses, defined here and nowhere else.

No key may spell another, whatever a tenant, job, file or batch id holds (a tenant named `active`
once read the runner's global list of active batches). The rule that keeps it so: a format with a
caller's string in it ends in a suffix of its own family (`kvferry:<family>:{x}:<suffix>`), no
suffix of a family ends another one of it (so `{x}:<a>` never equals `{y}:<b>`), and no global key
lies under a family's prefix. tests/broker/test_keys.py checks it over crafted names."""

from __future__ import annotations

PREFIX = "kvferry"
SHARED_QUEUE = "kvferry.shared"
GENERATE_TASK = "kvferry.generate"  # public API: producers may send_task() it by name

# kombu's Redis transport keeps unacknowledged messages here (its defaults; see broker/celery_app.py).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


def worker_queue(worker_name: str) -> str:
    """The queue only this worker consumes (a session's turns are routed to it)."""
    return f"{PREFIX}.worker.{worker_name}"


def job_stream(job_id: str) -> str:
    """Redis stream of a job's events (token deltas, then done or error)."""
    return f"{PREFIX}:job:{job_id}:events"


def job_end(job_id: str) -> str:
    """Redis stream holding only a copy of the job's first final event: a non-streaming reader
    waits for it with one blocking read instead of following every token."""
    return f"{PREFIX}:job:{job_id}:end"


def job_written(job_id: str) -> str:
    """Hash: how far the job's stream goes (t: the next token index, c: the next text character,
    f: its final event is in): the fenced append (broker/jobs/events.py) refuses what it holds."""
    return f"{PREFIX}:job:{job_id}:written"


def job_engine_failures(job_id: str) -> str:
    """Counter: how many attempts of the job ended in an engine failure (the attempt cap reads it;
    lease takes after worker deaths are not counted)."""
    return f"{PREFIX}:job:{job_id}:engine-failures"


def job_stages(job_id: str) -> str:
    """Hash: when the worker's attempt passed each stage (unix seconds), for `bench queue`."""
    return f"{PREFIX}:job:{job_id}:stages"


def job_meta(job_id: str) -> str:
    """Hash: what the api knew when it queued the job (model, queue, route reason, times)."""
    return f"{PREFIX}:job:{job_id}:meta"


def job_cancel(job_id: str) -> str:
    """Set when a client cancels a job; the worker running it stops at its next token."""
    return f"{PREFIX}:job:{job_id}:cancel"


def worker_heartbeat(worker_name: str) -> str:
    """Hash with a TTL: a live worker's load and pool figures; gone means the worker is dead."""
    return f"{PREFIX}:worker:{worker_name}:heartbeat"


def worker_jobs(worker_name: str) -> str:
    """Set of the job ids a worker is running now (to hand back if it dies)."""
    return f"{PREFIX}:worker:{worker_name}:jobs"


WORKERS = f"{PREFIX}:workers"  # set of every worker name that has ever announced itself
REAPER_LOCK = f"{PREFIX}:reaper:lock"
# Which worker is the fleet's sweeper now (workers/jobs/sweeper_lease.py): a redis-py Lock its
# holder renews every maintenance pass; only it reaps, sweeps orphans, resends and sweeps sessions.
SWEEPER_LEASE = f"{PREFIX}:sweeper:lease"
# The Redis KV tier's report (kvstore/redis/report.py's read_report, JSON), published by one worker
# at a time (the lock) for the api's /metrics: the api never reads the KV tier itself.
TIER_REPORT = f"{PREFIX}:tier:report"
TIER_REPORT_LOCK = f"{PREFIX}:tier:report:lock"
# Interactive requests flow somewhere in the fleet while this key lives: a worker starting one sets
# it with a TTL of the batch sizer's linger; every worker reads it (workers/jobs/interactive_presence.py).
INTERACTIVE_FLOWING = f"{PREFIX}:interactive:flowing"


def session_member(tenant: str, session_id: str) -> str:
    """A session's name across tenants: length-prefixed, so no (tenant, id) pair can spell another's
    whatever characters they hold. The member of SESSION_EXPIRY and the tail of its record's key."""
    return f"{len(tenant)}:{tenant}:{session_id}"


def parse_session_member(member: str) -> tuple[str, str]:
    """(tenant, session id) of a session_member(); ValueError if it is not one."""
    length, sep, rest = member.partition(":")
    if not sep or not length.isdigit() or rest[int(length) : int(length) + 1] != ":":
        raise ValueError(f"not a session member: {member!r}")
    return rest[: int(length)], rest[int(length) + 1 :]


def session(tenant: str, session_id: str) -> str:
    """The session's record (JSON of broker.messages.SessionRecord), in its tenant's namespace."""
    return f"{PREFIX}:session:{session_member(tenant, session_id)}"


def session_deleted(tenant: str, session_id: str) -> str:
    """When the session was last deleted (a tombstone): a turn that began before cannot revive it.
    A prefix of its own: under `session:`, the id "x:deleted" would name session x's tombstone."""
    return f"{PREFIX}:session-deleted:{session_member(tenant, session_id)}"


def session_tokens(tenant: str, session_id: str) -> str:
    """The exact token ids of the session's last turn and a digest of its conversation (binary,
    broker/sessions/tokens.py): the next turn reuses them instead of re-tokenising the history.
    A prefix of its own: under `session:`, the id "x:tokens" would name session x's tokens."""
    return f"{PREFIX}:session-tokens:{session_member(tenant, session_id)}"


# ZSET session_member(tenant, id) -> when it expires (the sweep releases its pins then)
SESSION_EXPIRY = f"{PREFIX}:sessions:expiry"


def prefix_holders(digest: str) -> str:
    """ZSET of the workers that served this prompt-prefix digest (score: last use), for routing:
    broker/routing/prefix_index.py."""
    return f"{PREFIX}:prefix:{digest}:holders"


def worker_prefetch(worker_name: str) -> str:
    """LIST of prefetch hints (broker/routing/prefetch_hint.py) for this worker: sessions whose blocks it
    should load from the Redis tier now, while their turn waits in its queue."""
    return f"{PREFIX}:worker:{worker_name}:prefetch"


def job_lease(job_id: str) -> str:
    """Hash with a TTL: which worker runs the job now (owner, epoch); renewed while it runs."""
    return f"{PREFIX}:job:{job_id}:lease"


def job_epoch(job_id: str) -> str:
    """Counter: the job's fencing token, raised by every lease taken; old epochs' writes are refused."""
    return f"{PREFIX}:job:{job_id}:epoch"


PENDING_JOBS = f"{PREFIX}:jobs:pending"  # ZSET job id -> when sent: queued, not yet started


def job_message(job_id: str) -> str:
    """A queued job's message (JSON: the encoded job and its queue) until a worker starts it: kombu's
    Redis transport pops a message before it records it as unacked, so a worker killed in between
    loses it; from this copy it is sent again (workers/jobs/lost_messages.py)."""
    return f"{PREFIX}:job:{job_id}:message"


def job_delivery(job_id: str) -> str:
    """String with a TTL: where a queued job's message went (broker/jobs/delivery.py: its delivery
    tag, queue and submit time), the lost-message check's own small record: no prompt."""
    return f"{PREFIX}:job:{job_id}:delivery"


def message_job(delivery_tag: str) -> str:
    """String with a TTL: the job id of the Celery message with this delivery tag ("" for a message
    that is no job of ours): the orphan sweep reads it instead of the message's payload."""
    return f"{PREFIX}:message:{delivery_tag}:job"


# ZSET queue -> the latest submit time of a job a worker started from it: a pending job submitted
# well before that was popped already (each queue is first in, first out).
QUEUES_STARTED = f"{PREFIX}:queues:started"


def tenant_jobs(tenant: str) -> str:  # the tenant family: kvferry:tenant:{tenant}:<suffix>
    """ZSET job id -> deadline: a tenant's jobs not yet finished (the per-tenant job limit)."""
    return f"{PREFIX}:tenant:{tenant}:jobs"


def file_record(file_id: str) -> str:
    """Hash: an uploaded or generated file's metadata (api/files/records.py); its contents live in
    the file store (a directory by default), never in Redis."""
    return f"{PREFIX}:file:{file_id}:record"


def file_readers(file_id: str) -> str:
    """SET of the batches, not yet ended, that read this file as their input: while any does, the
    file cannot be deleted (api/files/records.py)."""
    return f"{PREFIX}:file:{file_id}:readers"


def tenant_files(tenant: str) -> str:
    """ZSET file id -> when it was saved: a tenant's files, for GET /v1/files."""
    return f"{PREFIX}:tenant:{tenant}:files"


# Fair dispatch (api/dispatch/): admission at the api decides, inside the submit script, whether a
# job goes straight to its queue or is parked; the elected dispatcher releases parked jobs.
# ZSET job id -> deadline: every released, unfinished job (interactive or batch); it leaves at
# its final event (the worker's append script), on cancel, when the api sees its end, or at its
# deadline (pruned before every count).
INFLIGHT = f"{PREFIX}:inflight"
PARKED = f"{PREFIX}:parked"  # ZSET job id -> when parked: every parked job, not yet released
PARKED_TENANTS = f"{PREFIX}:parked:tenants"  # SET of the tenants that may have parked jobs
# Which api is the dispatcher now (api/dispatch/lease.py): token "<api>|<uuid>"; the release
# script runs only under the token it holds (a fence against a stalled former holder).
DISPATCH_LEASE = f"{PREFIX}:dispatch:lease"


def tenant_inflight(tenant: str) -> str:
    """ZSET job id -> deadline: a tenant's released, unfinished interactive jobs (its fair share)."""
    return f"{PREFIX}:tenant:{tenant}:inflight"


def tenant_parked(tenant: str) -> str:
    """ZSET job id -> band x 1e10 + park time: a tenant's parked jobs, released lowest first."""
    return f"{PREFIX}:tenant:{tenant}:parked"


def job_parked(job_id: str) -> str:
    """Hash with a TTL: what releasing a parked job writes (its queue list key, Celery payload,
    delivery tag and queue, tenant, deadline, TTL). A parked job has its metadata and message copy
    but no pending entry, so the lost-message sweep never resends it until it is released."""
    return f"{PREFIX}:job:{job_id}:parked"


def batch_record(batch_id: str) -> str:
    """Hash: a batch's record (api/batches/records.py): its OpenAI fields, tenant, counts and the
    runner's cursor into its input file."""
    return f"{PREFIX}:batch:{batch_id}:record"


def tenant_batches(tenant: str) -> str:
    """ZSET batch id -> created_at: a tenant's batches, for GET /v1/batches."""
    return f"{PREFIX}:tenant:{tenant}:batches"


def batch_running(batch_id: str) -> str:
    """Hash line number -> the line's fed jobs (JSON): a batch's lines fed and not yet written."""
    return f"{PREFIX}:batch:{batch_id}:running"


BATCHES_ACTIVE = f"{PREFIX}:batches:active"  # ZSET batch id -> created_at: not yet ended
# The api that runs every batch (api/batches/lease.py): "<epoch>|<api>", with a TTL. The epoch is
# BATCH_RUNNER_EPOCH, raised by every take: the fencing token every runner write is checked against.
BATCH_RUNNER_LEASE = f"{PREFIX}:batches:runner:lease"
BATCH_RUNNER_EPOCH = f"{PREFIX}:batches:runner:epoch"


# Retention and quotas (api/files/quota.py, api/files/sweeper.py, api/batches/quota.py).
def tenant_file_sizes(tenant: str) -> str:
    """Hash file id -> bytes: the files a tenant stores, for its quotas (a file whose record has
    expired leaves it at the next count)."""
    return f"{PREFIX}:tenant:{tenant}:file-bytes"


def tenant_open_batches(tenant: str) -> str:
    """ZSET batch id -> when admitted: a tenant's batches that may not have ended, for its quota
    (an ended one leaves it at the next count)."""
    return f"{PREFIX}:tenant:{tenant}:open-batches"


# Which api sweeps the file store (expired contents, orphans): a Lock, as the dispatcher's.
FILES_SWEEPER_LEASE = f"{PREFIX}:files:sweeper:lease"


# The Responses API (api/responses/): a stored response and a conversation, each under its tenant
# (session_member's length prefix: no (tenant, id) pair spells another's) and ending in a suffix of
# its family, so an id such as "resp_x:final" names no key at all (a GET of it is a 404).
def response_record(tenant: str, response_id: str) -> str:
    """A stored response (JSON of api/responses/record.py's ResponseRecord), TTL response_ttl_s."""
    return f"{PREFIX}:response:{session_member(tenant, response_id)}:record"


def response_final(tenant: str, response_id: str) -> str:
    """Set (NX) by whoever applies the response's end first: it is applied once."""
    return f"{PREFIX}:response:{session_member(tenant, response_id)}:final"


def conversation_record(tenant: str, conversation_id: str) -> str:
    """A conversation's metadata (JSON), TTL response_ttl_s from its last append."""
    return f"{PREFIX}:conversation:{session_member(tenant, conversation_id)}:record"


def conversation_items(tenant: str, conversation_id: str) -> str:
    """LIST of a conversation's items (JSON each), in order; the same TTL as its record."""
    return f"{PREFIX}:conversation:{session_member(tenant, conversation_id)}:items"
