# syntax=docker/dockerfile:1
# Two images from one build (BuildKit, the default builder of current Docker):
#
#   docker build --target hub -t flotilla .           # the hub, and every flotilla command
#   docker build --target agent -t flotilla-agent .   # the edge agent alone, a small image
#
# README.md ("Docker") has the `docker run` lines for both.

ARG RUST_VERSION=1.89

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# .dockerignore keeps target/, .git and state folders out of the context.
COPY . .
# The hub in the release profile; the edge agent in the `edge` profile (whole-program
# LTO: a smaller binary, for a longer build).
# The registry and target/ are cache mounts, so a rebuild after a source edit compiles
# only what changed; the binaries are copied out, since cache mounts are not layers.
# The empty state folder is the agent image's volume, owned by the agent's user.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p flotilla --bins \
    && cargo build --profile edge --locked -p flotilla-agent --bins \
    && mkdir -p /out/agent-state \
    && cp target/release/flotilla target/edge/flotilla-agent /out/

# The edge agent alone, on a distroless base (glibc and CA certificates, no shell),
# as an unprivileged user. Its settings come from FLOTILLA_AGENT_* variables or flags.
FROM gcr.io/distroless/cc-debian12:nonroot AS agent
COPY --from=build /out/flotilla-agent /usr/local/bin/flotilla-agent
COPY --from=build --chown=65532:65532 /out/agent-state /var/lib/flotilla-agent
# The token file's path, not a token: mount the cluster's token (a Secret) there.
# hadolint ignore=DL3064
ENV FLOTILLA_AGENT_STATE_DIR=/var/lib/flotilla-agent \
    FLOTILLA_AGENT_TOKEN_FILE=/etc/flotilla/token \
    FLOTILLA_AGENT_SINK=kube
# glibc serves each allocation of 1 MiB or more (a bundle's document) from a mapping
# of its own, given back when freed, instead of raising that threshold as it goes and
# keeping such buffers in its heap (docs/agent.md, "Memory").
ENV GLIBC_TUNABLES=glibc.malloc.mmap_threshold=1048576
VOLUME ["/var/lib/flotilla-agent"]
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/flotilla-agent"]

# The hub (the last stage, so that a plain `docker build .` gives it). Git is there
# to follow a remote repository (`--repo https://…`), which the hub mirrors with it.
# A fleet mounted at /fleet belongs to the host's user, not to the container's, and
# Git (libgit2 too) refuses a repository someone else owns unless it is trusted: the
# system configuration trusts /fleet. Package versions follow the Debian release the
# base image names (security updates included), so they are not pinned.
FROM debian:bookworm-slim AS hub
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/flotilla --create-home flotilla \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/flotilla/state \
    && git config --system --add safe.directory /fleet
COPY --from=build /out/flotilla /usr/local/bin/flotilla
# Inside the container the hub listens on every interface (outside one, loopback
# stays the default); its state is a volume; the fleet is read from /fleet.
ENV FLOTILLA_LISTEN=0.0.0.0:8080 \
    FLOTILLA_STATE_DIR=/var/lib/flotilla/state
VOLUME ["/var/lib/flotilla/state"]
EXPOSE 8080
USER 10001:10001
WORKDIR /var/lib/flotilla
ENTRYPOINT ["/usr/local/bin/flotilla"]
CMD ["serve", "--repo", "/fleet"]
