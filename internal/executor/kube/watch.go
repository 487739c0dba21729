package kube

import (
	"context"
	"fmt"
	"sync/atomic"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// The executor watches, with one informer per kind, the Jobs and pods
// labelled with its worker's id. Each running attempt registers a watcher
// under its Job's name; the informers' event handlers wake it, and it reads
// the Job and pod from the informers' caches. Nothing polls.

// watcher is how the informers reach one attempt.
type watcher struct {
	// changed receives a value when the Job or its pod changed. One value
	// may stand for several changes.
	changed chan struct{}
	// jobGone is set once the informer has seen the Job deleted.
	jobGone atomic.Bool
}

func (e *Executor) startInformers() error {
	selector := labels.SelectorFromSet(ownerLabels(e.cfg.WorkerID)).String()
	e.factory = informers.NewSharedInformerFactoryWithOptions(e.client, 0,
		informers.WithNamespace(e.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	jobs := e.factory.Batch().V1().Jobs()
	pods := e.factory.Core().V1().Pods()
	handlers := map[cache.SharedIndexInformer]cache.ResourceEventHandler{
		jobs.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { e.notify(obj, false) },
			UpdateFunc: func(_, obj any) { e.notify(obj, false) },
			DeleteFunc: func(obj any) { e.notify(obj, true) },
		},
		pods.Informer(): cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { e.notify(obj, false) },
			UpdateFunc: func(_, obj any) { e.notify(obj, false) },
			DeleteFunc: func(obj any) { e.notify(obj, false) },
		},
	}
	for inf, h := range handlers {
		if err := inf.SetWatchErrorHandlerWithContext(e.onWatchError); err != nil {
			return err
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	e.jobs = jobs.Lister().Jobs(e.cfg.Namespace)
	e.pods = pods.Lister().Pods(e.cfg.Namespace)
	e.jobsSynced = jobs.Informer().HasSynced
	e.podsSynced = pods.Informer().HasSynced
	e.factory.Start(e.stop)
	return nil
}

// notify wakes the attempt that owns obj, a Job or a pod; jobGone says obj
// is a Job that was deleted.
func (e *Executor) notify(obj any, jobGone bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	o, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	name := o.GetName()
	if job := o.GetLabels()[batchv1.JobNameLabel]; job != "" {
		name = job // a pod: its Job's name
	}
	e.mu.Lock()
	w := e.watchers[name]
	e.mu.Unlock()
	if w == nil {
		return
	}
	if jobGone {
		w.jobGone.Store(true)
	}
	select {
	case w.changed <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// watch registers a watcher for the Job name; the returned function
// unregisters it.
func (e *Executor) watch(name string) (*watcher, func()) {
	w := &watcher{changed: make(chan struct{}, 1)}
	e.mu.Lock()
	e.watchers[name] = w
	e.mu.Unlock()
	return w, func() {
		e.mu.Lock()
		delete(e.watchers, name)
		e.mu.Unlock()
	}
}

func (e *Executor) onWatchError(ctx context.Context, r *cache.Reflector, err error) {
	e.watchErr.Store(&err)
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// synced waits until the informers have listed the worker's Jobs and pods.
func (e *Executor) synced(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.SyncTimeout)
	defer cancel()
	if err := e.factory.WaitForCacheSyncWithContext(ctx).AsError(); err != nil {
		if last := e.watchErr.Load(); last != nil {
			err = fmt.Errorf("%w; last error: %w", err, *last)
		}
		return fmt.Errorf("watch Jobs and pods in namespace %s: %w", e.cfg.Namespace, err)
	}
	return nil
}
