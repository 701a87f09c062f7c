# plugproxy sidecar image. Build it with `make image` (docs/injecting.md, "The image").
#
# Two stages: `build` installs plugproxy with the same Makefile target the README's
# `make demo` uses (one source of truth for the install steps), into a virtualenv at
# /opt/plugproxy; the final stage copies only that virtualenv onto a runtime base that
# holds the Python interpreter and the libraries it loads, and nothing else: no shell, no
# package manager, no pip.
#
# The bases are build arguments. The defaults are pulled from registries; `make image`
# (BASES=debian) builds both from Debian packages instead (tools/build-bases.sh). Either
# way both are Debian 12 with python at /usr/bin/python3.11, the interpreter the
# virtualenv links to.
#
# The image runs as a numeric non-root user and needs no writable root filesystem:
# bytecode is compiled at build time and never written at run time; the only writes are the
# listen socket (a mounted volume) and, if configured, log files on a mounted volume.

ARG BUILD_BASE=docker.io/library/debian:bookworm-slim
ARG RUNTIME_BASE=gcr.io/distroless/python3-debian12:nonroot

FROM ${BUILD_BASE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Debian's slim image lacks what the install needs; the bases of tools/build-bases.sh have it.
# gcc and Python's headers compile the hot path (setup.py); the runtime stage needs neither.
RUN if ! command -v make >/dev/null || ! command -v gcc >/dev/null \
      || ! python3.11 -c 'import ensurepip' 2>/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-venv make ca-certificates \
         gcc libc6-dev python3-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY Makefile pyproject.toml setup.py README.md ./
COPY src ./src
# INSTALL_SPEC=. installs a regular (not editable) copy, so /src is not needed at run time.
# An extra CA bundle for the downloads (e.g. a proxy's) comes in as a build secret: it is
# mounted for this step only and never stored in a layer.
RUN --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
 && make install VENV=/opt/plugproxy INSTALL_SPEC=. \
 && /opt/plugproxy/bin/python -m pip uninstall --quiet --yes pip setuptools \
 && /opt/plugproxy/bin/python -m compileall -q /opt/plugproxy/lib \
 && /opt/plugproxy/bin/plugproxy --version

FROM ${RUNTIME_BASE}
LABEL org.opencontainers.image.title="plugproxy" \
      org.opencontainers.image.description="Spec-aware gRPC sidecar for CSI, COSI and CMI plugins" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/plugproxy /opt/plugproxy
ENV PATH=/opt/plugproxy/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    PLUGPROXY_ADMIN_LISTEN=0.0.0.0:9808
# /tmp is the only scratch path; mount an emptyDir there when the root filesystem is read-only.
WORKDIR /tmp
# The base's nonroot user (65532), by number so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9808
STOPSIGNAL SIGTERM
ENTRYPOINT ["plugproxy"]
CMD ["serve"]
