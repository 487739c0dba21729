package hostinfo

import (
	"runtime"
	"testing"
)

func TestLocalReadsThisMachine(t *testing.T) {
	h := Local()
	if h.Cores != runtime.NumCPU() || h.KernelVersion == "" || h.Hostname == "" {
		t.Errorf("host %+v", h)
	}
	if h.MemoryTotalBytes <= 0 || h.MemoryUsedBytes <= 0 || h.MemoryUsedBytes >= h.MemoryTotalBytes {
		t.Errorf("memory: %d used of %d", h.MemoryUsedBytes, h.MemoryTotalBytes)
	}
	if _, _, _, ok := LoadAvg(); !ok {
		t.Error("no load average")
	}
}
