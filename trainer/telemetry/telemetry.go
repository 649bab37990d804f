// Package telemetry holds the names of the trainer's OpenTelemetry spans,
// metrics and attributes, and its histograms' bucket boundaries: what a
// dashboard, an alert or a test that reads a job's telemetry refers to.
// The trainer records them through the TracerProvider and MeterProvider
// it is given (trainer.WithTracerProvider, trainer.WithMeterProvider), in
// the instrumentation scope Scope; it never installs an SDK.
package telemetry

import "go.opentelemetry.io/otel/attribute"

// Scope is the instrumentation scope (tracer and meter name) under which
// the trainer records.
const Scope = "github.com/elastictrain/elastictrain/trainer"

// The documented telemetry names.
const (
	// Span names.
	SpanJoin       = "elastictrain.join"
	SpanStateSync  = "elastictrain.state_sync"
	SpanStep       = "elastictrain.step"
	SpanAllReduce  = "elastictrain.allreduce"
	SpanCommit     = "elastictrain.commit"
	SpanCheckpoint = "elastictrain.checkpoint"
	SpanRecovery   = "elastictrain.recovery"

	// Metric names (units in the instrument).
	MetricStepDuration      = "elastictrain.step.duration"      // s, histogram
	MetricSamples           = "elastictrain.samples"            // {sample}, counter on rank 0 of samples in applied steps (rolled-back steps count too); rate = samples/s
	MetricWorldSize         = "elastictrain.world_size"         // {worker}, gauge
	MetricRounds            = "elastictrain.rounds"             // {round}, counter
	MetricRecoveries        = "elastictrain.recoveries"         // {recovery}, counter
	MetricRecoveryDuration  = "elastictrain.recovery.duration"  // s, histogram
	MetricGoodput           = "elastictrain.goodput"            // 1, gauge: useful training time / wall time
	MetricStragglers        = "elastictrain.stragglers"         // {report}, counter
	MetricShare             = "elastictrain.balance.share"      // {sample}, gauge per rank: its samples in the last step
	MetricSpeed             = "elastictrain.balance.speed"      // {sample}/s, gauge per rank: its smoothed speed (cost units/s with Batch.Cost)
	MetricCheckpointBlocked = "elastictrain.checkpoint.blocked" // s, histogram per rank: training time one periodic durable checkpoint blocked (the write runs in the background)

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
	// CheckpointBlockedBuckets: a checkpoint copies state in memory
	// (milliseconds per tens of MB) or, written synchronously, waits for
	// a store.
	CheckpointBlockedBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
)
