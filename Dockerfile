# One image for the API and the worker. The worker runs on a CUDA base:
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 -t lethe-worker .
# The default base is a slim CPU image for the API (which never imports torch at request time).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 VIRTUAL_ENV=/opt/venv
RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip && \
      rm -rf /var/lib/apt/lists/*; \
    fi && python3 -m venv $VIRTUAL_ENV
ENV PATH=$VIRTUAL_ENV/bin:$PATH

# torch first: the CPU wheel for the API, a CUDA wheel for the worker (TORCH_INDEX picks the build).
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --index-url ${TORCH_INDEX} "${TORCH_SPEC}"

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY lethe ./lethe
COPY migrations ./migrations
RUN pip install ".[all,s3,ops]"

RUN useradd --create-home --uid 1000 lethe && mkdir -p /data && chown lethe /data
USER lethe
ENV LETHE_ARTIFACT_ROOT=/data/artifacts
EXPOSE 8000
CMD ["uvicorn", "lethe.service.api.app:app", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", "--limit-concurrency", "200"]
