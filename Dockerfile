# Multi-stage build: compile in the Rust image, run from a small Debian image.
# docker build -t flotilla .
# docker run --rm -v "$PWD/fleet-example:/fleet:ro" flotilla render --repo /fleet
FROM rust:1.89-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src benches examples/support \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/render.rs \
    && echo 'fn main() {}' > examples/gen_fleet.rs \
    && cargo build --release --locked \
    && rm -rf src benches examples
COPY . .
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin flotilla

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/flotilla --create-home flotilla
COPY --from=build /src/target/release/flotilla /usr/local/bin/flotilla
USER 10001
WORKDIR /var/lib/flotilla
ENTRYPOINT ["/usr/local/bin/flotilla"]
CMD ["--help"]
