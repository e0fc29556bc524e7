package mysqldriver

import "github.com/billing/ledger/internal/txsink/driver"

// What the service reads and writes, table by table: the one declaration
// of it, the store's. `billing` checks these privileges at start
// (cmd/billing, preflight), a test holds the grant files to them, and a
// test parses the migrations and fails when one creates a table this list
// does not name. A new table, or a new statement on a table, is declared
// here, next to the feature that needs it (driver.Feature).
//
// The statements are this package's: the ledger's tables (dedup.go,
// ledger.go, deadletters.go), the control tables (control.go), plus the
// operators' statements on dead_letters (package deadletters), the
// ledger's period settings (package periods) and the schema-version check
// of cmd/billing (goose). Every table the service writes it also reads:
// INSERT ... ON DUPLICATE KEY UPDATE, DELETE ... WHERE and locking reads
// read columns, and the start-up checks copy a table into itself (INSERT
// ... SELECT ... WHERE 1=0).

// Feature is a part of the store only some configurations use.
type Feature = driver.Feature

// The features (driver.Feature).
const (
	FeatureAlways    = driver.FeatureAlways
	FeatureClosing   = driver.FeatureClosing
	FeatureEntries   = driver.FeatureEntries
	FeatureRetention = driver.FeatureRetention
	FeatureChangelog = driver.FeatureChangelog
)

// Privileges.
const (
	Select = "SELECT"
	Insert = "INSERT"
	Update = "UPDATE"
	Delete = "DELETE"
	// Drop is what TRUNCATE TABLE needs on MySQL and MariaDB: the upkeep
	// of the dedup keys' generations empties a table whole with it.
	Drop = "DROP"
)

// TableAccess is a privilege the service needs on a table, and the feature
// that needs it.
type TableAccess struct {
	Table, Privilege string
	Feature          Feature
}

// access is the declaration, table by table (SELECT first: the checks of
// the others need it).
var access = []TableAccess{
	// Balances: careful-mode reads under row locks, upserts.
	{"account_balances", Select, FeatureAlways}, {"account_balances", Insert, FeatureAlways}, {"account_balances", Update, FeatureAlways},
	// Windows: the same, and sealing (locking reads, UPDATE of closed_at).
	{"billing_windows", Select, FeatureAlways}, {"billing_windows", Insert, FeatureAlways}, {"billing_windows", Update, FeatureAlways},
	// Adjustments: the events of closed windows, as windows.
	{"window_adjustments", Select, FeatureClosing}, {"window_adjustments", Insert, FeatureClosing}, {"window_adjustments", Update, FeatureClosing},
	// Entries: an upsert per counted event; the retention deletes by age.
	{"ledger_entries", Select, FeatureEntries}, {"ledger_entries", Insert, FeatureEntries}, {"ledger_entries", Update, FeatureEntries},
	{"ledger_entries", Delete, FeatureRetention},
	// Dead letters: an upsert (a replay keeps the stored row); the
	// sampler counts those waiting.
	{"dead_letters", Select, FeatureAlways}, {"dead_letters", Insert, FeatureAlways}, {"dead_letters", Update, FeatureAlways},
	// Dedup keys, a table per generation in rotation (migration 00008;
	// dedup_keys is generation 0's): lookups, the claim's upsert and its
	// locking reads of earlier generations, unclaims, replacement of
	// expired keys, and the upkeep's TRUNCATE of a table whose keys have
	// all expired (DROP).
	{"dedup_keys", Select, FeatureAlways}, {"dedup_keys", Insert, FeatureAlways}, {"dedup_keys", Update, FeatureAlways}, {"dedup_keys", Delete, FeatureAlways},
	{"dedup_keys", Drop, FeatureAlways},
	{"dedup_keys_g1", Select, FeatureAlways}, {"dedup_keys_g1", Insert, FeatureAlways}, {"dedup_keys_g1", Update, FeatureAlways},
	{"dedup_keys_g1", Delete, FeatureAlways}, {"dedup_keys_g1", Drop, FeatureAlways},
	{"dedup_keys_g2", Select, FeatureAlways}, {"dedup_keys_g2", Insert, FeatureAlways}, {"dedup_keys_g2", Update, FeatureAlways},
	{"dedup_keys_g2", Delete, FeatureAlways}, {"dedup_keys_g2", Drop, FeatureAlways},
	// The expiry journal of the version before generations: read before
	// dedup_keys is emptied (no key it lists may still be live), and
	// emptied with it.
	{"dedup_expiry", Select, FeatureAlways}, {"dedup_expiry", Drop, FeatureAlways},
	// The generations' state (control server): read by every checkpoint
	// that claims keys and under a shared lock by its decision; the
	// lifetime's registration, rotations and records of emptied tables
	// update its one row.
	{"dedup_generations", Select, FeatureAlways}, {"dedup_generations", Update, FeatureAlways},
	// The control server's bookkeeping (mysqldriver/control.go): claims
	// and decisions (upserts of positions and epochs), decision rows and
	// their pruning, the ledger's identity (inserted on first start), the
	// closing frontier (read by every checkpoint that closes windows,
	// raised by their decisions).
	{"partition_offsets", Select, FeatureAlways}, {"partition_offsets", Insert, FeatureAlways}, {"partition_offsets", Update, FeatureAlways},
	{"checkpoint_decisions", Select, FeatureAlways}, {"checkpoint_decisions", Insert, FeatureAlways}, {"checkpoint_decisions", Delete, FeatureAlways},
	{"ledger_identity", Select, FeatureAlways}, {"ledger_identity", Insert, FeatureAlways},
	{"window_frontier", Select, FeatureClosing}, {"window_frontier", Insert, FeatureClosing}, {"window_frontier", Update, FeatureClosing},
	// The commit log (migration 00006): every commit decision takes the
	// counter (an UPDATE of its one row) and appends a record; the
	// coordinator and recovery mark records applied; the retention prunes
	// old ones.
	{"commit_sequence", Select, FeatureAlways}, {"commit_sequence", Update, FeatureAlways},
	{"checkpoint_commits", Select, FeatureAlways}, {"checkpoint_commits", Insert, FeatureAlways}, {"checkpoint_commits", Update, FeatureAlways},
	{"checkpoint_commits", Delete, FeatureAlways},
	// The changelog (migration 00007): every checkpoint writes its changes
	// to the outbox in its branches; the publisher reads and deletes them
	// and scans the result tables for the snapshot (SELECT, declared
	// above); the changelog's state is enabled (an insert), leased,
	// raised, disabled (a delete, by billing changelog off), and read by
	// every instance. Every decision reads commit_sequence's flag (its
	// UPDATE, declared above).
	{"changelog_outbox", Select, FeatureChangelog}, {"changelog_outbox", Insert, FeatureChangelog}, {"changelog_outbox", Delete, FeatureChangelog},
	{"changelog_state", Select, FeatureAlways}, {"changelog_state", Insert, FeatureChangelog}, {"changelog_state", Update, FeatureChangelog},
	{"changelog_state", Delete, FeatureChangelog},
	// The ledger's period settings (migration 00005, package periods):
	// read at start and after every claim, stored by the first instance.
	{"ledger_periods", Select, FeatureAlways}, {"ledger_periods", Insert, FeatureAlways},
	// The ledger's layout (migration 00010, package shards): every server's
	// identity read at start and claimed by the first; the layout read at
	// start and stored by the first instance.
	{"ledger_server", Select, FeatureAlways}, {"ledger_server", Update, FeatureAlways},
	{"ledger_layout", Select, FeatureAlways}, {"ledger_layout", Insert, FeatureAlways},
	// Growing (migration 00012, package shards): a layout's slots and the
	// state of the move to it, read at start and after every claim
	// (written by billing shards add, not by instances).
	{"ledger_placement", Select, FeatureAlways}, {"ledger_moves", Select, FeatureAlways},
	// The live move (migration 00013): its cursor read before every
	// checkpoint and by every decision, under a shared lock (changed by
	// billing shards add and remove, not by instances).
	{"ledger_move_cursor", Select, FeatureAlways},
	// Migration 00014: an instance waiting for an announced step says so
	// (an upsert of its row, read and deleted by billing shards add).
	{"ledger_move_waits", Select, FeatureAlways}, {"ledger_move_waits", Insert, FeatureAlways}, {"ledger_move_waits", Update, FeatureAlways},
	// goose's version table: read at start to see whether migrations are
	// pending (created by goose, not by a migration).
	{SchemaVersionTable, Select, FeatureAlways},
}

// SchemaVersionTable is goose's table of applied migrations: the one table
// the service reads that no migration creates.
const SchemaVersionTable = "goose_db_version"

// Access is what a configuration that runs the features on needs, in
// declaration order (FeatureAlways is always on).
func Access(on map[Feature]bool) []TableAccess {
	var out []TableAccess
	for _, a := range access {
		if on[a.Feature] || a.Feature == FeatureAlways {
			out = append(out, a)
		}
	}
	return out
}

// AllAccess is the whole declaration: what the service needs with every
// feature on.
func AllAccess() []TableAccess { return append([]TableAccess(nil), access...) }
