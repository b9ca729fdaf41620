// The publish cells: one process, one connection, calls back to back from
// t_warm to t1, as the harness's own publishers (bench/children.cpp) do. Batch 1
// is client.Insert (one job per transaction); larger batches are
// client.InsertManyFast, River's fastest documented bulk insert (COPY FROM in
// the pgx driver). The client only inserts: no queues, no workers.
package main

import (
	"context"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

func publish(ctx context.Context) error {
	batch := envInt("BENCH_BATCH", 1)
	order := int64(envInt("BENCH_SEED", 1)) * 1000003
	pool, err := newPool(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return err
	}
	w, err := awaitGo()
	if err != nil {
		return err
	}
	c := &counter{w: w}
	sleepUntil(w.tWarm)
	params := make([]river.InsertManyParams, batch)
	for mono() < w.t1 {
		now := time.Now().UnixNano()
		start := mono()
		if batch == 1 {
			_, err = client.Insert(ctx, payload(&order, now), nil)
		} else {
			for i := range params {
				params[i].Args = payload(&order, now)
			}
			_, err = client.InsertManyFast(ctx, params)
		}
		end := mono()
		if err != nil {
			c.fail(err)
			time.Sleep(5 * time.Millisecond)
			continue
		}
		c.done(int64(batch), start, end)
	}
	return c.writeOut()
}

func payload(order *int64, now int64) benchArgs {
	*order++
	return benchArgs{Order: 10000000 + *order%90000000, Amount: 1999, Cur: "EUR", Cust: "c-123456", Note: "abcdefghij", T: now}
}
