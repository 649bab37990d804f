// Package telemetry installs the OpenTelemetry SDK in an example's worker
// for its -otlp and -metrics flags (OTLP over HTTP; a Prometheus endpoint)
// and hands the providers to the trainer. The trainer itself uses only the
// OpenTelemetry API; nothing here touches the global providers.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"golang.org/x/net/netutil"

	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/telemetry"
)

// Help texts of the -otlp and -metrics flags.
const (
	OTLPHelp = "export traces and metrics with OTLP over HTTP to this collector: host:port " +
		"(plain HTTP, e.g. localhost:4318) or an http:// or https:// URL, to which /v1/traces and /v1/metrics are appended"
	MetricsHelp = "serve Prometheus metrics at http://ADDR/metrics and a liveness probe at http://ADDR/healthz (host:port); " +
		"worker i (0-based launch order, joiners included) serves on port+i, so one flag covers every worker on this host; port 0: each picks a free port and logs it"
)

// maxMetricsConns bounds the connections the -metrics server holds open at
// once (Prometheus scrapes, /healthz probes).
const maxMetricsConns = 64

// metricsInterval is how often the -otlp metric reader exports.
const metricsInterval = 5 * time.Second

// otlpTimeout bounds one OTLP export request.
const otlpTimeout = 5 * time.Second

// ShutdownTimeout bounds the final flush of a worker's telemetry,
// so an unreachable collector cannot hold up the worker's exit.
const ShutdownTimeout = 5 * time.Second

// ValidateFlags checks -otlp and -metrics in the launcher, before
// any worker starts.
func ValidateFlags(otlp, metrics string) error {
	if otlp != "" {
		if _, err := ParseOTLPEndpoint(otlp); err != nil {
			return err
		}
	}
	if metrics != "" {
		if _, err := MetricsAddr(metrics, 0); err != nil {
			return err
		}
	}
	return nil
}

// Endpoint is a parsed -otlp value.
type Endpoint struct {
	Host     string // host:port
	Insecure bool   // plain HTTP
	Prefix   string // URL path before /v1/traces and /v1/metrics
}

// ParseOTLPEndpoint reads "host:port" (plain HTTP) or an http:// or
// https:// URL with an optional path prefix.
func ParseOTLPEndpoint(s string) (Endpoint, error) {
	bad := func(why string) (Endpoint, error) {
		return Endpoint{}, fmt.Errorf("-otlp %q: %s", s, why)
	}
	e := Endpoint{Host: s, Insecure: true}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Host != "" {
		switch u.Scheme {
		case "http":
		case "https":
			e.Insecure = false
		default:
			return bad("want an http:// or https:// URL, or host:port")
		}
		e.Host, e.Prefix = u.Host, u.Path
		if u.RawQuery != "" || u.Fragment != "" {
			return bad("a query or fragment has no meaning here")
		}
	}
	host, port, err := net.SplitHostPort(e.Host)
	if err != nil {
		return bad("want host:port or an http(s):// URL")
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return bad("want a port number from 1 to 65535")
	}
	if host == "" {
		e.Host = net.JoinHostPort("localhost", port)
	}
	return e, nil
}

// MetricsAddr returns the address worker serves -metrics on: addr's port
// plus worker (port 0 stays 0, a free port).
func MetricsAddr(addr string, worker int) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("-metrics %q: want host:port (e.g. 127.0.0.1:9464 or :9464)", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("-metrics %q: want a port number from 0 to 65535", addr)
	}
	if p == 0 {
		return addr, nil
	}
	if p+worker > 65535 {
		return "", fmt.Errorf("-metrics %q: worker %d would need port %d, above 65535", addr, worker, p+worker)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+worker)), nil
}

// WorkerIndex is this worker's launch index from the launcher's
// environment (0 when run by hand).
func WorkerIndex() int {
	i, err := strconv.Atoi(os.Getenv(launch.EnvWorker))
	if err != nil || i < 0 {
		return 0
	}
	return i
}

// Telemetry is the OpenTelemetry SDK one worker installs for -otlp and
// -metrics. The trainer uses only the OpenTelemetry API and is handed these
// providers (Options); nothing here touches the global providers. Not safe
// for concurrent use.
type Telemetry struct {
	tp  *sdktrace.TracerProvider // nil without -otlp
	mp  *sdkmetric.MeterProvider // nil without -otlp and -metrics
	srv *http.Server             // nil without -metrics
	// Addr is where the -metrics server listens ("" without -metrics).
	Addr string
	// hc carries the OTLP exports; its idle connections are closed at
	// shutdown so no connection goroutine outlives the worker's telemetry.
	hc *http.Client
	// served receives the metrics server's Serve result once.
	served chan error
}

// New installs the SDK for worker (its launch index) of job, as service
// (the OpenTelemetry service name, e.g. "elastictrain-mnist"):
// with otlp, a tracer provider with a batching OTLP/HTTP span exporter and
// a meter provider with a periodic (metricsInterval) OTLP/HTTP reader;
// with metrics, a Prometheus reader on that meter provider, served at
// http://MetricsAddr(metrics, worker)/metrics. With neither it returns an
// empty Telemetry whose Options are none. Shut it down to flush.
func New(ctx context.Context, service, otlp, metrics string, worker int, job string) (_ *Telemetry, err error) {
	t := &Telemetry{}
	if otlp == "" && metrics == "" {
		return t, nil
	}
	var undo []func()
	defer func() {
		if err != nil {
			for _, f := range undo {
				f()
			}
		}
	}()
	var readers []sdkmetric.Option
	var ln net.Listener
	if metrics != "" {
		// Listen first: a port in use is the likeliest failure.
		addr, err := MetricsAddr(metrics, worker)
		if err != nil {
			return nil, err
		}
		if ln, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("-metrics: %w", err)
		}
		undo = append(undo, func() { ln.Close() })
		reg := prometheus.NewRegistry()
		px, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			return nil, fmt.Errorf("-metrics: Prometheus exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(px))
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", healthz)
		// A scrape is one short request: bound what idle or slow clients
		// can hold (a flood of keep-alive connections once took every file
		// descriptor of a worker, and its checkpoint writes failed with
		// "too many open files"). Over maxMetricsConns, connections wait in
		// the kernel's accept queue, costing the process nothing.
		t.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 64 << 10}
		ln = netutil.LimitListener(ln, maxMetricsConns)
		t.Addr = ln.Addr().String()
	}
	res := resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(service),
		semconv.ServiceInstanceID(fmt.Sprintf("%s/worker-%d/pid-%d", job, worker, os.Getpid())),
		attribute.String(string(telemetry.AttrJob), job),
	)
	if otlp != "" {
		ep, err := ParseOTLPEndpoint(otlp)
		if err != nil {
			return nil, err
		}
		t.hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: otlpTimeout}
		topts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(ep.Host), otlptracehttp.WithHTTPClient(t.hc),
			otlptracehttp.WithURLPath(path.Join("/", ep.Prefix, "v1/traces"))}
		mopts := []otlpmetrichttp.Option{otlpmetrichttp.WithEndpoint(ep.Host), otlpmetrichttp.WithHTTPClient(t.hc),
			otlpmetrichttp.WithURLPath(path.Join("/", ep.Prefix, "v1/metrics"))}
		if ep.Insecure {
			topts = append(topts, otlptracehttp.WithInsecure())
			mopts = append(mopts, otlpmetrichttp.WithInsecure())
		}
		sx, err := otlptracehttp.New(ctx, topts...)
		if err != nil {
			return nil, fmt.Errorf("-otlp: span exporter: %w", err)
		}
		mx, err := otlpmetrichttp.New(ctx, mopts...)
		if err != nil {
			sx.Shutdown(ctx)
			return nil, fmt.Errorf("-otlp: metric exporter: %w", err)
		}
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(sx), sdktrace.WithResource(res))
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mx, sdkmetric.WithInterval(metricsInterval))))
	}
	t.mp = sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
	if t.srv != nil {
		t.served = make(chan error, 1)
		go func() { t.served <- t.srv.Serve(ln) }()
	}
	return t, nil
}

// healthz answers a liveness probe: 200 "ok" while the process serves
// HTTP. It looks at nothing the training loop holds, so a worker busy
// writing a long checkpoint, waiting in a rendezvous or restoring state
// stays alive; a hung or dead peer is the job's business (leases and
// failure reports), not the kubelet's.
func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// Options returns the trainer options that hand it the providers.
func (t *Telemetry) Options() []trainer.Option {
	var o []trainer.Option
	if t.tp != nil {
		o = append(o, trainer.WithTracerProvider(t.tp))
	}
	if t.mp != nil {
		o = append(o, trainer.WithMeterProvider(t.mp))
	}
	return o
}

// Shutdown stops the metrics server (waiting for its goroutine), then
// flushes and stops the providers: pending spans and a last metric export
// go to the collector, within ctx. It returns every error it met.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.srv != nil {
		errs = append(errs, t.srv.Shutdown(ctx))
		if err := <-t.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
		t.srv = nil
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
		t.mp = nil
	}
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
		t.tp = nil
	}
	if t.hc != nil {
		t.hc.CloseIdleConnections()
		t.hc = nil
	}
	return errors.Join(errs...)
}

// Close is Shutdown within ShutdownTimeout.
func (t *Telemetry) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	return t.Shutdown(ctx)
}
