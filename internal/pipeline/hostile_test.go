package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// Guarantee 3 under large input: junk of any size up to the broker's
// largest message becomes one dead letter each, with a bounded prefix of
// its value, its full size and its SHA-256, and never stalls a partition,
// even where the database accepts packets of only 1 MiB. Before statements
// were bounded in bytes, 300 invalid records of 60 KiB made one dead-letter
// statement of 18 MiB and every checkpoint failed forever.
func TestLargeRecordsBecomeDeadLetters(t *testing.T) {
	// The client refuses packets over 1 MiB, as a server configured so
	// would: the statement budget is derived from the smaller limit.
	e := newEnvWith(t, 2, envOptions{topicConfigs: map[string]string{"max.message.bytes": "8388608"}, dsnParams: "&maxAllowedPacket=1048576"})
	brokers := e.brokers

	const prefix = 48 << 10
	type junk struct {
		partition int32
		value     []byte
	}
	var (
		recs  []*kgo.Record
		sent  []junk
		valid int
	)
	add := func(partition int32, value []byte) {
		recs = append(recs, &kgo.Record{Partition: partition, Key: []byte("k"), Value: value})
	}
	// Partition 0: 300 invalid records of 60 KiB, then 100 valid events.
	for i := range 300 {
		v := []byte(fmt.Sprintf(`{"junk":%d,"pad":"%s"`, i, strings.Repeat("x", 60<<10))) // unterminated: invalid JSON
		add(0, v)
		sent = append(sent, junk{0, v})
	}
	for i := range 100 {
		r := ev{fmt.Sprintf("p0-%d", i), "acct-a", 1, "EUR", t0}.record("")
		add(0, r.Value)
		valid++
	}
	// Partition 1: records of 1 MiB and more (payload_too_large), between
	// valid events.
	for i, size := range []int{1 << 20, 3 << 19, 5 << 20} {
		v := bytes.Repeat([]byte{byte('a' + i)}, size)
		add(1, v)
		sent = append(sent, junk{1, v})
		for j := range 20 {
			r := ev{fmt.Sprintf("p1-%d-%d", i, j), "acct-b", 2, "EUR", t0}.record("")
			add(1, r.Value)
			valid++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(e.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	in := start(t, e, func(c *Config, _ *sinkConfig) {
		c.MaxPayloadBytes = 64 << 10
		c.DeadLetterPayloadBytes = prefix
		c.CheckpointMaxBytes = 4 << 20
	})
	waitCounted(t, e.db, int64(valid), len(sent))
	if n := in.p.Stats().Aborts.Load(); n != 0 {
		t.Errorf("%d checkpoint attempts failed: large records must not fail a checkpoint", n)
	}

	var rows []struct {
		Partition int32  `db:"kafka_partition"`
		Reason    string `db:"reason"`
		Payload   []byte `db:"payload"`
		Size      int    `db:"payload_size"`
		Sum       []byte `db:"payload_sha256"`
	}
	if err := e.db.Select(&rows, `SELECT kafka_partition, reason, payload, payload_size, payload_sha256 FROM dead_letters ORDER BY kafka_partition, kafka_offset`); err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(sent) {
		t.Fatalf("%d dead letters, want %d", len(rows), len(sent))
	}
	for i, r := range rows {
		want := sent[i]
		sum := sha256.Sum256(want.value)
		wantReason := "invalid_json"
		if len(want.value) > 64<<10 {
			wantReason = "payload_too_large"
		}
		switch {
		case r.Partition != want.partition || r.Reason != wantReason:
			t.Errorf("dead letter %d: partition %d reason %s, want %d %s", i, r.Partition, r.Reason, want.partition, wantReason)
		case r.Size != len(want.value):
			t.Errorf("dead letter %d: payload_size %d, want %d", i, r.Size, len(want.value))
		case !bytes.Equal(r.Sum, sum[:]):
			t.Errorf("dead letter %d: payload_sha256 is not the SHA-256 of the whole value", i)
		case len(r.Payload) > prefix || !bytes.Equal(r.Payload, want.value[:len(r.Payload)]):
			t.Errorf("dead letter %d: stored payload of %d bytes is not a prefix of at most %d", i, len(r.Payload), prefix)
		case len(r.Payload) < min(len(want.value), prefix):
			t.Errorf("dead letter %d: stored %d bytes, want %d", i, len(r.Payload), min(len(want.value), prefix))
		}
	}
}

// Guarantee 10 in bytes: a checkpoint is taken as soon as the buffered
// records hold CheckpointMaxBytes, however few they are and however far the
// next checkpoint is due; so large valid events are bounded in memory by
// bytes, not by their count.
func TestCheckpointMaxBytesSealsEarly(t *testing.T) {
	e := newEnv(t, 1)
	pad := strings.Repeat("p", 60<<10)
	var recs []*kgo.Record
	for i := range 200 {
		r := ev{fmt.Sprintf("big-%d", i), "acct-big", 1, "EUR", t0}.record("")
		r.Value = append(r.Value[:len(r.Value)-1], []byte(`,"padding":"`+pad+`"}`)...)
		recs = append(recs, r)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic), kgo.ProducerBatchMaxBytes(900<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		n, biggest int
	)
	start(t, e, func(c *Config, _ *sinkConfig) {
		c.CheckpointInterval = time.Hour // only the byte budget can seal
		c.CheckpointMaxRecords = 1 << 20
		c.CheckpointMaxBytes = 1 << 20
		c.MaxPayloadBytes = 64 << 10
		c.OnCheckpoint = func(info CheckpointInfo) {
			mu.Lock()
			defer mu.Unlock()
			n++
			biggest = max(biggest, info.Bytes)
		}
	})
	waitCounted(t, e.db, 200, 0)
	mu.Lock()
	defer mu.Unlock()
	if n < 3 {
		t.Errorf("%d checkpoints for 12 MiB of events with a 1 MiB budget", n)
	}
	// Sealed at the budget, plus at most what one poll added: two
	// fetches of at least 1 MiB each.
	if biggest > 1<<20+2*(1<<20)+64<<10 {
		t.Errorf("a checkpoint held %d bytes of records, over the 1 MiB budget and one poll", biggest)
	}
}

// The schema pins its character sets: a ledger database created with
// latin1 as its default stores any valid UTF-8 that input carries (event
// and account ids, a consumer group, and the details of dead letters that
// quote the input), emoji included. Before the columns were pinned, the
// first dead letter quoting an emoji failed every checkpoint with 1366.
func TestLatin1LedgerStoresAnyText(t *testing.T) {
	e := newEnvWith(t, 2, envOptions{create: []string{"CHARACTER SET latin1 COLLATE latin1_swedish_ci"}})
	produce(t, e,
		ev{"e-🎉-1", "acct-ü-🎉", 10, "EUR", t0}.record(""),
		ev{"e-🎉-2", "acct-ü-🎉", 5, "EUR", t0}.record(""),
		ev{"e-🎉-1", "acct-ü-🎉", 11, "EUR", t0}.record(""), // conflicting repeat: its detail quotes the id
		ev{"e-€", "acct-€", 1, "€UR", t0}.record(""),      // invalid currency: its detail quotes "€UR"
	)
	group := "g-ü-🎉-" + e.topic
	start(t, e, func(c *Config, s *sinkConfig) { c.Group, s.Group = group, group })
	waitCounted(t, e.db, 2, 2)
	got := balances(t, e.db)
	if b := got["acct-ü-🎉/EUR"]; b.Amount != 15 || b.Count != 2 {
		t.Errorf("balance of acct-ü-🎉 = %+v, want 15 over 2 events", b)
	}
	var details []string
	if err := e.db.Select(&details, `SELECT detail FROM dead_letters ORDER BY reason`); err != nil {
		t.Fatal(err)
	}
	if len(details) != 2 || !strings.Contains(details[0], "e-🎉-1") || !strings.Contains(details[1], "€UR") {
		t.Errorf("dead letter details = %q: the input's text must be kept as it was", details)
	}
	var stored string
	if err := e.db.Get(&stored, `SELECT consumer_group FROM partition_offsets LIMIT 1`); err != nil || stored != group {
		t.Errorf("stored consumer group = %q (%v), want %q", stored, err, group)
	}
}

// A renamed consumer group cannot double-count by accident: a group without
// stored positions is refused on a ledger that holds positions of the topic
// under another group. Allowed deliberately, it replays the topic from the
// start; events within the TTL are dropped as repeats, and the dead letters
// it meets again (same topic, partition and offset) do not stall it on
// their unique key.
func TestGroupChangeIsRefusedUnlessAllowed(t *testing.T) {
	e := newEnv(t, 2)
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, ev{fmt.Sprintf("g-%d", i), fmt.Sprintf("acct-%d", i%3), 5, "EUR", t0}.record(""))
	}
	recs = append(recs, &kgo.Record{Key: []byte("acct-0"), Value: []byte(`not json`)}, &kgo.Record{Key: []byte("acct-1"), Value: []byte(`{}`)})
	produce(t, e, recs...)
	first := start(t, e, nil)
	waitCounted(t, e.db, 20, 2)
	first.stop(t)

	renamed := func(c *Config, s *sinkConfig) { c.Group, s.Group = "renamed-"+e.topic, "renamed-"+e.topic }
	// Refused: Run returns at once, naming the setting.
	scfg := sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 2, Topic: e.topic, StepTimeout: 10 * time.Second, Logger: testenv.Logger()}}
	cfg := testConfig(e)
	renamed(&cfg, &scfg)
	sink, d := openSink(t, scfg)
	defer d.Close()
	defer sink.Close()
	p, err := New(cfg, sink, d.Stores())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The client joins the group before Run begins: let the group assign
	// the partitions first. A claim made then would store the renamed
	// group's positions, and the check in Run would let it pass.
	awaitStableGroup(ctx, t, e.brokers, "renamed-"+e.topic)
	renamedRows := func() int {
		var n int
		if err := e.db.Get(&n, `SELECT COUNT(*) FROM partition_offsets WHERE consumer_group = ?`, "renamed-"+e.topic); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(2 * time.Second); renamedRows() == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	err = p.Run(ctx)
	var gce *GroupChangeError
	if !errors.As(err, &gce) || !strings.Contains(err.Error(), "ALLOW_GROUP_CHANGE") || gce.Stored[0] != "g-"+e.topic {
		t.Fatalf("Run of a renamed group = %v, want a GroupChangeError naming ALLOW_GROUP_CHANGE", err)
	}
	if n := renamedRows(); n != 0 {
		t.Fatalf("the refused group claimed %d partitions", n)
	}

	// Allowed: the replay reaches the end of the topic; nothing counts
	// twice within the TTL and the stored dead letters stay as they were.
	in := start(t, e, func(c *Config, s *sinkConfig) {
		renamed(c, s)
		c.AllowGroupChange = true
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		var next []int64
		if err := e.db.Select(&next, `SELECT next_offset FROM partition_offsets WHERE consumer_group = ?`, "renamed-"+e.topic); err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, n := range next {
			total += max(n, 0)
		}
		if total == int64(len(recs)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the renamed group's positions sum to %d, want %d (aborted attempts: %d)", total, len(recs), in.p.Stats().Aborts.Load())
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitCounted(t, e.db, 20, 2)
	if d := in.p.Stats().Duplicates.Load(); d != 20 {
		t.Errorf("the replay dropped %d repeats, want 20", d)
	}
}

// Guarantee 3 against a database that refuses valid records: an operator's
// CHECK constraint refuses one account's events and caps another's
// balance. Each refused event becomes one rejected_by_database dead letter
// with the server's message, in arrival order (the event that would take
// the capped balance over the limit, not the earlier ones); everything
// else commits, and no partition stalls. Before, every checkpoint covering
// a refused record failed forever.
func TestRecordsTheDatabaseRefusesAreIsolated(t *testing.T) {
	e := newEnv(t, 3)
	for _, ddl := range []string{
		`ALTER TABLE account_balances ADD CONSTRAINT no_poison CHECK (account_id <> 'acct-poison')`,
		`ALTER TABLE account_balances ADD CONSTRAINT cap CHECK (account_id <> 'acct-cap' OR balance_minor <= 100)`,
	} {
		if _, err := e.db.Exec(ddl); err != nil {
			t.Fatal(err)
		}
	}
	var recs []*kgo.Record
	for i := range 60 {
		recs = append(recs, ev{fmt.Sprintf("ok-%d", i), fmt.Sprintf("acct-%d", i%7), 1, "EUR", t0}.record(""))
		if i%20 == 5 {
			recs = append(recs, ev{fmt.Sprintf("poison-%d", i), "acct-poison", 1, "EUR", t0}.record(fmt.Sprintf("k-%d", i)))
		}
	}
	// One partition (keyed by account), in this order: 60 passes, the
	// second 60 would make 120, the 30 makes 90.
	recs = append(recs,
		ev{"cap-1", "acct-cap", 60, "EUR", t0}.record(""),
		ev{"cap-2", "acct-cap", 60, "EUR", t0}.record(""),
		ev{"cap-3", "acct-cap", 30, "EUR", t0}.record(""),
	)
	produce(t, e, recs...)
	var (
		mu      sync.Mutex
		offsets []string
	)
	start(t, e, func(c *Config, _ *sinkConfig) {
		c.OnCheckpoint = func(info CheckpointInfo) {
			if info.Err != nil {
				mu.Lock()
				offsets = append(offsets, info.Offsets)
				mu.Unlock()
			}
		}
	})
	waitCounted(t, e.db, 62, 4)
	var rows []struct {
		EventID string `db:"event_id"`
		Reason  string `db:"reason"`
		Detail  string `db:"detail"`
	}
	if err := e.db.Select(&rows, `SELECT event_id, reason, detail FROM dead_letters ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	want := []string{"cap-2", "poison-25", "poison-45", "poison-5"}
	for i, r := range rows {
		if r.EventID != want[i] || r.Reason != "rejected_by_database" || !strings.Contains(r.Detail, "CONSTRAINT") {
			t.Errorf("dead letter %d = %+v, want %s rejected_by_database with the server's message", i, r, want[i])
		}
	}
	got := balances(t, e.db)
	if b := got["acct-cap/EUR"]; b.Amount != 90 || b.Count != 2 {
		t.Errorf("acct-cap = %+v, want 90 over 2 events", b)
	}
	if _, ok := got["acct-poison/EUR"]; ok {
		t.Error("the refused account has a balance")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(offsets) == 0 || offsets[0] == "" {
		t.Errorf("failed attempts reported offsets %q: a failing checkpoint must name its partitions and offsets", offsets)
	}
}

// awaitStableGroup waits until the consumer group has finished a
// rebalance: its members have their assignments.
func awaitStableGroup(ctx context.Context, t *testing.T, brokers []string, group string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for {
		described, err := adm.DescribeGroups(ctx, group)
		if err == nil && described[group].State == "Stable" && len(described[group].Members) > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("group %s never became stable: %v (last error: %v)", group, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Issue 18's reproduction, on a server whose max_allowed_packet is 1 MiB
// (set globally for the test: MariaDB gives each connection the global
// value, it cannot be set per session), dead letters keeping prefixes of up
// to 1 MiB (DEAD_LETTER_PAYLOAD_BYTES=1048576), five junk records of 300
// KiB and five of 900 KiB made of the bytes that cost most when quoted,
// then 100 valid events on one partition. Before the payload prefix and
// the statement were sized by one computation, the row estimate exceeded
// the budget by 11 bytes, stmt.Split refused it, and every replay failed
// alike: nothing was counted, ever. Now every event counts, every junk
// record is one dead letter with a prefix of at least a quarter of the
// packet less 4 KiB, and no attempt fails.
func TestDeadLettersOnAServerOfOneMiBPackets(t *testing.T) {
	// On a server of its own: MariaDB's limit is global, and every other
	// test's connections opened meanwhile would get it.
	admin := testenv.OwnMariaDB(t)
	const packet = 1 << 20
	testenv.SetGlobal(t, admin, "max_allowed_packet", packet)
	e := newEnvWith(t, 1, envOptions{topicConfigs: map[string]string{"max.message.bytes": "2097152"}, admin: admin})
	quoted := bytes.Repeat([]byte("'\"\\\x00\n"), 200<<10)
	var recs []*kgo.Record
	var junk [][]byte
	for i := range 10 {
		size := 300 << 10
		if i >= 5 {
			size = 900 << 10
		}
		v := append([]byte(fmt.Sprintf("junk %d ", i)), quoted[:size]...)
		junk = append(junk, v)
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: v})
	}
	for i := range 100 {
		recs = append(recs, ev{fmt.Sprintf("v-%d", i), "acct-v", 1, "EUR", t0}.record(""))
	}
	produce(t, e, recs...)
	in := start(t, e, func(c *Config, _ *sinkConfig) { c.DeadLetterPayloadBytes = 1 << 20 })
	if b := in.sink.MaxStatementBytes(0); b != stmt.Budget(packet) {
		t.Fatalf("statement budget %d: the server's 1 MiB limit did not reach the sink", b)
	}
	waitCounted(t, e.db, 100, len(junk))
	if n := in.p.Stats().Aborts.Load(); n != 0 {
		t.Errorf("%d checkpoint attempts failed", n)
	}
	var rows []struct {
		Payload []byte `db:"payload"`
		Size    int    `db:"payload_size"`
	}
	if err := e.db.Select(&rows, `SELECT payload, payload_size FROM dead_letters ORDER BY kafka_offset`); err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		v := junk[i]
		if r.Size != len(v) || len(r.Payload) < packet/4-4096 || !bytes.Equal(r.Payload, v[:len(r.Payload)]) {
			t.Errorf("dead letter %d: %d bytes of a %d-byte value (size %d), want a prefix of at least %d", i, len(r.Payload), len(v), r.Size, packet/4-4096)
		}
	}
}

// A max_allowed_packet lowered while the service runs (an operator's SET
// GLOBAL to 1 MiB, the budget read at start at the server's 16 MiB): MariaDB
// answers the first statement over the new limit by dropping the
// connection, not with error 1153, so the retry ladder took it for a
// transient failure and every replay failed the same way: the partition
// stalled until a restart. Now a write that lost its connection rereads the
// limits once and is cut to the new budget: every event counts, every junk
// record is one dead letter.
func TestALimitLoweredWhileRunningIsFollowed(t *testing.T) {
	admin := testenv.OwnMariaDB(t) // the limit is global: never the shared server's
	e := newEnvWith(t, 1, envOptions{topicConfigs: map[string]string{"max.message.bytes": "8388608"}, admin: admin})
	produce(t, e, ev{"before", "acct-v", 1, "EUR", t0}.record(""))
	in := start(t, e, func(c *Config, _ *sinkConfig) { c.DeadLetterPayloadBytes = 4 << 20 })
	waitCounted(t, e.db, 1, 0)
	if b := in.sink.MaxStatementBytes(0); b <= 2<<20 {
		t.Fatalf("statement budget %d at start: want the server's default limit, above 2 MiB", b)
	}
	const packet = 1 << 20
	own, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	own.SetMaxOpenConns(1)
	if _, err := own.Exec(fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", packet)); err != nil {
		t.Fatal(err)
	}
	// A session keeps the limit it connected with: end the service's
	// connections (as a wait_timeout or a failover would), so that its
	// pools reconnect under the new one.
	var ids []int64
	if err := sqlx.NewDb(own, "mysql").Select(&ids, `SELECT id FROM information_schema.PROCESSLIST WHERE id <> CONNECTION_ID() AND command <> 'Daemon'`); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		_, _ = own.Exec(fmt.Sprintf("KILL %d", id))
	}
	junk := bytes.Repeat([]byte{'j'}, 5<<18) // 1.25 MiB: the statement a quarter over the new limit
	var recs []*kgo.Record
	for range 3 {
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: junk})
	}
	for i := range 50 {
		recs = append(recs, ev{fmt.Sprintf("v-%d", i), "acct-v", 1, "EUR", t0}.record(""))
	}
	produce(t, e, recs...)
	waitCounted(t, e.db, 51, 3)
	if b := in.sink.MaxStatementBytes(0); b != stmt.Budget(packet) {
		t.Errorf("statement budget %d after the limit fell, want %d: the limits were not reread", b, stmt.Budget(packet))
	}
}
