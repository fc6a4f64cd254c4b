"""The sessions' text and timing: a few shared system prompts of different lengths, seeded user
messages that ask for long answers (so a server without `ignore_eos` rarely stops early), and
seeded exponential think times. Deterministic from the seed, so every server gets the same load."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Sentences the system prompts are built from; each prompt repeats them to its own length.
_RULES = (
    "Answer every question in full, detailed paragraphs, and never stop before the reader asked you to.",
    "Explain the reasoning behind each point, give concrete examples, and describe the history of the idea.",
    "Use plain words, define every technical term, and connect each answer to what was said earlier.",
    "When a question is short, still answer it at length, covering causes, consequences and exceptions.",
    "Keep a friendly, patient tone, and end each paragraph with a question the reader might ask next.",
)
_ROLES = ("a librarian", "a travel guide", "a science teacher", "a chef", "a historian", "a gardener")
_TOPICS = (
    "how bridges carry their load",
    "why the sea is salty",
    "how bread rises",
    "what makes a good map",
    "how birds find their way",
    "why leaves change colour",
    "how clocks keep time",
    "what a volcano is made of",
    "how a river shapes its valley",
    "why we dream",
)
_ASKS = (
    "Tell me, in as much detail as you can, {topic}.",
    "Please continue and explain at length {topic}, with several examples.",
    "Go deeper: describe {topic}, step by step, and do not be brief.",
    "Write a long, careful explanation of {topic}, covering every detail you know.",
)


def system_prompts(count: int) -> list[str]:
    """`count` system prompts from about 300 to about 1,000 tokens (250 to 830 words): different
    lengths, so the sessions' shared prefixes are not all one size."""
    prompts = []
    for i in range(count):
        target_words = 250 + (580 * i) // max(1, count - 1)
        head = f"You are {_ROLES[i % len(_ROLES)]}, assistant number {i}. "
        words: list[str] = head.split()
        j = i
        while len(words) < target_words:
            words.extend(_RULES[j % len(_RULES)].split())
            j += 1
        prompts.append(" ".join(words[:target_words]))
    return prompts


def user_message(rng: random.Random, tag: str) -> str:
    """A new user turn (about 20-40 tokens) asking for a long answer; `tag` keeps it unique."""
    ask = rng.choice(_ASKS).format(topic=rng.choice(_TOPICS))
    extra = " and ".join(rng.choice(_TOPICS) for _ in range(rng.randint(0, 2)))
    return f"{ask} ({tag}) {'Also mention ' + extra + '.' if extra else ''}".strip()


@dataclass(frozen=True, slots=True)
class SessionPlan:
    """One session of one level: its id, system prompt, user messages, and when it speaks."""

    sid: str
    system: str
    users: tuple[str, ...]
    start_delay_s: float
    thinks_s: tuple[float, ...]  # before turns 2..T


def plan_sessions(
    level: int, sessions: int, turns: int, think_mean_s: float, seed: int, systems: list[str]
) -> list[SessionPlan]:
    """The sessions of one level. A level has its own ids and user messages (its own seed offset),
    so it never hits an earlier level's histories; the system prompts stay the same, as a real
    server's do. Starts are spread over the first think interval."""
    plans = []
    for i in range(sessions):
        rng = random.Random(f"{seed}/{level}/{i}")
        sid = f"bs{seed}-l{level}-s{i}"
        users = tuple(user_message(rng, f"{sid} turn {t + 1}") for t in range(turns))
        thinks = tuple(_think(rng, think_mean_s) for _ in range(turns - 1))
        start = rng.uniform(0, think_mean_s) if think_mean_s > 0 else 0.0
        plans.append(SessionPlan(sid, systems[i % len(systems)], users, start, thinks))
    return plans


def _think(rng: random.Random, mean_s: float) -> float:
    return rng.expovariate(1 / mean_s) if mean_s > 0 else 0.0
