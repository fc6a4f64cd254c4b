"""The precisions an engine may be asked for, by name (model/precision.py resolves them): no torch
here, so the engine's config stays importable where torch is not (the simulated engine)."""

DTYPES = ("auto", "float32", "bfloat16", "float16")  # dtype: weights and GEMMs
KV_DTYPES = ("auto", "float32", "bfloat16", "int8")  # kv_cache_dtype: the hot pool's K/V (int8: opt-in)
QUANTIZATIONS = ("none", "int8")  # quantization: the decoder linears' weights (int8: weight-only)
