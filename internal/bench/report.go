package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

type kadmClient = kadm.Client

type machine struct {
	CPUs      int     `json:"cpus"`
	CPUModel  string  `json:"cpu_model"`
	MemoryGiB float64 `json:"memory_gib"`
	Go        string  `json:"go"`
	MySQL     string  `json:"mysql"`
	Packet    int64   `json:"max_allowed_packet"`
	Kafka     string  `json:"kafka"`
	LoadStart string  `json:"load_start"`
	LoadEnd   string  `json:"load_end"`
	TotalS    float64 `json:"total_s"`
	Command   string  `json:"command"`
	Build     string  `json:"build"`
}

func (m machine) String() string {
	return fmt.Sprintf("machine: %d CPUs (%s), %.1f GiB; %s; MySQL %s (max_allowed_packet %d KiB); Kafka %s; load average %s\nbuild: %s\ncommand: %s\n",
		m.CPUs, m.CPUModel, m.MemoryGiB, m.Go, m.MySQL, m.Packet>>10, m.Kafka, m.LoadStart, m.Build, m.Command)
}

func machineInfo(ctx context.Context, o *options, adm *kadm.Client) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), LoadStart: loadAvg(), Command: strings.Join(os.Args, " "), Build: "unknown"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			m.Build = "commit " + rev[:min(12, len(rev))]
			if modified == "true" {
				m.Build += " with uncommitted changes"
			}
		}
	}
	if m.Build == "unknown" { // built with -buildvcs=false: ask git about the working directory
		if rev, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
			m.Build = "commit " + strings.TrimSpace(string(rev))
			if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
				m.Build += " with uncommitted changes"
			}
			m.Build += " (working directory)"
		}
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb float64
			if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %f kB", &kb); err == nil {
				m.MemoryGiB = kb / (1 << 20)
				break
			}
		}
		f.Close()
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if db, err := adminDB(o.Admin); err == nil {
		_ = db.QueryRowContext(cctx, "SELECT VERSION(), @@GLOBAL.max_allowed_packet").Scan(&m.MySQL, &m.Packet)
		db.Close()
	}
	if vs, err := adm.ApiVersions(cctx); err == nil {
		vs.Each(func(v kadm.BrokerApiVersions) {
			if v.Err == nil {
				m.Kafka = v.VersionGuess()
			}
		})
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func serviceSummary(o *options) map[string]string {
	c := o.svc
	return map[string]string{
		"CHECKPOINT_INTERVAL":     c.CheckpointInterval.String(),
		"CHECKPOINT_MAX_RECORDS":  fmt.Sprint(c.CheckpointMaxRecords),
		"MYSQL_BRANCHES":          fmt.Sprint(c.MySQLBranches),
		"KAFKA_MAX_POLL_RECORDS":  fmt.Sprint(c.KafkaMaxPollRecords),
		"DEDUP_CACHE_KEYS":        fmt.Sprint(c.DedupCacheKeys),
		"MYSQL_LOCK_WAIT_TIMEOUT": c.MySQLLockWaitTimeout.String(),
	}
}

func optionSummary(o *options) map[string]any {
	return map[string]any{
		"events": o.Events, "accounts": o.Accounts, "many_accounts": o.ManyAccounts, "partitions": o.Partitions,
		"dup_ratio": o.DupRatio, "zipf_s": o.ZipfS, "seed": o.Seed, "naive_batch": o.NaiveBatch,
		"naive_wait": o.NaiveWait.String(), "sink_chunk": o.SinkChunk, "live_rate": o.LiveRate,
		"live_duration": o.LiveDuration.String(), "timeout": o.Timeout.String(), "service_env": o.ServiceEnv,
	}
}

// renderTable prints one row per measurement and the ratios the targets
// are stated in.
func renderTable(o *options, infos []variantInfo, ms []measurement) string {
	var b strings.Builder
	sc := serviceSummary(o)
	keys := make([]string, 0, len(sc))
	for k := range sc {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var kv []string
	for _, k := range keys {
		kv = append(kv, k+"="+sc[k])
	}
	fmt.Fprintf(&b, "service configuration: %s\n", strings.Join(kv, " "))
	memLimit := "none"
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		memLimit = "GOMEMLIMIT=" + v
	} else if o.MemLimit > 0 {
		memLimit = fmt.Sprintf("%d MiB", o.MemLimit>>20)
	}
	fmt.Fprintf(&b, "service Go soft memory limit: %s; naive: batch %d records or %s; sink-only: %d records per checkpoint; live phase: %.0f records/s for %s\n",
		memLimit, o.NaiveBatch, o.NaiveWait, o.SinkChunk, o.LiveRate, o.LiveDuration)
	for _, in := range infos {
		live := ""
		if in.LiveRate != o.LiveRate {
			live = fmt.Sprintf("; live phase %.0f records/s", in.LiveRate)
		}
		fmt.Fprintf(&b, "variant %s: %d records, %d accounts, DEDUP_CACHE_KEYS %d, %d dedup keys preloaded; produced in %.1fs%s\n",
			in.Name, in.Records, in.Accounts, in.CacheKeys, in.Preload, in.ProduceS, live)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "variant\tmode\tevents/s\t÷limit\t÷naive\te2e p50\te2e p99\tunit p50\tunit p99\trecords/unit\tSQL RT/unit\tfailed\tpeak RSS\tcores: self/mysql/kafka\tCPU s/M ev: self/mysql\tstall\tledger\t")
	// Per variant and mode, the run with the median rate stands for all.
	byKey := map[string]measurement{}
	rates := map[string][]float64{}
	groups := map[string][]measurement{}
	var order []string
	for _, m := range ms {
		k := m.Variant + "/" + m.Mode
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], m)
		rates[k] = append(rates[k], m.Result.CatchUp.Rate)
	}
	for k, g := range groups {
		slices.SortFunc(g, func(a, b measurement) int { return cmp.Compare(a.Result.CatchUp.Rate, b.Result.CatchUp.Rate) })
		byKey[k] = g[(len(g)-1)/2]
	}
	// Modes in their usual order within a variant, whatever order they ran
	// in (sink-only runs after the service it replays).
	rank := func(k string) int {
		_, mode, _ := strings.Cut(k, "/")
		return slices.Index([]string{modeConsume, modeSink, modeNaive, modeServicePlain, modeService}, mode)
	}
	firstOf := map[string]int{} // variant → its first position
	for i, k := range order {
		v, _, _ := strings.Cut(k, "/")
		if _, ok := firstOf[v]; !ok {
			firstOf[v] = i
		}
	}
	slices.SortStableFunc(order, func(a, b string) int {
		va, _, _ := strings.Cut(a, "/")
		vb, _, _ := strings.Cut(b, "/")
		return cmp.Or(cmp.Compare(firstOf[va], firstOf[vb]), cmp.Compare(rank(a), rank(b)))
	})
	var rows []measurement
	for _, k := range order {
		rows = append(rows, byKey[k])
	}
	// Ratios pair the measurements of one repetition (the service and the
	// sink-only run that replays it ran back to back): per repetition, then
	// the median over repetitions.
	repRate := map[string]float64{} // variant/mode/rep → rate; absent when timed out
	for _, m := range ms {
		if m.Result.CatchUp.Rate > 0 && !m.Result.TimedOut {
			repRate[fmt.Sprintf("%s/%s/%d", m.Variant, m.Mode, m.Rep)] = m.Result.CatchUp.Rate
		}
	}
	pairedRatios := func(variant, mode string, den func(rep int) float64) []float64 {
		var rs []float64
		for rep := 1; rep <= maxRep(ms); rep++ {
			num, d := repRate[fmt.Sprintf("%s/%s/%d", variant, mode, rep)], den(rep)
			if num > 0 && d > 0 {
				rs = append(rs, num/d)
			}
		}
		return rs
	}
	var inverted []string // service rows whose limit did not bound them in some repetition
	for _, in := range infos {
		limitOf := func(rep int) float64 {
			limit := 0.0
			for _, mode := range []string{modeConsume, modeSink} {
				if r := repRate[fmt.Sprintf("%s/%s/%d", in.Name, mode, rep)]; r > 0 && (limit == 0 || r < limit) {
					limit = r
				}
			}
			return limit
		}
		naiveOf := func(rep int) float64 { return repRate[fmt.Sprintf("%s/%s/%d", in.Name, modeNaive, rep)] }
		for _, m := range rows {
			if m.Variant != in.Name {
				continue
			}
			r := m.Result
			rate := fmtRate(r.CatchUp.Rate)
			if rs := rates[m.Variant+"/"+m.Mode]; len(rs) > 1 {
				rate += fmt.Sprintf(" (%s–%s)", fmtRate(slices.Min(rs)), fmtRate(slices.Max(rs)))
			}
			if r.TimedOut {
				rate = fmt.Sprintf("%s (timeout)", fmtRate(float64(r.Records)/r.CatchUpS))
			}
			ratio := func(den func(rep int) float64) string {
				if m.Mode != modeNaive && m.Mode != modeService {
					return "-"
				}
				return ratioCell(pairedRatios(m.Variant, m.Mode, den))
			}
			if m.Mode == modeService {
				rs := pairedRatios(m.Variant, m.Mode, limitOf)
				if k := countAbove(rs, 1); k > 0 {
					inverted = append(inverted, fmt.Sprintf("%s (%d of %d repetitions)", m.Variant, k, len(rs)))
				}
			}
			vsNaive := "-"
			if m.Mode == modeService {
				vsNaive = ratio(naiveOf)
			}
			lat := func(x float64) string {
				if m.Mode == modeConsume || m.Mode == modeSink || x == 0 {
					return "n/a"
				}
				return fmtMs(x)
			}
			unitP := func(x float64) string {
				if m.Mode == modeConsume {
					return "n/a"
				}
				return fmtMs(x)
			}
			rt := "-"
			if m.Mode != modeConsume && r.RoundTrip > 0 {
				rt = fmt.Sprintf("%.1f", r.RoundTrip)
			}
			ledger := m.Ledger
			if ledger == "" {
				ledger = "-"
			}
			if m.Err != "" || r.Err != "" {
				ledger += " (error, see log)"
			}
			cores := "-"
			if c, ok := r.CPU["bench process"]; ok {
				cores = fmt.Sprintf("%.2f", c)
				for _, name := range []string{"mysql", "kafka"} {
					if v, ok := r.CPU[name]; ok {
						cores += fmt.Sprintf("/%.2f", v)
					} else {
						cores += "/?"
					}
				}
			}
			stall := "?"
			if v, ok := r.CPU["cpu stall"]; ok {
				stall = fmt.Sprintf("%.0f%%", 100*v)
			}
			perM := "-"
			if r.Records > 0 && r.CatchUpS > 0 {
				// CPU seconds per million events: cores over the catch-up.
				f := r.CatchUpS / float64(r.Records) * 1e6
				perM = fmt.Sprintf("%.1f/%.1f", r.CPU["bench process"]*f, r.CPU["mysql"]*f)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t%s\t%d\t%.0f MiB\t%s\t%s\t%s\t%s\t\n",
				m.Variant, m.Mode, rate, ratio(limitOf), vsNaive, lat(r.LatP50), lat(r.LatP99),
				unitP(r.CatchUp.P50), unitP(r.CatchUp.P99), r.CatchUp.Mean, rt, r.Failed, r.PeakRSSMiB, cores, perM, stall, ledger)
		}
	}
	tw.Flush()
	if len(inverted) > 0 {
		fmt.Fprintf(&b, "the limit did NOT bound the service (÷limit > 1) in: %s; its range is the spread of the noise\n", strings.Join(inverted, ", "))
	} else if maxRep(ms) > 1 {
		fmt.Fprintf(&b, "the limit bounded the service (÷limit ≤ 1) in every repetition of every variant\n")
	}
	for _, m := range rows {
		if m.Result.SteadyInserted > 0 {
			fmt.Fprintf(&b, "%s %s: during the catch-up, %s\n", m.Variant, m.Mode, steadyLine(m.Result))
		}
		if len(m.Result.Tables) > 0 {
			fmt.Fprintf(&b, "%s %s: during the catch-up, %s\n", m.Variant, m.Mode, tablesLine(m.Result))
		}
		if len(m.Result.LiveTables) > 0 {
			fmt.Fprintf(&b, "%s %s: during the live phase, %s\n", m.Variant, m.Mode, liveTablesLine(m.Result))
		}
	}
	// InnoDB's IO per event, and the larger-than-memory variant's dedup
	// state with its service over the default variant's (bigstate.go).
	for _, m := range rows {
		if m.Result.IO != nil {
			fmt.Fprintf(&b, "%s %s: InnoDB during the catch-up, %s\n", m.Variant, m.Mode, ioLine(*m.Result.IO, m.Result.Records))
		}
		if m.State != nil {
			vsDefault := 0.0
			if m.Mode == modeService {
				if rs := pairedRatios(m.Variant, m.Mode, func(rep int) float64 { return repRate[fmt.Sprintf("default/%s/%d", modeService, rep)] }); len(rs) > 0 {
					vsDefault = median(rs)
				}
			}
			fmt.Fprintf(&b, "%s %s: %s\n", m.Variant, m.Mode, stateLine(*m.State, vsDefault))
		}
	}
	// The changelog's cost: its service over the same service without it,
	// paired per repetition (they ran back to back).
	for _, in := range infos {
		var rs []float64
		for rep := 1; rep <= maxRep(ms); rep++ {
			with, plain := repRate[fmt.Sprintf("%s/%s/%d", in.Name, modeService, rep)], repRate[fmt.Sprintf("%s/%s/%d", in.Name, modeServicePlain, rep)]
			if with > 0 && plain > 0 {
				rs = append(rs, with/plain)
			}
		}
		if len(rs) > 0 {
			fmt.Fprintf(&b, "%s: service ÷ service-plain (without the changelog), paired per repetition: median %.2f, range %.2f–%.2f over %d\n",
				in.Name, median(rs), slices.Min(rs), slices.Max(rs), len(rs))
		}
	}
	// A variant held against the default's rate: its service over the
	// default variant's service, paired per repetition.
	for _, in := range infos {
		if !in.VsDefault {
			continue
		}
		if rs := pairedRatios(in.Name, modeService, func(rep int) float64 { return repRate[fmt.Sprintf("default/%s/%d", modeService, rep)] }); len(rs) > 0 {
			fmt.Fprintf(&b, "%s: service ÷ the default variant's service, paired per repetition: median %.2f, range %.2f–%.2f over %d\n",
				in.Name, median(rs), slices.Min(rs), slices.Max(rs), len(rs))
		}
	}
	b.WriteString(instancesLines(ms))
	b.WriteString(growLines(ms))
	b.WriteString(`
events/s: sustained catch-up rate (records after the first checkpoint/batch/poll, over the time
  from its end to the last one's end); with -repeat, the median run (the row's other figures are
  that run's) and the range. ÷limit: over min(consume-only, sink-only); sink-only replays the
  service's checkpoints of the same repetition when the service ran. ÷naive: over naive. Ratios
  are taken per repetition, then their median, with their range when there are several (the
  line under the table names every service row whose limit did not bound it in some repetition).
  service-plain: the service without the changelog, beside the changelog variant's service.
e2e: record timestamp → commit that makes it visible, in the live phase. unit: checkpoint (service,
  sink-only), batch (naive), poll (consume-only), catch-up phase. SQL RT/unit: client commands sent
  per unit in the catch-up (the pipeline's start and background work included; the service's
  start-up checks, migrations, grants, clock and period settings, are not). failed: aborted checkpoint
  attempts. peak RSS: VmHWM of the child process. cores: CPU used during the catch-up by the child,
  the MySQL server and the broker (when they run on this machine), in cores; stall: share of that
  time in which some runnable task on the machine waited for a CPU (/proc/pressure/cpu), a measure
  of contention and so of noise. CPU s/M ev: CPU seconds per million events of the child and of the
  MySQL server over the catch-up (sink-only: over its checkpoints only). ledger: the catch-up
  result against billing-gen's expected ledger ("N twice": events counted twice).
InnoDB: the server's counters over the catch-up (server-wide) per event committed: pool reads
  (Innodb_buffer_pool_reads, pages read from disk on a miss), read requests (logical page reads),
  data reads and writes (IO requests to the data files), pages written. dedup tables: their
  data+index pages over the measurement's innodb_buffer_pool_size, their files' allocated size
  per stored key.
add-server: events/s before the move (from the first checkpoint's end to the start of billing shards
  add) and during it (from its start to its end, or the catch-up's end if that came first), and their
  ratio against 0.7; e2e: the live phase's, run while the move ran; rows/s: rows moved over the
  move's steps and rests (first step's start to last step's end).
`)
	return b.String()
}

// ratioCell shows the median of a row's per-repetition ratios and, when
// there are several, their range: one figure could hide that noise
// inverted the ratio in some repetition.
func ratioCell(rs []float64) string {
	switch len(rs) {
	case 0:
		return "-"
	case 1:
		return fmt.Sprintf("%.2f", rs[0])
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
}

// countAbove counts the ratios above x.
func countAbove(rs []float64, x float64) int {
	n := 0
	for _, r := range rs {
		if r > x {
			n++
		}
	}
	return n
}

func fmtRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2fM", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.1fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

func fmtMs(x float64) string {
	if x >= 10000 {
		return fmt.Sprintf("%.1f s", x/1000)
	}
	return fmt.Sprintf("%.0f ms", x)
}

func maxRep(ms []measurement) int {
	n := 0
	for _, m := range ms {
		n = max(n, m.Rep)
	}
	return n
}

// median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
