# syntax=docker/dockerfile:1
#
# Image of the billing ledger: the service (`billing`, the entrypoint) plus
# the demo tools `billing-gen` and `billing-verify`, all static Go binaries on
# distroless (no shell, no package manager, runs as nonroot 65532:65532).
#
#   docker build -t billing-ledger:local .
#   docker run --rm billing-ledger:local --help    # the environment variables
#   docker run --rm -e KAFKA_BROKERS=... -e MYSQL_DSN=... billing-ledger:local migrate
#   docker run --rm --entrypoint billing-gen billing-ledger:local -h
#   docker run --rm --entrypoint billing-verify billing-ledger:local -h
#
# This file is kept correct by reading (CI has no Docker engine): see
# docs/docker.md.

# The golang image sets GOTOOLCHAIN=local: its Go must be at least the
# `go` line of go.mod (1.26.8). The 1.26 tags follow the newest 1.26 patch.
# GO_VERSION selects the golang:<GO_VERSION>-bookworm build image.
ARG GO_VERSION=1.26

# ---------------------------------------------------------------- build
# Runs on the build machine's platform and cross-compiles to the target's
# (CGO is off, so a multi-arch `docker buildx build --platform ...` needs no
# emulation).
# build compiles the three commands into /out/bin.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src

# Modules first, in their own layer: rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .

ARG TARGETOS
ARG TARGETARCH
# The build cache mount only speeds up rebuilds; nothing in it reaches the image.
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false -ldflags="-s -w" -o /out/bin/ \
        ./cmd/billing ./cmd/billing-gen ./cmd/billing-verify

# /data: a directory the nonroot user owns, for a named volume mounted there
# (billing-gen writes its expected-ledger file into it). A new named volume
# takes the ownership of the image directory it is mounted on.
RUN mkdir -p /out/data

# ---------------------------------------------------------------- runtime
# static-debian12 carries CA certificates, tzdata and an /etc/passwd with
# nonroot (65532); the :nonroot tag already defaults to that user.
FROM gcr.io/distroless/static-debian12:nonroot

COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /data

USER nonroot:nonroot

# HTTP_ADDR (default :8080): /metrics, /healthz, /readyz.
EXPOSE 8080

# ASSUMES a `billing healthcheck` subcommand (not in cmd/billing yet): GET
# http://127.0.0.1<port of HTTP_ADDR>/readyz, exit 0 on 200, 1 otherwise.
# Distroless has no shell or curl to probe with. Until the subcommand exists
# this check reports "unhealthy" (billing exits 2 on an unknown command);
# nothing restarts on that. Kubernetes should use httpGet probes on /healthz
# (liveness) and /readyz (readiness) instead; this HEALTHCHECK is ignored
# there. Containers of this image that run billing-gen or billing-verify
# must disable it (docker-compose.yml does).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/billing", "healthcheck"]

ENTRYPOINT ["/usr/local/bin/billing"]
