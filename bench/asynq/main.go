// Command asynq-bench is the peer the fleet's benchmark is compared with:
// asynq enqueuing no-op tasks and processing them at the same time, on the
// same redis-server, as a user of asynq would run it. It is a module of its
// own, so that the fleet does not depend on asynq.
//
//	asynq-bench --redis 127.0.0.1:6379 --tasks 5000 --concurrency 64
//
// It prints one line of JSON: tasks, seconds, tasks per second, and the CPU
// time per task of this process and of the processes given with --pids
// (redis-server).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "redis-server address")
	db := flag.Int("db", 3, "Redis database to use (flushed first)")
	tasks := flag.Int("tasks", 5000, "tasks to enqueue and process")
	concurrency := flag.Int("concurrency", 64, "tasks processed at once (the fleet's slots)")
	producers := flag.Int("producers", 16, "goroutines enqueuing at once")
	pids := flag.String("pids", "", "comma-separated pids whose CPU time is counted too (redis-server)")
	flag.Parse()
	if err := run(*addr, *db, *tasks, *concurrency, *producers, *pids); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, db, n, concurrency, producers int, pids string) error {
	redisOpt := asynq.RedisClientOpt{Addr: addr, DB: db}
	inspector := asynq.NewInspector(redisOpt)
	defer inspector.Close()
	for _, q := range []string{"default"} {
		_ = inspector.DeleteQueue(q, true) // a clean queue; absent is fine
	}

	var done atomic.Int64
	finished := make(chan struct{})
	srv := asynq.NewServer(redisOpt, asynq.Config{
		Concurrency: concurrency,
		Logger:      quiet{},
		LogLevel:    asynq.ErrorLevel,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(context.Context, *asynq.Task) error {
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	defer srv.Shutdown()

	client := asynq.NewClient(redisOpt)
	defer client.Close()
	cpu0, err := cpuTime(pids)
	if err != nil {
		return err
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				if _, err := client.Enqueue(asynq.NewTask("noop", []byte(`{"command":["true"]}`)), asynq.MaxRetry(0)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return fmt.Errorf("enqueue: %w", err)
	default:
	}
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("only %d of %d tasks processed", done.Load(), n)
	}
	elapsed := time.Since(start)
	cpu1, err := cpuTime(pids)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"tasks":            n,
		"seconds":          elapsed.Seconds(),
		"tasks_per_second": float64(n) / elapsed.Seconds(),
		"cpu_per_task_us":  float64((cpu1 - cpu0).Microseconds()) / float64(n),
	})
}

// cpuTime is the CPU time this process and pids have used.
func cpuTime(pids string) (time.Duration, error) {
	list := []string{"self"}
	for _, p := range strings.Split(pids, ",") {
		if p = strings.TrimSpace(p); p != "" {
			list = append(list, p)
		}
	}
	var total time.Duration
	for _, p := range list {
		data, err := os.ReadFile("/proc/" + p + "/stat")
		if err != nil {
			return 0, fmt.Errorf("cpu time of %s: %w", p, err)
		}
		// Fields after the command name, which is in parentheses.
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / 100 // clock ticks
	}
	return total, nil
}

type quiet struct{}

func (quiet) Debug(...any) {}
func (quiet) Info(...any)  {}
func (quiet) Warn(...any)  {}
func (quiet) Error(...any) {}
func (quiet) Fatal(...any) {}
