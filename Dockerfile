# syntax=docker/dockerfile:1
#
# One Dockerfile for both services, one final stage per service:
#
#   docker build --target catalog-service -t catalog-service .
#   docker build --target orders-service  -t orders-service  .
#
# (docker-compose.yml does the same with `build.target`.) Why targets rather than a
# `SERVICE` build argument: both binaries come out of one `cargo build` in one shared
# build stage, so the workspace (shared/, every dependency) is compiled once for the two
# images instead of once per image, and each final stage can say exactly which ports
# its service listens on (EXPOSE cannot depend on a build argument).
#
# Dependency caching: BuildKit cache mounts keep cargo's registry and the target
# directory between builds, so after the first build only the changed crates are
# compiled again. Needs BuildKit: the default of `docker build` since Docker 23 and of
# `docker compose` (v2) always.
#
# Without a registry (no `rust` image to pull, no crates.io inside the build), the
# `*-prebuilt` targets take the binaries the host built instead. Their build context is
# a folder holding the two binaries, not this repository:
#
#   docker build -f Dockerfile --target orders-service-prebuilt \
#       -t deadline-propagation/orders-service:dev <folder with the binaries>
#
# `cargo xtask images` does that with target/debug's binaries, and with `--build-arg
# BASE_IMAGE=deadline-propagation/offline-debian:bookworm`, the Debian tree it makes by
# debootstrap, as the runtime's base (docs/docker.md). Those targets come before the
# build stage on purpose: Docker's legacy builder (the one that runs where BuildKit is
# absent) builds every stage up to the target in file order, so a build stage above them
# would make it pull the `rust` image. The legacy builder ignores the `syntax` line and
# never reaches the cache mounts below, which need BuildKit; BuildKit itself builds only
# the stages a target uses.

ARG RUST_VERSION=1.94
# The runtime stages' base: Debian bookworm, as the `rust` build image is, so the binaries
# find the same glibc. Without a registry, `cargo xtask images` passes its own.
ARG BASE_IMAGE=debian:bookworm-slim
# Cargo features for both services, e.g. `--build-arg CARGO_FEATURES=tls` for outbound
# HTTPS (a hosted LLM planner or OTLP endpoint). Empty: plain HTTP, the faster build.
ARG CARGO_FEATURES=""

# --------------------------------------------------------------------------- runtime
# No extra packages by default: the services speak plain HTTP inside the compose network
# (reqwest is built without TLS) and compose's health checks use bash's /dev/tcp. With
# the tls feature, rustls verifies servers against the system's CA certificates.
FROM ${BASE_IMAGE} AS runtime
ARG CARGO_FEATURES
RUN case ",$CARGO_FEATURES," in \
        *,tls,*) apt-get update \
            && apt-get install -y --no-install-recommends ca-certificates \
            && rm -rf /var/lib/apt/lists/* ;; \
    esac
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin app
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

# ----------------------------------------------------- each service, without its binary
# What each image says about its service, shared by the two ways of getting the binary.
FROM runtime AS catalog-runtime
# The service's defaults are loopback, which nothing outside the container could reach.
# The public API listens on all interfaces; the admin (fault injection) API stays on
# loopback unless the deployment sets CATALOG_ADMIN_ADDR (docker-compose.yml does).
ENV CATALOG_LISTEN_ADDR=0.0.0.0:8081
# 8081: GET /catalog/{sku}, /metrics, /healthz. 9081: /admin/faults.
EXPOSE 8081 9081
ENTRYPOINT ["/usr/local/bin/catalog-service"]

FROM runtime AS pricing-runtime
# gRPC on all interfaces; the admin API (faults, /metrics) stays on loopback unless the
# deployment sets PRICING_ADMIN_ADDR (docker-compose.yml does).
ENV PRICING_LISTEN_ADDR=0.0.0.0:50051
# 50051: pricing.v1.Pricing/Price (gRPC). 9082: /admin/faults, /metrics.
EXPOSE 50051 9082
ENTRYPOINT ["/usr/local/bin/pricing-service"]

FROM runtime AS orders-runtime
ENV ORDERS_LISTEN_ADDR=0.0.0.0:8080
# 8080: /api/orders, /api/assistant/chat, /mcp, /metrics, /healthz, /readyz.
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/orders-service"]

FROM runtime AS shipping-runtime
ENV SHIPPING_LISTEN_ADDR=0.0.0.0:8083
# 8083: /metrics, /healthz (its work comes from the queue in PostgreSQL).
EXPOSE 8083
ENTRYPOINT ["/usr/local/bin/shipping-worker"]

# ------------------------------------------------------ the host's binaries (no registry)
FROM catalog-runtime AS catalog-service-prebuilt
COPY catalog-service /usr/local/bin/catalog-service

FROM pricing-runtime AS pricing-service-prebuilt
COPY pricing-service /usr/local/bin/pricing-service

FROM orders-runtime AS orders-service-prebuilt
COPY orders-service /usr/local/bin/orders-service

FROM shipping-runtime AS shipping-worker-prebuilt
COPY shipping-worker /usr/local/bin/shipping-worker

# ----------------------------------------------------------------------------- build
FROM rust:${RUST_VERSION}-bookworm AS build
ARG CARGO_FEATURES
WORKDIR /src
ENV CARGO_TERM_COLOR=never
# The whole workspace: every member's manifest must be present for cargo to resolve it.
# .dockerignore keeps target/, .git/ and the non-Rust folders out of the context.
COPY . .
# The target directory is a cache mount, which is gone after this step: copy the two
# binaries out of it in the same RUN.
RUN --mount=type=cache,id=deadline-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=deadline-cargo-git,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,id=deadline-target,target=/src/target,sharing=locked \
    cargo build --release --locked --package catalog-service --package pricing-service --package orders-service --package shipping-worker --bins \
        ${CARGO_FEATURES:+--features "$CARGO_FEATURES"} \
 && mkdir -p /out \
 && cp target/release/catalog-service target/release/pricing-service target/release/orders-service \
       target/release/shipping-worker /out/

# ------------------------------------------------------- the images compose builds
FROM catalog-runtime AS catalog-service
COPY --from=build /out/catalog-service /usr/local/bin/catalog-service

FROM pricing-runtime AS pricing-service
COPY --from=build /out/pricing-service /usr/local/bin/pricing-service

FROM orders-runtime AS orders-service
COPY --from=build /out/orders-service /usr/local/bin/orders-service

FROM shipping-runtime AS shipping-worker
COPY --from=build /out/shipping-worker /usr/local/bin/shipping-worker
