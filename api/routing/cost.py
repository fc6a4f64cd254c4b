"""What a job would cost on each worker, for cache-aware routing (api/routing/router.py): the prefill left
after that worker's cache hit, plus the work already ahead of it there, in one unit, token
equivalents (the time one prompt token takes to compute).

Sending every job to the worker that holds its prefix piles sessions on one worker; sending it
to the least loaded one recomputes (or reloads) what another holds. Like Dynamo's KV router (new
prefill blocks weighed against a worker's active blocks) and SGLang's (cache affinity unless the
load is out of balance by a threshold), the router takes the worker of least expected cost, and
leaves the worker that holds the most of the prompt only when that saves more than MOVE_MARGIN
(SESSION_MOVE_MARGIN where that is the session's own worker, for one with room only).

The api has no tokenizer on the hot path, so a prompt's length is estimated from its characters
(CHARS_PER_TOKEN, the usual rate for English text under byte-pair encodings). The weights, reasoned
from the CPU figures in docs/benchmarks.md:

- DECODE_ROW: a sequence running on a worker when the job arrives costs the job's first token a
  few prompt tokens' time in each step they share (a decode row's share of a batch step against
  the per-token time of a prompt), over the step or two the job's prefill takes; served, a row
  costs about twice its engine share (its token streamed through Redis and the api each step:
  the served TPOT against the engine's step), hence twice that again.
- SEAT_WAIT: a sequence waiting on a worker (for a seat, or for room in its pool) is not a row
  the job shares steps with but a queue it joins: the job starts only after each one ahead has
  been admitted, each when a running sequence ends. One seat frees every (reply tokens /
  running rows) steps of (running rows x a row's step) time, so a waiting sequence ahead costs
  about a reply's tokens times a row's share of a step: tens of tokens (a chat reply) at half a
  DECODE_ROW each. Once a worker shows sequences waiting, it is full: the jobs routed to it since
  (and those its Celery threads hold) wait too, and a job seen ending there frees a seat for one
  of them rather than a row. Counted as rows, a queue of sequences looked no costlier than as
  many decodes, and a job was sent to a worker with more of them waiting.
- LOAD_FIXED + LOAD_SHARE per token: tokens missing on a worker but in the Redis tier (the session's
  history, or a prefix another worker served, both written through) are loaded, not computed:
  the resume rows measure a near-constant round trip plus a small share of a recompute per token.
- The backlog's jobs routed since the worker's heartbeat carry the prefill this router expected
  of them there (the heartbeat shows neither them nor their prompts yet); those this api routed
  before the heartbeat and saw end (or prefill) since are taken off it (it still counts them).
- THINKING_ROW per session living on a worker between turns (api/routing/homed.py), for a session
  settling on a worker (a new one, or one whose worker is not ready): it will live where it lands,
  and so do they; a session whose turn has just ended is back within a think time to share that
  worker's steps for a turn, a row to come (less as its silence grows: homed.py). The job's own
  first token does not wait for them, so a session staying with its worker does not count them.
- MOVE_MARGIN: the loads the router sees are up to a heartbeat old, so one job's difference is
  noise; and a move spends the cache it leaves behind.
- SESSION_MOVE_MARGIN: leaving a session's own worker reads its whole history from the Redis tier
  and leaves that copy to be evicted unused, every move again (a shared prefix left behind still
  serves the others there). The turn's load is cheap in time, but the bytes are not, and a move
  that saves rows or a short prefill saves the turn little where its worker admits it at once. So
  a session moves only to escape a queue, by more than one waiting sequence (in the heartbeat's
  age, and the fleet cache's, a seat or two turn over: a queue of one is noise), and only to a
  worker that shows none waiting (destinations()). Between two full workers a move reorders the
  fleet's queue rather than shortening it: the seats free no faster, the turn's gain is paid by the
  target's next arrivals, and its history takes pool room from the sessions living there, whose
  next turns reload what it displaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from api.routing.recent import Routed
from broker.messages import EngineFigures, GenerateJob, WorkerStatus
from broker.routing.prefix_digest import TEXT_CHUNK_CHARS

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4  # a chat template's role markers and separators per message
DECODE_ROW = 16  # token equivalents per sequence running on a worker
SEAT_WAIT = 16 * DECODE_ROW  # per sequence waiting there: a seat's turnover
LOAD_FIXED = 16  # a Redis tier fetch's round trip, in token equivalents
LOAD_SHARE = 1 / 32  # a loaded token against a computed one
THINKING_ROW = DECODE_ROW  # per session just ended on a worker, for a new session's placement
MOVE_MARGIN = DECODE_ROW  # what leaving the worker that holds the prompt's prefix must save
SESSION_MOVE_MARGIN = SEAT_WAIT  # what leaving a session's own worker (its history) must save


def prompt_tokens(job: GenerateJob) -> list[int]:
    """Estimated tokens of each prefix unit the router's digests cover (a chat's messages, or a
    text's chunks, the last one with the text's tail), in order."""
    if job.messages:
        return [MESSAGE_OVERHEAD_TOKENS + len(m.content) // CHARS_PER_TOKEN for m in job.messages]
    if job.prompt:
        chunks, tail = divmod(len(job.prompt), TEXT_CHUNK_CHARS)
        return [TEXT_CHUNK_CHARS // CHARS_PER_TOKEN] * chunks + [tail // CHARS_PER_TOKEN]
    return [max(1, len(job.prompt_token_ids))]


def held_tokens(units: Sequence[int], matched: int) -> int:
    """Tokens of the first `matched` units."""
    return sum(units[:matched])


def prefill_cost(total: int, cached: int, loadable: int, redis_tier: bool) -> float:
    """Token equivalents to prefill `total` tokens on a worker holding `cached` of them, when
    `loadable` are in the Redis tier."""
    cached = min(cached, total)
    loaded = max(0, min(loadable, total) - cached) if redis_tier else 0
    computed = total - cached - loaded
    return computed + (LOAD_FIXED + LOAD_SHARE * loaded if loaded else 0.0)


@dataclass(frozen=True, slots=True)
class Backlog:
    """A worker's work ahead of a new job: sequences running (rows it shares steps with), sequences
    waiting (a queue it joins) and prompt tokens not yet computed, as of its heartbeat, plus what
    this api routed to it since, less what it saw end or prefill since (api/routing/recent.py).
    `own_ended`: that includes a turn of the session being routed."""

    running: int
    waiting: int
    prefill_tokens: float
    own_ended: bool = False

    @property
    def sequences(self) -> int:
        return self.running + self.waiting

    @property
    def cost(self) -> float:
        return self.prefill_tokens + DECODE_ROW * self.running + SEAT_WAIT * self.waiting

    def less_ended(self, ended: int) -> Backlog:
        """Without `ended` of its jobs: on a full worker each frees a seat for a waiting one."""
        seats = min(ended, self.waiting)
        running = max(0, self.running - (ended - seats))
        return Backlog(running, self.waiting - seats, self.prefill_tokens, self.own_ended)

    def less_one_ended(self, ended_at: float, w: WorkerStatus) -> Backlog:
        """Without a job that ended at `ended_at`, when `w`'s heartbeat came before that: the
        heartbeat (or the routes since) still count it. For a session's last turn, when this api
        did not see it end (another api routed it): else it is off already (`own_ended`)."""
        if self.own_ended or ended_at <= w.sent_at or self.sequences == 0:
            return self
        less = self.less_ended(1)
        return Backlog(less.running, less.waiting, less.prefill_tokens, True)


def backlog(w: WorkerStatus, since: Routed) -> Backlog:
    """Jobs the worker holds but its engine does not yet (a Celery thread before its submit, or a
    fetch from Redis) count as sequences, their prompts as no tokens (how much of one hits is not
    known). Those routed to it since its heartbeat count as sequences and as the prefill the
    router expected of them there: a burst of turns for one worker (sessions that ended in one
    step come back together) would otherwise look no costlier than one turn, and stay together
    as a convoy whose prefills fill one long step that every one of them waits out. Both are rows
    where the heartbeat shows no sequence waiting, and wait where it shows the worker full. Those
    this api routed before the heartbeat and saw end since (or prefill since) no longer count: a
    cohort that has just ended would otherwise still weigh on its worker for up to a heartbeat and
    a fleet read, and push its next turns away from their blocks."""
    e: EngineFigures | None = w.engine
    running, waiting = (e.num_running, e.num_waiting) if e else (0, 0)
    outside = max(0, w.jobs_running - running - waiting)
    full = waiting > 0
    pending = e.prefill_tokens_pending if e else 0
    prefill = max(0.0, pending - since.prefill_done) + since.prefill_tokens
    held = Backlog(running + (0 if full else outside), waiting + (outside if full else 0), prefill)
    held = held.less_ended(since.gone)
    if full:
        return Backlog(held.running, held.waiting + since.jobs, prefill, since.own_ended)
    return Backlog(held.running + since.jobs, held.waiting, prefill, since.own_ended)


def destinations(
    cost: Mapping[str, float], backlogs: Mapping[str, Backlog], home: str, own_worker: bool
) -> dict[str, float]:
    """The workers a job held by `home` may go to, with their costs: any; for a session on its own
    worker (`own_worker`), that one and those with room (none waiting: SESSION_MOVE_MARGIN)."""
    return {n: c for n, c in cost.items() if not own_worker or n == home or backlogs[n].waiting == 0}


def rows_to_come(thinking: Mapping[str, float], workers: Iterable[str]) -> dict[str, float]:
    """Per worker, a new session's share of the turns to come from its sessions between turns
    (`thinking`: HomedSessions.thinking())."""
    return {n: THINKING_ROW * thinking.get(n, 0.0) for n in workers}


def move_margin(own_worker: bool) -> float:
    """What leaving the worker that holds the most of the prompt must save."""
    return SESSION_MOVE_MARGIN if own_worker else MOVE_MARGIN


def session_key(job: GenerateJob) -> str:
    """The job's session as RecentRoutes keeps it ("" for none)."""
    return f"{job.tenant}\0{job.session_id}" if job.session_id else ""


def cheapest(costs: Mapping[str, float], tiebreak: Mapping[str, float]) -> str:
    return min(costs, key=lambda n: (costs[n], tiebreak[n]))
