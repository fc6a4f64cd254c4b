"""`kvferry bench sessions`: many multi-turn chat sessions against any OpenAI chat server (kvferry,
vLLM, llama-server), TTFT/TPOT by turn index, and the most sessions a server holds within an SLO."""
