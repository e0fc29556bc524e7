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
GO_TEST_TIMEOUT ?= 15m
# Extra `go test` flags, e.g. GOTESTFLAGS=-v or GOTESTFLAGS='-run TestMySQLXA'.
GOTESTFLAGS ?=

# What the integration harness (integration/harness) connects to. Derived
# from the ports rather than taken from the environment, so `make test`
# always tests the services it has just started; override on the command
# line (`make test MYSQL_DSN=...`) to point elsewhere.
KAFKA_BROKERS = 127.0.0.1:$(KAFKA_PORT)
MYSQL_DSN = root:root@tcp(127.0.0.1:$(MYSQL_PORT))/

# scripts/services.sh reads the ports from the environment.
export KAFKA_PORT KAFKA_CONTROLLER_PORT MYSQL_PORT

.PHONY: services services-down services-status build vet test test-unit

## services: start (or reuse) local Kafka and MariaDB under .services/
services:
	scripts/services.sh up

## services-down: stop them; no process is left behind
services-down:
	scripts/services.sh down

services-status:
	scripts/services.sh status || true

build:
	$(GO) build ./...

## vet: go vet, and gofmt must have nothing to reformat
vet:
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard -- '*.go')); \
	if [[ -n $$unformatted ]]; then \
		echo "gofmt: these files need formatting (run gofmt -w):" >&2; echo "$$unformatted" >&2; exit 1; \
	fi

## test: everything, integration tests included, against local services
test: services
	$(GO) vet ./...
	KAFKA_BROKERS='$(KAFKA_BROKERS)' MYSQL_DSN='$(MYSQL_DSN)' \
		$(GO) test -count=1 -timeout $(GO_TEST_TIMEOUT) $(GOTESTFLAGS) ./...

## test-unit: fast tests only; needs no services (-short skips integration tests)
test-unit:
	$(GO) test -short -count=1 $(GOTESTFLAGS) ./...

# Placeholders, added by others:
# demo:        (to be added)
# bench:       (to be added)
# chaos-long:  (to be added)
