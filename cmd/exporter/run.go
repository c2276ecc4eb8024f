package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/shardlock/shardlock/internal/cliflags"
	"github.com/shardlock/shardlock/internal/exporter"
	"github.com/shardlock/shardlock/metrics"
)

type options struct {
	cliflags.Redis
	listen, webConfig, telemetryPath   string
	scanInterval, scanTimeout, overdue time.Duration
	probeInterval, probeTimeout        time.Duration
	scanCount                          int64
	maxKeys, maxClasses                int
	demo                               bool
}

// envPrefix starts the environment variable that stands in for a flag.
const envPrefix = "SHARDLOCK_EXPORTER_"

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("shardlock-exporter", flag.ContinueOnError)
	o.Redis.Register(fs, "required unless -demo")
	fs.BoolVar(&o.demo, "demo", false, "serve a demo instead: a lock workload on an embedded Redis (made-up data: never in production)")
	fs.DurationVar(&o.scanInterval, "scan.interval", 30*time.Second, "time between background scans")
	fs.DurationVar(&o.scanTimeout, "scan.timeout", 20*time.Second, "deadline of one scan")
	fs.Int64Var(&o.scanCount, "scan.count", 1000, "SCAN COUNT")
	fs.IntVar(&o.maxKeys, "scan.max-keys", 2_000_000, "keys one scan examines at most")
	fs.IntVar(&o.maxClasses, "scan.max-classes", metrics.DefaultMaxClasses, "distinct lock classes at most (then overflow)")
	fs.DurationVar(&o.overdue, "lock.overdue", 15*time.Minute, "a lock held longer is overdue")
	fs.DurationVar(&o.probeInterval, "probe.interval", 15*time.Second, "time between probes of every master")
	fs.DurationVar(&o.probeTimeout, "probe.timeout", 2*time.Second, "deadline of one probe")
	fs.StringVar(&o.listen, "web.listen-address", ":9436", "address to serve on")
	fs.StringVar(&o.webConfig, "web.config.file", "", "exporter-toolkit web config file (TLS, basic auth)")
	fs.StringVar(&o.telemetryPath, "web.telemetry-path", "/metrics", "path of the metrics")
	if err := cliflags.ApplyEnv(fs, envPrefix); err != nil {
		return nil, err
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// validate rejects flag values the exporter cannot work with, before it
// connects or serves anything.
func (o *options) validate() error {
	switch {
	case o.Addr == "" && !o.demo:
		return fmt.Errorf("no Redis to watch: set -redis.addr (or %s), or run the demo with -demo", cliflags.EnvName(envPrefix, "redis.addr"))
	case o.Addr != "" && o.demo:
		return fmt.Errorf("-demo runs on an embedded Redis: it takes no -redis.addr (%q)", o.Addr)
	}
	p := o.telemetryPath
	if !strings.HasPrefix(p, "/") || p == "/" || p == "/healthz" {
		return fmt.Errorf("-web.telemetry-path %q: want a path that starts with / and is neither / nor /healthz", p)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"scan.interval", o.scanInterval}, {"scan.timeout", o.scanTimeout}, {"probe.interval", o.probeInterval},
		{"probe.timeout", o.probeTimeout}, {"lock.overdue", o.overdue}} {
		if d.v <= 0 {
			return fmt.Errorf("-%s %v: want a positive duration", d.name, d.v)
		}
	}
	if o.probeTimeout > exporter.MaxProbeTimeout {
		return fmt.Errorf("-probe.timeout %v: want at most %v", o.probeTimeout, exporter.MaxProbeTimeout)
	}
	if o.scanCount < 1 || o.maxKeys < 1 || o.maxClasses < 1 {
		return fmt.Errorf("-scan.count, -scan.max-keys and -scan.max-classes must be at least 1")
	}
	if o.webConfig != "" {
		if err := web.Validate(o.webConfig); err != nil {
			return fmt.Errorf("-web.config.file %s: %w", o.webConfig, err)
		}
	}
	return nil
}

func (o *options) client() (redis.UniversalClient, error) { return o.Redis.Client() }

// run serves until ctx ends. ready, when not nil, receives the address the
// server listens on.
func run(ctx context.Context, args []string, out io.Writer, ready chan<- string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	logger, err := zap.NewProduction()
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	defer func() { _ = logger.Sync() }()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	client, demo, closeRedis, err := openRedis(ctx, o, reg)
	if err != nil {
		return err
	}
	defer closeRedis()

	exp, err := exporter.New(client, exporter.Config{
		Prefix: o.Prefix, ScanInterval: o.scanInterval, ScanTimeout: o.scanTimeout, ScanCount: o.scanCount,
		MaxKeys: o.maxKeys, MaxClasses: o.maxClasses, Overdue: o.overdue,
		ProbeInterval: o.probeInterval, ProbeTimeout: o.probeTimeout, Logger: logger,
	})
	if err != nil {
		return err
	}
	reg.MustRegister(exp)
	mux, err := handler(reg, o.telemetryPath)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	webFlags := &web.FlagConfig{WebListenAddresses: &[]string{o.listen}, WebSystemdSocket: new(bool), WebConfigFile: &o.webConfig}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	expDone := make(chan error, 1)
	go func() { expDone <- exp.Run(runCtx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- web.Serve(ln, srv, webFlags, slog.New(zapslog.NewHandler(logger.Core()))) }()

	if demo != nil {
		fmt.Fprintf(out, "demo: an embedded Redis with a contended lock, a slow holder and one leaked key (no TTL)\n")
		fmt.Fprintf(out, "demo: its locks, from another shell: go run ./cmd/shardlock -redis.addr %s list\n", demo.addr)
	}
	fmt.Fprintf(out, "serving http://%s%s (landing page http://%s/)\n", addr, o.telemetryPath, addr)
	if ready != nil {
		ready <- addr
	}
	return waitServing(ctx, cancel, srv, srvDone, expDone)
}

// openRedis returns the client to scan: the flags' Redis, or, with -demo,
// an embedded miniredis with a demo workload on it (its scans and
// probes made frequent, so the page changes while you look). closeRedis
// stops the demo and closes what it opened.
func openRedis(ctx context.Context, o *options, reg *prometheus.Registry) (client redis.UniversalClient, demo *demoWorkload, closeRedis func(), err error) {
	if !o.demo {
		client, err = o.client()
		if err != nil {
			return nil, nil, nil, err
		}
		return client, nil, func() { _ = client.Close() }, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, nil, nil, err
	}
	client = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	demo, err = startDemo(ctx, client, reg, mr)
	if err != nil {
		_ = client.Close()
		mr.Close()
		return nil, nil, nil, err
	}
	o.scanInterval, o.probeInterval, o.overdue = 2*time.Second, 2*time.Second, 5*time.Second
	return client, demo, func() {
		demo.stop()
		_ = client.Close()
		mr.Close()
	}, nil
}

// handler serves the metrics at telemetryPath, /healthz and a landing page.
func handler(reg *prometheus.Registry, telemetryPath string) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle(telemetryPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	landing, err := web.NewLandingPage(web.LandingConfig{
		Name: "shardlock exporter", Description: "Lock keys, leaks and lock-service health of a Redis deployment",
		Links: []web.LandingLinks{{Address: telemetryPath, Text: "Metrics"}, {Address: "/healthz", Text: "Health"}},
	})
	if err != nil {
		return nil, err
	}
	mux.Handle("/", landing)
	return mux, nil
}

// waitServing waits until ctx ends, the server fails or the exporter stops
// (it cannot scan or probe: stop serving, say why), then stops both (cancel
// stops the exporter) and returns the first error.
func waitServing(ctx context.Context, cancel context.CancelFunc, srv *http.Server, srvDone, expDone <-chan error) error {
	var serveErr error
	expEnded := false
	select {
	case <-ctx.Done():
	case serveErr = <-srvDone:
	case serveErr = <-expDone:
		expEnded = true
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	if serveErr == nil {
		if err := <-srvDone; err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr = err
		}
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	if !expEnded {
		if err := <-expDone; err != nil && serveErr == nil {
			serveErr = err
		}
	}
	return serveErr
}
