package kube

import (
	"context"
	"fmt"
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The container's log is followed from the moment it starts, not read at
// the end: its lines reach the job's events while it runs, and a pod that
// Kubernetes deletes (at the deadline, on a cancel) takes its log with it.
// Kubernetes merges stdout and stderr into one log, which the executor
// reports as stdout.

// logDrain is how long, once the attempt has ended, its log stream may take
// to end by itself before it is cut. A kubelet ends it when the container
// exits; a simulated node may never end it.
const logDrain = 2 * time.Second

// follower copies one pod's log stream into the attempt's output.
type follower struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// follow starts following the log of pod, once per attempt. Until the
// stream opens (a kubelet may not serve the log at once), it tries again
// every second.
func (a *attempt) follow(pod string) {
	if a.logs != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{cancel: cancel, done: make(chan struct{})}
	a.logs = f
	go func() {
		defer close(f.done)
		for {
			opened, err := a.copyLog(ctx, pod, true)
			switch {
			case err == nil:
				return
			case opened:
				// Opening it again would repeat lines.
				if ctx.Err() == nil {
					a.log.Warn("log stream broke", "err", err)
				}
				return
			}
			select {
			case <-ctx.Done():
				a.log.Warn("no log", "err", err)
				return
			case <-time.After(time.Second):
			}
		}
	}()
}

// readLogs finishes reading the log once the attempt has ended: it lets a
// followed stream drain or, when the container ran (the verdict has its
// exit code) between two looks, reads its log once.
func (a *attempt) readLogs(ctx context.Context, v *verdict) {
	defer a.stdout.Close()
	if a.logs != nil {
		select {
		case <-a.logs.done:
		case <-time.After(logDrain):
			a.logs.cancel()
			<-a.logs.done
		}
		return
	}
	if v.exitCode == nil {
		return // it never ran, or it was stopped with its pod
	}
	pod := a.pod
	if pod == nil || !observe(pod).started {
		pod = a.freshPod(ctx) // the cache lags
	}
	if pod == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if _, err := a.copyLog(ctx, pod.Name, false); err != nil {
		a.log.Warn("could not read the log", "err", err)
	}
}

// copyLog copies the log of pod into the output. It says whether the
// stream opened.
func (a *attempt) copyLog(ctx context.Context, pod string, follow bool) (opened bool, err error) {
	opts := &corev1.PodLogOptions{Container: ContainerName, Follow: follow}
	if follow {
		opts.SinceTime = a.since
	}
	rc, err := a.e.client.CoreV1().Pods(a.e.cfg.Namespace).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return false, fmt.Errorf("log of pod %s: %w", pod, err)
	}
	defer rc.Close()
	if _, err := io.Copy(a.stdout, rc); err != nil {
		return true, fmt.Errorf("log of pod %s: %w", pod, err)
	}
	return true, nil
}
