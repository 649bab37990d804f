package collector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/examples/otelcol"
	"github.com/elastictrain/elastictrain/trainer/telemetry"
)

// documentedSpans and documentedMetrics are what the trainer documents
// (trainer/doc.go, docs/operations.md) and exports.
var (
	documentedSpans = []string{telemetry.SpanJoin, telemetry.SpanStateSync, telemetry.SpanStep, telemetry.SpanAllReduce,
		telemetry.SpanCommit, telemetry.SpanCheckpoint, telemetry.SpanRecovery}
	documentedMetrics = map[string]string{ // name -> unit
		telemetry.MetricStepDuration:     "s",
		telemetry.MetricSamples:          "{sample}",
		telemetry.MetricWorldSize:        "{worker}",
		telemetry.MetricRounds:           "{round}",
		telemetry.MetricRecoveries:       "{recovery}",
		telemetry.MetricRecoveryDuration: "s",
		telemetry.MetricGoodput:          "1",
		telemetry.MetricStragglers:       "{report}",
	}
)

// The real example, launched as an operator would with -otlp pointing at a
// real OpenTelemetry Collector (OTLP/HTTP receiver, file exporter), with a
// worker killed mid-run and durable checkpoints: every documented span and
// metric arrives at the Collector, from every worker, with the job's
// attributes.
func TestSpansAndMetricsReachARealCollector(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	col, err := collector.Start(ctx, dir)
	require.NoError(t, err)
	stopped := false
	defer func() {
		if !stopped {
			col.Stop()
		}
	}()

	bin := filepath.Join(dir, "mnist")
	build := exec.Command("go", "build", "-o", bin, "./examples/mnist")
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./examples/mnist:\n%s", out)

	job := "otelcol-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + time.Now().Format("150405.000000")
	job = strings.ReplaceAll(job, ".", "")
	run := exec.Command(bin, "-workers", "3", "-epochs", "1", "-batch", "512", "-kill", "1@50",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-otlp", col.Endpoint, "-job", job, "-json", "-quiet")
	var stdout, stderr bytes.Buffer
	run.Stdout, run.Stderr = &stdout, &stderr
	require.NoError(t, run.Run(), "mnist:\nstdout:\n%s\nstderr:\n%s", &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var res struct {
		Recoveries      int   `json:"recoveries"`
		WorldSizes      []int `json:"world_sizes"`
		AuditMissing    int   `json:"audit_missing"`
		AuditDuplicates int   `json:"audit_duplicates"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res))
	require.Equal(t, 1, res.Recoveries, "the kill made one recovery")
	require.NotEmpty(t, res.WorldSizes)
	require.Zero(t, res.AuditMissing+res.AuditDuplicates)

	// Each worker flushed its telemetry before exiting; the Collector's
	// exporters flush on shutdown.
	require.NoError(t, col.Stop())
	stopped = true
	spans, err := col.Spans()
	require.NoError(t, err)
	metrics, err := col.Metrics()
	require.NoError(t, err)

	got := collector.SpanNames(spans)
	for _, name := range documentedSpans {
		require.Contains(t, got, name, "span %s did not reach the collector; got %v", name, got)
	}
	workers := map[any]bool{}
	for _, s := range spans {
		require.Equal(t, "elastictrain-mnist", s.Resource["service.name"])
		require.Equal(t, job, s.Resource[string(telemetry.AttrJob)])
		workers[s.Resource["service.instance.id"]] = true
		if s.Name == telemetry.SpanStep {
			for _, k := range []string{string(telemetry.AttrRound), string(telemetry.AttrRank), string(telemetry.AttrWorldSize),
				string(telemetry.AttrStep), string(telemetry.AttrEpoch)} {
				require.Contains(t, s.Attributes, k, "step span attribute")
			}
		}
	}
	// The killed worker may die before its batch of spans leaves; the
	// survivors flush theirs when they exit.
	require.GreaterOrEqual(t, len(workers), 2, "spans from every surviving worker")

	byName := map[string][]collector.Metric{}
	for _, m := range metrics {
		byName[m.Name] = append(byName[m.Name], m)
		require.Equal(t, job, m.Resource[string(telemetry.AttrJob)])
		require.Equal(t, job, m.Attributes[string(telemetry.AttrJob)], "%s carries the job attribute", m.Name)
	}
	for name, unit := range documentedMetrics {
		ms := byName[name]
		require.NotEmpty(t, ms, "metric %s did not reach the collector; got %v", name, collector.MetricNames(metrics))
		require.Equal(t, unit, ms[0].Unit, "unit of %s", name)
	}
	max := func(name string) float64 {
		v := 0.0
		for _, m := range byName[name] {
			v = maxf(v, m.Value)
		}
		return v
	}
	// The world size gauge is exported every 5 s, and the first round (50
	// steps, the JSON's world sizes say 3) may end between two exports: the
	// gauge shows 2 after the kill and never more than 3.
	require.Equal(t, 3, res.WorldSizes[0], "the first round had 3 workers")
	require.LessOrEqual(t, max(telemetry.MetricWorldSize), 3.0, "the world size gauge")
	require.GreaterOrEqual(t, max(telemetry.MetricRecoveries), 1.0, "the survivors count the recovery")
	require.GreaterOrEqual(t, max(telemetry.MetricRecoveryDuration), 1.0, "a recovery duration was recorded")
	require.GreaterOrEqual(t, max(telemetry.MetricSamples), float64(60000/512*512)-512*3, "rank 0 counts the samples it applied")
	ws := []float64{}
	for _, m := range byName[telemetry.MetricWorldSize] {
		if !slices.Contains(ws, m.Value) {
			ws = append(ws, m.Value)
		}
	}
	require.Contains(t, ws, 2.0, "after the kill the world size was 2")
}

func maxf(a, b float64) float64 {
	if b > a {
		return b
	}
	return a
}
