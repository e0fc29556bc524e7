# Build, check and test entry points. `make test` is the project's test
# command (CI runs it through .ci/run): it starts local Kafka and MariaDB
# with scripts/services.sh, then runs every test against them.
#
# Ports can be moved, e.g. `make test KAFKA_PORT=19092 MYSQL_PORT=13306`.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
KAFKA_PORT ?= 9092
KAFKA_CONTROLLER_PORT ?= 9093
MYSQL_PORT ?= 3306
MYSQL2_PORT ?= 3307
# The schema registry of the Avro tests: ../shared/registry/run beside the
# clone (CI lays shared/ there), a real Confluent-compatible registry.
REGISTRY_PORT ?= 18081
REGISTRY_RUN ?= ../shared/registry/run
# go test's bound per package: the integration package takes 530-630 s on
# two cores (a fresh-clone CI check: 629 s), so 15m left too little room
# on a slower machine; a hang still ends well inside CI's limit.
GO_TEST_TIMEOUT ?= 25m
# Extra `go test` flags, e.g. GOTESTFLAGS=-v or GOTESTFLAGS='-run TestMySQLXA'.
GOTESTFLAGS ?=

# What the test environment (internal/testenv) connects to. Derived
# from the ports rather than taken from the environment, so `make test`
# always tests the services it has just started; override on the command
# line (`make test MYSQL_DSN=...`) to point elsewhere.
KAFKA_BROKERS = 127.0.0.1:$(KAFKA_PORT)
MYSQL_DSN = root:root@tcp(127.0.0.1:$(MYSQL_PORT))/
# A second, independent server, for tests that need two (scripts/services.sh
# starts it as mariadb2).
MYSQL2_DSN = root:root@tcp(127.0.0.1:$(MYSQL2_PORT))/
SCHEMA_REGISTRY_URL = http://127.0.0.1:$(REGISTRY_PORT)/apis/ccompat/v7

# scripts/services.sh reads the ports from the environment.
export KAFKA_PORT KAFKA_CONTROLLER_PORT MYSQL_PORT MYSQL2_PORT

.PHONY: services services-down services-status registry registry-down build vet test test-unit demo

## services: start (or reuse) local Kafka and MariaDB under .services/
services:
	scripts/services.sh up

## services-down: stop them; no process is left behind
services-down:
	scripts/services.sh down

services-status:
	scripts/services.sh status || true

## registry: start (or reuse) the schema registry on REGISTRY_PORT (the
## first start builds it with Maven, about 90 s)
registry:
	@if curl -fs -o /dev/null '$(SCHEMA_REGISTRY_URL)/subjects'; then \
		echo "registry: reusing $(SCHEMA_REGISTRY_URL)"; \
	else \
		'$(REGISTRY_RUN)' start $(REGISTRY_PORT); \
	fi

## registry-down: stop the registry `make registry` started
registry-down:
	'$(REGISTRY_RUN)' stop

build:
	$(GO) build ./...

## vet: go vet, and gofmt must have nothing to reformat
vet:
	$(GO) vet ./...
	cd deploy/check && $(GO) vet -mod=mod ./...
	@unformatted=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard -- '*.go')); \
	if [[ -n $$unformatted ]]; then \
		echo "gofmt: these files need formatting (run gofmt -w):" >&2; echo "$$unformatted" >&2; exit 1; \
	fi

## test: everything, integration tests included, against local services,
## then the CI-sized chaos run (CHAOS_IN_TEST= skips it)
test: services registry
	$(GO) vet ./...
	KAFKA_BROKERS='$(KAFKA_BROKERS)' MYSQL_DSN='$(MYSQL_DSN)' MYSQL2_DSN='$(MYSQL2_DSN)' SCHEMA_REGISTRY_URL='$(SCHEMA_REGISTRY_URL)' \
		$(GO) test -count=1 -timeout $(GO_TEST_TIMEOUT) $(GOTESTFLAGS) ./...
	$(deploy-check)
	$(if $(CHAOS_IN_TEST),$(call chaos-run,$(CHAOS_IN_TEST),$(CHAOS_TIMEOUT)))

## test-unit: fast tests only; needs no services (-short skips integration tests)
test-unit:
	$(GO) test -short -count=1 $(GOTESTFLAGS) ./...
	$(deploy-check)

# deploy/check, a Go module of its own (the Prometheus and Kubernetes
# libraries stay out of go.mod): the alert rules' unit tests in promtool's
# format on the Prometheus rules engine, the Grafana dashboard, the list of
# metrics both use, and the Kubernetes manifests (strict decoding, settings,
# probes). Offline, no services; under 2 minutes from an empty build cache.
# It builds the service's own packages from this checkout (replace in its
# go.mod): -mod=mod lets a dependency added to the service's go.mod reach
# deploy/check/go.sum without failing the run (`cd deploy/check && go mod
# tidy` records it for good).
deploy-check = cd deploy/check && $(GO) test -mod=mod -count=1 $(GOTESTFLAGS) ./...

.PHONY: deploy-check
## deploy-check: only the checks of deploy/ (see above)
deploy-check:
	$(deploy-check)

# Placeholders, added by others:
## demo: the main job in one command: services, a topic, the service, the
## generator, and an exact comparison of the ledger (DEMO_EVENTS=100000)
demo:
	scripts/demo.sh

## bench: the service against its limits (Kafka read alone, its SQL alone)
## and against the naive at-least-once job, on the services `make services`
## starts (override KAFKA_BROKERS / MYSQL_DSN like `make test`). Variants
## default, amended (10 % of the events amended or cancelled, service mode
## only, beside the default's rate), avro, protobuf, json-schema (the default
## workload in each registry format, service mode only, beside the default's rate), large-state, many-accounts, steady-state, changelog and
## larger-than-memory (it shrinks the server's innodb_buffer_pool_size for its
## measurements and restores it) and three-instances (three service processes
## in one group), BENCH_EVENTS each
## (two interleaved repetitions: 43–47 minutes at 1,000,000 on 2 cores).
## Not by default: add-server (billing shards add halfway through the
## catch-up, onto MYSQL2_DSN: events/s before and during the move, e2e
## during it, the move's rows/s; the run fails if the ledger is not exact
## over both servers), two-servers, steady-state-entries, ledger-entries,
## closing, hostile. More
## flags through BENCH_FLAGS, e.g. BENCH_FLAGS='-variants default -profile
## -service-env MYSQL_BRANCHES=1'; `bin/billing-bench -h` lists them.
## Results, logs and profiles go to bin/bench-results/<time>/. See
## docs/performance.md.
BENCH_EVENTS ?= 1000000
BENCH_FLAGS ?=
.PHONY: bench
bench: services registry
	$(GO) build -o bin/ ./cmd/billing-bench ./cmd/billing-gen ./cmd/billing
	bin/billing-bench -brokers '$(KAFKA_BROKERS)' -mysql-dsn '$(MYSQL_DSN)' -mysql2-dsn '$(MYSQL2_DSN)' -schema-registry '$(SCHEMA_REGISTRY_URL)' -events $(BENCH_EVENTS) \
		-out "bin/bench-results/$$(date +%Y%m%d-%H%M%S)" $(BENCH_FLAGS)

# The chaos suite (integration/chaos_test.go, docs/chaos.md): three service
# instances, the generator, and a seeded driver that kills, stops and
# restarts them and restarts (or crashes) Kafka and MariaDB through
# scripts/services.sh. It restarts the shared services, so it runs alone
# (-p 1) and, in `make test`, after every other test. Seeds and the fault
# schedule are printed; replay with CHAOS_SEED=... CHAOS_GEN_SEED=...
# (other knobs: CHAOS_EVENTS, CHAOS_RATE, CHAOS_FAULTS, CHAOS_KINDS,
# CHAOS_KEEP_LOGS, CHAOS_LOG_DIR, CHAOS_REPORT).
CHAOS_IN_TEST ?= ci
CHAOS_TIMEOUT ?= 15m
CHAOS_LONG_TIMEOUT ?= 90m
CHAOS_GOTESTFLAGS ?=
chaos-run = KAFKA_BROKERS='$(KAFKA_BROKERS)' MYSQL_DSN='$(MYSQL_DSN)' MYSQL2_DSN='$(MYSQL2_DSN)' CHAOS=$(1) \
	$(GO) test -p 1 -count=1 -v -timeout $(2) -run '^TestChaos$$' $(CHAOS_GOTESTFLAGS) ./integration/

.PHONY: chaos chaos-long
## chaos: the CI-sized chaos run (about 2-3 minutes on 2 cores)
chaos: services
	$(call chaos-run,ci,$(CHAOS_TIMEOUT))

## chaos-long: a million events and 130 faults (about 22 minutes); the
## logs and report.json are kept, their folder is printed
chaos-long: services
	CHAOS_KEEP_LOGS=1 $(call chaos-run,long,$(CHAOS_LONG_TIMEOUT))

# ---------------------------------------------------------------- containers
# The image and its tests (docs/docker.md, scripts/images/). The engine is
# Docker if it answers, else Podman (as root: installed with runc and set up
# for these machines). Base images are the public ones; where no registry
# answers, local substitutes are built and cached under .services/images.
# The image is stamped with VERSION and COMMIT (internal/buildinfo).
IMAGE ?= billing-ledger:local
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
image-env = IMAGE='$(IMAGE)' VERSION='$(VERSION)' COMMIT='$(COMMIT)' GO='$(GO)'

.PHONY: image test-containers compose-demo

## image: build $(IMAGE) from the Dockerfile (size and build time printed)
image:
	$(image-env) scripts/images/images.sh image

## test-containers: the image, run against the local services (help,
## migrate, /readyz, an exact run with kill -9 and SIGTERM), then the
## integration tests through testcontainers (KAFKA_BROKERS and MYSQL_DSN
## unset), then a check that no container, volume or network is left
test-containers: services
	$(image-env) KAFKA_BROKERS='$(KAFKA_BROKERS)' MYSQL_DSN='$(MYSQL_DSN)' \
		scripts/images/test-containers.sh

## compose-demo: docker-compose.yml for real (Docker Compose, else
## podman-compose): up, generator and verifier until EXACT, scale to 3,
## down -v, nothing left
compose-demo:
	$(image-env) scripts/images/compose-demo.sh
