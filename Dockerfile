# syntax=docker/dockerfile:1
# plugproxy sidecar image.
#
#   docker build -t plugproxy:dev .
#
# Two stages: `build` installs plugproxy with the same Makefile target the README's
# `make demo` uses (one source of truth for the install steps), into a virtualenv at
# /opt/plugproxy; the final stage copies only that virtualenv onto a fresh slim Python
# image: no compilers, no make, no package manager caches.
#
# The image runs as a numeric non-root user and needs no writable root filesystem:
# bytecode is compiled at build time and never written at run time; the only writes are the
# listen socket (a mounted volume) and, if configured, log files on a mounted volume.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# make is needed only here, to run the Makefile's install target.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile pyproject.toml README.md ./
COPY src ./src
# INSTALL_SPEC=. installs a regular (not editable) copy, so /src is not needed at run time.
RUN make install VENV=/opt/plugproxy INSTALL_SPEC=. \
 && /opt/plugproxy/bin/python -m compileall -q /opt/plugproxy/lib \
 && /opt/plugproxy/bin/plugproxy --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="plugproxy" \
      org.opencontainers.image.description="Spec-aware gRPC sidecar for CSI, COSI and CMI plugins" \
      org.opencontainers.image.licenses="Apache-2.0"
# A named account for the numeric UID, so tools that look the user up find one.
RUN groupadd --system --gid 65532 plugproxy \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin plugproxy
COPY --from=build /opt/plugproxy /opt/plugproxy
ENV PATH=/opt/plugproxy/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    PLUGPROXY_ADMIN_LISTEN=0.0.0.0:9808
# /tmp is the only scratch path; mount an emptyDir there when the root filesystem is read-only.
WORKDIR /tmp
USER 65532:65532
EXPOSE 9808
STOPSIGNAL SIGTERM
ENTRYPOINT ["plugproxy"]
CMD ["serve"]
