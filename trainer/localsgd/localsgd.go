// Package localsgd is a low-communication strategy for package trainer:
// LocalSGD and DiLoCo, for workers joined by slow links.
//
// Every rank takes H local optimizer steps (Config.Every) on its own share
// of each global batch, with no communication but the trainer's small
// per-step control exchange; then an outer step makes the ranks agree
// again: one float32 sum-allreduce of the parameter change since the last
// outer step (the outer gradient, averaged over the ranks), applied by an
// outer optimizer to the parameters of the last outer step:
//
//   - Average (LocalSGD: Stich, "Local SGD Converges Fast and Communicates
//     Little", ICLR 2019; Lin et al., "Don't Use Large Mini-Batches, Use
//     Local SGD", ICLR 2020): the parameters become the ranks' mean;
//   - Nesterov (DiLoCo: Douillard et al., "DiLoCo: Distributed
//     Low-Communication Training of Language Models", 2023): SGD with
//     Nesterov momentum on the averaged change, u = mu*u + delta,
//     theta = anchor - lr*(delta + mu*u), with the paper's outer learning
//     rate 0.7 and momentum 0.9 by default.
//
// A step's allreduce of the gradients (4 bytes a parameter, about twice
// over in a ring) becomes one allreduce of the same size every H steps.
//
// # Use
//
//	s, err := localsgd.New(params, optim.NewAdam(1e-3), ring.NewBackend(cfg.ListenAddr, cfg.Sync), localsgd.DefaultConfig())
//	tr, err := trainer.New(params, s.Optimizer(), loader, step, store, cfg, trainer.WithBackend(s.Backend()))
//
// # Through the trainer's seams
//
// The strategy is a driver.Backend that wraps another one (the ring by
// default) and whose rounds' Synchronizers implement driver.LocalStepper,
// and a optim.Optimizer that wraps the inner optimizer. The outer
// optimizer's state (its momentum, and how many local steps were taken
// since the last outer step) is part of the optimizer's state, so every
// commit and checkpoint holds it and a restore continues from it. The
// trainer commits only at outer steps (driver.LocalStepper): a failure,
// a join or a preemption between two outer steps rolls every rank back to
// the last outer step, parameters, optimizers and loader cursor together,
// and exactly-once holds across it. Between outer steps the inner
// optimizer's state is each rank's own (as in the paper); a new round
// starts every rank from the committed state of one rank (the lowest
// holding the agreed commit), its inner state included.
//
// # Determinism
//
// Shares are not balanced under this strategy, so each rank's local steps
// depend only on the global batch and the world size, and the outer sums
// add in the ring's fixed order: the same H, world-size history and host
// layout give the same bits. With trainer.Config.Deterministic the local gradients are exact fixed-point
// sums over the micro-batches, but the outer sum is float32 (the flat and
// hierarchical rings differ in the last bits), and the result depends on
// the world size by design: the trainer's promise of the same bits
// whatever the world size and the faults does not hold for this strategy.
//
// # Not done
//
// The outer allreduce is float32 (no lower precision) and is not
// overlapped with the next local steps: the trainer commits at the outer
// step, which needs its result (overlapping delays the outer update by a
// step, as streaming variants of DiLoCo do, and would need commits one step
// later).
package localsgd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/driver"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

// Outer names the outer optimizer.
type Outer int

const (
	// Average is LocalSGD's outer step: the ranks' parameters are averaged.
	Average Outer = iota
	// Nesterov is DiLoCo's: SGD with Nesterov momentum on the averaged
	// parameter change.
	Nesterov
)

// String returns "localsgd" or "diloco".
func (o Outer) String() string {
	switch o {
	case Average:
		return "localsgd"
	case Nesterov:
		return "diloco"
	}
	return fmt.Sprintf("Outer(%d)", int(o))
}

// Config sets the strategy up. Start from DefaultConfig.
type Config struct {
	// Every is H, the local steps between two outer steps (a step is one
	// global batch). 1 synchronises at every step. Default 500 (the
	// paper's); small models on few workers want less (examples/mnist: 16).
	Every int
	// Outer is the outer optimizer. Default Nesterov (DiLoCo).
	Outer Outer
	// LR is the outer learning rate (Nesterov only). Default 0.7.
	LR float64
	// Momentum is the outer momentum, in [0, 1) (Nesterov only). Default 0.9.
	Momentum float64
}

// DefaultConfig returns DiLoCo with the paper's settings: H = 500, outer
// learning rate 0.7, Nesterov momentum 0.9.
func DefaultConfig() Config { return Config{Every: 500, Outer: Nesterov, LR: 0.7, Momentum: 0.9} }

// Validate reports a setting out of range, wrapping trainer.ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Every < 1:
		return fmt.Errorf("%w: localsgd: Every %d: want at least 1", trainer.ErrInvalidConfig, c.Every)
	case c.Outer != Average && c.Outer != Nesterov:
		return fmt.Errorf("%w: localsgd: unknown outer optimizer %d", trainer.ErrInvalidConfig, int(c.Outer))
	case c.Outer == Nesterov && !(c.LR > 0 && c.LR <= 1e6):
		return fmt.Errorf("%w: localsgd: outer LR %v: want a positive finite rate", trainer.ErrInvalidConfig, c.LR)
	case c.Outer == Nesterov && !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("%w: localsgd: outer Momentum %v: want [0, 1)", trainer.ErrInvalidConfig, c.Momentum)
	}
	return nil
}

// Stats are a Strategy's counters.
type Stats struct {
	// OuterSteps counts the outer steps this worker took (rolled back ones
	// included).
	OuterSteps int64
	// ReducedBytes counts the bytes of parameter change this worker handed
	// to the outer allreduces (4 a parameter each time; the wire carries
	// about 2(W-1)/W of it each way in a ring).
	ReducedBytes int64
}

// Strategy is LocalSGD or DiLoCo for one trainer: Optimizer and Backend
// give what trainer.New takes. Its methods are called by that trainer's
// loop goroutine; Stats may be called from any goroutine.
type Strategy struct {
	cfg    Config
	params []trainer.Param
	inner  optim.Optimizer
	base   driver.Backend

	anchor   [][]float32 // the parameters of the last outer step
	anchored bool        // anchor holds them (false after New and LoadState until the next Step)
	u        [][]float32 // outer momentum (Nesterov)
	count    int64       // local steps since the last outer step
	buf      []float32   // the fused change, allreduced

	stats statCounters
}

// New returns a Strategy over params (the trainer's, in its order), with
// inner as the local optimizer and base as the Backend its rounds
// communicate over. It returns an error wrapping trainer.ErrInvalidConfig
// for an invalid cfg, no params, or a nil inner or base.
func New(params []trainer.Param, inner optim.Optimizer, base driver.Backend, cfg Config) (*Strategy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case len(params) == 0:
		return nil, fmt.Errorf("%w: localsgd: no parameters", trainer.ErrInvalidConfig)
	case inner == nil:
		return nil, fmt.Errorf("%w: localsgd: no inner optimizer", trainer.ErrInvalidConfig)
	case base == nil:
		return nil, fmt.Errorf("%w: localsgd: no Backend", trainer.ErrInvalidConfig)
	}
	n := 0
	for _, p := range params {
		if len(p.Grad) < len(p.Value) {
			return nil, fmt.Errorf("%w: localsgd: parameter %q has %d gradients for %d values", trainer.ErrInvalidConfig, p.Name, len(p.Grad), len(p.Value))
		}
		n += len(p.Value)
	}
	s := &Strategy{cfg: cfg, params: params, inner: inner, base: base, buf: make([]float32, n)}
	s.anchor = zerosLike(params)
	if cfg.Outer == Nesterov {
		s.u = zerosLike(params)
	}
	return s, nil
}

// Config returns the strategy's settings.
func (s *Strategy) Config() Config { return s.cfg }

// Stats returns the strategy's counters so far.
func (s *Strategy) Stats() Stats {
	return Stats{OuterSteps: s.stats.outer.Load(), ReducedBytes: s.stats.bytes.Load()}
}

// Optimizer returns the optim.Optimizer to give trainer.New: the inner
// optimizer, counting its steps, with the outer optimizer's state in its
// own (AppendState, LoadState).
func (s *Strategy) Optimizer() optim.Optimizer { return (*optimizer)(s) }

// Backend returns the driver.Backend to give trainer.WithBackend: the base
// Backend, whose rounds' Synchronizers also implement driver.LocalStepper
// (and sync.AllGatherer when the base's do).
func (s *Strategy) Backend() driver.Backend { return (*backend)(s) }

// outerStep is driver.LocalStepper's OuterStep over comm.
func (s *Strategy) outerStep(ctx context.Context, comm sync.Synchronizer, final bool) (bool, error) {
	if s.count == 0 {
		return true, nil
	}
	if s.count < int64(s.cfg.Every) && !final {
		return false, nil
	}
	if !s.anchored {
		// Steps were counted, so Step anchored: unreachable unless the
		// state was loaded mid-interval without its anchor.
		return false, fmt.Errorf("%w: localsgd: an outer step without the parameters of the last one", trainer.ErrCorruptState)
	}
	off := 0
	for k, p := range s.params {
		a := s.anchor[k]
		d := s.buf[off : off+len(p.Value)]
		for i, v := range p.Value {
			d[i] = a[i] - v
		}
		off += len(p.Value)
	}
	if err := comm.AllReduceFloat32(ctx, s.buf, sync.OpSum); err != nil {
		return false, err
	}
	s.stats.outer.Add(1)
	s.stats.bytes.Add(int64(4 * len(s.buf)))
	s.apply(s.buf, comm.Size())
	s.count = 0
	return true, nil
}

// apply makes the parameters and the anchor the outer step's result from
// sum, the ranks' summed change (anchor - theta_r), over w ranks.
func (s *Strategy) apply(sum []float32, w int) {
	inv := 1 / float32(w)
	lr, mu := float32(s.cfg.LR), float32(s.cfg.Momentum)
	off := 0
	for k, p := range s.params {
		a := s.anchor[k]
		d := sum[off : off+len(p.Value)]
		switch s.cfg.Outer {
		case Average:
			for i := range a {
				a[i] -= d[i] * inv
			}
		case Nesterov:
			u := s.u[k]
			for i := range a {
				g := d[i] * inv
				u[i] = mu*u[i] + g
				a[i] -= lr * (g + mu*u[i])
			}
		}
		copy(p.Value, a)
		off += len(p.Value)
	}
}

// optimizer is Strategy's optim.Optimizer face.
type optimizer Strategy

// Name implements optim.Optimizer: "diloco/" or "localsgd/" and the
// inner optimizer's name.
func (o *optimizer) Name() string { return o.cfg.Outer.String() + "/" + o.inner.Name() }

// LearningRate implements optim.Optimizer: the inner learning rate.
func (o *optimizer) LearningRate() float64 { return o.inner.LearningRate() }

// SetLearningRate implements optim.Optimizer: it sets the inner learning rate.
func (o *optimizer) SetLearningRate(lr float64) { o.inner.SetLearningRate(lr) }

// Step implements optim.Optimizer: one local step of the inner optimizer.
// The first step after New or LoadState takes the parameters as those of
// the last outer step.
func (o *optimizer) Step(params []trainer.Param) error {
	if err := sameShapes(o.anchor, params); err != nil {
		return err
	}
	if !o.anchored {
		for k, p := range params {
			copy(o.anchor[k], p.Value)
		}
		o.anchored = true
	}
	if err := o.inner.Step(params); err != nil {
		return err
	}
	o.count++
	return nil
}

const stateVersion = 1

// AppendState implements optim.Optimizer: a version, the outer
// optimizer, H, the local steps since the last outer step, the outer
// momentum (Nesterov), the anchor when local steps are pending (never at a
// commit: the trainer commits at outer steps only), and the inner
// optimizer's state.
func (o *optimizer) AppendState(dst []byte) []byte {
	dst = append(dst, stateVersion, byte(o.cfg.Outer))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(o.cfg.Every))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(o.count))
	if o.cfg.Outer == Nesterov {
		dst = appendTensors(dst, o.u)
	}
	if o.count > 0 {
		dst = appendTensors(dst, o.anchor)
	}
	return o.inner.AppendState(dst)
}

// LoadState implements optim.Optimizer. It returns an error wrapping
// trainer.ErrCorruptState for state of another version, outer optimizer,
// H or parameter shapes, and leaves the state unchanged then.
func (o *optimizer) LoadState(src []byte, params []trainer.Param) error {
	if err := sameShapes(o.anchor, params); err != nil {
		return fmt.Errorf("%w: %v", trainer.ErrCorruptState, err)
	}
	if len(src) < 18 || src[0] != stateVersion || Outer(src[1]) != o.cfg.Outer {
		return fmt.Errorf("%w: localsgd: not the state of %s (version %d)", trainer.ErrCorruptState, o.cfg.Outer, stateVersion)
	}
	every, count := binary.LittleEndian.Uint64(src[2:]), binary.LittleEndian.Uint64(src[10:])
	if every != uint64(o.cfg.Every) {
		return fmt.Errorf("%w: localsgd: state of H = %d, this strategy's is %d", trainer.ErrCorruptState, every, o.cfg.Every)
	}
	if count >= every {
		return fmt.Errorf("%w: localsgd: %d local steps pending with H = %d", trainer.ErrCorruptState, count, every)
	}
	rest := src[18:]
	var u, anchor [][]float32
	var err error
	if o.cfg.Outer == Nesterov {
		if u, rest, err = readTensors(rest, params); err != nil {
			return err
		}
	}
	if count > 0 {
		if anchor, rest, err = readTensors(rest, params); err != nil {
			return err
		}
	}
	if err := o.inner.LoadState(rest, params); err != nil {
		return err
	}
	o.count = int64(count)
	if u != nil {
		o.u = u
	}
	o.anchored = anchor != nil
	if anchor != nil {
		o.anchor = anchor
	}
	return nil
}

// appendTensors appends every tensor's float32 bits (the lengths are the
// parameters').
func appendTensors(dst []byte, ts [][]float32) []byte {
	for _, t := range ts {
		for _, v := range t {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
		}
	}
	return dst
}

// readTensors reads tensors shaped like params from src and returns the rest.
func readTensors(src []byte, params []trainer.Param) ([][]float32, []byte, error) {
	out := make([][]float32, len(params))
	for k, p := range params {
		n := len(p.Value)
		if len(src) < 4*n {
			return nil, nil, fmt.Errorf("%w: localsgd: state too short for parameter %q", trainer.ErrCorruptState, p.Name)
		}
		t := make([]float32, n)
		for i := range t {
			t[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
		out[k], src = t, src[4*n:]
	}
	return out, src, nil
}

func zerosLike(params []trainer.Param) [][]float32 {
	out := make([][]float32, len(params))
	for k, p := range params {
		out[k] = make([]float32, len(p.Value))
	}
	return out
}

// errShapes is returned by Step for parameters other than New's.
var errShapes = errors.New("localsgd: the parameters differ from the ones the strategy was made for")

func sameShapes(ts [][]float32, params []trainer.Param) error {
	if len(ts) != len(params) {
		return fmt.Errorf("%w: %d tensors, %d parameters", errShapes, len(ts), len(params))
	}
	for k, p := range params {
		if len(ts[k]) != len(p.Value) {
			return fmt.Errorf("%w: parameter %q has %d values, want %d", errShapes, p.Name, len(p.Value), len(ts[k]))
		}
	}
	return nil
}

var _ optim.Optimizer = (*optimizer)(nil)
