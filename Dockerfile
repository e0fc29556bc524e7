# syntax=docker/dockerfile:1
#
# Image of the billing ledger: the service (`billing`, the entrypoint) plus
# the demo tools `billing-gen` and `billing-verify`, all static Go binaries on
# distroless (no shell, no package manager, runs as nonroot 65532:65532).
#
#   make image                                      # Docker, else Podman; see docs/docker.md
#   docker build -t billing-ledger:local .          # the same with Docker by hand
#   docker run --rm billing-ledger:local --help     # the environment variables
#   docker run --rm billing-ledger:local version    # version and commit (make image stamps them)
#   docker run --rm -e KAFKA_BROKERS=... -e MYSQL_DSN=... billing-ledger:local migrate
#   docker run --rm --entrypoint billing-gen billing-ledger:local -h
#   docker run --rm --entrypoint billing-verify billing-ledger:local -h
#
# CI builds it with Podman and local base images (`make test-containers`,
# scripts/images/) and runs it against Kafka and MariaDB
# (integration/container_test.go).

# Base images. The defaults are the public ones; `make image` passes local
# substitutes (scripts/images/) where no registry answers. Fully qualified
# names, so that Podman needs no short-name resolution. The golang image sets
# GOTOOLCHAIN=local: its Go must be at least the `go` line of go.mod; the
# 1.26 tags follow the newest 1.26 patch.
ARG GO_VERSION=1.26
ARG GOLANG_IMAGE=docker.io/library/golang:${GO_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# ---------------------------------------------------------------- build
# Runs on the build machine's platform and cross-compiles to the target's
# (CGO is off, so a multi-arch `docker buildx build --platform ...` needs no
# emulation).
FROM --platform=$BUILDPLATFORM ${GOLANG_IMAGE} AS build
WORKDIR /src

# A module proxy other than the image's default, e.g. a company mirror.
ARG GOPROXY

# Modules first: downloaded again only when go.mod or go.sum change. The
# module and build caches are cache mounts (BuildKit, Buildah): they speed
# up rebuilds and never reach the image.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download

COPY . .

ARG TARGETOS
ARG TARGETARCH
# Stamped into internal/buildinfo (`billing version`); `make image`
# passes `git describe` and the commit.
ARG VERSION=dev
ARG COMMIT=unknown
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -buildvcs=false \
        -ldflags="-s -w -X github.com/billing/ledger/internal/buildinfo.Version=${VERSION} -X github.com/billing/ledger/internal/buildinfo.Commit=${COMMIT}" \
        -o /out/bin/ ./cmd/billing ./cmd/billing-gen ./cmd/billing-verify

# /data: a directory the nonroot user owns, for a named volume mounted there
# (billing-gen writes its expected-ledger file into it). A new named volume
# takes the ownership of the image directory it is mounted on.
RUN mkdir -p /out/data

# ---------------------------------------------------------------- runtime
# static-debian12 carries CA certificates, tzdata and an /etc/passwd with
# nonroot (65532); the :nonroot tag already defaults to that user.
FROM ${RUNTIME_IMAGE}

COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /data

USER 65532:65532

# HTTP_ADDR (default :8080): /metrics, /healthz, /readyz.
EXPOSE 8080

# `billing healthcheck` GETs http://127.0.0.1:<port of HTTP_ADDR>/readyz and
# exits 0 on 200, 1 otherwise: distroless has no shell or curl to probe
# with. Ready means the instance can do its job (docs/operations.md; a
# standby without partitions is ready); nothing restarts on unhealthy.
# Kubernetes ignores HEALTHCHECK: use httpGet probes on /healthz (liveness)
# and /readyz (readiness). Containers of this image that run billing-gen or
# billing-verify disable the check (docker-compose.yml does).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/billing", "healthcheck"]

ENTRYPOINT ["/usr/local/bin/billing"]
