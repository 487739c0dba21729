package executor

import (
	"context"
	"sync"
	"time"

	"github.com/fleet-dev/fleet/job"
)

// UsageSampler shares one reading of a UsageReader between those who ask
// for it (the heartbeat, the attempts' heartbeat events): a reading younger
// than its maximum age is served again, so that the backend is asked at
// most once per that age, however many ask.
type UsageSampler struct {
	r      UsageReader
	maxAge time.Duration

	mu   sync.Mutex // held while reading, so that one reads at a time
	at   time.Time
	last map[AttemptID]*job.Usage
}

// NewUsageSampler returns a sampler of r that reads again once its last
// reading is older than maxAge; nil when r is nil.
func NewUsageSampler(r UsageReader, maxAge time.Duration) *UsageSampler {
	if r == nil {
		return nil
	}
	return &UsageSampler{r: r, maxAge: maxAge}
}

// Latest returns the latest reading, reading again if it is too old. The
// map is shared: do not change it.
func (s *UsageSampler) Latest(ctx context.Context) map[AttemptID]*job.Usage {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil || time.Since(s.at) >= s.maxAge {
		s.last = s.r.Usage(ctx)
		s.at = time.Now()
	}
	return s.last
}

// Of returns the latest reading of one attempt, or nil; tenant is "" for
// the default tenant.
func (s *UsageSampler) Of(ctx context.Context, tenant, jobID string, attempt int) *job.Usage {
	if tenant == job.DefaultTenant {
		tenant = ""
	}
	return s.Latest(ctx)[AttemptID{Tenant: tenant, JobID: jobID, Attempt: attempt}]
}

// CPUMeter turns cumulative CPU times into percents of one core between
// readings, per attempt.
type CPUMeter struct {
	mu   sync.Mutex
	prev map[AttemptID]cpuReading
}

type cpuReading struct {
	cpu time.Duration
	at  time.Time
}

// Percent returns the CPU an attempt used since its previous reading, or
// since it started at started on the first, in percent of one core; nil
// when there is no interval to measure over.
func (m *CPUMeter) Percent(id AttemptID, cpu time.Duration, at, started time.Time) *float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prev == nil {
		m.prev = map[AttemptID]cpuReading{}
	}
	p, ok := m.prev[id]
	m.prev[id] = cpuReading{cpu, at}
	if !ok {
		p = cpuReading{0, started}
	}
	span := at.Sub(p.at)
	if p.at.IsZero() || span <= 0 || cpu < p.cpu {
		return nil
	}
	v := float64(cpu-p.cpu) / float64(span) * 100
	return &v
}

// Forget drops the readings of attempts not in live.
func (m *CPUMeter) Forget(live map[AttemptID]bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := range m.prev {
		if !live[id] {
			delete(m.prev, id)
		}
	}
}
