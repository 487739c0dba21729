// Package hostinfo reads what a worker reports of the machine it runs on,
// from /proc. What cannot be read stays zero.
package hostinfo

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/fleet-dev/fleet/job"
)

// Local describes the machine the process runs on.
func Local() *job.Host {
	h := &job.Host{OS: runtime.GOOS, Arch: runtime.GOARCH, Cores: runtime.NumCPU()}
	h.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.KernelVersion = strings.TrimSpace(string(b))
	}
	h.Load1, h.Load5, h.Load15, _ = LoadAvg()
	if total, avail, ok := Memory(); ok {
		h.MemoryTotalBytes, h.MemoryUsedBytes = total, total-avail
	}
	return h
}

// LoadAvg reads the load averages over 1, 5 and 15 minutes.
func LoadAvg() (l1, l5, l15 float64, ok bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, 0, false
	}
	l1, _ = strconv.ParseFloat(f[0], 64)
	l5, _ = strconv.ParseFloat(f[1], 64)
	l15, _ = strconv.ParseFloat(f[2], 64)
	return l1, l5, l15, true
}

// Memory reads the machine's total and available memory, in bytes.
func Memory() (total, available int64, ok bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total, seen = kb<<10, seen+1
		case "MemAvailable:":
			available, seen = kb<<10, seen+1
		}
	}
	return total, available, seen == 2
}
