# syntax=docker/dockerfile:1
# dispatcher: durable delayed-job dispatcher for PostgreSQL.
#
#   docker build -t dispatcher .
#   docker run --init -e DISPATCHER_API_TOKENS=change-me -p 8080:8080 \
#       -v dispatcher-state:/var/lib/dispatcher dispatcher
#
# Without DISPATCHER_DATABASE_URL the daemon runs its own PostgreSQL in the volume; give the
# container an init (--init, or `init: true` in compose) then, so the database's processes are
# reaped. With an external database no init is needed.

FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl

RUN useradd --system --user-group --uid 10001 --no-create-home \
        --home-dir /var/lib/dispatcher --shell /usr/sbin/nologin dispatcher \
    && install -d -o dispatcher -g dispatcher -m 0700 /var/lib/dispatcher

# The embedded database (used when DISPATCHER_DATABASE_URL is unset) lives in the volume.
ENV DISPATCHER_STATE_DIR=/var/lib/dispatcher
VOLUME ["/var/lib/dispatcher"]

# Listening beyond loopback is what a container is for, and the daemon refuses to do it without
# API tokens: set DISPATCHER_API_TOKENS (comma-separated) or, better, DISPATCHER_API_TOKENS_FILE
# naming a mounted secret. The signing secret for HTTP targets works the same way
# (DISPATCHER_HTTP__SIGNING_SECRET_FILE).
ENV DISPATCHER_LISTEN=0.0.0.0:8080
EXPOSE 8080

USER 10001:10001
WORKDIR /var/lib/dispatcher

# Exec form: the daemon is PID 1 itself and receives SIGTERM, which starts its drain
# (DISPATCHER_DRAIN_TIMEOUT_S, 30 s by default). Give the container a stop timeout above it
# (docker stop -t 45, compose stop_grace_period, Kubernetes terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('DISPATCHER_LISTEN', ':8080').rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]
ENTRYPOINT ["dispatcher"]
CMD ["run"]
