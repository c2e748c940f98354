# dbvt-server container image.
#   docker build -t dbvt-server .
#   docker run -p 127.0.0.1:50051:50051 dbvt-server
# With TLS and tokens, the files mounted read-only (readable by uid 10001):
#   docker run -p 50051:50051 -v /etc/dbvt:/etc/dbvt:ro -e DBVT_TLS_CERT=/etc/dbvt/server.pem \
#     -e DBVT_TLS_KEY=/etc/dbvt/server-key.pem -e DBVT_TOKENS=/etc/dbvt/tokens.txt dbvt-server
# Settings come from the same DBVT_* environment variables as the dbvt-server command.
# BASE_IMAGE may be any Debian bookworm image with python3 (>= 3.10), python3-venv and pip;
# scripts/check_container.py builds on a locally debootstrapped one.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS builder
# Both stages run the BASE_IMAGE's python3 from a venv at the same path, so the venv
# filled here works unchanged in the runtime stage (on the official image python3 is
# /usr/local/bin/python3, on a Debian base /usr/bin/python3: the venv hides the difference).
# python3-dev brings the headers Debian's python3 lacks; the official image already has its own.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.9 python3-dev=3.11.2-1+b1 \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# Every dependency becomes a wheel too, so the runtime venv is filled from /wheels
# alone (--no-index): nothing is compiled or fetched at that point. The wheels are
# built from a separate venv so that build tools never end up in /opt/venv, and that
# venv's pip fills /opt/venv, which so needs no pip of its own.
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-cache-dir --wheel-dir /wheels ./client . \
    && python3 -m venv --without-pip /opt/venv \
    && /opt/build/bin/pip --python /opt/venv/bin/python install --no-cache-dir --no-index \
        --find-links /wheels /wheels/*.whl

FROM ${BASE_IMAGE} AS runtime
# Only the venv of installed wheels is carried over: no compiler, no sources, no wheel files.
COPY --from=builder /opt/venv /opt/venv
# /var/lib/dbvt: where a volume for DBVT_DATA_DIR goes (worlds kept across restarts), owned by
# the server's user so that a fresh named volume mounted there is writable too.
RUN groupadd --system --gid 10001 dbvt \
    && useradd --system --no-create-home --shell /usr/sbin/nologin --uid 10001 --gid dbvt dbvt \
    && install -d -o 10001 -g 10001 /var/lib/dbvt
USER 10001:10001
# The health service alone, in plaintext, on its own port: the HEALTHCHECK and Kubernetes' native
# gRPC probe (which has no TLS option, nor tokens) reach it whatever the main port needs. Prometheus
# metrics, /healthz and /readyz on 9464.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    DBVT_HOST=0.0.0.0 \
    DBVT_PORT=50051 \
    DBVT_HEALTH_PORT=50052 \
    DBVT_METRICS_ADDRESS=0.0.0.0:9464
EXPOSE 50051 50052 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=5s --retries=3 \
    CMD ["python", "-m", "dbvt_server.healthcheck"]
# Exec form: dbvt-server is PID 1 and gets SIGTERM itself, for a graceful stop. It lets calls in
# flight finish for DBVT_GRACE_SECONDS (10 by default); give `docker stop --time` more than that.
ENTRYPOINT ["dbvt-server"]
