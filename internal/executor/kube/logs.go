package kube

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cenkalti/backoff/v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The container's log is followed from the moment it starts, not read at
// the end: its lines reach the job's events while it runs, and a pod that
// Kubernetes deletes (at the deadline, on a cancel) takes its log with it.
// Kubernetes merges stdout and stderr into one log, which the executor
// reports as stdout.
//
// The log is read with timestamps, and the attempt keeps its place in it
// (logPos): the timestamp of the last line copied, and how many lines
// copied carry that timestamp. So nothing waits for a followed stream to
// end once the container has: a kubelet ends it only when it next looks at
// the container (about a second later), and a simulated node never does.
// The follower is stopped at once, and what it had not copied yet is read
// in one call from its place, no line twice and none lost. A stream that
// broke is opened again from its place too.

// logOpenWait bounds how long the follower tries to open the log stream (a
// kubelet may not serve it at once), counted from its last success. After
// that, the rest of the log is read once the attempt ends.
const logOpenWait = time.Minute

// follower copies one pod's log stream into the attempt's output.
type follower struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// logPos is how far an attempt's log was copied.
type logPos struct {
	last time.Time // the timestamp of the last line copied
	n    int       // how many lines copied carry it
	// untimed: a line came without a timestamp, so the place is unknown
	// and the log cannot be read on from it.
	untimed bool
}

// follow starts following the log of pod, once per attempt. Until the
// stream opens, and when it breaks, it tries again with a backoff bounded
// by logOpenWait.
func (a *attempt) follow(pod string) {
	if a.logs != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{cancel: cancel, done: make(chan struct{})}
	a.logs = f
	go func() {
		defer close(f.done)
		b := backoff.WithContext(backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(100*time.Millisecond),
			backoff.WithMaxInterval(2*time.Second),
			backoff.WithMaxElapsedTime(logOpenWait)), ctx)
		err := backoff.RetryNotify(func() error {
			opened, err := a.copyLog(ctx, pod, true, a.since)
			switch {
			case err == nil:
				return nil
			case ctx.Err() != nil:
				return backoff.Permanent(ctx.Err())
			case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
				return backoff.Permanent(err) // asking again will not help
			case opened && a.pos.untimed:
				return backoff.Permanent(fmt.Errorf("%w; it came without timestamps, so it cannot be opened again without repeating lines", err))
			case opened:
				b.Reset() // it worked for a while: the bound counts from now
			}
			return err
		}, b, func(err error, next time.Duration) {
			a.log.Debug("the pod's log stream is not open; trying again", "err", err, "in", next.Round(time.Millisecond))
		})
		if err != nil && ctx.Err() == nil {
			a.log.Warn("stopped following the pod's log; the rest is read once the attempt ends", "err", err)
		}
	}()
}

// readLogs finishes reading the log once the attempt has ended: it stops
// the follower and, when the container ran to its end (the verdict has its
// exit code), reads what the follower had not copied, from its place; or
// all of the log of a container that ran between two looks. Even a stream
// that ended by itself is read on from its place: a stream may end before
// its container does.
func (a *attempt) readLogs(ctx context.Context, v *verdict) {
	defer a.stdout.Close()
	followed := a.logs != nil
	if followed {
		a.logs.cancel()
		<-a.logs.done
	}
	if v.exitCode == nil {
		return // it never ran, or it was stopped with its pod
	}
	if a.pos.untimed {
		a.log.Warn("the pod's log came without timestamps; its last lines may be missing")
		return
	}
	pod := a.pod
	if pod == nil || !observe(pod).started {
		pod = a.freshPod(ctx) // the cache lags
	}
	if pod == nil {
		return
	}
	var since *metav1.Time // all of it, when it was never followed
	if followed {
		since = a.since
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if _, err := a.copyLog(ctx, pod.Name, false, since); err != nil {
		a.log.Warn("could not read the log", "err", err)
	}
}

// copyLog copies the log of pod into the output, from the attempt's place
// in it, or from since when nothing was copied yet (nil: from its start).
// It says whether the stream opened.
func (a *attempt) copyLog(ctx context.Context, pod string, follow bool, since *metav1.Time) (opened bool, err error) {
	if !a.pos.last.IsZero() {
		// The API takes whole seconds; the lines of that second that were
		// copied already are skipped.
		t := metav1.NewTime(a.pos.last.Truncate(time.Second))
		since = &t
	}
	opts := &corev1.PodLogOptions{Container: ContainerName, Follow: follow, Timestamps: true, SinceTime: since}
	rc, err := a.e.client.CoreV1().Pods(a.e.cfg.Namespace).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return false, fmt.Errorf("log of pod %s: %w", pod, err)
	}
	defer rc.Close()
	if err := a.copyLines(rc); err != nil {
		return true, fmt.Errorf("log of pod %s: %w", pod, err)
	}
	return true, nil
}

// copyLines copies the lines of a log stream read with timestamps into the
// output, skipping those before the attempt's place, and moves the place.
// A line cut short by an error is not copied: it is read again from the
// place. At the end of the stream, a last line without a newline is.
func (a *attempt) copyLines(r io.Reader) error {
	from, skip := a.pos.last, a.pos.n
	br := bufio.NewReaderSize(r, 32<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if len(line) > 0 {
			ts, text, ok := splitTimestamp(line)
			switch {
			case !ok:
				a.pos.untimed = true
				_, _ = a.stdout.Write(line)
			case ts.Before(from):
			case ts.Equal(from) && skip > 0:
				skip--
			default:
				if ts.Equal(a.pos.last) {
					a.pos.n++
				} else {
					a.pos.last, a.pos.n = ts, 1
				}
				_, _ = a.stdout.Write(text)
			}
		}
		if err != nil {
			return nil // io.EOF: the stream ended
		}
	}
}

// splitTimestamp splits a log line read with timestamps into its
// timestamp and its text.
func splitTimestamp(line []byte) (time.Time, []byte, bool) {
	i := bytes.IndexByte(line, ' ')
	if i <= 0 {
		return time.Time{}, nil, false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(line[:i]))
	if err != nil {
		return time.Time{}, nil, false
	}
	return ts, line[i+1:], true
}
