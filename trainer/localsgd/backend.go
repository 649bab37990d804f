package localsgd

import (
	"context"
	"sync/atomic"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// statCounters are read by Stats from any goroutine.
type statCounters struct {
	outer, bytes atomic.Int64
}

// backend is Strategy's driver.Backend face.
type backend Strategy

// Listen implements driver.Backend: the base Backend's.
func (b *backend) Listen(ctx context.Context) (string, error) { return b.base.Listen(ctx) }

// Close implements driver.Backend: the base Backend's.
func (b *backend) Close() error { return b.base.Close() }

// Connect implements driver.Backend: the base Backend's round, with the
// strategy's outer step (driver.LocalStepper).
func (b *backend) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	c, err := b.base.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	r := &round{Synchronizer: c, s: (*Strategy)(b)}
	if ag, ok := c.(sync.AllGatherer); ok {
		return &gatherRound{round: r, ag: ag}, nil
	}
	return r, nil
}

// round is one round's Synchronizer: the base's, and the outer step.
type round struct {
	sync.Synchronizer
	s *Strategy
}

// OuterStep implements driver.LocalStepper: after H local steps (or with
// final, after any), one float32 sum-allreduce of the parameter change
// and the outer optimizer's update; synced is true when no local step is
// pending afterwards.
func (r *round) OuterStep(ctx context.Context, step int64, final bool) (bool, error) {
	return r.s.outerStep(ctx, r.Synchronizer, final)
}

// gatherRound is a round whose base Synchronizer implements sync.AllGatherer.
type gatherRound struct {
	*round
	ag sync.AllGatherer
}

// AllGather implements sync.AllGatherer: the base's.
func (g *gatherRound) AllGather(ctx context.Context, send, recv []byte) error {
	return g.ag.AllGather(ctx, send, recv)
}

var (
	_ driver.Backend      = (*backend)(nil)
	_ driver.LocalStepper = (*round)(nil)
	_ sync.AllGatherer    = (*gatherRound)(nil)
)
