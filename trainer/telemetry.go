package trainer

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Instrumentation scope and the documented telemetry names.
const (
	scopeName = "github.com/elastictrain/elastictrain/trainer"

	// Span names.
	SpanJoin       = "elastictrain.join"
	SpanStateSync  = "elastictrain.state_sync"
	SpanStep       = "elastictrain.step"
	SpanAllReduce  = "elastictrain.allreduce"
	SpanCommit     = "elastictrain.commit"
	SpanCheckpoint = "elastictrain.checkpoint"
	SpanRecovery   = "elastictrain.recovery"

	// Metric names (units in the instrument).
	MetricStepDuration     = "elastictrain.step.duration"     // s, histogram
	MetricSamples          = "elastictrain.samples"           // {sample}, counter on rank 0 of samples in applied steps (rolled-back steps count too); rate = samples/s
	MetricWorldSize        = "elastictrain.world_size"        // {worker}, gauge
	MetricRounds           = "elastictrain.rounds"            // {round}, counter
	MetricRecoveries       = "elastictrain.recoveries"        // {recovery}, counter
	MetricRecoveryDuration = "elastictrain.recovery.duration" // s, histogram
	MetricGoodput          = "elastictrain.goodput"           // 1, gauge: useful training time / wall time
	MetricStragglers       = "elastictrain.stragglers"        // {report}, counter
	MetricShare            = "elastictrain.balance.share"     // {sample}, gauge per rank: its samples in the last step
	MetricSpeed            = "elastictrain.balance.speed"     // {sample}/s, gauge per rank: its smoothed speed (cost units/s with Batch.Cost)

	// Resource adjustment (Config.Autoscale), the same on every rank:
	MetricAutoscaleGoodput     = "elastictrain.autoscale.goodput"                // {sample}/s, gauge: throughput × statistical efficiency (useful samples per second)
	MetricAutoscaleThroughput  = "elastictrain.autoscale.throughput"             // {sample}/s, gauge: measured samples per second at the current world size
	MetricAutoscaleEfficiency  = "elastictrain.autoscale.efficiency"             // 1, gauge: statistical efficiency of the global batch, B_noise/(B_noise+B)
	MetricAutoscaleRecommended = "elastictrain.autoscale.recommended_world_size" // {worker}, gauge: the policy's target world size

	// Attribute keys.
	AttrJob       = attribute.Key("elastictrain.job")
	AttrRound     = attribute.Key("elastictrain.round")
	AttrRank      = attribute.Key("elastictrain.rank")
	AttrWorldSize = attribute.Key("elastictrain.world_size")
	AttrStep      = attribute.Key("elastictrain.step")
	AttrEpoch     = attribute.Key("elastictrain.epoch")
	AttrBytes     = attribute.Key("elastictrain.bytes")
	AttrSource    = attribute.Key("elastictrain.state_source")
	AttrCause     = attribute.Key("elastictrain.cause")
)

// Histogram bucket boundaries, in seconds: steps take milliseconds to
// seconds; recoveries tens of milliseconds to a lease or a timeout.
var (
	StepDurationBuckets     = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	RecoveryDurationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
)

type telemetry struct {
	tracer      trace.Tracer
	stepDur     metric.Float64Histogram
	samples     metric.Int64Counter
	worldSize   metric.Int64Gauge
	rounds      metric.Int64Counter
	recoveries  metric.Int64Counter
	recoveryDur metric.Float64Histogram
	goodput     metric.Float64Gauge
	stragglers  metric.Int64Counter
	share       metric.Int64Gauge
	speed       metric.Float64Gauge
	jobAttr     attribute.KeyValue
	commonAttrs metric.MeasurementOption

	// Resource adjustment's gauges.
	asGoodput, asThroughput, asEfficiency metric.Float64Gauge
	asRecommended                         metric.Int64Gauge
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, job string) (*telemetry, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(scopeName)
	t := &telemetry{tracer: tp.Tracer(scopeName), jobAttr: AttrJob.String(job)}
	var err error
	must := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	var e error
	t.stepDur, e = m.Float64Histogram(MetricStepDuration, metric.WithUnit("s"), metric.WithDescription("Wall time of one applied training step."),
		metric.WithExplicitBucketBoundaries(StepDurationBuckets...))
	must(e)
	t.samples, e = m.Int64Counter(MetricSamples, metric.WithUnit("{sample}"), metric.WithDescription("Samples of the global batches applied (counted on rank 0)."))
	must(e)
	t.worldSize, e = m.Int64Gauge(MetricWorldSize, metric.WithUnit("{worker}"), metric.WithDescription("World size of the current round."))
	must(e)
	t.rounds, e = m.Int64Counter(MetricRounds, metric.WithUnit("{round}"), metric.WithDescription("Rounds this worker took part in."))
	must(e)
	t.recoveries, e = m.Int64Counter(MetricRecoveries, metric.WithUnit("{recovery}"), metric.WithDescription("Rounds begun because the previous one failed."))
	must(e)
	t.recoveryDur, e = m.Float64Histogram(MetricRecoveryDuration, metric.WithUnit("s"), metric.WithDescription("Time from seeing a failure to the first applied step of the next round."),
		metric.WithExplicitBucketBoundaries(RecoveryDurationBuckets...))
	must(e)
	t.goodput, e = m.Float64Gauge(MetricGoodput, metric.WithUnit("1"), metric.WithDescription("Useful training time over wall time since Run began."))
	must(e)
	t.stragglers, e = m.Int64Counter(MetricStragglers, metric.WithUnit("{report}"), metric.WithDescription("Straggler reports."))
	must(e)
	t.share, e = m.Int64Gauge(MetricShare, metric.WithUnit("{sample}"), metric.WithDescription("This rank's samples in the last step (its share of the global batch)."))
	must(e)
	t.speed, e = m.Float64Gauge(MetricSpeed, metric.WithUnit("{sample}/s"), metric.WithDescription("This rank's smoothed speed: samples (or cost units) per compute second."))
	must(e)
	t.asGoodput, e = m.Float64Gauge(MetricAutoscaleGoodput, metric.WithUnit("{sample}/s"), metric.WithDescription("Throughput times the statistical efficiency of the global batch: useful samples per second (autoscale)."))
	must(e)
	t.asThroughput, e = m.Float64Gauge(MetricAutoscaleThroughput, metric.WithUnit("{sample}/s"), metric.WithDescription("Measured samples per second at the current world size (autoscale)."))
	must(e)
	t.asEfficiency, e = m.Float64Gauge(MetricAutoscaleEfficiency, metric.WithUnit("1"), metric.WithDescription("Statistical efficiency of the global batch from the gradient noise scale (autoscale)."))
	must(e)
	t.asRecommended, e = m.Int64Gauge(MetricAutoscaleRecommended, metric.WithUnit("{worker}"), metric.WithDescription("The world size the autoscale policy recommends."))
	must(e)
	t.commonAttrs = metric.WithAttributes(t.jobAttr)
	return t, err
}
