package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
)

// The sink-only limit replays the service's own checkpoints when the
// service ran before it in the same repetition: the service reports where
// each of its catch-up checkpoints left each partition (its cuts), and
// sink-only feeds the checkpoint protocol exactly those records, checkpoint
// by checkpoint. The statements are then the service's statements, not
// only the same kind of statements: which repeats fall into which
// checkpoint (and so which ones the dedup cache still holds, and how many
// claim statements meet a stored key and need a lookup) depends on how the
// topic was cut, and a different cut can cost MySQL more than the
// service's. Without a service run to replay, sink-only cuts the topic in
// poll order (topicChunks).

// cutReplay reads each partition with a client of its own (so that reading
// one partition ahead never buffers the others) and returns, per recorded
// cut, the records from the previous cut to it.
type cutReplay struct {
	dec     *event.Decoder
	clients map[int32]*kgo.Client
	next    map[int32]int64 // next offset to return, per partition
	pending map[int32][]pipeline.Record
	cuts    []map[int32]int64
	invalid int64
}

func newCutReplay(spec childSpec, maxPayload int) (*cutReplay, error) {
	r := &cutReplay{dec: event.NewDecoder(maxPayload), clients: map[int32]*kgo.Client{}, next: map[int32]int64{},
		pending: map[int32][]pipeline.Record{}, cuts: spec.Replay}
	for p := range spec.Ends {
		cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{spec.Topic: {p: kgo.NewOffset().AtStart()}}),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		if err != nil {
			r.close()
			return nil, err
		}
		r.clients[p] = cl
	}
	return r, nil
}

func (r *cutReplay) close() {
	for _, cl := range r.clients {
		cl.Close()
	}
}

// chunk returns the records of the next recorded checkpoint and its cut
// (partition → next offset); no records and a nil cut after the last.
func (r *cutReplay) chunk(ctx context.Context) ([]pipeline.Record, map[int32]int64, error) {
	if len(r.cuts) == 0 {
		return nil, nil, nil
	}
	cut := r.cuts[0]
	r.cuts = r.cuts[1:]
	var out []pipeline.Record
	for _, p := range slices.Sorted(maps.Keys(cut)) {
		recs, err := r.upTo(ctx, p, cut[p])
		if err != nil {
			return nil, nil, err
		}
		out = append(out, recs...)
	}
	return out, cut, nil
}

// upTo returns partition p's records from where the last chunk left it to
// end (exclusive). The service's cuts always follow a record it read
// (control records and aborted ones leave gaps in the offsets, but a cut
// is the offset after the last record returned), so reading until that
// record has been seen ends.
func (r *cutReplay) upTo(ctx context.Context, p int32, end int64) ([]pipeline.Record, error) {
	cl, ok := r.clients[p]
	if !ok {
		return nil, fmt.Errorf("replayed cut names partition %d, which the topic does not have", p)
	}
	var out []pipeline.Record
	take := func() {
		i := 0
		for i < len(r.pending[p]) && r.pending[p][i].Offset < end {
			i++
		}
		out = append(out, r.pending[p][:i]...)
		r.pending[p] = slices.Delete(r.pending[p], 0, i)
	}
	take()
	for r.next[p] < end && len(r.pending[p]) == 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading partition %d: %w", p, ctx.Err())
		}
		fs.EachRecord(func(rec *kgo.Record) {
			r.next[p] = rec.Offset + 1
			ev, err := r.dec.Decode(rec.Value)
			if err != nil {
				r.invalid++
				return
			}
			r.pending[p] = append(r.pending[p], pipeline.Record{Event: ev, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp})
		})
		take()
	}
	return out, nil
}
