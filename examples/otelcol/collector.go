// Package collector runs a real OpenTelemetry Collector in-process, built
// from the Collector's own components (the OTLP receiver of
// go.opentelemetry.io/collector and the file exporter of
// opentelemetry-collector-contrib), so a test can check what an operator's
// collector receives from elastictrain's workers: every span and metric the
// trainer documents, with its attributes. It is a module of its own (the
// Collector's dependencies are heavy); the core module never imports it.
package collector

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/pmetric"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// Collector is a running in-process OpenTelemetry Collector: an OTLP/HTTP
// receiver on a loopback port whose traces and metrics pipelines end in
// file exporters (OTLP JSON, one export request per line). Stop shuts it
// down and waits for it.
type Collector struct {
	// Endpoint is the OTLP/HTTP receiver's host:port (paths /v1/traces
	// and /v1/metrics), what a worker's -otlp flag takes.
	Endpoint string
	// TracesFile and MetricsFile are the file exporters' outputs.
	TracesFile, MetricsFile string

	col  *otelcol.Collector
	done chan error
}

// config is the Collector's configuration, as an operator would write it.
const config = `
receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
exporters:
  file/traces:
    path: %s
    flush_interval: 200ms
  file/metrics:
    path: %s
    flush_interval: 200ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file/traces]
    metrics:
      receivers: [otlp]
      exporters: [file/metrics]
`

// Start builds and starts a Collector writing into dir and returns once it
// runs (within 30 s). Errors: a free port cannot be had, the configuration
// is refused, the Collector stops before it runs.
func Start(ctx context.Context, dir string) (*Collector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	endpoint := ln.Addr().String()
	ln.Close()
	c := &Collector{
		Endpoint:    endpoint,
		TracesFile:  filepath.Join(dir, "traces.jsonl"),
		MetricsFile: filepath.Join(dir, "metrics.jsonl"),
		done:        make(chan error, 1),
	}
	factories := func() (otelcol.Factories, error) {
		var f otelcol.Factories
		var err1, err2 error
		f.Receivers, err1 = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
		f.Exporters, err2 = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory())
		f.Telemetry = otelconftelemetry.NewFactory()
		return f, errors.Join(err1, err2)
	}
	yml := fmt.Sprintf(config, endpoint, c.TracesFile, c.MetricsFile)
	set := otelcol.CollectorSettings{
		BuildInfo:               component.BuildInfo{Command: "elastictrain-otelcol", Description: "in-process collector for elastictrain's tests", Version: "test"},
		Factories:               factories,
		DisableGracefulShutdown: true,
		SkipSettingGRPCLogger:   true,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			URIs:              []string{"yaml:" + yml},
			ProviderFactories: []confmap.ProviderFactory{yamlprovider.NewFactory()},
		}},
	}
	col, err := otelcol.NewCollector(set)
	if err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	c.col = col
	go func() { c.done <- col.Run(context.WithoutCancel(ctx)) }()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for col.GetState() != otelcol.StateRunning {
		select {
		case err := <-c.done:
			return nil, fmt.Errorf("collector: stopped before running: %w", err)
		case <-deadline.C:
			col.Shutdown()
			return nil, errors.Join(errors.New("collector: not running after 30 s"), <-c.done)
		case <-tick.C:
		}
	}
	return c, nil
}

// Stop shuts the Collector down (its exporters flush) and waits for it;
// it returns Run's error. Call it once.
func (c *Collector) Stop() error {
	c.col.Shutdown()
	return <-c.done
}

// Spans reads the traces file: every span the Collector exported, with
// its resource's attributes.
func (c *Collector) Spans() ([]Span, error) {
	var out []Span
	var u ptrace.JSONUnmarshaler
	err := eachLine(c.TracesFile, func(line []byte) error {
		td, err := u.UnmarshalTraces(line)
		if err != nil {
			return err
		}
		for _, rs := range td.ResourceSpans().All() {
			res := rs.Resource().Attributes().AsRaw()
			for _, ss := range rs.ScopeSpans().All() {
				for _, s := range ss.Spans().All() {
					out = append(out, Span{Name: s.Name(), Scope: ss.Scope().Name(), Resource: res, Attributes: s.Attributes().AsRaw(),
						Duration: s.EndTimestamp().AsTime().Sub(s.StartTimestamp().AsTime())})
				}
			}
		}
		return nil
	})
	return out, err
}

// Span is one exported span.
type Span struct {
	Name, Scope string
	Resource    map[string]any
	Attributes  map[string]any
	Duration    time.Duration
}

// Metric is one exported metric stream's latest data point in one export.
type Metric struct {
	Name, Unit, Type string
	Resource         map[string]any
	Attributes       map[string]any
	// Value is a sum's or gauge's value, or a histogram's count.
	Value float64
}

// Metrics reads the metrics file: every data point of every export.
func (c *Collector) Metrics() ([]Metric, error) {
	var out []Metric
	var u pmetric.JSONUnmarshaler
	err := eachLine(c.MetricsFile, func(line []byte) error {
		md, err := u.UnmarshalMetrics(line)
		if err != nil {
			return err
		}
		for _, rm := range md.ResourceMetrics().All() {
			res := rm.Resource().Attributes().AsRaw()
			for _, sm := range rm.ScopeMetrics().All() {
				for _, m := range sm.Metrics().All() {
					base := Metric{Name: m.Name(), Unit: m.Unit(), Type: m.Type().String(), Resource: res}
					switch m.Type() {
					case pmetric.MetricTypeSum:
						for _, dp := range m.Sum().DataPoints().All() {
							x := base
							x.Attributes, x.Value = dp.Attributes().AsRaw(), numberValue(dp)
							out = append(out, x)
						}
					case pmetric.MetricTypeGauge:
						for _, dp := range m.Gauge().DataPoints().All() {
							x := base
							x.Attributes, x.Value = dp.Attributes().AsRaw(), numberValue(dp)
							out = append(out, x)
						}
					case pmetric.MetricTypeHistogram:
						for _, dp := range m.Histogram().DataPoints().All() {
							x := base
							x.Attributes, x.Value = dp.Attributes().AsRaw(), float64(dp.Count())
							out = append(out, x)
						}
					default:
						out = append(out, base)
					}
				}
			}
		}
		return nil
	})
	return out, err
}

func numberValue(dp pmetric.NumberDataPoint) float64 {
	if dp.ValueType() == pmetric.NumberDataPointValueTypeInt {
		return float64(dp.IntValue())
	}
	return dp.DoubleValue()
}

// eachLine calls f on every non-empty line of path; a missing file has no
// lines.
func eachLine(path string, f func([]byte) error) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if line := bytes.TrimSpace(sc.Bytes()); len(line) > 0 {
			if err := f(line); err != nil {
				return fmt.Errorf("%s: %w", filepath.Base(path), err)
			}
		}
	}
	return sc.Err()
}

// names returns the distinct names in order of first appearance.
func names[T any](xs []T, name func(T) string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range xs {
		if n := name(x); !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// SpanNames and MetricNames list the distinct names received.
func SpanNames(s []Span) []string     { return names(s, func(x Span) string { return x.Name }) }
func MetricNames(m []Metric) []string { return names(m, func(x Metric) string { return x.Name }) }
