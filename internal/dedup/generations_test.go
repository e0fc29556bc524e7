package dedup

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/txsink/driver"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func TestClaimAtReadsWhatMayBeLive(t *testing.T) {
	const life = time.Hour
	m := ledgerclock.Margin
	s := driver.KeyGenerations{Current: 4, Since: t0, PreviousSince: t0.Add(-life - m), Emptied: 1, Lifetime: life}
	for _, c := range []struct {
		name string
		s    driver.KeyGenerations
		now  time.Time
		want []driver.Generation
	}{
		{"generation 0 reads nothing", driver.KeyGenerations{Since: t0, Emptied: -1, Lifetime: life}, t0, nil},
		{"the previous one until a lifetime after the current began", s, t0.Add(life + m - time.Nanosecond), []driver.Generation{3}},
		{"the one before, not once it expired", func() driver.KeyGenerations { x := s; x.PreviousSince = t0.Add(-2 * life); return x }(), t0, []driver.Generation{3}},
		{"the one before until it expired", func() driver.KeyGenerations { x := s; x.PreviousSince = t0.Add(-life); return x }(), t0.Add(m - time.Nanosecond), []driver.Generation{3, 2}},
		{"nothing emptied is read", func() driver.KeyGenerations { x := s; x.Emptied = 2; return x }(), t0, []driver.Generation{3}},
		{"the previous one, once expired", s, t0.Add(life + m), nil},
		{"generation 0 until emptied", driver.KeyGenerations{Current: 2, Since: t0, PreviousSince: t0.Add(-10 * life), Emptied: -1, Lifetime: life}, t0.Add(5 * life), []driver.Generation{0}},
		{"no bound known: read", driver.KeyGenerations{Current: 3, Since: t0, Emptied: 0, Lifetime: life}, t0.Add(5 * life), []driver.Generation{1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := ClaimAt(c.s, c.now)
			if got.Write != c.s.Current || !slices.Equal(got.Read, c.want) {
				t.Fatalf("ClaimAt = %+v, want write %d, read %v", got, c.s.Current, c.want)
			}
		})
	}
}

func TestKeepEmptiesAndRotatesOnTime(t *testing.T) {
	const life = time.Hour
	m := ledgerclock.Margin
	for _, c := range []struct {
		name   string
		s      driver.KeyGenerations
		empty  driver.Generation
		rotate bool
	}{
		{"no lifetime registered: nothing", driver.KeyGenerations{Since: t0, Emptied: -1, Now: t0.Add(100 * life)}, -1, false},
		{"generation 0 for a lifetime", driver.KeyGenerations{Since: t0, Emptied: -1, Lifetime: life, Now: t0.Add(life + m - time.Microsecond)}, -1, false},
		{"then the next one", driver.KeyGenerations{Since: t0, Emptied: -1, Lifetime: life, Now: t0.Add(life + m)}, -1, true},
		{"the previous one expires with the current's lifetime", driver.KeyGenerations{Current: 1, Since: t0, PreviousSince: t0.Add(-life), Emptied: -1, Lifetime: life, Now: t0.Add(life + m)}, 0, true},
		{"not before", driver.KeyGenerations{Current: 1, Since: t0, PreviousSince: t0.Add(-life), Emptied: -1, Lifetime: life, Now: t0.Add(life + m - time.Microsecond)}, -1, false},
		{"no rotation onto a table not emptied", driver.KeyGenerations{Current: 2, Since: t0, PreviousSince: t0.Add(-life), Emptied: -1, Lifetime: life, Now: t0.Add(life + m)}, 0, false},
		{"the oldest first", driver.KeyGenerations{Current: 2, Since: t0, PreviousSince: t0.Add(-life), Emptied: 0, Lifetime: life, Now: t0.Add(life + m)}, 1, true},
		{"never the current one", driver.KeyGenerations{Current: 2, Since: t0, PreviousSince: t0.Add(-life), Emptied: 1, Lifetime: life, Now: t0.Add(10 * life)}, -1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Keep(c.s); got.Empty != c.empty || got.Rotate != c.rotate {
				t.Fatalf("Keep = %+v, want empty %d, rotate %v", got, c.empty, c.rotate)
			}
		})
	}
}

// simKey is a key of the simulation: its generation and expiry.
type simKey struct {
	gen     driver.Generation
	expires time.Time
}

// Property (the rules under skew, generated): instances whose clocks are
// each off the control server's by up to ledgerclock.MaxError claim keys
// of their own lifetimes (registered before the claim) at random times,
// under the state as it is then (a claim that straddles a rotation is
// refused at its decision, so each claim happens within one state); the
// upkeep takes every step dedup.Keep allows by the server's clock; keys
// the version before generations stored in generation 0's table have
// lifetimes of their own. Then, at every moment:
//
//   - no emptying removes a key that any instance may still see live
//     (its expiry after the server's clock less MaxError), and generation
//     0's table is emptied only when its journal allows it (no old key
//     expires after the server's clock less the margin, as the upkeep
//     asks EmptyKeys);
//   - every key live by some instance's clock is in a table that
//     instance's claim writes or reads (ClaimAt): no repeat is missed;
//   - the tables keep going round: generations advance.
func TestGenerationRulesUnderSkew(t *testing.T) {
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { simulate(t, seed) })
	}
}

func simulate(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 21))
	E := ledgerclock.MaxError
	base := time.Duration(1+r.IntN(3600)) * time.Second
	offsets := make([]time.Duration, 1+r.IntN(4))
	lifetimes := make([]time.Duration, len(offsets))
	for i := range offsets {
		offsets[i] = time.Duration(r.Int64N(int64(2*E+1))) - E
		lifetimes[i] = base + time.Duration(r.Int64N(int64(base/2)+1)) + ledgerclock.Margin
	}
	now := t0
	s := driver.KeyGenerations{Since: now, Emptied: -1}
	var keys []simKey
	var legacy []time.Time // expiries of the keys the version before stored
	for range r.IntN(50) {
		legacy = append(legacy, now.Add(time.Duration(r.Int64N(int64(6*base)))))
	}
	for _, e := range legacy {
		keys = append(keys, simKey{0, e})
	}
	startGen := s.Current
	for step := 0; step < 3000; step++ {
		now = now.Add(time.Duration(r.Int64N(int64(base / 20))))
		s.Now = now
		// The upkeep, by the server's clock, as often as it may.
		for {
			k := Keep(s)
			acted := false
			if k.Empty >= 0 {
				due := now.Add(-ledgerclock.Margin)
				blocked := false
				if k.Empty.Table() == 0 {
					for _, e := range legacy {
						blocked = blocked || e.After(due)
					}
				}
				if !blocked {
					var kept []simKey
					for _, key := range keys {
						if key.gen.Table() != k.Empty.Table() {
							kept = append(kept, key)
							continue
						}
						if key.gen != k.Empty {
							t.Fatalf("step %d: table %d holds generation %d while emptying %d (state %+v)", step, key.gen.Table(), key.gen, k.Empty, s)
						}
						if key.expires.After(now.Add(-E)) {
							t.Fatalf("step %d: generation %d emptied at %s with a key expiring %s, live for an instance whose clock is %s behind", step, k.Empty, now, key.expires, E)
						}
					}
					keys = kept
					if k.Empty.Table() == 0 {
						legacy = nil
					}
					s.Emptied = k.Empty
					acted = true
				}
			}
			if !acted && k.Rotate {
				s.Current, s.PreviousSince, s.Since = s.Current+1, s.Since, now
				acted = true
			}
			if !acted {
				break
			}
		}
		// A claim by a random instance.
		i := r.IntN(len(offsets))
		local := now.Add(offsets[i])
		s.Lifetime = max(s.Lifetime, lifetimes[i])
		c := ClaimAt(s, local)
		keys = append(keys, simKey{c.Write, local.Add(lifetimes[i])})
		// Coverage, for every instance's clock.
		for j := range offsets {
			localJ := now.Add(offsets[j])
			cj := ClaimAt(s, localJ)
			seen := append([]driver.Generation{cj.Write}, cj.Read...)
			for _, key := range keys {
				if localJ.Before(key.expires) && !slices.Contains(seen, key.gen) {
					t.Fatalf("step %d: a key of generation %d, live until %s, is not read by an instance at %s (claims write %d, read %v; state %+v)",
						step, key.gen, key.expires, localJ, cj.Write, cj.Read, s)
				}
			}
		}
	}
	if s.Current-startGen < 3 {
		t.Fatalf("only %d rotations in the run: the tables do not go round", s.Current-startGen)
	}
}
