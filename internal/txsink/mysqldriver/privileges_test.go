package mysqldriver

import (
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/billing/ledger/migrations"
)

// schemaTables replays the Up sections of the goose migrations of fsys in
// order and returns the tables they leave, each with the migration that
// created it (CREATE TABLE; DROP TABLE and RENAME TABLE / ALTER TABLE ...
// RENAME followed).
func schemaTables(t *testing.T, fsys fs.FS) map[string]string {
	t.Helper()
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names) // goose applies them in the order of their numbers
	var (
		ident   = "`?([A-Za-z0-9_$]+)`?"
		create  = regexp.MustCompile(`(?is)^CREATE\s+(?:TEMPORARY\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?` + ident)
		drop    = regexp.MustCompile(`(?is)^DROP\s+(?:TEMPORARY\s+)?TABLES?\s+(?:IF\s+EXISTS\s+)?(.+)$`)
		rename  = regexp.MustCompile(`(?is)^RENAME\s+TABLES?\s+(.+)$`)
		pair    = regexp.MustCompile(`(?is)` + ident + `\s+TO\s+` + ident)
		alterRn = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+` + ident + `\s+.*?\bRENAME\s+(?:TO\s+|AS\s+)?` + ident + `\s*$`)
		comment = regexp.MustCompile(`(?m)--.*$`)
	)
	tables := map[string]string{}
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			t.Fatal(err)
		}
		up, _, _ := strings.Cut(string(b), "-- +goose Down")
		_, up, ok := strings.Cut(up, "-- +goose Up")
		if !ok {
			t.Fatalf("%s: no -- +goose Up section", name)
		}
		for _, st := range strings.Split(comment.ReplaceAllString(up, ""), ";") {
			st = strings.TrimSpace(st)
			switch {
			case create.MatchString(st):
				tables[strings.ToLower(create.FindStringSubmatch(st)[1])] = name
			case drop.MatchString(st):
				for _, n := range strings.Split(drop.FindStringSubmatch(st)[1], ",") {
					delete(tables, strings.ToLower(strings.Trim(strings.TrimSpace(n), "`")))
				}
			case rename.MatchString(st):
				for _, m := range pair.FindAllStringSubmatch(rename.FindStringSubmatch(st)[1], -1) {
					from, to := strings.ToLower(m[1]), strings.ToLower(m[2])
					tables[to] = tables[from] + " (renamed in " + name + ")"
					delete(tables, from)
				}
			case alterRn.MatchString(st):
				m := alterRn.FindStringSubmatch(st)
				from, to := strings.ToLower(m[1]), strings.ToLower(m[2])
				tables[to] = tables[from] + " (renamed in " + name + ")"
				delete(tables, from)
			}
		}
	}
	return tables
}

// undeclared lists the tables of fsys's migrations that the declaration
// (privileges.go) does not name, and the declared tables no migration leaves.
func undeclared(t *testing.T, fsys fs.FS) (missing, stale []string) {
	t.Helper()
	declared := map[string]bool{}
	for _, a := range AllAccess() {
		declared[a.Table] = true
	}
	tables := schemaTables(t, fsys)
	for table, by := range tables {
		if !declared[table] {
			missing = append(missing, table+" (created by migrations/"+by+")")
		}
	}
	for table := range declared {
		if _, ok := tables[table]; !ok && table != SchemaVersionTable {
			stale = append(stale, table)
		}
	}
	slices.Sort(missing)
	slices.Sort(stale)
	return missing, stale
}

// Preflight is derived from the schema (issue 18): every table the
// migrations create is in the declaration of what the service reads and
// writes, so that preflight checks it and the grant files cover it, and
// the declaration names no table the schema does not have. A migration
// added later (a settings table, a commit log) fails this test until its
// table is declared.
func TestEveryTableOfTheMigrationsIsDeclared(t *testing.T) {
	missing, stale := undeclared(t, migrations.FS)
	for _, m := range missing {
		t.Errorf("table %s is not declared in internal/txsink/mysqldriver/privileges.go: add what the service reads and writes in it "+
			"(table, privilege, feature) there, so that `billing` checks those privileges at start and the grant files are checked for them", m)
	}
	for _, s := range stale {
		t.Errorf("internal/txsink/mysqldriver/privileges.go declares table %s, which no migration leaves: remove it", s)
	}
	if len(schemaTables(t, migrations.FS)) < 11 {
		t.Fatalf("the migrations parse to %d tables: the parser misses some", len(schemaTables(t, migrations.FS)))
	}
}

// The check of the migrations sees tables created, renamed and dropped by
// later migrations, in any spelling goose accepts.
func TestSchemaTablesFollowsLaterMigrations(t *testing.T) {
	fsys := fstest.MapFS{}
	real, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range real {
		b, _ := fs.ReadFile(migrations.FS, name)
		fsys[name] = &fstest.MapFile{Data: b}
	}
	fsys["00090_settings.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\n-- a comment; with a semicolon\ncreate table if not exists `ledger_settings` (k INT);\n" +
		"CREATE TABLE scratch (x INT);\nRENAME TABLE scratch TO scratch2;\n-- +goose Down\nDROP TABLE ledger_settings;\n")}
	fsys["00091_commit_log.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE commit_log (seq BIGINT);\nALTER TABLE window_adjustments ADD COLUMN commit_seq BIGINT NULL;\n" +
		"ALTER TABLE scratch2 RENAME TO scratch3;\nDROP TABLE IF EXISTS scratch3;\n-- +goose Down\nDROP TABLE commit_log;\n")}
	missing, stale := undeclared(t, fsys)
	want := []string{"commit_log (created by migrations/00091_commit_log.sql)", "ledger_settings (created by migrations/00090_settings.sql)"}
	if !slices.Equal(missing, want) || len(stale) != 0 {
		t.Errorf("undeclared %q, stale %q; want %q and none", missing, stale, want)
	}
}

// Every table the service writes it reads too, under the same feature or
// one that is always on when that one is: the checks of INSERT copy the
// table into itself, and the service's upserts and deletes read columns.
func TestDeclarationReadsWhatItWrites(t *testing.T) {
	implies := func(reader, writer Feature) bool {
		return reader == FeatureAlways || reader == writer || writer == FeatureRetention && reader == FeatureEntries
	}
	for _, a := range AllAccess() {
		if a.Privilege == Select {
			continue
		}
		if !slices.ContainsFunc(AllAccess(), func(r TableAccess) bool {
			return r.Table == a.Table && r.Privilege == Select && implies(r.Feature, a.Feature)
		}) {
			t.Errorf("%s on %s (%s) without SELECT on it", a.Privilege, a.Table, a.Feature)
		}
	}
}

// What a configuration needs follows its features: the default needs no
// adjustments, entries or frontier; entries without retention no DELETE
// on them; every feature on needs the whole declaration.
func TestAccessFollowsTheFeatures(t *testing.T) {
	has := func(as []TableAccess, table, priv string) bool {
		return slices.Contains(as, TableAccess{table, priv, FeatureAlways}) ||
			slices.ContainsFunc(as, func(a TableAccess) bool { return a.Table == table && a.Privilege == priv })
	}
	def := Access(map[Feature]bool{})
	for _, table := range []string{"window_adjustments", "ledger_entries", "window_frontier"} {
		if has(def, table, Select) {
			t.Errorf("the default configuration needs %s", table)
		}
	}
	if !has(def, "dedup_keys", Delete) || !has(def, "dead_letters", Insert) || !has(def, SchemaVersionTable, Select) {
		t.Errorf("the default configuration lacks what it always needs: %v", def)
	}
	entries := Access(map[Feature]bool{FeatureEntries: true})
	if !has(entries, "ledger_entries", Insert) || has(entries, "ledger_entries", Delete) {
		t.Errorf("LEDGER_ENTRIES alone: %v", entries)
	}
	all := Access(map[Feature]bool{FeatureEntries: true, FeatureRetention: true, FeatureClosing: true, FeatureChangelog: true})
	if !slices.Equal(all, AllAccess()) {
		t.Errorf("every feature on: %v, want the whole declaration", all)
	}
}

// grant is one GRANT statement: privileges on database.table (either may
// be *).
type grant struct {
	privileges  []string
	db, table   string
	versionOnly bool // inside a versioned comment (/*!80000 ... */)
}

// grants reads the GRANT statements of a SQL file, or of the SQL blocks of
// a Markdown file.
func grants(t *testing.T, path string) []grant {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if strings.HasSuffix(path, ".md") {
		var blocks []string
		for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(text, -1) {
			blocks = append(blocks, m[1])
		}
		text = strings.Join(blocks, "\n")
	}
	re := regexp.MustCompile("(?is)(/\\*!\\d+\\s*)?GRANT\\s+([^;]+?)\\s+ON\\s+`?([A-Za-z0-9_*]+)`?\\.`?([A-Za-z0-9_*]+)`?\\s+TO\\s")
	var out []grant
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		g := grant{db: m[3], table: m[4], versionOnly: m[1] != ""}
		for _, p := range strings.Split(m[2], ",") {
			g.privileges = append(g.privileges, strings.ToUpper(strings.Join(strings.Fields(p), " ")))
		}
		out = append(out, g)
	}
	return out
}

// The grant files give the service account every privilege the
// declaration names, with every feature on, on every database they grant
// anything on: the compose stack's (deploy/mysql), the local services'
// (scripts/mariadb, both shard databases) and the one docs/operations.md
// tells operators to run.
func TestGrantFilesCoverTheDeclaration(t *testing.T) {
	for _, path := range []string{"../../../deploy/mysql/initdb.d/01-billing.sql", "../../../scripts/mariadb/grants.sql", "../../../docs/operations.md"} {
		gs := grants(t, path)
		dbs := map[string]bool{}
		for _, g := range gs {
			if g.db != "*" && !g.versionOnly {
				dbs[g.db] = true
			}
		}
		if len(dbs) == 0 {
			t.Errorf("%s: no GRANT on a database", path)
		}
		for db := range dbs {
			for _, a := range AllAccess() {
				if !slices.ContainsFunc(gs, func(g grant) bool {
					return !g.versionOnly && (g.db == db || g.db == "*") && (g.table == "*" || g.table == a.Table) &&
						(slices.Contains(g.privileges, a.Privilege) || slices.Contains(g.privileges, "ALL") || slices.Contains(g.privileges, "ALL PRIVILEGES"))
				}) {
					t.Errorf("%s: no grant of %s on `%s`.%s (declared in internal/txsink/mysqldriver/privileges.go, %s)", path, a.Privilege, db, a.Table, a.Feature)
				}
			}
		}
	}
}
