"""Structured outputs: grammars compiled once per (tokenizer, spec) on a task thread, a matcher
per request, and the token masks the sampler applies to the rows that have one."""
