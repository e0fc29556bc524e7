package bench

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// quantile returns the q-quantile (0..1) of xs by the nearest-rank method,
// or NaN-free 0 for an empty slice. xs is sorted in place.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(q*float64(len(xs))+0.5) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// unit is one checkpoint, batch or poll.
type unit struct {
	end     time.Time
	dur     time.Duration
	records int
	counted int // events added to the ledger (keys inserted)
	phases  map[string]time.Duration
	cut     map[int32]int64 // service: partition → next offset after it
}

// summary of a run of units.
type unitStats struct {
	Count   int                `json:"count"`
	Records int64              `json:"records"`
	Rate    float64            `json:"rate"` // records/s after the first unit
	Mean    float64            `json:"mean_records"`
	P50     float64            `json:"p50_ms"`
	P99     float64            `json:"p99_ms"`
	Max     float64            `json:"max_ms"`
	Phases  map[string]float64 `json:"phases_mean_ms,omitempty"`
}

// summarize computes the sustained rate as the records of every unit but
// the first, over the time from the first unit's end to the last unit's
// end: start-up (connections, group join, the first fetch) is left out.
// With a single unit it falls back to records over the time since start.
func summarize(us []unit, start time.Time) unitStats {
	s := unitStats{Count: len(us), Phases: map[string]float64{}}
	if len(us) == 0 {
		return s
	}
	var durs []float64
	for _, u := range us {
		s.Records += int64(u.records)
		durs = append(durs, ms(u.dur))
		for k, v := range u.phases {
			s.Phases[k] += ms(v) / float64(len(us))
		}
	}
	s.Mean = float64(s.Records) / float64(len(us))
	if span := us[len(us)-1].end.Sub(us[0].end); len(us) > 1 && span > 0 {
		s.Rate = float64(s.Records-int64(us[0].records)) / span.Seconds()
	} else if span := us[0].end.Sub(start); span > 0 {
		s.Rate = float64(s.Records) / span.Seconds()
	}
	s.P50, s.P99 = quantile(durs, 0.5), quantile(durs, 0.99)
	s.Max = durs[len(durs)-1]
	return s
}

// peakRSS returns VmHWM (peak resident set size) of this process in MiB.
func peakRSS() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			fs := strings.Fields(rest)
			if len(fs) > 0 {
				kb, _ := strconv.ParseFloat(fs[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}
