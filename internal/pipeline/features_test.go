package pipeline

import (
	"maps"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The store's features follow the settings: the default runs none but the
// ones always on; entries without retention no retention; every setting
// on, every feature.
func TestFeaturesFollowTheSettings(t *testing.T) {
	on := func(fs ...driver.Feature) map[driver.Feature]bool {
		out := map[driver.Feature]bool{driver.FeatureAlways: true, driver.FeatureClosing: false, driver.FeatureEntries: false, driver.FeatureRetention: false,
			driver.FeatureChangelog: false}
		for _, f := range fs {
			out[f] = true
		}
		return out
	}
	for _, c := range []struct {
		name string
		cfg  Config
		want map[driver.Feature]bool
	}{
		{"default", Config{}, on()},
		{"closing", Config{WindowCloseAfter: time.Minute}, on(driver.FeatureClosing)},
		{"entries", Config{LedgerEntries: true}, on(driver.FeatureEntries)},
		{"retention without entries", Config{LedgerEntriesRetention: time.Hour}, on()},
		{"changelog", Config{Changelog: true}, on(driver.FeatureChangelog)},
		{"everything", Config{WindowCloseAfter: time.Minute, LedgerEntries: true, LedgerEntriesRetention: time.Hour, Changelog: true},
			on(driver.FeatureClosing, driver.FeatureEntries, driver.FeatureRetention, driver.FeatureChangelog)},
	} {
		if got := c.cfg.Features(); !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
