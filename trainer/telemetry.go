package trainer

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	tel "github.com/elastictrain/elastictrain/trainer/telemetry"
)

// scopeName is the instrumentation scope the trainer records in.
const scopeName = tel.Scope

// The trainer's span, metric and attribute names.
//
// Deprecated: use package trainer/telemetry, which holds the same names.
const (
	SpanJoin                   = tel.SpanJoin
	SpanStateSync              = tel.SpanStateSync
	SpanStep                   = tel.SpanStep
	SpanAllReduce              = tel.SpanAllReduce
	SpanCommit                 = tel.SpanCommit
	SpanCheckpoint             = tel.SpanCheckpoint
	SpanRecovery               = tel.SpanRecovery
	MetricStepDuration         = tel.MetricStepDuration
	MetricSamples              = tel.MetricSamples
	MetricWorldSize            = tel.MetricWorldSize
	MetricRounds               = tel.MetricRounds
	MetricRecoveries           = tel.MetricRecoveries
	MetricRecoveryDuration     = tel.MetricRecoveryDuration
	MetricGoodput              = tel.MetricGoodput
	MetricStragglers           = tel.MetricStragglers
	MetricShare                = tel.MetricShare
	MetricSpeed                = tel.MetricSpeed
	MetricAutoscaleGoodput     = tel.MetricAutoscaleGoodput
	MetricAutoscaleThroughput  = tel.MetricAutoscaleThroughput
	MetricAutoscaleEfficiency  = tel.MetricAutoscaleEfficiency
	MetricAutoscaleRecommended = tel.MetricAutoscaleRecommended
	AttrJob                    = tel.AttrJob
	AttrRound                  = tel.AttrRound
	AttrRank                   = tel.AttrRank
	AttrWorldSize              = tel.AttrWorldSize
	AttrStep                   = tel.AttrStep
	AttrEpoch                  = tel.AttrEpoch
	AttrBytes                  = tel.AttrBytes
	AttrSource                 = tel.AttrSource
	AttrCause                  = tel.AttrCause
)

// Histogram bucket boundaries, in seconds.
//
// Deprecated: use package trainer/telemetry, which holds the same
// boundaries.
var (
	StepDurationBuckets     = tel.StepDurationBuckets
	RecoveryDurationBuckets = tel.RecoveryDurationBuckets
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
	ckptBlocked metric.Float64Histogram
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
	t.ckptBlocked, e = m.Float64Histogram(tel.MetricCheckpointBlocked, metric.WithUnit("s"),
		metric.WithDescription("Training time one periodic durable checkpoint blocked on this rank (the write runs in the background)."),
		metric.WithExplicitBucketBoundaries(tel.CheckpointBlockedBuckets...))
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
