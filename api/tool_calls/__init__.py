"""Tool calling at the edge, torch-free: the parsers that turn a model's output back into OpenAI's
tool_calls, whole or streamed (parser.py, hermes.py, registry.py), and the answer's shapes
(answer.py). The request side (tools, tool_choice) is api/schema/tool_choice.py."""
