package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPU accounting: on a small machine the service, MySQL and Kafka share the
// cores, so where the CPU goes explains the numbers. When the broker or the
// MySQL server listens on this machine (and /proc lets us see its process),
// each child samples its CPU time, and its own, around the measured phase.

// clockTicks is USER_HZ, 100 on every Linux platform Go supports.
const clockTicks = 100

// cpuSeconds returns the user+system CPU time of a process ("self" for this
// one), or -1 if unreadable.
func cpuSeconds(pid string) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return -1
	}
	// The command name (field 2) may contain spaces: fields after it
	// start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return (ut + st) / clockTicks
}

// cpuStallMicros returns the machine's total CPU pressure stall time (PSI
// "some": time in which at least one runnable task waited for a CPU), in
// microseconds, or -1.
func cpuStallMicros() float64 {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return -1
	}
	for _, f := range strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				return x
			}
		}
	}
	return -1
}

// cpuMeter measures the cores used by a set of processes over an interval,
// and how much the machine's runnable tasks waited for a CPU meanwhile.
type cpuMeter struct {
	pids  map[string]string // name → pid ("self" for this process)
	start map[string]float64
	stall float64
	t0    time.Time

	skipped     time.Duration      // paused time, left out
	pausedAt    time.Time          // while paused
	pausedCPU   map[string]float64 // CPU seconds at the pause; nil when running
	pausedStall float64
}

func newCPUMeter(watch map[string]int) *cpuMeter {
	m := &cpuMeter{pids: map[string]string{"bench process": "self"}}
	for name, pid := range watch {
		m.pids[name] = strconv.Itoa(pid)
	}
	m.start = map[string]float64{}
	for name, pid := range m.pids {
		m.start[name] = cpuSeconds(pid)
	}
	m.stall = cpuStallMicros()
	m.t0 = time.Now()
	return m
}

// pause stops the meter: what the processes use until resume is not
// counted, nor the time.
func (m *cpuMeter) pause() {
	m.pausedAt = time.Now()
	m.pausedCPU = map[string]float64{}
	for name, pid := range m.pids {
		m.pausedCPU[name] = cpuSeconds(pid)
	}
	m.pausedStall = cpuStallMicros()
}

// resume starts the meter again after pause.
func (m *cpuMeter) resume() {
	if m.pausedCPU == nil {
		return
	}
	m.skipped += time.Since(m.pausedAt)
	for name, pid := range m.pids {
		if now, at := cpuSeconds(pid), m.pausedCPU[name]; now >= 0 && at >= 0 {
			m.start[name] += now - at
		}
	}
	if now := cpuStallMicros(); now >= 0 && m.pausedStall >= 0 {
		m.stall += now - m.pausedStall
	}
	m.pausedCPU = nil
}

// cores returns, per process, CPU seconds used since the meter started
// divided by the elapsed time (pauses left out of both).
func (m *cpuMeter) cores() map[string]float64 {
	el := (time.Since(m.t0) - m.skipped).Seconds()
	out := map[string]float64{}
	for name, pid := range m.pids {
		if m.start[name] < 0 || el <= 0 {
			continue
		}
		if now := cpuSeconds(pid); now >= 0 {
			out[name] = (now - m.start[name]) / el
		}
	}
	if now := cpuStallMicros(); m.stall >= 0 && now >= 0 && el > 0 {
		out["cpu stall"] = (now - m.stall) / 1e6 / el
	}
	return out
}

// localListener returns the pid of the process listening on addr (host:port)
// when the host is a loopback address, or 0.
func localListener(addr string) int {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return 0
	}
	want := fmt.Sprintf(":%04X", p)
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 9 && strings.HasSuffix(f[1], want) && f[3] == "0A" { // LISTEN
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		fds, err := os.ReadDir(filepath.Join(proc, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(proc, "fd", fd.Name())); err == nil && inodes[target] {
				pid, _ := strconv.Atoi(filepath.Base(proc))
				return pid
			}
		}
	}
	return 0
}
