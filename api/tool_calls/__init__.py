"""Tool calling at the edge: the request's tools and tool_choice (request.py), and the parsers that
turn a model's output back into OpenAI's tool_calls, whole or streamed (parser.py, hermes.py)."""
