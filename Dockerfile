# cluster-preflight images (docs/kubernetes.md).
#
#   node  preflight, NVML bindings, the daemon, journalctl; no engine. The DaemonSet and the gate.
#   nccl  node plus the torch-free engine: NCCL through nccl4py, CUDA and cuBLAS through
#         cuda-bindings (the bandwidth test, `preflight cluster`); the chart's bandwidthTest.
#   full  node plus torch, for a bandwidth test with the torch engine (TORCH_SPEC /
#         TORCH_INDEX_URL choose the build).
#
# BASE must hold python3 (>= 3.10) with its venv module (CI: a debootstrap bookworm with python3).
# Build:  buildah bud --target node -t cluster-preflight:node .   (or docker build --target node)
ARG BASE=docker.io/library/python:3.11.11-slim-bookworm

FROM ${BASE} AS build
# Every Python dependency pinned; the package itself installs without resolving anything else.
COPY deploy/image/requirements-node.txt /tmp/requirements-node.txt
RUN python3 -m venv /opt/preflight \
 && /opt/preflight/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --only-binary=:all: -r /tmp/requirements-node.txt
COPY pyproject.toml setup.py README.md /src/
COPY preflight /src/preflight
COPY docs /src/docs
RUN /opt/preflight/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --no-deps --no-build-isolation /src \
 && /opt/preflight/bin/preflight --version \
 && /opt/preflight/bin/python -c "from preflight.explain.classifier import SCAN; assert SCAN.one_pass"

FROM build AS build-full
# torch's CUDA build by default (GBs): what the bandwidth workers and `preflight cluster` import.
ARG TORCH_SPEC=torch==2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
RUN /opt/preflight/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --index-url "${TORCH_INDEX_URL}" --extra-index-url https://pypi.org/simple "${TORCH_SPEC}"

FROM build AS build-nccl
# The torch-free engine and the NCCL and cuBLAS libraries it loads (cuda-pathfinder finds them in
# site-packages), every version pinned; wheels only.
COPY deploy/image/requirements-nccl.txt /tmp/requirements-nccl.txt
RUN /opt/preflight/bin/python -m pip install --no-cache-dir --disable-pip-version-check \
      --only-binary=:all: -r /tmp/requirements-nccl.txt \
 && /opt/preflight/bin/python -c "import cuda.bindings.driver, nccl.core, cuda.pathfinder"

FROM ${BASE} AS node
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="cluster-preflight" \
      org.opencontainers.image.description="Node validator for GPU clusters running PyTorch distributed training" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.documentation="docs/kubernetes.md"
# journalctl: the xid check reads the node's journal (mounted under --root) without root or
# /dev/kmsg. Versions come with the base image's Debian release and its security updates.
# hadolint ignore=DL3008
RUN if ! command -v journalctl >/dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd \
      && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb; \
    fi \
 && journalctl --version >/dev/null
COPY --from=build /opt/preflight /opt/preflight
# The NVIDIA container toolkit injects the driver's libnvidia-ml into containers that ask for it:
# utility = NVML / nvidia-smi, compute = CUDA (the bandwidth test).
ENV PATH=/opt/preflight/bin:${PATH} \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric non-root user, so that Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
EXPOSE 9857
ENTRYPOINT ["preflight"]
CMD ["check"]

FROM node AS nccl
COPY --from=build-nccl /opt/preflight /opt/preflight

FROM node AS full
COPY --from=build-full /opt/preflight /opt/preflight
