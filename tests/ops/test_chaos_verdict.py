"""`kvferry chaos`' verdict (ops/chaos/check.py) and its check against HF generate
(ops/chaos/hf.py), on hand-made records: no stack, no model."""

from __future__ import annotations

from typing import Any

from broker.codec import encode_event
from broker.jobs.events import EVENT_FIELD
from broker.messages import ChatMessage, GenerateResult, JobDone, TokenDelta, Usage
from broker.sessions.tokens import after_turn
from ops.chaos.check import report, verdict
from ops.chaos.clients import JobRecord
from ops.chaos.fault_log import FaultLog, KillEvent
from ops.chaos.hf import Group, JobIds, compare, groups, ids_of
from ops.chaos.raw_streams import _repeats

SYSTEM = {"role": "system", "content": "be brief"}
CLEAN_HF = {"hf_checked": 3, "hf_mismatches": 0, "hf_uncovered": [], "hf_unverified": [], "hf_examples": []}


def _job(key: str, text: str = "ab", status: str = "completed", **request: Any) -> JobRecord:
    record = JobRecord(key, job_id=f"id-{key}", status=status, stream_complete=status == "completed")
    record.chunks = [(0.0, 0, text)] if status == "completed" else []
    record.text = text if status == "completed" else ""
    record.usage = {"completion_tokens": 2}
    record.submit_attempts = 1
    record.request = request
    return record


def _run(records: list[JobRecord], kills: list[KillEvent] | None = None, **extra: Any) -> dict[str, Any]:
    references = {r.key: _job(r.key) for r in records}
    faults = FaultLog(kills=kills or [])
    raw = {"raw_duplicated_tokens": 0, "raw_duplicated_finals": 0}
    pools = {"integrity_ok": {"w1@h": True, "w2@h": True}, "engine_step_failures": 0}
    extra = {**pools, **CLEAN_HF, **raw, **extra}
    return report(records, references, faults, 1.0, extra)


def _kill(*jobs: str) -> KillEvent:
    return KillEvent(at=0.0, child="worker1", node="w1@h", jobs=jobs, back_after_s=1.0)


def test_a_clean_run_passes() -> None:
    result = _run([_job("a"), _job("b")], [_kill("id-a")])
    assert result["passed"] and result["failures"] == [], result["failures"]


def test_verdict_fails_on_a_raw_stream_repeat_or_an_unread_stream_check() -> None:
    assert not _run([_job("a")], raw_duplicated_tokens=1)["passed"]
    assert not _run([_job("a")], raw_duplicated_finals=1)["passed"]
    assert not _run([_job("a")], raw_duplicated_tokens=None)["passed"]


def test_raw_repeats_count_each_index_held_twice_and_finals_past_the_first() -> None:
    done = JobDone(_result([7], [1, 2, 3]))
    again = TokenDelta("c", (3,), start=2)
    deltas = [TokenDelta("ab", (1, 2), start=0), again, again]
    entries = [(b"0-%d" % i, {EVENT_FIELD: encode_event(e)}) for i, e in enumerate([*deltas, done, done])]
    assert _repeats(entries) == (1, 1)
    assert _repeats(entries[:2] + entries[3:4]) == (0, 0)
    unindexed = [(b"0-9", {EVENT_FIELD: encode_event(TokenDelta("d", (4,)))})]
    assert _repeats(entries[:2] + unindexed) == (0, 0)


def test_verdict_fails_when_a_pool_fails_its_integrity_check() -> None:
    result = _run([_job("a")], [_kill("id-a")], integrity_ok={"w1@h": True, "w2@h": False})
    assert not result["passed"] and any("integrity" in f for f in result["failures"])
    assert not _run([_job("a")], [_kill("id-a")], integrity_ok={})["passed"]  # nobody answered


def test_verdict_fails_when_kills_hit_no_job() -> None:
    result = _run([_job("a")], [_kill(), _kill()])
    assert result["kills"] == 2 and result["jobs_hit_by_kills"] == 0 and result["kills_that_hit_jobs"] == 0
    assert not result["passed"] and any("hit no job" in f for f in result["failures"])
    assert _run([_job("a")])["passed"]  # no kills asked (a soak): none needed


def test_never_submitted_jobs_count_and_fail_the_run() -> None:
    result = _run([_job("a"), _job("b", status="not_submitted")], [_kill("id-a")])
    assert result["jobs"] == 2 and result["not_submitted"] == 1 and result["completed"] == 1
    assert not result["passed"] and "1 job(s) not submitted" in result["failures"]


def test_verdict_fails_on_hf_mismatches_uncovered_or_unchecked() -> None:
    records, kills = [_job("a")], [_kill("id-a")]
    assert not _run(records, kills, hf_mismatches=1)["passed"]
    assert not _run(records, kills, hf_uncovered=["kill 0 (w1@h)"])["passed"]
    assert not _run(records, kills, hf_checked=0)["passed"]
    unrun = {k: v for k, v in _run(records, kills).items() if not k.startswith("hf_")}
    assert any("HF" in f for f in verdict({**unrun, "hf_error": "no model"}))


def _session(sid: str, turn: int) -> JobRecord:
    messages = [SYSTEM]
    for t in range(turn):
        messages += [{"role": "user", "content": f"q{t}"}, {"role": "assistant", "content": f"a{t}"}]
    messages.append({"role": "user", "content": f"q{turn}"})
    return _job(f"c0.r0.session.{sid}.t{turn}", messages=messages, session_id=sid)


def test_the_sample_takes_each_session_and_every_job_a_kill_hit() -> None:
    s0, s1, other = _session("s", 0), _session("s", 1), _session("u", 0)
    chat = _job("c0.r0.chat.t0", messages=[SYSTEM, {"role": "user", "content": "hi"}])
    lost = _job("c0.r0.completion.t0", status="lost", prompt="hello")
    plan = groups([s0, s1, other, chat, lost], [_kill("id-" + chat.key, "id-" + lost.key), _kill()])
    assert [(g.what, [j.key for j in g.jobs], g.every) for g in plan] == [
        ("session s", [s1.key, s0.key], False),  # the last turn first
        ("session u", [other.key], False),
        ("kill 0 (w1@h)", [chat.key], True),  # the lost job has no answer to check
    ]


def test_compare_counts_mismatches_and_groups_left_unchecked() -> None:
    a, b, c = _job("a"), _job("b"), _job("c")
    again = _job("a")  # the same script's job in a later pass of the load: a job of its own
    again.job_id = "id-a-again"
    known = {"a": JobIds([1, 2], [3, 4]), "b": JobIds([5], [6]), "c": "gone"}
    plan = [Group("session s", (c, a), every=False), Group("kill 0", (a, b), every=True)]
    plan += [Group("kill 1", (c,), every=True), Group("session t", (again,), every=False)]
    hf = {(1, 2): [3, 4], (5,): [9]}  # b's answer differs from HF's
    out = compare(plan, lambda r: known[r.key], lambda prompt, n: hf[tuple(prompt)][:n])
    assert out["hf_checked"] == 3 and out["hf_mismatches"] == 1
    assert out["hf_uncovered"] == ["kill 1"] and out["hf_unverified"] == ["c (id-c): gone"]
    assert out["hf_examples"][0]["key"] == "b" and out["hf_examples"][0]["diverges_at"] == 0


class _Tokenizer:
    chat_template = "{{ messages }}"

    @staticmethod
    def _ids(text: str) -> list[int]:
        return [ord(ch) for ch in text]

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        return [1, *self._ids("".join(m["content"] for m in messages)), 2]

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self._ids(text)}


def _result(prompt: list[int], out: list[int]) -> GenerateResult:
    usage = Usage(len(prompt), len(out), 0)
    return GenerateResult("id", "m", "", tuple(out), "length", usage, "w1@h", 0.0, 0.0, 0.0)


def test_ids_of_finds_the_worker_s_prompt_ids() -> None:
    tok = _Tokenizer()
    completion = _job("c0.r0.completion.t0", prompt="hey")
    assert ids_of(completion, _result([104, 101, 121], [9]), None, tok, "m") == JobIds([104, 101, 121], [9])
    first = _session("s", 0)
    fresh = tok.apply_chat_template(first.request["messages"])
    assert ids_of(first, _result(fresh, [7, 8]), None, tok, "m") == JobIds(fresh, [7, 8])
    # turn 1 reused turn 0's exact ids (not a re-tokenisation): only the session's tokens know them
    second = _session("s", 1)
    conversation0 = (*(ChatMessage(**m) for m in first.request["messages"]), ChatMessage("assistant", "a0"))
    tokens = after_turn(None, "m", conversation0, [*fresh, 7, 8])
    prompt1 = [*fresh, 7, 8, 50, 51]
    conversation1 = (*(ChatMessage(**m) for m in second.request["messages"]), ChatMessage("assistant", "a1"))
    tokens = after_turn(tokens, "m", conversation1, [*prompt1, 60])
    assert ids_of(second, _result(prompt1, [60]), tokens, tok, "m") == JobIds(prompt1, [60])
    assert ids_of(first, _result(fresh, [7, 8]), tokens, tok, "m") == JobIds(fresh, [7, 8])
    assert isinstance(ids_of(second, _result(prompt1, [60]), None, tok, "m"), str)  # not known
    assert isinstance(ids_of(second, None, tokens, tok, "m"), str)  # no result
    assert isinstance(ids_of(completion, _result([1], [9]), None, tok, "m"), str)  # counts disagree
