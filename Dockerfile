# syntax=docker/dockerfile:1
# dispatcher: durable delayed-job dispatcher for PostgreSQL.
#
#   docker build -t dispatcher .
#   podman build --format docker -t dispatcher .         # docker format keeps the HEALTHCHECK
#   docker build --build-arg BASE=registry.example/debian-python:bookworm -t dispatcher .
#   docker run --init --read-only --stop-timeout 65 -p 8080:8080 \
#       -e DISPATCHER_API_TOKENS="$(openssl rand -hex 32)" -e DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS=true \
#       -v dispatcher-state:/var/lib/dispatcher dispatcher
#
# Without DISPATCHER_DATABASE_URL the daemon runs its own PostgreSQL in the volume; give the
# container an init (--init, or `init: true` in compose) then, so the database's processes are
# reaped. With an external database no init is needed.

# Any Debian-like image with python3 (3.11 or newer) and its venv module: the default is the
# public Python image; tests build on a Debian 12 base made without a registry
# (tests/e2e/test_container.py). Everything is installed into a venv, so the base needs no pip.
ARG BASE=python:3.11-slim

# The run-time dependencies and the tracing extra (OpenTelemetry, off unless OTEL_* asks for it),
# listed from pyproject.toml in a stage of their own: the build stage copies only this list, so
# their install layer stays cached until the list itself changes (not when the code, the version
# or the test extra does).
FROM ${BASE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print(*p['dependencies'], *p['optional-dependencies']['tracing'], sep='\n')" > requirements.txt

FROM ${BASE} AS build
# A CA bundle for pip, where TLS to the package index is intercepted (unset: the system's).
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/dispatcher
WORKDIR /src
COPY --from=requirements /src/requirements.txt ./
RUN /opt/dispatcher/bin/pip install -r requirements.txt
COPY pyproject.toml README.md setup.py MANIFEST.in LICENSE ./
COPY dispatcher ./dispatcher
# shipped inside the package as data (setup.py): `dispatcher config example` prints them
COPY config ./config
COPY systemd ./systemd
# pip and setuptools are not needed at run time.
RUN /opt/dispatcher/bin/pip install --no-deps . \
    && /opt/dispatcher/bin/pip uninstall -q -y pip setuptools

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/dispatcher/bin:$PATH
COPY --from=build /opt/dispatcher /opt/dispatcher

RUN useradd --system --user-group --uid 10001 --no-create-home \
        --home-dir /var/lib/dispatcher --shell /usr/sbin/nologin dispatcher \
    && install -d -o dispatcher -g dispatcher -m 0700 /var/lib/dispatcher

# The embedded database (used when DISPATCHER_DATABASE_URL is unset) lives in the volume, so the
# root filesystem can be read-only (--read-only; Kubernetes readOnlyRootFilesystem).
ENV DISPATCHER_STATE_DIR=/var/lib/dispatcher
VOLUME ["/var/lib/dispatcher"]

# Listening beyond loopback is what a container is for, and the daemon refuses to do it without
# API tokens: set DISPATCHER_API_TOKENS (comma-separated) or, better, DISPATCHER_API_TOKENS_FILE
# naming a mounted secret. Without TLS (DISPATCHER_TLS__CERT_FILE/KEY_FILE) the tokens would
# cross the network in the clear, which needs DISPATCHER_ALLOW_PLAIN_HTTP_TOKENS=true (a private
# network, or TLS ending at a proxy). The signing secret for HTTP targets works the same way
# (DISPATCHER_HTTP__SIGNING_SECRET_FILE).
ENV DISPATCHER_LISTEN=0.0.0.0:8080
EXPOSE 8080

USER 10001:10001
WORKDIR /var/lib/dispatcher

# Exec form: the daemon (or the runtime's init) is PID 1 and receives SIGTERM, which starts its
# drain. Give the container a stop timeout above the stop budget (drain 30 s + hard stop 10 s +
# lease hand-back 10 s by default): docker run --stop-timeout 65, podman stop -t 65, compose
# stop_grace_period, Kubernetes terminationGracePeriodSeconds.
STOPSIGNAL SIGTERM
# Probes the daemon's own listener wherever its configuration puts it (dispatcher/healthcheck.py).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-m", "dispatcher.healthcheck"]
ENTRYPOINT ["dispatcher"]
CMD ["run"]
