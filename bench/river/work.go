// The dispatch cells: one River client per process working a preloaded backlog
// from t_warm to t1, with the settings of River's own benchmark (`river bench`,
// cmd/river/riverbench): FetchCooldown 2 ms, FetchPollInterval 20 ms and
// MaxWorkers 2,000 on the default queue (River's defaults are 100 ms, 1 s and
// 100). The job does nothing. A unit is a job whose completion River
// committed, seen on the client's subscription (as `river bench` counts), so a
// worked job counts once its state is written, as relaybus counts an ack.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

type benchWorker struct {
	river.WorkerDefaults[benchArgs]
}

func (benchWorker) Work(context.Context, *river.Job[benchArgs]) error { return nil }

func work(ctx context.Context) error {
	maxWorkers := envInt("BENCH_MAX_WORKERS", 2000)
	pool, err := newPool(ctx, envInt("BENCH_POOL", 10))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	// Large enough that no event is dropped (River drops events a full channel cannot take).
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 4_000_000,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()

	w, err := awaitGo()
	if err != nil {
		return err
	}
	c := &counter{w: w}
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		for e := range events { // closed when the client has stopped
			now := mono()
			if e.Kind != river.EventKindJobCompleted {
				c.fail(fmt.Errorf("job %d: %s", e.Job.ID, e.Kind))
				continue
			}
			c.unit(now)
			c.receipt(e.Job.ID, now)
		}
	}()

	sleepUntil(w.tWarm)
	if err := client.Start(ctx); err != nil {
		return err
	}
	sleepUntil(w.t1)
	// Graceful stop: no new fetches, running jobs finish, the completer writes
	// what it holds; then the subscription closes.
	stopCtx, stopCancel := context.WithTimeout(ctx, 10*time.Second)
	defer stopCancel()
	if err := client.Stop(stopCtx); err != nil {
		c.fail(fmt.Errorf("stop: %w", err))
	}
	select {
	case <-counted:
	case <-time.After(5 * time.Second):
		c.fail(fmt.Errorf("subscription not closed 5 s after stop"))
	}
	return c.writeOut()
}
