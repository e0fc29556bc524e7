package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/txsink"
)

// progressSnapshot is what a progress line compares between two ticks.
type progressSnapshot struct {
	at                time.Time
	consumed, counted int64
	parts             []partProgress // in partition order
}

// partProgress is where an assigned partition stands: its next offset
// (txsink.StartOffset before its first record) against the end of its log
// as the latest fetch reported it (-1: not known yet).
type partProgress struct {
	id            int32
	position, end int64
}

// maxProgressPartitions bounds the partitions a progress line names.
const maxProgressPartitions = 32

// progressLine is the progress line from prev to cur: records counted and
// consumed, the rate, each partition's position against its log end, how
// many records are behind the log end and when they would be caught up at
// this rate. work is false when nothing was consumed since prev and
// nothing is known to be behind: an idle instance logs nothing.
func progressLine(prev, cur progressSnapshot) (attrs []any, work bool) {
	consumed := cur.consumed - prev.consumed
	secs := cur.at.Sub(prev.at).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(consumed) / secs
	}
	var behind int64
	var pos []string
	unknown := 0
	for i, p := range cur.parts {
		switch {
		case p.end < 0 || p.position == txsink.StartOffset:
			unknown++
		default:
			behind += max(p.end-p.position, 0)
		}
		if i < maxProgressPartitions {
			pos = append(pos, fmt.Sprintf("p%d %s/%s", p.id, offsetText(p.position), endText(p.end)))
		}
	}
	if n := len(cur.parts) - maxProgressPartitions; n > 0 {
		pos = append(pos, fmt.Sprintf("and %d more", n))
	}
	work = consumed > 0 || behind > 0
	attrs = []any{
		"partitions", len(cur.parts), "counted", cur.counted, "consumed", cur.consumed,
		"records_per_second", int64(rate + 0.5), "behind", behind, "positions", strings.Join(pos, ", "),
	}
	if unknown > 0 {
		attrs = append(attrs, "positions_not_known_yet", unknown)
	}
	switch {
	case behind == 0:
	case rate > 0:
		eta := time.Duration(float64(behind) / rate * float64(time.Second))
		unit := 100 * time.Millisecond
		if eta >= time.Minute {
			unit = time.Second
		}
		attrs = append(attrs, "catch_up_in", max(eta.Round(unit), unit))
	default:
		attrs = append(attrs, "catch_up_in", "unknown (no progress since the last line)")
	}
	return attrs, work
}

func offsetText(o int64) string {
	if o == txsink.StartOffset {
		return "start"
	}
	return fmt.Sprint(o)
}

func endText(o int64) string {
	if o < 0 {
		return "?"
	}
	return fmt.Sprint(o)
}

// progressSnapshotNow reads the counters and the assigned partitions.
func (p *Pipeline) progressSnapshotNow() progressSnapshot {
	s := progressSnapshot{at: time.Now(), consumed: p.stats.Consumed.Load(), counted: p.stats.Counted.Load()}
	p.mu.Lock()
	for id, pt := range p.parts {
		s.parts = append(s.parts, partProgress{id: id, position: pt.position, end: pt.end})
	}
	p.mu.Unlock()
	slices.SortFunc(s.parts, func(a, b partProgress) int { return int(a.id - b.id) })
	return s
}

// progress logs a progress line every ProgressInterval while there is
// work, until ctx ends.
func (p *Pipeline) progress(ctx context.Context) {
	if p.cfg.ProgressInterval <= 0 {
		return
	}
	t := time.NewTicker(p.cfg.ProgressInterval)
	defer t.Stop()
	prev := p.progressSnapshotNow()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := p.progressSnapshotNow()
		if attrs, work := progressLine(prev, cur); work {
			p.log.Info("progress", attrs...)
		}
		prev = cur
	}
}
