package mnist

import (
	"context"

	"github.com/elastictrain/elastictrain/examples/internal/telemetry"
	"github.com/elastictrain/elastictrain/trainer"
)

// The workers' OpenTelemetry SDK (-otlp, -metrics) is package
// examples/internal/telemetry's, shared with the other examples.

const (
	otlpHelp                 = telemetry.OTLPHelp
	metricsHelp              = telemetry.MetricsHelp
	telemetryShutdownTimeout = telemetry.ShutdownTimeout
)

var (
	validateTelemetryFlags = telemetry.ValidateFlags
	workerIndex            = telemetry.WorkerIndex
)

// workerTelemetry is one worker's telemetry.Telemetry.
type workerTelemetry struct {
	*telemetry.Telemetry
	addr string // where the -metrics server listens
}

func newTelemetry(ctx context.Context, otlp, metrics string, worker int, job string) (*workerTelemetry, error) {
	t, err := telemetry.New(ctx, "elastictrain-mnist", otlp, metrics, worker, job)
	if err != nil {
		return nil, err
	}
	return &workerTelemetry{Telemetry: t, addr: t.Addr}, nil
}

func (t *workerTelemetry) options() []trainer.Option          { return t.Options() }
func (t *workerTelemetry) shutdown(ctx context.Context) error { return t.Shutdown(ctx) }
