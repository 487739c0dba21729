package docker

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/jsonmessage"

	"github.com/fleet-dev/fleet/internal/executor"
	"github.com/fleet-dev/fleet/job"
)

// image makes sure ref is on the Docker host as policy says, and returns
// its description. if_not_present pulls only an image the host does not
// have, so an image built on the host is never pulled; always pulls every
// time; never only looks.
func (e *Executor) image(ctx context.Context, ref string, policy job.PullPolicy, report executor.Reporter) (image.InspectResponse, error) {
	if policy != job.PullAlways {
		img, err := e.api.ImageInspect(ctx, ref)
		switch {
		case err == nil:
			return img, nil
		case !cerrdefs.IsNotFound(err):
			return img, fmt.Errorf("inspect image %s: %w", ref, err)
		case policy == job.PullNever:
			return img, job.Failf(job.ClassImage, job.CodeImageNotPresent,
				"image %s is not on the Docker host, and pull_policy is never", ref)
		}
	}
	if report != nil {
		report.Phase("pulling", "pulling image "+ref)
	}
	if err := e.pulls.pull(ctx, ref); err != nil {
		return image.InspectResponse{}, err
	}
	img, err := e.api.ImageInspect(ctx, ref)
	if err != nil {
		return img, fmt.Errorf("inspect image %s after pulling it: %w", ref, err)
	}
	return img, nil
}

// pullImage pulls ref. A daemon that cannot be reached is the
// infrastructure's fault; any other failure is the image's.
func (e *Executor) pullImage(ctx context.Context, ref string) error {
	start := time.Now()
	auth, err := e.auths.For(ctx, ref)
	if err != nil {
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	rc, err := e.stream.ImagePull(ctx, ref, image.PullOptions{RegistryAuth: auth})
	if err == nil {
		// The stream ends with the error the pull failed with, if any.
		err = jsonmessage.DisplayJSONMessagesStream(rc, io.Discard, 0, false, nil)
		_ = rc.Close()
	}
	switch {
	case err == nil:
		e.log.Info("pulled image", "image", ref, "took", time.Since(start).Round(time.Millisecond))
		return nil
	case client.IsErrConnectionFailed(err):
		return fmt.Errorf("pull image %s: %w", ref, err)
	}
	return job.Failf(job.ClassImage, job.CodeImagePull, "cannot pull image %s: %v", ref, err)
}

// puller pulls each image once at a time: an attempt that needs an image
// already being pulled waits for that pull (Nomad's coordinator). A pull
// runs on its own context, bounded by timeout, so that the attempt that
// started it may be cancelled without failing the others.
type puller struct {
	pullFunc func(ctx context.Context, ref string) error
	timeout  time.Duration

	mu       sync.Mutex
	inflight map[string]*pull
}

type pull struct {
	done chan struct{}
	err  error
}

func newPuller(f func(ctx context.Context, ref string) error, timeout time.Duration) *puller {
	return &puller{pullFunc: f, timeout: timeout, inflight: map[string]*pull{}}
}

// pull pulls ref, or waits for the pull of ref under way, until ctx ends.
func (p *puller) pull(ctx context.Context, ref string) error {
	p.mu.Lock()
	pl := p.inflight[ref]
	if pl == nil {
		pl = &pull{done: make(chan struct{})}
		p.inflight[ref] = pl
		go func() {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
			pl.err = p.pullFunc(pctx, ref)
			cancel()
			p.mu.Lock()
			delete(p.inflight, ref)
			p.mu.Unlock()
			close(pl.done)
		}()
	}
	p.mu.Unlock()
	select {
	case <-pl.done:
		return pl.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
