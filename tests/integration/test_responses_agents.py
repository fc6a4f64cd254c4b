"""The openai-agents SDK against the real stack: Runner.run with a function_tool on
OpenAIResponsesModel over a custom client. tool_choice required makes the tiny random model call
the tool (a grammar forces the call's shape) and the SDK runs it; then the run's items (the
function_call and its function_call_output) go back as input to an agent whose output type is a
JSON schema, the only way a random model's answer ends before max_output_tokens."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.integration.conftest import MODEL, WorkerProcess
from tests.integration.test_responses import responses_api  # noqa: F401  (the module's api fixture)

CALLS: list[str] = []


class Verdict(BaseModel):
    sunny: bool


@function_tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:  # an enum: a random model's call ends
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


def test_runner_calls_the_tool_and_answers(
    responses_api: str,  # noqa: F811
    two_workers: tuple[WorkerProcess, WorkerProcess],
) -> None:
    client = AsyncOpenAI(base_url=f"{responses_api}/v1", api_key="unused", max_retries=0, timeout=120)
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=1.0
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    answer = Agent(
        name="answer",
        instructions="Say whether it is sunny.",
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(max_tokens=200, temperature=0.0),
        output_type=Verdict,
    )
    config = RunConfig(tracing_disabled=True)

    async def run() -> tuple[Any, Any]:
        first = await Runner.run(agent, "What is the weather in Paris?", run_config=config)
        second = await Runner.run(answer, first.to_input_list(), run_config=config)
        return first, second

    first, second = asyncio.run(run())
    assert len(CALLS) == 1 and first.final_output == f"sunny in {CALLS[0]}", (CALLS, first.final_output)
    kinds = [item.type for item in first.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"], kinds
    assert isinstance(second.final_output, Verdict), second.final_output
