# syntax=docker/dockerfile:1
# Build: docker build -t copyrator:0.1.0 .

FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, so that a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

# Distroless: glibc and CA certificates, no shell, non-root (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/copyrator /usr/local/bin/copyrator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["copyrator"]
