// river-bench: River (github.com/riverqueue/river, pgx v5 driver), the Go
// application-queue peer of bench/relaybus-bench. One program, three commands:
//
//	river-bench migrate   install or upgrade River's schema (rivermigrate), print River's version
//	river-bench publish   one publisher process: client.Insert (batch 1) or client.InsertManyFast
//	river-bench work      one worker process: a River client working the preloaded jobs
//
// BENCH_PG is the libpq conninfo the harness's other children use. publish and
// work follow the external-child contract in contract.go.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// benchArgs is the job's args: the fields of the harness's event payload
// (make_payload in bench/children.cpp, sql_payload_expr in bench/systems.cpp).
type benchArgs struct {
	Order  int64  `json:"order"`
	Amount int    `json:"amount"`
	Cur    string `json:"cur"`
	Cust   string `json:"cust"`
	Note   string `json:"note"`
	T      int64  `json:"t"`
}

func (benchArgs) Kind() string { return "bench" }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// newPool opens the pool River runs on; maxConns 0 keeps pgxpool's default.
func newPool(ctx context.Context, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv("BENCH_PG"))
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = int32(maxConns)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}

func migrate(ctx context.Context) error {
	pool, err := newPool(ctx, 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	fmt.Println(riverVersion())
	return nil
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: river-bench migrate|publish|work (BENCH_PG=conninfo)")
		os.Exit(2)
	}
	ctx := context.Background()
	var err error
	switch os.Args[1] {
	case "migrate":
		err = migrate(ctx)
	case "publish":
		err = publish(ctx)
	case "work":
		err = work(ctx)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "river-bench "+os.Args[1]+": "+err.Error())
		os.Exit(1)
	}
}
