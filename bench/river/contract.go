// The external-child contract of relaybus-bench (bench/children.cpp, Role::External):
//
//	env    BENCH_OUT   where to write the key=value counters (the ChildOut format)
//	       BENCH_RCPT  where to write receipts (48-byte Receipt records, little endian)
//	stdout "ready\n" once connected; stdin "go <t_warm> <t0> <t1>\n" (CLOCK_MONOTONIC ns).
//
// The program works from t_warm, counts units inside [t0, t1] by the harness's
// clock, stops at t1 on its own, writes its counters and exits 0.
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// monoBase pairs one CLOCK_MONOTONIC reading with Go's own monotonic clock, so
// mono() costs no system call (Go's runtime clock is CLOCK_MONOTONIC on Linux too).
var monoBase, monoStart = clockMonotonic(), time.Now()

func clockMonotonic() int64 {
	var ts syscall.Timespec
	const clockMonotonicID = 1
	_, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonicID, uintptr(unsafe.Pointer(&ts)), 0)
	if e != 0 {
		panic("clock_gettime: " + e.Error())
	}
	return ts.Nano()
}

func mono() int64 { return monoBase + int64(time.Since(monoStart)) }

// The window marks the harness hands over.
type window struct{ tWarm, t0, t1 int64 }

// awaitGo reports ready and reads the go line.
func awaitGo() (window, error) {
	fmt.Fprint(os.Stdout, "ready\n")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return window{}, fmt.Errorf("reading go line: %w", err)
	}
	var w window
	var word string
	if _, err := fmt.Sscanf(strings.TrimSpace(line), "%s %d %d %d", &word, &w.tWarm, &w.t0, &w.t1); err != nil || word != "go" {
		return window{}, fmt.Errorf("expected go line, got %q", line)
	}
	return w, nil
}

func sleepUntil(t int64) {
	if d := t - mono(); d > 0 {
		time.Sleep(time.Duration(d))
	}
}

// counter counts units by the harness's clock (safe for concurrent use).
type counter struct {
	mu                             sync.Mutex
	w                              window
	unitsWindow, unitsSince, total int64
	callsWindow, errors            int64
	firstError                     string
	callNs                         []int64
	rcpt                           []byte
}

// done counts n units whose call started at start and ended at end.
func (c *counter) done(n int64, start, end int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count(n, end)
	if end >= c.w.t0 && end <= c.w.t1 {
		c.callsWindow++
		c.callNs = append(c.callNs, end-start)
	}
}

// unit counts one unit seen at t that no call of ours timed (a job River completed).
func (c *counter) unit(t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count(1, t)
}

func (c *counter) count(n int64, t int64) {
	c.total += n
	if t >= c.w.t0 {
		c.unitsSince += n
	}
	if t >= c.w.t0 && t <= c.w.t1 {
		c.unitsWindow += n
	}
}

func (c *counter) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errors++
	if c.firstError == "" {
		c.firstError = err.Error()
	}
}

// receipt records one job handed over: event and delivery id are the job id;
// seq and key are NULL (River keeps no per-key order); flags 1 = completed.
func (c *counter) receipt(jobID int64, now int64) {
	var b [48]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(jobID))
	binary.LittleEndian.PutUint64(b[8:], uint64(jobID))
	binary.LittleEndian.PutUint64(b[16:], ^uint64(0))
	binary.LittleEndian.PutUint64(b[24:], uint64(now))
	binary.LittleEndian.PutUint64(b[32:], uint64(time.Now().UnixNano()))
	binary.LittleEndian.PutUint32(b[40:], ^uint32(0))
	binary.LittleEndian.PutUint16(b[44:], 0)
	binary.LittleEndian.PutUint16(b[46:], 1)
	c.mu.Lock()
	c.rcpt = append(c.rcpt, b[:]...)
	c.mu.Unlock()
}

func percentileUs(sorted []int64, p float64) string {
	if len(sorted) == 0 {
		return "nan"
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return fmt.Sprintf("%.1f", float64(sorted[i])/1000)
}

// writeOut writes the counters (and receipts, when any) where the harness reads them.
func (c *counter) writeOut() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	sort.Slice(c.callNs, func(i, j int) bool { return c.callNs[i] < c.callNs[j] })
	s := fmt.Sprintf("units_window=%d\nunits_since_t0=%d\nunits_total=%d\nerrors=%d\nempty_in_window=0\n"+
		"calls_window=%d\ncall_p50_us=%s\ncall_p99_us=%s\nfirst_error=%s\n",
		c.unitsWindow, c.unitsSince, c.total, c.errors, c.callsWindow,
		percentileUs(c.callNs, 50), percentileUs(c.callNs, 99), strings.ReplaceAll(c.firstError, "\n", " "))
	if err := os.WriteFile(os.Getenv("BENCH_OUT"), []byte(s), 0o644); err != nil {
		return err
	}
	return os.WriteFile(os.Getenv("BENCH_RCPT"), c.rcpt, 0o644)
}
