package periods

import (
	"context"
	"errors"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Report is what `billing periods show` prints: the ledger's definitions,
// whether windows close, the closing frontier and the latest watermark of
// a group's partitions.
type Report struct {
	Definitions  []ReportDefinition `json:"definitions"`
	Windows      string             `json:"windows"`
	WindowsClose bool               `json:"windows_close"`
	ClosedBefore *time.Time         `json:"closed_before"`
	SealedBefore *time.Time         `json:"sealed_before"`
	Watermark    *time.Time         `json:"watermark"` // the latest of the scope's partitions
}

// ReportDefinition is one definition of a Report.
type ReportDefinition struct {
	Seq          int        `json:"seq"`
	From         *time.Time `json:"from"` // null: from the beginning
	Window       string     `json:"window"`
	Timezone     string     `json:"timezone"`
	WindowsClose bool       `json:"windows_close"`
	RecordedAt   time.Time  `json:"recorded_at"`
	RecordedBy   string     `json:"recorded_by"`
}

// ErrNoneStored: the ledger has no period settings stored yet.
var ErrNoneStored = errors.New("no period settings stored in this ledger: no instance of this version has started on it yet (the first one stores its own)")

// Show reads the ledger's period settings, its frontier and the latest
// watermark of scope's partitions, through the read-only view.
func Show(ctx context.Context, v driver.View, scope driver.Scope) (*Report, error) {
	stored, err := Read(ctx, v)
	if err != nil {
		return nil, err
	}
	if len(stored) == 0 {
		return nil, ErrNoneStored
	}
	f, parts, err := v.EventTime(ctx, scope)
	if err != nil {
		return nil, err
	}
	r := &Report{Windows: stored.Describe(), WindowsClose: stored.Current().Close, ClosedBefore: timeOrNil(f.Closed), SealedBefore: timeOrNil(f.Sealed)}
	var wm time.Time
	for _, p := range parts {
		if p.Watermark.After(wm) {
			wm = p.Watermark
		}
	}
	r.Watermark = timeOrNil(wm)
	for _, def := range stored {
		r.Definitions = append(r.Definitions, ReportDefinition{Seq: def.Seq, From: timeOrNil(def.From), Window: def.Period.Unit(), Timezone: def.Period.Zone(),
			WindowsClose: def.Close, RecordedAt: def.RecordedAt, RecordedBy: def.RecordedBy})
	}
	return r, nil
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
