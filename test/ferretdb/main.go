// Command ferretdb-test runs FerretDB v1 (github.com/FerretDB/FerretDB/ferretdb,
// the embeddable package) for relaybus-mongo's tests: the MongoDB wire protocol on
// a loopback TCP address, the SQLite backend in a directory (or the PostgreSQL
// backend with -postgresql-url), telemetry disabled
// (the embeddable package disables and locks it), no debug listener (the
// embeddable package starts none).
//
// A plain `go install github.com/FerretDB/FerretDB/cmd/ferretdb@v1.24.2` builds a
// binary that panics at start for lack of generated build/version files; the
// embeddable package needs none of them.
//
// Usage:
//
//	ferretdb-test -dir DIR [-postgresql-url URL] [-listen 127.0.0.1:0] [-uri-file FILE] [-log-level warn]
//
// With port 0 the kernel picks a free port; the resulting URI
// (mongodb://127.0.0.1:PORT/) is printed on stdout and written to -uri-file
// (atomically, via rename) once the listener is bound. SIGINT/SIGTERM stop it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "TCP address to listen on (port 0: a free port)")
	dir := flag.String("dir", "", "directory for the SQLite backend's files (required)")
	pgURL := flag.String("postgresql-url", "", "use the PostgreSQL backend at this URL instead of SQLite")
	uriFile := flag.String("uri-file", "", "write the MongoDB URI to this file once listening")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	flag.Parse()

	// FerretDB decodes every document it scans from JSON, and the collector
	// took a quarter of its CPU at Go's default GOGC=100 (mongo_order: 32
	// against 25 CPU-s at 400). A test server's heap is small; GOGC in the
	// environment still wins.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(400)
	}

	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ferretdb-test: -dir is required")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*dir)
	if err == nil {
		err = os.MkdirAll(abs, 0o755)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferretdb-test: %v\n", err)
		os.Exit(1)
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "ferretdb-test: bad -log-level: %v\n", err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	config := &ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *listen},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: "file:" + abs + "/",
	}
	if *pgURL != "" {
		config.Handler = "postgresql"
		config.PostgreSQLURL = *pgURL
	}
	f, err := ferretdb.New(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ferretdb-test: %v\n", err)
		os.Exit(1)
	}

	// The TCP listener is bound by New, so the address is known now.
	uri := f.MongoDBURI()
	if *uriFile != "" {
		tmp := *uriFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(uri+"\n"), 0o644); err == nil {
			err = os.Rename(tmp, *uriFile)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ferretdb-test: %v\n", err)
			os.Exit(1)
		}
	}
	fmt.Println(uri)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := f.Run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "ferretdb-test: %v\n", err)
		os.Exit(1)
	}
}
