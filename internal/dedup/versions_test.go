package dedup

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestClassifyVersions runs the scenario files of testdata/versions: each
// "classify" gives the stored rows (known: the current generation's,
// earlier: an earlier one's) and the arrivals, one a line, as
//
//	known|earlier|arrive id=ID rev=N fp=N amount=N [expires=DURATION] [cancelled] [unknown]
//
// (expires: from now; a stored row's first version was at expires minus
// the ttl; unknown: a row that keeps no version), and prints every arrival's verdict, the changes and the ids
// taken back. now is fixed, ttl=DURATION and horizon=DURATION are the
// command's arguments.
func TestClassifyVersions(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	datadriven.Walk(t, "testdata/versions", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "classify" {
				t.Fatalf("unknown command %q", d.Cmd)
			}
			ttl, horizon := time.Hour, time.Hour
			for _, arg := range d.CmdArgs {
				v, err := time.ParseDuration(arg.Vals[0])
				if err != nil {
					t.Fatal(err)
				}
				switch arg.Key {
				case "ttl":
					ttl = v
				case "horizon":
					horizon = v
				}
			}
			known, earlier := map[string]Stored{}, map[string]Stored{}
			var arrivals []Arrival
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				kind, id, s := parseVersionLine(t, now, ttl, line)
				switch kind {
				case "known":
					known[id] = s
				case "earlier":
					earlier[id] = s
				case "arrive":
					arrivals = append(arrivals, Arrival{ID: id, Fingerprint: s.Fingerprint, Version: s.Version})
				default:
					t.Fatalf("unknown line %q", line)
				}
			}
			verdicts, changes, back := ClassifyVersions(now, ttl, horizon, arrivals, known, earlier)
			var b strings.Builder
			for i, a := range arrivals {
				fmt.Fprintf(&b, "%s@%d: %s\n", a.ID, a.Version.Revision, verdicts[i])
			}
			for _, c := range changes {
				old := "none"
				if c.Old != nil {
					old = showVersion(*c.Old)
				}
				claimed := ""
				if c.Claimed {
					claimed = ", claimed"
				}
				fmt.Fprintf(&b, "change %s: retract %s, count %s, fp=%d, expires %s, write %s%s\n",
					c.ID, old, showVersion(c.New), c.Fingerprint[0], c.ExpiresAt.Sub(now), [...]string{"none", "replace", "update"}[c.Write], claimed)
			}
			for _, id := range back {
				fmt.Fprintf(&b, "take back %s\n", id)
			}
			return b.String()
		})
	})
}

func parseVersionLine(t *testing.T, now time.Time, ttl time.Duration, line string) (string, string, Stored) {
	fields := strings.Fields(line)
	var id string
	s := Stored{ExpiresAt: now.Add(ttl), Version: Version{Account: "acct", Currency: "EUR", OccurredAt: now}}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "id":
			id = v
		case "rev":
			s.Version.Revision, err = strconv.ParseInt(v, 10, 64)
		case "fp":
			var n int
			n, err = strconv.Atoi(v)
			s.Fingerprint = fp(byte(n))
		case "amount":
			s.Version.Amount, err = strconv.ParseInt(v, 10, 64)
		case "expires":
			var d time.Duration
			d, err = time.ParseDuration(v)
			s.ExpiresAt = now.Add(d)
		case "unknown":
			s.Unknown = true
		case "cancelled":
			s.Version = Version{Revision: s.Version.Revision, Cancelled: true}
		default:
			t.Fatalf("unknown field %q in %q", k, line)
		}
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
	}
	return fields[0], id, s
}

func showVersion(v Version) string {
	if v.Cancelled {
		return fmt.Sprintf("r%d:cancelled", v.Revision)
	}
	return fmt.Sprintf("r%d:%d", v.Revision, v.Amount)
}

// TestClassifyVersionsKeepsClassify: with every revision 0 and nothing
// cancelled, versions change nothing: the verdicts and the ids taken back
// are Classify's, and the changes are its inserts.
func TestClassifyVersionsKeepsClassify(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ttl := time.Hour
	rng := rand.New(rand.NewPCG(1, 2))
	expiry := func() time.Time { return now.Add(time.Duration(rng.IntN(5)-2) * time.Minute) }
	for range 2000 {
		var keys []Key
		var arrivals []Arrival
		known, earlier := map[string]Seen{}, map[string]Seen{}
		vknown, vearlier := map[string]Stored{}, map[string]Stored{}
		for range rng.IntN(6) {
			id := string(rune('a' + rng.IntN(3)))
			f := fp(byte(rng.IntN(2)))
			keys = append(keys, Key{id, f})
			arrivals = append(arrivals, Arrival{ID: id, Fingerprint: f})
		}
		for _, id := range []string{"a", "b", "c"} {
			if rng.IntN(2) == 0 {
				s := Seen{Fingerprint: fp(byte(rng.IntN(2))), ExpiresAt: expiry()}
				known[id], vknown[id] = s, Stored{Fingerprint: s.Fingerprint, ExpiresAt: s.ExpiresAt}
			}
			if rng.IntN(2) == 0 {
				s := Seen{Fingerprint: fp(byte(rng.IntN(2))), ExpiresAt: expiry()}
				earlier[id], vearlier[id] = s, Stored{Fingerprint: s.Fingerprint, ExpiresAt: s.ExpiresAt}
			}
		}
		want, inserts, wantBack := Classify(now, ttl, keys, known, earlier)
		got, changes, back := ClassifyVersions(now, ttl, ttl, arrivals, vknown, vearlier)
		if !slices.Equal(got, want) || !slices.Equal(back, wantBack) || len(changes) != len(inserts) {
			t.Fatalf("keys %v known %v earlier %v: verdicts %v, want %v; taken back %v, want %v; changes %v, inserts %v",
				keys, known, earlier, got, want, back, wantBack, changes, inserts)
		}
		for i, c := range changes {
			in := inserts[i]
			if c.ID != in.ID || c.Fingerprint != in.Fingerprint || !c.ExpiresAt.Equal(in.ExpiresAt) || (c.Write == WriteReplace) != in.Replace || c.Claimed == in.Replace || c.Old != nil {
				t.Fatalf("change %+v, insert %+v", c, in)
			}
		}
	}
}
