package job_test

import (
	"time"

	"github.com/fleet-dev/fleet/job"
)

var (
	t0    = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	code3 = 3
	delay = job.Duration(2 * time.Second)
	total = int64(8000)
	avail = int64(7000)
)

func sampleEvent() *job.Event {
	return &job.Event{
		JobID: "j1", Attempt: 1, Type: job.EventRetryScheduled, Time: t0, WorkerID: "w1", Pool: "default",
		Backend: "process", ExitCode: &code3, Failure: job.Failf(job.ClassExecution, job.CodeExitCode, "exited with code 3"),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Message: "m", Phase: "Running", Stream: "stderr", Line: "l",
		NextAttemptAt: &t0, Delay: &delay, Usage: sampleUsage(),
	}
}

func sampleResult() *job.Result {
	return &job.Result{
		JobID: "j1", Pool: "default", Status: job.StatusFailed, Attempts: 2, ExitCode: &code3,
		Outputs: map[string]string{"a": "b"},
		Artifacts: map[string]job.Artifact{"m.bin": {Bucket: "fleet-artifacts", Key: "outputs/j1/2/m.bin", Size: 3,
			SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", ContentType: "application/octet-stream"}},
		Log:    &job.LogInfo{Truncated: true, Bytes: 10, Lines: 1, DroppedLines: 2, Limit: 10},
		Stdout: "o", Stderr: "e", StartedAt: &t0, FinishedAt: t0,
		WorkerID: "w1", Backend: "docker", Failure: job.Failf(job.ClassExecution, job.CodeExitCode, "exited with code 3"),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", RunID: "r", NodeID: "n",
		History: []job.Attempt{{Attempt: 1, WorkerID: "w0", StartedAt: &t0, FinishedAt: &t0, ExitCode: &code3,
			Failure: job.Failf(job.ClassInfrastructure, job.CodeWorkerLost, "lost"),
			Log:     &job.LogInfo{Truncated: true, Bytes: 10, Lines: 1, DroppedLines: 2, Limit: 10}}},
	}
}

func sampleHeartbeat() *job.Heartbeat {
	return &job.Heartbeat{
		WorkerID: "w1", Pool: "default", Backend: "docker", Labels: map[string]string{"a": "b"}, Version: "v",
		ObservedAt: t0, Health: job.HealthHealthy, Reason: "r",
		Slots:       job.Slots{Total: 2, Used: 1, Available: 1},
		CPUMilli:    job.Amount{Total: &total, Reserved: 1000, Available: &avail},
		MemoryBytes: job.Amount{Reserved: 5},
		GPUs:        job.GPUs{Total: 1},
		Running:     []job.RunningAttempt{{JobID: "j", Tenant: "team-a", Attempt: 1, StartedAt: t0, CPUMilli: 1000, MemoryBytes: 5, GPUs: 1, Usage: sampleUsage()}},
		Host:        &job.Host{Hostname: "h", OS: "linux", Arch: "amd64", KernelVersion: "k", BackendVersion: "b", Cores: 2, Load1: 1, Load5: 1, Load15: 1, MemoryTotalBytes: 1, MemoryUsedBytes: 1},
		Containers:  &job.ContainerCounts{Running: 1},
		Inventory: &job.Inventory{GPUs: []job.GPUModel{{Model: "H100", Count: 2}}, PlacementKeys: []string{"zone"},
			Nodes: []job.Node{{Name: "n1", Labels: map[string]string{"zone": "a"}}}, Images: []string{"alpine:3"}},
	}
}

func sampleUsage() *job.Usage {
	cpu, n := 12.5, int64(7)
	return &job.Usage{ObservedAt: t0, CPUPercent: &cpu, MemoryBytes: &n, MemoryLimitBytes: &n, NetRxBytes: &n, NetTxBytes: &n,
		BlockReadBytes: &n, BlockWriteBytes: &n, Pids: &n}
}

// sampleRecords are two versions of a job's record, the first that queues
// it and a final one, which together set every field: no one version has
// them all (a request and a result).
func sampleRecords() []*job.Record {
	res := sampleResult()
	code := 3
	queued := &job.Record{
		ID: "j1", Tenant: "acme", Pool: "default", Priority: 2, State: job.StateQueued, Event: job.EventQueued,
		Message: "starts not before", MaxAttempts: 3, SubmittedAt: t0, UpdatedAt: t0, NextAttemptAt: &t0,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", RunID: "r", NodeID: "n", Labels: map[string]string{"team": "a"},
		Request: &job.Request{ID: "j1", Pool: "default", Priority: 2, Command: []string{"true"}, Env: map[string]string{"A": ""}},
		Secrets: "seal-1:AAAA",
	}
	final := &job.Record{
		ID: "j1", Tenant: "acme", Pool: "default", Priority: 2, State: job.StateFailed, Event: job.EventFailed,
		Phase: "p", Message: "m", Attempt: 2, MaxAttempts: 3, WorkerID: "w1", Backend: "docker",
		SubmittedAt: t0, UpdatedAt: t0, StartedAt: &t0, FinishedAt: &t0, NextAttemptAt: &t0,
		Failure: res.Failure, ExitCode: &code, CancelRequested: true, Handbacks: 1, SubmitSeq: 7,
		AwaitingSince: &t0, Adoptions: 1, MemoryOverride: "512Mi", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736",
		RunID: "r", NodeID: "n", Labels: map[string]string{"team": "a"}, History: res.History,
		Result: res, DeadLettered: true, AttemptStarted: true,
	}
	return []*job.Record{queued, final}
}

// The documents of a run, each with every field of its types set.

func sampleRunRequest() *job.RunRequest {
	return &job.RunRequest{ID: "nightly", Labels: map[string]string{"team": "search"}, Nodes: []job.RunNode{
		{ID: "fetch", Job: &job.Request{Command: []string{"fetch"}, Outputs: []string{"urls.txt"}}},
		{ID: "index", After: []string{"fetch"}, InputsFrom: map[string]job.OutputOf{"urls.txt": {Node: "fetch", Output: "urls.txt"}},
			When: job.WhenAllDone, Job: &job.Request{Pool: "batch", Priority: 2, Command: []string{"index"}}},
	}}
}

func sampleRunRecord() *job.RunRecord {
	return &job.RunRecord{RunID: "nightly", Tenant: "acme", SubmittedAt: t0, Labels: map[string]string{"team": "search"},
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Nodes: []job.RunNodeRecord{
			{ID: "fetch", Pool: "default", Priority: 3, Secrets: "seal-1:AAAA",
				Job: &job.Request{Command: []string{"fetch"}, Env: map[string]string{"TOKEN": ""}, Outputs: []string{"urls.txt"}}},
			{ID: "index", After: []string{"fetch"}, InputsFrom: map[string]job.OutputOf{"urls.txt": {Node: "fetch", Output: "urls.txt"}},
				When: job.WhenAnyFailed, Pool: "batch", Priority: 2, Job: &job.Request{Pool: "batch", Priority: 2, Command: []string{"index"}}},
		}}
}

func sampleNodeEnded() *job.NodeEnded {
	return &job.NodeEnded{RunID: "nightly", NodeID: "index", JobID: job.RunJobID("nightly", "index", 2), Pool: "batch", Round: 2,
		State: job.StateFailed, Code: job.CodeExitCode, At: t0}
}

func sampleRunCancel() *job.RunCancel {
	return &job.RunCancel{RunID: "nightly", Tenant: "acme", Round: 1, RequestedAt: t0}
}

func sampleRunRetry() *job.RunRetry {
	return &job.RunRetry{RunID: "nightly", Tenant: "acme", Round: 2, Nodes: []string{"index"}, RequestedAt: t0}
}

func sampleRunEnd() *job.RunEnd {
	return &job.RunEnd{RunID: "nightly", Tenant: "acme", Round: 2, State: job.RunFailed, SubmittedAt: t0, FinishedAt: t0,
		Nodes: []job.NodeState{
			{ID: "fetch", JobID: job.RunJobID("nightly", "fetch", 1), Pool: "default", State: job.StateSucceeded},
			{ID: "index", JobID: job.RunJobID("nightly", "index", 2), Pool: "batch", State: job.StateFailed, Code: job.CodeExitCode},
		}}
}

func sampleRunSubmitReply() *job.RunSubmitReply {
	return &job.RunSubmitReply{RunID: "nightly", Tenant: "acme", State: job.RunRunning, Nodes: 3, Duplicate: true}
}

func sampleRunView() *job.RunView {
	done := t0.Add(time.Minute)
	return &job.RunView{RunID: "nightly", Tenant: "acme", State: job.RunRunning, Round: 2, Labels: map[string]string{"team": "search"},
		SubmittedAt: t0, FinishedAt: &done, CancelRequested: true,
		Nodes: []job.NodeView{
			{ID: "fetch", Pool: "default", JobID: job.RunJobID("nightly", "fetch", 1), State: job.StateSucceeded, Round: 1},
			{ID: "index", After: []string{"fetch"}, When: job.WhenAllSucceeded, Pool: "batch", JobID: job.RunJobID("nightly", "index", 2),
				State: job.StateFailed, Code: job.CodeExitCode, Round: 2},
			{ID: "report", After: []string{"index"}, When: job.WhenAllDone, Pool: "default", JobID: job.RunJobID("nightly", "report", 2),
				State: job.NodeWaiting, WaitingFor: []string{"index"}},
		}}
}

func sampleRunReply() *job.RunReply {
	return &job.RunReply{RunID: "nightly", Round: 2, Cancelled: true, Retried: []string{"index", "report"}, Message: "round 2 runs 2 nodes again"}
}
