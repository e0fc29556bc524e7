package integration_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ---------------------------------------------------------------- Kafka

// committedEnds returns, per partition, the offset just after the last
// committed data record (target) and the read_committed end offset (lso).
//
// The two differ when a partition ends with transaction markers: a consumer
// is not handed markers (unless it asks for them), so the service's stored
// position stops after the last record (target) while the log's end is
// past the markers. "Consumer lag zero" therefore means target <= position
// <= end offset, not position == end offset.
//
// It first waits until the last stable offset has caught up with the high
// watermark everywhere: EndTxn returns before the broker has written every
// marker, so right after the generator exits a partition's end may still
// move.
func committedEnds(ctx context.Context, brokers []string, topic string) (target, lso map[int32]int64, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var ends, starts kadm.ListedOffsets
	for {
		hw, err1 := adm.ListEndOffsets(ctx, topic)
		ls, err2 := adm.ListCommittedOffsets(ctx, topic)
		if err := errors.Join(err1, err2, hw.Error(), ls.Error()); err == nil {
			stable := true
			hw.Each(func(o kadm.ListedOffset) {
				if c, ok := ls.Lookup(topic, o.Partition); !ok || c.Offset != o.Offset {
					stable = false
				}
			})
			if stable {
				ends = ls
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("waiting for the last stable offsets of %s to reach the high watermarks: %w", topic, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
	if starts, err = adm.ListStartOffsets(ctx, topic); err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("start offsets of %s: %w", topic, err)
	}

	// Read each partition's tail read_committed, keeping the markers, until
	// the record at end-1 arrived: then the last data record seen is the
	// last committed one. A window of tailWindow offsets surely holds a
	// committed record (aborted transactions are a few percent of the log);
	// a partition without one is read from its start.
	const tailWindow = 20000
	lso, target = map[int32]int64{}, map[int32]int64{}
	from := map[int32]kgo.Offset{}
	ends.Each(func(o kadm.ListedOffset) {
		lso[o.Partition] = o.Offset
		start, _ := starts.Lookup(topic, o.Partition)
		if o.Offset > start.Offset {
			from[o.Partition] = kgo.NewOffset().At(max(start.Offset, o.Offset-tailWindow))
		} else {
			target[o.Partition] = txsinkStartOffset // empty partition
		}
	})
	for len(from) > 0 {
		last, err := readTails(ctx, brokers, topic, from, lso)
		if err != nil {
			return nil, nil, err
		}
		retry := map[int32]kgo.Offset{}
		for p := range from {
			if off, ok := last[p]; ok {
				target[p] = off + 1
				continue
			}
			start, _ := starts.Lookup(topic, p)
			if from[p].EpochOffset().Offset <= start.Offset {
				target[p] = txsinkStartOffset // only markers and aborted records
				continue
			}
			retry[p] = kgo.NewOffset().At(start.Offset)
		}
		from = retry
	}
	return target, lso, nil
}

// txsinkStartOffset is txsink.StartOffset: the stored position of a
// partition never checkpointed.
const txsinkStartOffset = -2

// readTails consumes the partitions from the given offsets until each has
// delivered its record (data or marker) at end-1, and returns the offset of
// the last data record of each (absent if none was seen).
func readTails(ctx context.Context, brokers []string, topic string, from map[int32]kgo.Offset, end map[int32]int64) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("kafka consumer: %w", err)
	}
	defer cl.Close()
	last := map[int32]int64{}
	pending := map[int32]bool{}
	for p := range from {
		pending[p] = true
	}
	for len(pending) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading the tail of %s (partitions %v not done): %w", topic, slices.Sorted(maps.Keys(pending)), context.Cause(ctx))
		}
		fs.EachError(func(_ string, p int32, err error) {
			// Retriable fetch errors are retried by the client; report
			// nothing unless the deadline passes.
			_ = p
		})
		fs.EachRecord(func(rec *kgo.Record) {
			if !rec.Attrs.IsControl() {
				last[rec.Partition] = max(last[rec.Partition], rec.Offset)
			}
			if rec.Offset >= end[rec.Partition]-1 {
				delete(pending, rec.Partition)
			}
		})
	}
	return last, nil
}

// ---------------------------------------------------------------- MySQL

// positions reads the stored next offsets of the run's partitions.
func (r *chaosRun) positions(ctx context.Context) (map[int32]int64, error) {
	var rows []struct {
		Partition int32 `db:"kafka_partition"`
		Next      int64 `db:"next_offset"`
	}
	err := r.db.SelectContext(ctx, &rows, `SELECT kafka_partition, next_offset FROM partition_offsets WHERE consumer_group = ? AND kafka_topic = ?`, r.group, r.topic)
	if err != nil {
		return nil, err
	}
	pos := map[int32]int64{}
	for _, row := range rows {
		pos[row.Partition] = row.Next
	}
	return pos, nil
}

// offsetSum is the sum of the stored positions: it grows with every
// committed checkpoint.
func (r *chaosRun) offsetSum(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pos, err := r.positions(ctx)
	if err != nil {
		return 0, err
	}
	var sum int64
	for _, n := range pos {
		sum += max(n, 0)
	}
	return sum, nil
}

// caughtUp reports whether every partition's stored position is at its
// target: past the last committed record, and not beyond the end offset (a
// service that steps over trailing transaction markers stops there);
// false until the targets are known (the generator finished).
func (r *chaosRun) caughtUp(ctx context.Context) (bool, map[int32]int64, error) {
	r.mu.Lock()
	target, lso := r.targets, r.lso
	r.mu.Unlock()
	if target == nil {
		return false, nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pos, err := r.positions(ctx)
	if err != nil {
		return false, nil, err
	}
	for p, want := range target {
		if got, ok := pos[p]; want != txsinkStartOffset && (!ok || got < want || got > lso[p]) {
			return false, pos, nil
		}
	}
	return true, pos, nil
}

// awaitProgress waits until a checkpoint committed since the stored
// positions summed to base (base < 0: since the first successful read), or
// everything produced is consumed. It fails after the profile's Progress
// deadline: a service that makes no progress for that long after a single
// fault is stuck, and the next fault would only hide it.
func (r *chaosRun) awaitProgress(ctx context.Context, base int64) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.prof.Progress)
	defer cancel()
	var lastErr error
	for {
		sum, err := r.offsetSum(ctx)
		switch {
		case err != nil:
			lastErr = err
		case base < 0:
			base = sum
		case sum > base:
			return "progress", nil
		}
		if ok, _, err := r.caughtUp(ctx); err == nil && ok {
			return "caught up", nil
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return "", cause
			}
			return "", fmt.Errorf("no checkpoint committed for %s (positions summing to %d; last read error: %v)", r.prof.Progress, base, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// awaitCommitBy waits until the incarnation with writer tag commits a new
// checkpoint decision, polling the audit trail every 10 ms; false if none
// came within timeout.
func (r *chaosRun) awaitCommitBy(ctx context.Context, tag string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const q = `SELECT COALESCE(MAX(seq), 0) FROM chaos_decision_audit WHERE writer = ? AND op = 'insert' AND outcome = 'commit'`
	var base int64 = -1
	for {
		var top int64
		if err := r.db.GetContext(ctx, &top, q, tag); err == nil {
			if base >= 0 && top > base {
				return true
			}
			if base < 0 {
				base = top
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// chaosInDoubt lists the prepared XA branches of this run's instances. XA
// RECOVER is server-wide; other runs' branches are told apart by the
// instance id in the gtrid (blg1-<instance>-...).
func chaosInDoubt(ctx context.Context, db *sqlx.DB, instances map[string]bool) ([]string, error) {
	rows, err := db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return nil, fmt.Errorf("XA RECOVER: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var f, g, b int64
		var data []byte
		if err := rows.Scan(&f, &g, &b, &data); err != nil {
			return nil, fmt.Errorf("XA RECOVER: %w", err)
		}
		gtrid := string(data[:min(int(g), len(data))])
		rest, ok := strings.CutPrefix(gtrid, "blg1-")
		if !ok {
			continue
		}
		if id, _, _ := strings.Cut(rest, "-"); instances[id] {
			out = append(out, gtrid+"/"+string(data[min(int(g), len(data)):]))
		}
	}
	return out, rows.Err()
}

// ---------------------------------------------------------------- audit

// The audit trail. Triggers on the service's two control tables copy every
// committed change into audit tables, with the writing connection's
// @chaos_writer tag, which the suite sets per incarnation through the DSN
// (go-sql-driver sends unknown DSN parameters as SET statements when it
// connects). A rolled-back change rolls back its audit row with it, so the
// trail holds exactly the committed history, in commit order per row (row
// locks serialise the writers of a row, and the audit sequence number is
// taken while the lock is held). The suite then checks the protocol's
// invariants on that history, which catches a broken fence or a moving
// offset even when dedup or luck keeps the ledger itself exact.
var auditDDL = []string{
	`CREATE TABLE chaos_offset_audit (
		seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		at DATETIME(6) NOT NULL,
		writer VARCHAR(64) NULL,
		conn BIGINT UNSIGNED NOT NULL,
		kafka_partition INT NOT NULL,
		old_next BIGINT NULL, new_next BIGINT NOT NULL,
		old_epoch BIGINT NULL, new_epoch BIGINT NOT NULL,
		old_owner VARBINARY(64) NULL, new_owner VARBINARY(64) NOT NULL
	) ENGINE = InnoDB`,
	`CREATE TRIGGER chaos_offsets_ai AFTER INSERT ON partition_offsets FOR EACH ROW
		INSERT INTO chaos_offset_audit (at, writer, conn, kafka_partition, old_next, new_next, old_epoch, new_epoch, old_owner, new_owner)
		VALUES (NOW(6), @chaos_writer, CONNECTION_ID(), NEW.kafka_partition, NULL, NEW.next_offset, NULL, NEW.epoch, NULL, NEW.owner)`,
	`CREATE TRIGGER chaos_offsets_au AFTER UPDATE ON partition_offsets FOR EACH ROW
		INSERT INTO chaos_offset_audit (at, writer, conn, kafka_partition, old_next, new_next, old_epoch, new_epoch, old_owner, new_owner)
		VALUES (NOW(6), @chaos_writer, CONNECTION_ID(), NEW.kafka_partition, OLD.next_offset, NEW.next_offset, OLD.epoch, NEW.epoch, OLD.owner, NEW.owner)`,
	`CREATE TABLE chaos_decision_audit (
		seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		at DATETIME(6) NOT NULL,
		op VARCHAR(8) NOT NULL,
		writer VARCHAR(64) NULL,
		conn BIGINT UNSIGNED NOT NULL,
		gtrid VARBINARY(64) NOT NULL,
		outcome VARCHAR(8) NOT NULL,
		decided_by VARBINARY(64) NOT NULL,
		KEY chaos_decision_audit_conn (conn, at),
		KEY chaos_decision_audit_writer (writer, seq)
	) ENGINE = InnoDB`,
	`CREATE TRIGGER chaos_decisions_ai AFTER INSERT ON checkpoint_decisions FOR EACH ROW
		INSERT INTO chaos_decision_audit (at, op, writer, conn, gtrid, outcome, decided_by)
		VALUES (NOW(6), 'insert', @chaos_writer, CONNECTION_ID(), NEW.gtrid, NEW.outcome, NEW.decided_by)`,
	`CREATE TRIGGER chaos_decisions_ad AFTER DELETE ON checkpoint_decisions FOR EACH ROW
		INSERT INTO chaos_decision_audit (at, op, writer, conn, gtrid, outcome, decided_by)
		VALUES (NOW(6), 'delete', @chaos_writer, CONNECTION_ID(), OLD.gtrid, OLD.outcome, OLD.decided_by)`,
}

// closingAuditDDL watches sealed windows (windows that close): a committed
// change of a billing_windows row that was sealed already is recorded (A8);
// so is every seal, for the report. A rolled-back change rolls back its
// record: only committed history counts, as in the other audit tables.
var closingAuditDDL = []string{
	`CREATE TABLE chaos_window_audit (
		seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		at DATETIME(6) NOT NULL,
		writer VARCHAR(64) NULL,
		op VARCHAR(16) NOT NULL,
		account_id VARBINARY(64) NOT NULL,
		currency CHAR(3) NOT NULL,
		window_start DATETIME(6) NOT NULL,
		old_amount BIGINT NOT NULL, new_amount BIGINT NOT NULL,
		old_count BIGINT NOT NULL, new_count BIGINT NOT NULL,
		closed_at DATETIME(6) NULL
	) ENGINE = InnoDB`,
	`CREATE TRIGGER chaos_windows_au AFTER UPDATE ON billing_windows FOR EACH ROW
		INSERT INTO chaos_window_audit (at, writer, op, account_id, currency, window_start, old_amount, new_amount, old_count, new_count, closed_at)
		SELECT NOW(6), @chaos_writer, IF(OLD.closed_at IS NULL, 'seal', 'changed'), NEW.account_id, NEW.currency, NEW.window_start,
			OLD.amount_minor, NEW.amount_minor, OLD.event_count, NEW.event_count, OLD.closed_at
		FROM DUAL WHERE OLD.closed_at IS NOT NULL OR NEW.closed_at IS NOT NULL`,
}

func installAudit(ctx context.Context, db *sqlx.DB, closing bool) error {
	ddl := auditDDL
	if closing {
		ddl = append(slices.Clip(ddl), closingAuditDDL...)
	}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	return nil
}

// unmatchedMoves finds offset moves (audit rows from seq on) that are
// visible without a commit decision inserted after them, in the same
// transaction, by the same connection. A decision commits together with
// its offsets, so one statement's snapshot sees both or neither: in a
// correct build the query returns nothing, whenever it runs. A build that
// commits offsets in a transaction of their own leaves a window in which
// they are visible alone, and the monitor (watchMoves) looks into it many
// times a second. (The decision's NOW(6) is its statement's start, after
// the offsets' statement in the same transaction.)
const unmatchedMoves = `SELECT m.seq, CAST(m.at AS CHAR) AS at, m.writer, m.kafka_partition, m.old_next, m.new_next
	FROM chaos_offset_audit m
	WHERE m.seq >= ? AND m.old_next IS NOT NULL AND m.new_next <> m.old_next
	AND NOT EXISTS (SELECT 1 FROM chaos_decision_audit d
		WHERE d.conn = m.conn AND d.at >= m.at AND d.op = 'insert' AND d.outcome = 'commit' AND d.writer <=> m.writer)
	ORDER BY m.seq LIMIT 20`

type unmatchedMove struct {
	Seq       int64   `db:"seq"`
	At        string  `db:"at"`
	Writer    *string `db:"writer"`
	Partition int32   `db:"kafka_partition"`
	OldNext   int64   `db:"old_next"`
	NewNext   int64   `db:"new_next"`
}

func (m unmatchedMove) String() string {
	w := "<no tag>"
	if m.Writer != nil {
		w = *m.Writer
	}
	return fmt.Sprintf("A7 audit #%d at %s: partition %d next_offset %d -> %d by %s visible without its commit decision (offsets committed apart from the decision)",
		m.Seq, m.At, m.Partition, m.OldNext, m.NewNext, w)
}

// watchMoves runs unmatchedMoves every few milliseconds until ctx ends and
// returns what it found (at most 30). Errors (MariaDB restarting) are
// skipped. Rows are checked again for a while after they first appear,
// because a lower sequence number may commit after a higher one.
func watchMoves(ctx context.Context, db *sqlx.DB) (found []string, polls int) {
	seen := map[int64]bool{}
	var from int64
	for ctx.Err() == nil {
		var rows []unmatchedMove
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := db.SelectContext(qctx, &rows, unmatchedMoves, max(from-2000, 0))
		cancel()
		if err == nil {
			polls++
			for _, m := range rows {
				if !seen[m.Seq] && len(found) < 30 {
					found = append(found, m.String())
				}
				seen[m.Seq] = true
			}
			var top int64
			if err := db.GetContext(ctx, &top, `SELECT COALESCE(MAX(seq), 0) FROM chaos_offset_audit`); err == nil {
				from = top
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return found, polls
}

// auditSummary counts what the audit trail holds.
type auditSummary struct {
	OffsetRows, Moves, Claims int
	Seals                     int // billing_windows rows sealed (windows that close)
	Fences                    int // partition rows fenced by billing shards add
	Commits, Aborts, Pruned   int
	Violations                []string
	ViolationCount            int
	MonitorPolls              int
}

// moverWriter is the instance id the audit gives the writer tags of
// billing shards add, whose fences (an epoch raised, nothing else) are
// not claims.
const moverWriter = "billing shards add"

// checkAudit checks the committed history of partition_offsets and
// checkpoint_decisions against the protocol's invariants:
//
//	A1  a partition's next_offset never decreases;
//	A2  it only moves by a write of its current owner, at its current
//	    epoch, and never together with an ownership change (fencing: a
//	    zombie's decision cannot move anyone's offsets);
//	A3  ownership only changes with the epoch raised by exactly one, and
//	    epochs never decrease (billing shards add raises them alone: a
//	    fence, its owner and offset unchanged);
//	A4  a row is created at StartOffset and epoch 1 by its owner;
//	A5  a gtrid is decided once (no second insert), a commit only by the
//	    instance that ran the checkpoint;
//	A6  every change was made by a known incarnation of this run;
//	A7  an offset move is never visible without its commit decision
//	    (watched during the run by watchMoves, whose findings are passed
//	    in as moves, and checked once more on the final history);
//	A8  with windows that close, a sealed billing_windows row never
//	    changes again, and is sealed once.
//
// writers maps writer tags to instance ids.
func checkAudit(ctx context.Context, db *sqlx.DB, writers map[string]string, moves []string, closing bool) (auditSummary, error) {
	var s auditSummary
	bad := func(format string, args ...any) {
		s.ViolationCount++
		if len(s.Violations) < 30 {
			s.Violations = append(s.Violations, fmt.Sprintf(format, args...))
		}
	}
	var final []unmatchedMove
	if err := db.SelectContext(ctx, &final, unmatchedMoves, 0); err != nil {
		return s, fmt.Errorf("read offset audit: %w", err)
	}
	seen := map[string]bool{}
	for _, m := range moves {
		seen[m] = true
		bad("%s", m)
	}
	for _, m := range final {
		if !seen[m.String()] {
			bad("%s", m)
		}
	}
	var offs []struct {
		Seq       int64   `db:"seq"`
		At        string  `db:"at"`
		Writer    *string `db:"writer"`
		Partition int32   `db:"kafka_partition"`
		OldNext   *int64  `db:"old_next"`
		NewNext   int64   `db:"new_next"`
		OldEpoch  *int64  `db:"old_epoch"`
		NewEpoch  int64   `db:"new_epoch"`
		OldOwner  *string `db:"old_owner"`
		NewOwner  string  `db:"new_owner"`
	}
	if err := db.SelectContext(ctx, &offs, `SELECT seq, CAST(at AS CHAR) AS at, writer, kafka_partition, old_next, new_next, old_epoch, new_epoch, old_owner, new_owner FROM chaos_offset_audit ORDER BY seq`); err != nil {
		return s, fmt.Errorf("read offset audit: %w", err)
	}
	s.OffsetRows = len(offs)
	who := func(w *string) (string, bool) {
		if w == nil {
			return "", false
		}
		id, ok := writers[*w]
		return id, ok
	}
	for _, o := range offs {
		id, known := who(o.Writer)
		wr := "<no tag>"
		if o.Writer != nil {
			wr = *o.Writer + "=" + id
		}
		if !known {
			bad("A6 audit #%d at %s: partition %d changed by an unknown writer %s", o.Seq, o.At, o.Partition, wr)
		}
		if o.OldNext == nil { // row created
			if o.NewNext != txsinkStartOffset || o.NewEpoch != 1 || (known && o.NewOwner != id) {
				bad("A4 audit #%d at %s: partition %d created with next %d epoch %d owner %s by %s", o.Seq, o.At, o.Partition, o.NewNext, o.NewEpoch, o.NewOwner, wr)
			}
			s.Claims++
			continue
		}
		oldNext, oldEpoch, oldOwner := *o.OldNext, *o.OldEpoch, *o.OldOwner
		if o.NewNext < oldNext {
			bad("A1 audit #%d at %s: partition %d next_offset went back from %d to %d (by %s)", o.Seq, o.At, o.Partition, oldNext, o.NewNext, wr)
		}
		if o.NewEpoch < oldEpoch {
			bad("A3 audit #%d at %s: partition %d epoch went back from %d to %d (by %s)", o.Seq, o.At, o.Partition, oldEpoch, o.NewEpoch, wr)
		}
		switch {
		case id == moverWriter && o.NewEpoch == oldEpoch+1 && o.NewOwner == oldOwner && o.NewNext == oldNext:
			// billing shards add fences every partition (its epoch
			// raised, its owner and offset as they were).
			s.Fences++
		case o.NewEpoch != oldEpoch || o.NewOwner != oldOwner: // a claim
			s.Claims++
			if o.NewEpoch != oldEpoch+1 {
				bad("A3 audit #%d at %s: partition %d claimed by %s with epoch %d -> %d", o.Seq, o.At, o.Partition, wr, oldEpoch, o.NewEpoch)
			}
			if o.NewNext != oldNext {
				bad("A2 audit #%d at %s: partition %d next_offset moved %d -> %d in an ownership change %s@%d -> %s@%d (by %s)",
					o.Seq, o.At, o.Partition, oldNext, o.NewNext, oldOwner, oldEpoch, o.NewOwner, o.NewEpoch, wr)
			}
			if known && o.NewOwner != id {
				bad("A3 audit #%d at %s: partition %d claimed for %s by %s", o.Seq, o.At, o.Partition, o.NewOwner, wr)
			}
		case o.NewNext != oldNext: // a decision moving the offset
			s.Moves++
			if known && id != oldOwner {
				bad("A2 audit #%d at %s: partition %d next_offset moved %d -> %d by %s, but the partition is owned by %s at epoch %d (unfenced zombie)",
					o.Seq, o.At, o.Partition, oldNext, o.NewNext, wr, oldOwner, oldEpoch)
			}
		}
	}

	var decs []struct {
		Seq       int64   `db:"seq"`
		At        string  `db:"at"`
		Op        string  `db:"op"`
		Writer    *string `db:"writer"`
		Gtrid     string  `db:"gtrid"`
		Outcome   string  `db:"outcome"`
		DecidedBy string  `db:"decided_by"`
	}
	if err := db.SelectContext(ctx, &decs, `SELECT seq, CAST(at AS CHAR) AS at, op, writer, gtrid, outcome, decided_by FROM chaos_decision_audit ORDER BY seq`); err != nil {
		return s, fmt.Errorf("read decision audit: %w", err)
	}
	if closing {
		var changes []struct {
			Seq      int64   `db:"seq"`
			At       string  `db:"at"`
			Writer   *string `db:"writer"`
			Op       string  `db:"op"`
			Account  string  `db:"account_id"`
			Currency string  `db:"currency"`
			Start    string  `db:"window_start"`
			OldAmt   int64   `db:"old_amount"`
			NewAmt   int64   `db:"new_amount"`
			OldCount int64   `db:"old_count"`
			NewCount int64   `db:"new_count"`
			Closed   *string `db:"closed_at"`
		}
		if err := db.SelectContext(ctx, &changes, `SELECT seq, CAST(at AS CHAR) AS at, writer, op, account_id, currency, CAST(window_start AS CHAR) AS window_start,
			old_amount, new_amount, old_count, new_count, CAST(closed_at AS CHAR) AS closed_at FROM chaos_window_audit ORDER BY seq`); err != nil {
			return s, fmt.Errorf("read window audit: %w", err)
		}
		for _, c := range changes {
			if c.Op == "seal" {
				s.Seals++
				continue
			}
			wr := "<no tag>"
			if c.Writer != nil {
				wr = *c.Writer
			}
			bad("A8 window audit #%d at %s: %q/%s@%s sealed at %s changed by %s: amount %d -> %d, count %d -> %d",
				c.Seq, c.At, c.Account, c.Currency, c.Start, *c.Closed, wr, c.OldAmt, c.NewAmt, c.OldCount, c.NewCount)
		}
	}

	inserted := map[string]string{}
	for _, d := range decs {
		if d.Op == "delete" {
			s.Pruned++
			continue
		}
		id, known := who(d.Writer)
		if !known {
			bad("A6 decision audit #%d at %s: %s %s inserted by an unknown writer", d.Seq, d.At, d.Outcome, d.Gtrid)
		}
		if prev, dup := inserted[d.Gtrid]; dup {
			bad("A5 decision audit #%d at %s: %s decided twice (%s, then %s)", d.Seq, d.At, d.Gtrid, prev, d.Outcome)
		}
		inserted[d.Gtrid] = d.Outcome
		owner := strings.SplitN(strings.TrimPrefix(d.Gtrid, "blg1-"), "-", 2)[0]
		switch d.Outcome {
		case "commit":
			s.Commits++
			if known && (id != owner || d.DecidedBy != owner) {
				bad("A5 decision audit #%d at %s: commit of %s decided by %s (writer %s)", d.Seq, d.At, d.Gtrid, d.DecidedBy, id)
			}
		case "abort":
			s.Aborts++
		}
	}
	return s, nil
}
