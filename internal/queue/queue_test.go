package queue

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestNames(t *testing.T) {
	n := Names{}
	if n.Submit() != "fleet.submit" || n.Jobs("gpu") != "fleet.jobs.gpu" || n.Bucket() != "fleet-jobs" ||
		n.JobsStream("gpu") != "FLEET_JOBS_gpu" || n.SharedJobsStream() != "FLEET_JOBS" || n.PoolConsumer("gpu") != "jobs-gpu" || n.KVSubject("a.b") != "$KV.fleet-jobs.a.b" {
		t.Fatal("default names do not match the contract")
	}
	other := Names{Prefix: "acme.prod"}
	if other.SubmitStream() != "ACME_PROD_SUBMIT" || other.Events("x") != "acme.prod.events.x" {
		t.Errorf("prefixed names: %s %s", other.SubmitStream(), other.Events("x"))
	}
	// Ids may hold dots: the id is everything after the kind.
	for subj, want := range map[string]string{
		"fleet.events.a.b.c": "a.b.c", "fleet.results.x": "x", "fleet.cancel.build-1.2": "build-1.2", "other.events.x": "",
	} {
		if got := n.JobID(subj); got != want {
			t.Errorf("JobID(%s) = %q, want %q", subj, got, want)
		}
	}
}

func TestStreamsMatchTheContract(t *testing.T) {
	v2 := map[string]jetstream.StreamConfig{}
	for _, s := range (Config{}).Streams() {
		v2[s.Name] = s
	}
	if s := v2["FLEET_INTAKE"]; s.Retention != jetstream.WorkQueuePolicy || s.NoAck || len(s.Subjects) != 1 || s.Subjects[0] != "fleet.t.*.intake" {
		t.Errorf("intake stream: %+v", s)
	}
	if s := v2["FLEET_EVENTS"]; len(s.Subjects) != 1 || s.Subjects[0] != "fleet.t.*.ev.>" {
		t.Errorf("events stream without v1: %+v", s.Subjects)
	}
	if s := v2["FLEET_RUNS"]; len(s.Subjects) != 1 || s.Subjects[0] != "fleet.r.>" || s.RePublish == nil ||
		s.RePublish.Source != "fleet.r.*.*.>" || s.RePublish.Destination != "fleet.t.{{wildcard(1)}}.run.{{wildcard(2)}}.>" {
		t.Errorf("runs stream: %+v", s)
	}
	if len(v2) != 4 {
		t.Errorf("v2 streams: %v", v2)
	}
	p := (Config{}).PoolStreamV2("gpu")
	if p.Name != "FLEET_POOL_gpu" || p.Retention != jetstream.LimitsPolicy || len(p.Subjects) != 1 || p.Subjects[0] != "fleet.p.gpu.>" ||
		!p.AllowDirect || p.RePublish == nil || p.RePublish.Source != "fleet.p.gpu.*.*.>" ||
		p.RePublish.Destination != "fleet.t.{{wildcard(2)}}.job.gpu.{{wildcard(1)}}.>" {
		t.Errorf("a pool's stream: %+v", p)
	}

	byName := map[string]jetstream.StreamConfig{}
	for _, s := range (Config{V1: true}).Streams() {
		byName[s.Name] = s
	}
	if s := byName["FLEET_SUBMIT"]; s.Retention != jetstream.WorkQueuePolicy || !s.NoAck {
		t.Errorf("submit stream: %+v", s)
	}
	if s := (Config{}).JobsStream("gpu"); s.Name != "FLEET_JOBS_gpu" || s.Retention != jetstream.WorkQueuePolicy ||
		len(s.Subjects) != 1 || s.Subjects[0] != "fleet.jobs.gpu" {
		t.Errorf("a pool's jobs stream: %+v", s)
	}
	if s := byName["FLEET_RESULTS"]; s.MaxMsgsPerSubject != 1 || !s.DiscardNewPerSubject || s.MaxAge == 0 {
		t.Errorf("results stream keeps more than one result per job: %+v", s)
	}
	if s := byName["FLEET_EVENTS"]; s.Retention != jetstream.LimitsPolicy || s.MaxAge == 0 {
		t.Errorf("events stream: %+v", s)
	}
	if _, ok := byName["FLEET_DLQ"]; !ok || len(byName) != 6 {
		t.Errorf("streams: %v", byName)
	}
}

// TestParseRunLive: the live copy of each of a run's messages is read as
// the message itself is, and what is not one is refused.
func TestParseRunLive(t *testing.T) {
	for _, n := range []Names{{}, {Prefix: "acme.prod"}} {
		for what, stored := range map[string]string{
			"def": n.RunDef("acme", "r-1"), "node.gpu.train": n.RunNodeEnded("acme", "r-1", "gpu", "train"),
			"cancel.1": n.RunCancel("acme", "r-1", 1), "retry.2": n.RunRetry("acme", "r-1", 2), "end.3": n.RunEnd("acme", "r-1", 3),
		} {
			want, ok := n.ParseRun(stored)
			got, ok2 := n.ParseRunLive(n.RunLive("acme", "r-1", what))
			if !ok || !ok2 || got != want {
				t.Errorf("%q %s: %+v %v, want %+v", n.Prefix, what, got, ok2, want)
			}
		}
		for _, bad := range []string{n.RunLive("acme", "r-1", "end.x"), n.RunLive("acme", "r-1", "other"),
			n.RunLive("acme", "r:1", "def"), n.JobLive("acme", "default", "q", "x"), "elsewhere.t.acme.run.r-1.def"} {
			if m, ok := n.ParseRunLive(bad); ok {
				t.Errorf("%q: read as %+v", bad, m)
			}
		}
		for _, pattern := range n.AllRunRoundsLive() {
			if !strings.HasPrefix(pattern, n.RunLive("*", "*", "")) {
				t.Errorf("pattern %s is not a run's live subject", pattern)
			}
		}
	}
}
