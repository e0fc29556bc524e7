package ledgerstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/waits"
)

// InstanceWaits are one instance's waits in progress, as its /waits
// endpoint lists them (package waits): the waits of the service without a
// bound of their own (the commit log settling at a start, an open Kafka
// transaction, the changelog's backlog holding checkpoints, a changelog
// that waits for an operator's repair).
type InstanceWaits struct {
	Instance string `json:"instance"` // the base URL asked
	// Optional: asked by default (the instance on this host), not by
	// name; its silence is no problem of the report.
	Optional bool         `json:"optional,omitempty"`
	Waits    []waits.Info `json:"waits"`
	// Error says why the instance's waits are unknown.
	Error string `json:"error,omitempty"`
	// Records are the totals of the records the instance took since it
	// started (its /records endpoint), the skipped ones among them,
	// which no table of the ledger holds; nil when it did not say (an
	// instance that does not answer, or a version without the endpoint).
	Records *health.Records `json:"records,omitempty"`
}

// AddWaits asks each instance (the base URL of its HTTP endpoints,
// HTTP_ADDR) for its waits and its records' totals and adds them to the
// report. An instance that
// does not answer is a problem of the report when required, else only
// said (the instance of this host asked by default may not run here).
func (r *Report) AddWaits(ctx context.Context, client *http.Client, instances []string, required bool) {
	for _, base := range instances {
		iw := InstanceWaits{Instance: base, Optional: !required}
		ws, err := fetchWaits(ctx, client, base)
		if err != nil {
			iw.Error = err.Error()
			if required {
				r.Problems = append(r.Problems, "waits of "+base+": "+iw.Error)
			}
		}
		iw.Waits = ws
		if err == nil {
			// Said when known; its absence is no problem of the report.
			iw.Records, _ = fetchRecords(ctx, client, base)
		}
		r.Waits = append(r.Waits, iw)
	}
}

func fetchWaits(ctx context.Context, client *http.Client, base string) ([]waits.Info, error) {
	var body waits.List
	if err := getJSON(ctx, client, base, waits.Path, 1<<20, &body); err != nil {
		return nil, err
	}
	if body.Waits == nil {
		body.Waits = []waits.Info{}
	}
	return body.Waits, nil
}

func fetchRecords(ctx context.Context, client *http.Client, base string) (*health.Records, error) {
	var rec health.Records
	if err := getJSON(ctx, client, base, health.PathRecords, 1<<16, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// getJSON decodes an instance's answer to GET path (at most limit bytes)
// into v.
func getJSON(ctx context.Context, client *http.Client, base, path string, limit int64, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
