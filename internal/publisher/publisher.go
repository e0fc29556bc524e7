package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/waits"
)

// Failpoint names of the publisher's steps, in order (package failpoint).
const (
	FailBeforeTxn     = "changelog-before-txn"     // the batch planned, no record produced
	FailAfterProduce  = "changelog-after-produce"  // every record produced, the transaction not committed
	FailAfterKafka    = "changelog-after-kafka"    // the transaction committed, no MySQL bookkeeping
	FailAfterBookkeep = "changelog-after-bookkeep" // outbox rows deleted and the hint raised
)

// Control is what the publisher reads and writes on the control server.
type Control interface {
	Changelog(ctx context.Context) (driver.ChangelogState, error)
	LeaseChangelog(ctx context.Context, owner string, ttl time.Duration) (bool, error)
	ChangelogPublished(ctx context.Context, seq int64) error
	Commits(ctx context.Context, from int64, unapplied bool, limit int) ([]driver.CommitRecord, error)
	CommitPosition(ctx context.Context) (driver.CommitPosition, error)
	// SkipChangelogSnapshot records that the rows decided before from are
	// published (the snapshot of an existing ledger is).
	SkipChangelogSnapshot(ctx context.Context, from int64) error
}

// Server is what the publisher reads and deletes on one server: its
// outbox, and its tables for the snapshot of an existing ledger.
type Server interface {
	Outbox
	Tables
}

// Outbox is the outbox of one server.
type Outbox interface {
	OutboxIndex(ctx context.Context, checkpoints []string) ([]driver.OutboxChunk, error)
	ReadOutbox(ctx context.Context, chunks []driver.OutboxChunk) ([][]byte, error)
	DeleteOutbox(ctx context.Context, checkpoints []string) (int64, error)
}

// Config configures a Publisher.
type Config struct {
	Prefix   string // CHANGELOG_TOPIC_PREFIX
	Ledger   string // the ledger's id
	Instance string // the lease's owner
	Version  string // source.version
	// KafkaOpts are the brokers' connection options (no producer or
	// consumer settings).
	KafkaOpts   []kgo.Opt
	Partitions  int32 // of the table and append-only topics created
	Replication int16
	// MaxEvents bounds the events of one transaction
	// (CHANGELOG_TRANSACTION_MAX_EVENTS); TxnTimeout is the producer's
	// transaction timeout (at most the broker's
	// transaction.max.timeout.ms).
	MaxEvents  int
	TxnTimeout time.Duration
	// Lease is the publisher lease's term (CHANGELOG_LEASE): renewed every
	// third of it; another instance takes over once it ran out.
	Lease time.Duration
	// Poll is how long an idle publisher waits before it looks again.
	Poll time.Duration
	// Batch bounds the checkpoints read from the commit log at once.
	Batch      int
	Failpoints *failpoint.Set
	Logger     *slog.Logger
	// Waits are the instance's waits (package waits); the publisher's
	// are logged and listed there.
	Waits *waits.Set
	// Now is the clock of the snapshot's events (ts_ms); time.Now when
	// nil.
	Now func() time.Time

	// SnapshotIndexBytes bounds what the snapshot of an existing ledger
	// holds of the outbox (CHANGELOG_SNAPSHOT_INDEX_BYTES, snapshot.go's
	// firsts); 64 MiB when 0.
	SnapshotIndexBytes int
}

// TransactionalID is the one transactional id of every publisher of a
// ledger's changelog: initialising it fences every other.
func TransactionalID(ledger, prefix string) string {
	return "billing-changelog." + ledger + "." + prefix
}

// Topic is the topic of a table of the changelog.
func Topic(prefix, table string) string { return prefix + "." + table }

// ProgressTopic is the publisher's progress topic.
func ProgressTopic(prefix string) string { return prefix + "._progress" }

// Publisher publishes one ledger's changelog while it holds the lease.
type Publisher struct {
	cfg     Config
	control Control
	servers []Server
	log     *slog.Logger
	// published counts the transactions committed (tests, metrics).
	published atomic.Int64
	active    atomic.Bool
	// repair is the wait for an operator's repair after a refusal (nil:
	// none); Run's goroutine only.
	repair *waits.Wait
}

// New returns a publisher of the ledger's changelog over its control
// server and its servers (the control server first).
func New(cfg Config, control Control, servers []Server) *Publisher {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 100 * time.Millisecond
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 256
	}
	if cfg.SnapshotIndexBytes <= 0 {
		cfg.SnapshotIndexBytes = 64 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Publisher{cfg: cfg, control: control, servers: servers, log: cfg.Logger.With("component", "changelog-publisher")}
}

// Transactions is the number of Kafka transactions this publisher
// committed.
func (p *Publisher) Transactions() int64 { return p.published.Load() }

// Active says whether this publisher holds the lease and publishes.
func (p *Publisher) Active() bool { return p.active.Load() }

// errLeaseLost ends a session whose lease another instance took.
var errLeaseLost = errors.New("publisher: the lease was lost")

// Run publishes until ctx ends: it waits for the lease, then publishes
// (a session) until the lease is lost, the producer is fenced or an error
// occurs, and starts again. It releases the lease when it returns, which
// is only at ctx's end. A refusal (refused: the progress lost, the commit
// log pruned, a progress topic of several partitions) publishes nothing
// until an operator repairs it (docs/production.md, "The changelog's
// topics"): it is logged as an error, then as a wait (p.cfg.Waits), and
// tried again every refusedRetry, so that the repair needs no restart.
func (p *Publisher) Run(ctx context.Context) error {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := p.control.LeaseChangelog(rctx, p.cfg.Instance, 0); err != nil {
			p.log.Warn("cannot release the changelog lease", "err", err)
		}
	}()
	defer p.repaired()
	backoff := p.cfg.Poll
	for ctx.Err() == nil {
		wait := max(p.cfg.Poll, p.cfg.Lease/3) // another holds the lease
		held, err := p.control.LeaseChangelog(ctx, p.cfg.Instance, p.cfg.Lease)
		switch {
		case err != nil:
			p.log.Warn("cannot take the changelog lease", "err", err)
		case held:
			p.active.Store(true)
			before := p.Transactions()
			err = p.session(ctx)
			p.active.Store(false)
			if p.Transactions() > before {
				backoff = p.cfg.Poll // it published: a new failure starts over
			}
			if refused(err) {
				if p.repair == nil {
					p.log.Error("the changelog cannot be published until it is repaired (docs/production.md, \"The changelog's topics\")", "err", err)
					p.repair = p.cfg.Waits.Begin("an operator to repair the changelog (docs/production.md, \"The changelog's topics\")")
				}
				p.repair.Still(err.Error())
				wait = refusedRetry
				break
			}
			if ctx.Err() == nil {
				p.log.Warn("changelog publishing stopped; starting again", "err", err, "after", backoff)
			}
			wait, backoff = backoff, min(2*backoff, 5*time.Second)
		}
		if !sleep(ctx, wait) {
			break
		}
	}
	return ctx.Err()
}

// repaired ends the wait for a repair, if any: a session got past it.
func (p *Publisher) repaired() {
	if p.repair != nil {
		p.repair.End()
		p.repair = nil
	}
}

// refusedRetry is how often a refused publisher looks again.
const refusedRetry = 5 * time.Second

// refused says whether err is a refusal that only an operator's repair
// ends.
func refused(err error) bool {
	return errors.Is(err, ErrProgressLost) || errors.Is(err, ErrCommitLogPruned) || errors.Is(err, ErrProgressTopic)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session publishes as the lease holder: a new producer of the ledger's
// transactional id, initialised (fencing every other), the position read
// from Kafka, the bookkeeping a previous session left undone redone, then
// transaction after transaction.
func (p *Publisher) session(ctx context.Context) error {
	cl, err := kgo.NewClient(producerOpts(p.cfg)...)
	if err != nil {
		return fmt.Errorf("publisher: client: %w", err)
	}
	defer cl.Close()
	// Every session: a progress topic deleted and created again by hand
	// is checked again.
	if err := ensureTopics(ctx, cl, p.cfg); err != nil {
		return err
	}
	// InitProducerID: the previous holder's open transaction is settled
	// and the previous holder fenced, before anything is read.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("publisher: initialising the producer: %w", err)
	}
	held, err := readProgress(ctx, p.cfg)
	if err != nil {
		return err
	}
	st, err := p.control.Changelog(ctx)
	if err != nil {
		return err
	}
	if !st.On {
		return fmt.Errorf("publisher: the ledger's changelog is off")
	}
	pos, err := resume(held, st, p.cfg.Ledger)
	if err != nil {
		return err
	}
	if st.Snapshot && pos.Snapshot == nil {
		// Kafka holds the whole snapshot; a crash came before this.
		if err := p.control.SkipChangelogSnapshot(ctx, st.From); err != nil {
			return err
		}
	}
	if err := p.catchUpBookkeeping(ctx, st.Published, pos); err != nil {
		return err
	}
	p.repaired() // past every refusal of a session's start
	renewed := time.Now()
	renew := func() error {
		if time.Since(renewed) <= p.cfg.Lease/3 {
			return nil
		}
		held, err := p.control.LeaseChangelog(ctx, p.cfg.Instance, p.cfg.Lease)
		if err != nil {
			return err
		}
		if !held {
			return errLeaseLost
		}
		renewed = time.Now()
		return nil
	}
	enc := &changelog.Encoder{}
	if pos.Snapshot != nil {
		p.log.Info("publishing the snapshot of the ledger's rows", "as_of", pos.Seq, "server", pos.Snapshot.Server, "table", pos.Snapshot.Table)
		if pos, err = p.snapshot(ctx, cl, enc, pos, renew); err != nil {
			return err
		}
	}
	p.log.Info("publishing the changelog", "from", pos.Seq, "parts", pos.Parts, "hint", st.Published)
	for {
		if err := renew(); err != nil {
			return err
		}
		cps, err := p.pendingCheckpoints(ctx, pos)
		if err != nil {
			return err
		}
		t := planTxn(pos, cps, p.cfg.MaxEvents)
		if len(t.Parts) == 0 {
			if !sleep(ctx, p.cfg.Poll) {
				return ctx.Err()
			}
			continue
		}
		if err := p.publish(ctx, cl, enc, t); err != nil {
			return err
		}
		p.published.Add(1)
		if err := p.cfg.Failpoints.Inject(FailAfterKafka); err != nil {
			return err
		}
		if err := p.bookkeep(ctx, deletable(t), t.Next.Seq); err != nil {
			return err
		}
		if err := p.cfg.Failpoints.Inject(FailAfterBookkeep); err != nil {
			return err
		}
		pos = t.Next
	}
}

// pendingCheckpoints reads the checkpoints after pos up to the visible
// position (every branch of every checkpoint up to it committed, so their
// outbox rows are all visible), with their outbox rows.
func (p *Publisher) pendingCheckpoints(ctx context.Context, pos Progress) ([]pending, error) {
	cp, err := p.control.CommitPosition(ctx)
	if err != nil {
		return nil, err
	}
	if cp.Visible <= pos.Seq {
		return nil, nil
	}
	recs, err := p.control.Commits(ctx, pos.Seq+1, false, int(min(int64(p.cfg.Batch), cp.Visible-pos.Seq)))
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 || recs[0].Seq != pos.Seq+1 {
		return nil, fmt.Errorf("%w: wanted %d", ErrCommitLogPruned, pos.Seq+1)
	}
	out := make([]pending, 0, len(recs))
	byGtrid := map[string]int{}
	gtrids := make([]string, 0, len(recs))
	for _, r := range recs {
		if r.Seq > cp.Visible {
			break
		}
		byGtrid[r.Gtrid] = len(out)
		gtrids = append(gtrids, r.Gtrid)
		out = append(out, pending{Seq: r.Seq, Gtrid: r.Gtrid, At: r.CommittedAt})
	}
	for s, o := range p.servers {
		idx, err := o.OutboxIndex(ctx, gtrids)
		if err != nil {
			return nil, err
		}
		for _, c := range idx {
			if i, ok := byGtrid[c.Checkpoint]; ok {
				out[i].Chunks = append(out[i].Chunks, chunkRef{Server: s, OutboxChunk: c})
			}
		}
	}
	if len(out) > 0 && pos.Parts > len(out[0].Chunks) {
		// Another publisher deleted them: this one's position is stale.
		return nil, fmt.Errorf("publisher: checkpoint %d has %d outbox rows, %d of them published", out[0].Seq, len(out[0].Chunks), pos.Parts)
	}
	return out, nil
}

// publish runs one Kafka transaction of the plan's events, read one
// outbox row at a time (the producer's buffer bounds what waits).
func (p *Publisher) publish(ctx context.Context, cl *kgo.Client, enc *changelog.Encoder, t txnPlan) error {
	return p.transaction(ctx, cl, t.Next, func(produce func(*kgo.Record)) error {
		return p.produceParts(ctx, enc, t, produce)
	})
}

func (p *Publisher) produceParts(ctx context.Context, enc *changelog.Encoder, t txnPlan, produce func(*kgo.Record)) error {
	for _, pt := range t.Parts {
		cp := pt.Checkpoint
		src := changelog.Source{Version: p.cfg.Version, Name: p.cfg.Prefix, Ledger: p.cfg.Ledger, Checkpoint: cp.Gtrid,
			CommitSeq: cp.Seq, TsMs: cp.At.UnixMilli()}
		for _, c := range cp.Chunks[pt.From:pt.To] {
			if err := p.eachChange(ctx, c.Server, c.OutboxChunk, func(ch changelog.Change) error {
				r, err := p.record(enc, ch, src)
				if err == nil {
					produce(r)
				}
				return err
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

// record is the Kafka record of a change.
func (p *Publisher) record(enc *changelog.Encoder, ch changelog.Change, src changelog.Source) (*kgo.Record, error) {
	tb, _ := changelog.ByID(ch.Table)
	k, v, err := enc.Record(ch, src.TsMs, src)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{Topic: Topic(p.cfg.Prefix, tb.Name), Key: k, Value: v}, nil
}

// eachChange calls fn with each change of one outbox row, in order.
func (p *Publisher) eachChange(ctx context.Context, server int, c driver.OutboxChunk, fn func(changelog.Change) error) error {
	bodies, err := p.servers[server].ReadOutbox(ctx, []driver.OutboxChunk{c})
	if err != nil {
		return err
	}
	if len(bodies) != 1 {
		return fmt.Errorf("publisher: outbox row %s/%d/%d not found", c.Checkpoint, c.Participant, c.Chunk)
	}
	if err := changelog.Records(bodies[0], fn); err != nil {
		return fmt.Errorf("publisher: outbox row %s/%d/%d: %w", c.Checkpoint, c.Participant, c.Chunk, err)
	}
	return nil
}

// transaction runs one Kafka transaction: the records events produces,
// then the progress record of next, committed together (the publishing
// steps' failpoints between).
func (p *Publisher) transaction(ctx context.Context, cl *kgo.Client, next Progress, events func(produce func(*kgo.Record)) error) error {
	if err := p.cfg.Failpoints.Inject(FailBeforeTxn); err != nil {
		return err
	}
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("publisher: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			abort(ctx, cl)
		}
	}()
	var failed atomic.Pointer[error]
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	if err := events(func(r *kgo.Record) { cl.Produce(ctx, r, done) }); err != nil {
		return err
	}
	progress := &kgo.Record{Topic: ProgressTopic(p.cfg.Prefix), Partition: progressPartition, Key: []byte(ProgressKey), Value: encodeProgress(next)}
	cl.Produce(ctx, progress, done)
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if e := failed.Load(); e != nil {
		return fmt.Errorf("publisher: produce: %w", *e)
	}
	if err := p.cfg.Failpoints.Inject(FailAfterProduce); err != nil {
		return err
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return fmt.Errorf("publisher: commit: %w", err)
	}
	committed = true
	// What follows (the outbox rows deleted) must not rest on a commit
	// that did not happen: the client can end a transaction it asked to
	// commit by an abort and report success (franz-go, when it missed
	// that a produce succeeded), and then these changes would be in
	// neither Kafka nor the outbox. The progress record is read back,
	// read_committed: there iff the transaction committed.
	return committedAt(ctx, cl, progress.Topic, progress.Partition, progress.Offset)
}

// ErrTxnNotCommitted: a transaction the publisher committed, by the client's
// answer, is not in Kafka (its progress record is not readable
// read_committed: Kafka aborted it). The session ends; the next one reads
// the progress Kafka holds and publishes again from there.
var ErrTxnNotCommitted = errors.New("publisher: Kafka did not commit the transaction the client reported committed")

// committedAt says whether the record at offset of a partition is
// committed: cl reads read_committed and keeps control records, so it
// either returns the record or skips it, aborted, and returns the abort
// marker after it.
func committedAt(ctx context.Context, cl *kgo.Client, topic string, partition int32, offset int64) error {
	found, err := readRange(ctx, cl, topic, partition, offset, offset+1, func(r *kgo.Record) (bool, error) {
		return r.Offset == offset, nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("publisher: reading back the progress record: %w", err)
	case !found:
		return fmt.Errorf("%w (progress record at %s[%d] offset %d)", ErrTxnNotCommitted, topic, partition, offset)
	}
	return nil
}

// abort ends a transaction that failed before its commit, best effort and
// briefly (a shutdown, a lost broker): read_committed consumers then need
// not wait for its timeout. Whatever is left open, the next publisher's
// initialisation aborts.
func abort(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		return
	}
	_ = cl.EndTransaction(ctx, kgo.TryAbort)
}

// bookkeep deletes the outbox rows of checkpoints Kafka holds in whole,
// on every server, then raises the hint: the hint never passes a row
// still in the outbox.
func (p *Publisher) bookkeep(ctx context.Context, gtrids []string, seq int64) error {
	if len(gtrids) > 0 {
		for _, o := range p.servers {
			if _, err := o.DeleteOutbox(ctx, gtrids); err != nil {
				return err
			}
		}
	}
	return p.control.ChangelogPublished(ctx, seq)
}

// catchUpBookkeeping redoes what a session that crashed after its Kafka
// commit left: the outbox rows of the checkpoints between the hint and
// what Kafka holds.
func (p *Publisher) catchUpBookkeeping(ctx context.Context, hint int64, pos Progress) error {
	for from := hint + 1; from <= pos.Seq; {
		recs, err := p.control.Commits(ctx, from, false, int(min(int64(p.cfg.Batch), pos.Seq-from+1)))
		if err != nil {
			return err
		}
		if len(recs) == 0 || recs[0].Seq != from {
			return fmt.Errorf("%w: wanted %d", ErrCommitLogPruned, from)
		}
		var gtrids []string
		for _, r := range recs {
			if r.Seq <= pos.Seq {
				gtrids = append(gtrids, r.Gtrid)
				from = r.Seq + 1
			}
		}
		if err := p.bookkeep(ctx, gtrids, from-1); err != nil {
			return err
		}
	}
	return nil
}
