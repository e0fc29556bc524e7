package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// EnvSchemaRegistryURL names the base URL of a Confluent-compatible schema
// registry (`make test` starts one with ../shared/registry/run and sets it).
const EnvSchemaRegistryURL = "SCHEMA_REGISTRY_URL"

var registryOnce once[string]

// SchemaRegistry returns the base URL of a Confluent-compatible schema
// registry: skipped outside CI when SCHEMA_REGISTRY_URL is unset, a
// failure under CI=true, like Kafka and MySQL (there is no container
// fallback).
func SchemaRegistry(t testing.TB) string {
	t.Helper()
	requireIntegration(t)
	registryOnce.Do(func() { registryOnce.val, registryOnce.err = resolveRegistry() })
	check(t, "a schema registry ("+EnvSchemaRegistryURL+")", registryOnce.err)
	return registryOnce.val
}

func resolveRegistry() (string, error) {
	v := strings.TrimRight(strings.TrimSpace(os.Getenv(EnvSchemaRegistryURL)), "/")
	if v == "" {
		return "", fmt.Errorf("%w: %s is not set (make test starts one: ../shared/registry/run start 18081)", errAbsent, EnvSchemaRegistryURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v+"/subjects", nil)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvSchemaRegistryURL, v, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s=%s is set but the registry does not answer: %w", EnvSchemaRegistryURL, v, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s=%s: GET /subjects answered %s", EnvSchemaRegistryURL, v, resp.Status)
	}
	return v, nil
}
