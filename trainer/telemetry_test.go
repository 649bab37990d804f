package trainer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	. "github.com/elastictrain/elastictrain/trainer"
)

// Must-show 6: the documented span and metric names, attributes and units,
// checked with the SDK's in-memory span exporter and a manual metric reader.
func TestTelemetryNamesAttributesUnits(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer tp.Shutdown(context.Background())
	defer mp.Shutdown(context.Background())

	ckpt, err := NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	j := newJob(t, stores(t)["memory"])
	j.epochs = 1
	j.mutate = func(c *Config) {
		c.Elastic.MinWorkers = 2
		c.StepSpanEvery = 5
		c.CheckpointEvery = 10
	}
	j.opts = func(int) []Option {
		return []Option{WithTracerProvider(tp), WithMeterProvider(mp), WithCheckpointStore(ckpt)}
	}
	var fired atomic.Bool
	j.afterReduce = func(rank int, step int64) error {
		if rank == 1 && step == 12 && fired.CompareAndSwap(false, true) {
			return errors.New("injected failure")
		}
		return nil
	}
	ws := []*inproc{j.start(), j.start()}
	j.wait()
	j.checkFinished(ws)

	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans.GetSpans().Snapshots() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	for _, name := range []string{SpanJoin, SpanStateSync, SpanStep, SpanAllReduce, SpanCommit, SpanCheckpoint, SpanRecovery} {
		require.NotEmpty(t, byName[name], "span %s", name)
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}
	step := attrs(byName[SpanStep][0])
	for _, k := range []attribute.Key{AttrRound, AttrRank, AttrWorldSize, AttrStep, AttrEpoch} {
		require.Contains(t, step, k, "step span attribute %s", k)
	}
	require.Zero(t, step[AttrStep].AsInt64()%5, "one step span every StepSpanEvery steps")
	require.Equal(t, int64(2), step[AttrWorldSize].AsInt64())
	sync := attrs(byName[SpanStateSync][0])
	require.Contains(t, sync, AttrSource)
	ck := attrs(byName[SpanCheckpoint][0])
	require.Contains(t, ck, AttrBytes)
	rec := byName[SpanRecovery][0]
	require.True(t, rec.EndTime().After(rec.StartTime()), "the recovery span runs from the failure to the next step")

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	units := map[string]string{
		MetricStepDuration:     "s",
		MetricSamples:          "{sample}",
		MetricWorldSize:        "{worker}",
		MetricRounds:           "{round}",
		MetricRecoveries:       "{recovery}",
		MetricRecoveryDuration: "s",
		MetricGoodput:          "1",
	}
	for name, unit := range units {
		m, ok := got[name]
		require.True(t, ok, "metric %s", name)
		require.Equal(t, unit, m.Unit, "unit of %s", name)
	}
	samples := got[MetricSamples].Data.(metricdata.Sum[int64])
	require.Len(t, samples.DataPoints, 1)
	// Counted on rank 0 as steps are applied: the epoch once, plus the one
	// step that was rolled back if rank 0 had applied it.
	n := int64(len(j.prob.Samples))
	require.GreaterOrEqual(t, samples.DataPoints[0].Value, n)
	require.LessOrEqual(t, samples.DataPoints[0].Value, n+int64(j.batch))
	job, ok := samples.DataPoints[0].Attributes.Value(AttrJob)
	require.True(t, ok)
	require.Equal(t, j.id, job.AsString())
	rounds := got[MetricRounds].Data.(metricdata.Sum[int64])
	var total int64
	for _, dp := range rounds.DataPoints {
		total += dp.Value
	}
	require.Equal(t, int64(4), total, "two rounds on each of two workers")
	recs := got[MetricRecoveries].Data.(metricdata.Sum[int64])
	require.Equal(t, int64(2), recs.DataPoints[0].Value, "one recovery, seen by both workers")
	gp := got[MetricGoodput].Data.(metricdata.Gauge[float64])
	for _, dp := range gp.DataPoints {
		require.Greater(t, dp.Value, 0.0)
		require.LessOrEqual(t, dp.Value, 1.0)
	}
}
