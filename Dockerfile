# pairreg: one image for the API, the migrations and the worker.
#
#   docker build -t pairreg .                                  # CPU torch (API, migrate)
#   docker build -t pairreg-gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#
# torch is installed first from the chosen index and pinned, so the project's own install
# never pulls a different (multi-GB) build. The CUDA wheels bundle their runtime libraries;
# the host needs only the NVIDIA driver and container toolkit.
FROM python:3.12-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PAIRREG_HOME=/data/pairreg \
    HF_HOME=/data/hf

RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /app
COPY pyproject.toml README.md* alembic.ini ./
COPY registry ./registry
COPY runner ./runner
COPY builders ./builders
COPY api ./api
COPY cli ./cli
COPY migrations ./migrations
RUN pip install . \
    && useradd --create-home --uid 10001 pairreg \
    && mkdir -p /data/pairreg /data/hf \
    && chown -R pairreg:pairreg /data

USER pairreg
VOLUME ["/data/pairreg", "/data/hf"]
EXPOSE 8000

# /readyz: database reachable and schema at the code's revision.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=5 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status == 200 else 1)"

CMD ["pairreg", "serve", "--host", "0.0.0.0", "--port", "8000"]
