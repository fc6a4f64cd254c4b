"""StructuredOutputs: a constraint on a request's output, as vLLM's `structured_outputs` (a JSON
schema, any JSON object, a regex, a choice of strings, or a grammar). It travels inside
SamplingParams; `grammar_text()` turns it into the llguidance grammar that the api validates and each
worker compiles against its tokenizer (workers/engine/grammar/)."""

from __future__ import annotations

import json as jsonlib
from typing import Literal

import msgspec

from broker.errors import InvalidRequestError

Kind = Literal["json", "json_object", "regex", "choice", "grammar"]
MAX_SPEC_CHARS = 1 << 16  # a schema's JSON text, a regex or a grammar
MAX_CHOICES = 256
# JSON without free whitespace: a small model can loop on spaces or newlines until max_tokens.
# The separators are json.dumps' default (", ", ": "). Passed as overrides, so that a
# schema's own "x-guidance" options cannot turn free whitespace back on.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = '{"type": "object"}'  # json_object: any JSON object, as OpenAI's JSON mode
LABELS: dict[Kind, str] = {
    "json": "JSON schema",
    "json_object": "JSON object",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}


class StructuredOutputs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Exactly one of json (a JSON schema, as JSON text), json_object, regex, choice, grammar
    (Lark, or GBNF that llguidance converts). `source` is the request field it came from
    (response_format, structured_outputs, guided_json, ...): the `param` of any 400 about it.
    Cheap checks here (raise InvalidRequestError); whether llguidance accepts it is `check()`."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    source: str = "structured_outputs"

    def __post_init__(self) -> None:
        given = [k for k, v in self._fields().items() if v is not None and v is not False]
        if len(given) != 1:
            names = ", ".join(given) or "none"
            raise InvalidRequestError(
                f"{self.source}: give exactly one of json, json_object, regex, choice, grammar (got {names})",
                self.source,
            )
        text = self.key[1]
        if len(text) > MAX_SPEC_CHARS:
            raise self.invalid(f"over {MAX_SPEC_CHARS} characters")
        if self.json is not None:
            try:
                schema = jsonlib.loads(self.json)
            except ValueError as exc:
                raise self.invalid(f"not JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise self.invalid("not a JSON object")
        if self.choice is not None and not 0 < len(self.choice) <= MAX_CHOICES:
            raise self.invalid(f"it must hold 1 to {MAX_CHOICES} strings")
        if not text:
            raise self.invalid("empty")

    def _fields(self) -> dict[str, object]:
        return {
            "json": self.json,
            "json_object": self.json_object,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
        }

    @property
    def kind(self) -> Kind:
        return self.key[0]

    def invalid(self, why: str) -> InvalidRequestError:
        """A 400 about this spec, naming the field it came from."""
        return InvalidRequestError(
            f"{self.source}: invalid {LABELS[self.kind]}: {why.strip()[:500]}", self.source
        )

    @property
    def key(self) -> tuple[Kind, str]:
        """(kind, text): what identifies the constraint, whichever field carried it (the
        compiled-grammar cache's key)."""
        if self.json is not None:
            return "json", self.json
        if self.json_object:
            return "json_object", ANY_OBJECT
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", jsonlib.dumps(self.choice)
        return "grammar", self.grammar or ""

    def grammar_text(self) -> str:
        """The llguidance grammar (JSON text). Raises InvalidRequestError when it cannot be
        built (a GBNF grammar that does not convert)."""
        import llguidance  # torch-free and light, but only the processes that check specs need it

        kind, text = self.key
        try:
            if kind in ("json", "json_object"):
                return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
            if kind == "regex":
                return llguidance.LLMatcher.grammar_from_regex(text)
            # a choice is a JSON list of strings; a grammar, Lark or GBNF (converted to Lark)
            return llguidance.grammar_from("choice" if kind == "choice" else "grammar", text)
        except ValueError as exc:
            raise self.invalid(str(exc)) from None

    def check(self) -> None:
        """Raise InvalidRequestError unless llguidance accepts the grammar (no tokenizer needed:
        what the api checks; the worker's compile can then fail only on its tokenizer)."""
        import llguidance

        error = llguidance.LLMatcher.validate_grammar(self.grammar_text())
        if error:
            raise self.invalid(error)
