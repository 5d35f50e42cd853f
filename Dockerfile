# syntax=docker/dockerfile:1
# Build: docker build -t copyrator:0.1.0 .
# Without Docker or a registry, `make image` (hack/image) builds the same
# recipe into an OCI archive: the same build script, the same final stage.

FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY hack/build-static hack/build-static
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && hack/build-static \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && hack/build-static

# The binary alone: statically linked, no shell, no libc, non-root.
FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/copyrator /copyrator
USER 65532:65532
# glibc's malloc arenas, two at most: an arena per short-lived thread keeps
# the memory freed in it, and the RSS grew by megabytes as rules came and
# went while the live heap stayed put (tests/suite/restart.rs).
ENV MALLOC_ARENA_MAX=2
EXPOSE 8080
ENTRYPOINT ["/copyrator"]
