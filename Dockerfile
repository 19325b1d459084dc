# One image for every warren role: `warren collector`, `warren coordinator`,
# `warren learner` and `warren run` (the container's arguments pick the role).
#
#   docker build -t warren .
#   docker build -t warren:cu126 --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
#
# torch comes from TORCH_INDEX_URL (CPU wheels by default, a few hundred MB instead
# of several GB); every other dependency comes from PyPI, as listed in pyproject.toml.
#
# PYTHON_IMAGE replaces the base image: any Debian-based image with Python 3.11 as
# `python`. An image that sets pip's own variables (PIP_NO_INDEX=1, PIP_FIND_LINKS=<a
# directory of wheels>) gets every package from those wheels, with no index at all:
# scripts/local-images builds such an image for machines without a registry.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/warren \
    PATH=/opt/warren/bin:$PATH

# tini runs as PID 1: it hands SIGTERM/SIGINT on to warren (which stops cleanly on the
# first and exits at once on the second) and reaps zombies. The Debian release is fixed
# by the base image tag, so its tini package is not pinned separately; a base image
# that already has it needs no package index.
# hadolint ignore=DL3008
RUN if [ ! -x /usr/bin/tini ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends tini \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# An unprivileged user; /data is where the compose file mounts the shared volume, and a
# fresh named volume takes over this directory's owner, so the user can write to it.
RUN groupadd --system --gid 10001 warren \
    && useradd --system --uid 10001 --gid warren --create-home --home-dir /home/warren \
        --shell /usr/sbin/nologin warren \
    && mkdir -p /data/steps /data/policy /data/runs \
    && chown -R warren:warren /data \
    && python -m venv "$VIRTUAL_ENV"

# Dependencies only, from pyproject.toml: this layer is rebuilt when the dependency list
# or the torch build arguments change, not on every source edit.
COPY pyproject.toml /build/pyproject.toml
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" \
    && python -c 'import tomllib; print("\n".join(tomllib.load(open("/build/pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > /build/requirements.txt \
    && pip install --requirement /build/requirements.txt

# The source, then warren itself (no dependency resolution: they are all in place).
COPY pyproject.toml README.md /build/src/
COPY messaging /build/src/messaging
COPY worker /build/src/worker
RUN pip install --no-deps /build/src \
    && rm -rf /build \
    && warren --help > /dev/null

ENV WARREN_PATH_DATA=/data/steps \
    WARREN_PATH_POLICY=/data/policy

# Numeric, so the platform can tell it is not root (e.g. Kubernetes runAsNonRoot).
USER 10001:10001
WORKDIR /home/warren

# Exec form: tini is PID 1 and warren its direct child, so signals reach Python.
ENTRYPOINT ["/usr/bin/tini", "--", "warren"]
CMD ["--help"]
