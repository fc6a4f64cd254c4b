"""What ends a request, as vLLM decides it: stop_token_ids end it with "stop" (the token in the
output ids, its text left out); min_tokens holds back EOS, stop tokens and stop strings until
that many tokens are out; a resumed request decides the same on the output it restores."""

from __future__ import annotations

from typing import Any

from broker.sampling import SamplingParams
from workers.engine.requests.detokenizer import Detokenizer
from workers.engine.requests.sequence import EngineRequest
from workers.engine.sampling.postprocess import Postprocessor

EOS = 0


class _Letters:
    """A tokenizer whose token id is a character's code point; id 0 is a special EOS."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(t) for t in ids if not (skip_special_tokens and t == EOS))


def _ids(text: str) -> list[int]:
    return [EOS if char == "$" else ord(char) for char in text]  # "$" stands for EOS


def _post() -> Postprocessor:
    return Postprocessor(Detokenizer(_Letters()), {EOS}, max_model_len=1000)


def _run(text: str, **fields: Any) -> tuple[EngineRequest, str | None]:
    """Append text's characters one by one until a rule ends the request."""
    post = _post()
    seq = EngineRequest("r", [ord("p")], SamplingParams(max_tokens=50, **fields), 50)
    reason = None
    for token in _ids(text):
        reason = post.append(seq, token)
        if reason is not None:
            break
    return seq, reason


def test_a_stop_token_id_ends_the_request_in_its_ids_not_its_text() -> None:
    seq, reason = _run("abcxdef", stop_token_ids=(ord("x"), ord("z")))
    assert reason == "stop" and seq.stop_reason == ord("x")
    assert seq.output_token_ids == [ord(c) for c in "abcx"]
    assert seq.output_text == "abc"


def test_stop_token_ids_end_a_request_that_ignores_eos() -> None:
    seq, reason = _run("ab$cxd", ignore_eos=True, stop_token_ids=(ord("x"),))
    assert reason == "stop" and seq.output_text == "abc"


def test_min_tokens_holds_back_eos_stop_tokens_and_stop_strings() -> None:
    seq, reason = _run("axe$bx", min_tokens=3, stop_token_ids=(ord("x"),))
    assert reason == "stop" and seq.stop_reason == EOS  # the 4th token: the first past min_tokens
    seq, reason = _run("a$xbx", min_tokens=3, stop_token_ids=(ord("x"),))
    assert reason == "stop" and seq.output_text == "axb"
    # as vLLM: a stop string within the first min_tokens tokens' text does not count later either
    seq, reason = _run("abecede", min_tokens=3, stop=("e",))
    assert reason == "stop" and seq.output_text == "abec"
    assert _run("abcdef", min_tokens=6, stop=("b",))[1] is None


def test_a_resumed_request_ends_as_the_uninterrupted_one_would() -> None:
    def resume(text: str, **fields: Any) -> tuple[EngineRequest, str | None]:
        seq = EngineRequest("r", [ord("p")], SamplingParams(max_tokens=50, **fields), 50)
        return seq, _post().resume(seq, _ids(text), streamed_chars=0)

    seq, reason = resume("abcx", stop_token_ids=(ord("x"),))
    assert reason == "stop" and seq.stop_reason == ord("x") and seq.output_text == "abc"
    assert resume("abx", min_tokens=3, stop_token_ids=(ord("x"),))[1] is None  # held back then
    assert resume("abece", min_tokens=3, stop=("e",))[1] == "stop"
    seq, reason = resume("abec", min_tokens=3, stop=("e",))
    assert reason is None and seq.output_text == "abec"
    assert resume("ab$", min_tokens=2, ignore_eos=False)[1] == "stop"
