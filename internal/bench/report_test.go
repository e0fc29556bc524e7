package bench

import (
	"strings"
	"testing"

	"github.com/billing/ledger/internal/config"
)

// rateOf is one measurement of mode at rep with the given catch-up rate.
func rateOf(variant, mode string, rep int, rate float64) measurement {
	return measurement{Variant: variant, Mode: mode, Rep: rep, Result: childResult{Records: 1000, CatchUpS: 1, CatchUp: unitStats{Rate: rate}}}
}

// TestLimitSpreadAndInversion: with several repetitions the ÷limit cell
// shows the median and the range of the paired ratios, and a repetition in
// which the service outran its limit is named under the table, so that one
// median cannot hide an inverted bound.
func TestLimitSpreadAndInversion(t *testing.T) {
	o := &options{svc: config.Defaults()}
	infos := []variantInfo{{Name: "default"}, {Name: "other"}}
	ms := []measurement{
		rateOf("default", modeSink, 1, 100), rateOf("default", modeService, 1, 90),
		rateOf("default", modeSink, 2, 100), rateOf("default", modeService, 2, 110), // inverted
		rateOf("other", modeSink, 1, 100), rateOf("other", modeService, 1, 80),
		rateOf("other", modeSink, 2, 100), rateOf("other", modeService, 2, 70),
	}
	out := renderTable(o, infos, ms)
	if !strings.Contains(out, "1.00 (0.90–1.10)") {
		t.Errorf("default's ÷limit should read 1.00 (0.90–1.10):\n%s", out)
	}
	if !strings.Contains(out, "0.75 (0.70–0.80)") {
		t.Errorf("other's ÷limit should read 0.75 (0.70–0.80):\n%s", out)
	}
	if !strings.Contains(out, "did NOT bound the service (÷limit > 1) in: default (1 of 2 repetitions);") {
		t.Errorf("the inverted repetition of default is not named:\n%s", out)
	}
	if strings.Contains(out, "other (") {
		t.Errorf("other was always bounded, yet named:\n%s", out)
	}

	// Bounded everywhere: said so.
	ms[3] = rateOf("default", modeService, 2, 95)
	if out := renderTable(o, infos, ms); !strings.Contains(out, "bounded the service (÷limit ≤ 1) in every repetition") {
		t.Errorf("all bounded, not said:\n%s", out)
	}
}
