package dispatcher

import (
	"context"
	"sync"
	"time"
)

// runners run a dispatcher's submissions, at most max at once, on
// goroutines that live on from one submission to the next. A submission's
// call chain (decode, validate, admit, seal, queue, answer) grows a new
// goroutine's stack several times over, each growth a copy: with a
// goroutine per submission, that copying was a tenth of a dispatcher's
// CPU under load. A goroutine idle for runnerIdle ends.
type runners struct {
	work chan func()
	sema chan struct{} // a value per goroutine
	done chan struct{} // closed by close: the idle runners end
	once sync.Once
	wg   sync.WaitGroup
}

// runnerIdle is how long a runner waits for the next submission before
// it ends.
const runnerIdle = time.Minute

func newRunners(max int) *runners {
	return &runners{work: make(chan func()), sema: make(chan struct{}, max), done: make(chan struct{})}
}

// close ends the runners once they are idle, and waits for them; run is
// not called after it.
func (r *runners) close() {
	r.once.Do(func() { close(r.done) })
	r.wg.Wait()
}

// try runs f on an idle runner (one is taken before a new one is made),
// or a new one while there are fewer than max; false, with f not run, when
// all max are busy.
func (r *runners) try(f func()) bool {
	select {
	case r.work <- f:
		return true
	default:
	}
	select {
	case r.work <- f:
	case r.sema <- struct{}{}:
		r.start(f)
	default:
		return false
	}
	return true
}

// run is try, waiting for a runner to be free while all max are busy;
// false, with f not run, when ctx ends first.
func (r *runners) run(ctx context.Context, f func()) bool {
	if r.try(f) {
		return true
	}
	select {
	case r.work <- f:
	case r.sema <- struct{}{}:
		r.start(f)
	case <-ctx.Done():
		return false
	}
	return true
}

// start runs f on a new runner, which holds a value of sema.
func (r *runners) start(f func()) {
	r.wg.Add(1)
	go r.loop(f)
}

func (r *runners) loop(f func()) {
	defer r.wg.Done()
	defer func() { <-r.sema }()
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(runnerIdle)
		select {
		case f = <-r.work:
		case <-idle.C:
			return
		case <-r.done:
			return
		}
	}
}
