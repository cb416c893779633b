# The `hindsight` binary: every service in one image.
# docker build -t hindsight .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin hindsight && strip target/release/hindsight

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* && useradd --system --home /var/lib/hindsight hindsight \
    && mkdir -p /var/lib/hindsight && chown hindsight /var/lib/hindsight
COPY --from=build /src/target/release/hindsight /usr/local/bin/hindsight
USER hindsight
WORKDIR /var/lib/hindsight
ENV HINDSIGHT_DATA_DIR=/var/lib/hindsight
ENTRYPOINT ["hindsight"]
