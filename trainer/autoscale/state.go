package autoscale

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrCorruptState reports a policy state that UnmarshalBinary cannot read.
var ErrCorruptState = errors.New("autoscale: corrupt policy state")

// stateMagic begins an encoded state (version 1).
const stateMagic = "ETAS0001"

// MarshalBinary encodes the policy's state (every measurement, the fitted
// model's inputs, the noise estimate, backoffs, a decision awaiting
// enactment), not its Config: a job that restarts from a checkpoint holding
// it continues with what it learned. Floats travel as their bits, so
// UnmarshalBinary restores the same state exactly and ranks that restore
// it decide as the ones that kept it. It never fails.
func (p *Policy) MarshalBinary() ([]byte, error) {
	s := &p.st
	b := []byte(stateMagic)
	u := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	i := func(v int64) { u(uint64(v)) }
	f := func(v float64) { u(math.Float64bits(v)) }
	u(uint64(len(s.sizes)))
	for _, r := range s.sizes {
		i(r.steps)
		f(r.stepTime)
		f(r.compute)
		f(r.sync)
		f(r.batch)
		i(r.badUntil)
		i(r.backoff)
	}
	u(s.round)
	i(int64(s.roundSize))
	i(s.roundSteps)
	i(s.measured)
	u(uint64(len(s.slow)))
	for r := range s.slow {
		f(s.slow[r])
		i(s.slowN[r])
	}
	i(s.lastChange)
	i(int64(s.lastFrom))
	i(s.holdUntil)
	i(s.holdNext)
	i(int64(s.pending))
	i(s.pendSince)
	i(int64(s.probeFrom))
	i(int64(s.capLow))
	f(s.cost)
	i(s.costN)
	i(s.gns.n)
	f(s.gns.trace)
	f(s.gns.g2)
	f(s.lastStep)
	f(s.fig.Throughput)
	f(s.fig.Efficiency)
	f(s.fig.NoiseScale)
	f(s.fig.Goodput)
	i(int64(s.fig.Recommended))
	return b, nil
}

// UnmarshalBinary replaces the policy's state with one MarshalBinary
// encoded (its Config stays). Errors: ErrCorruptState for input it cannot
// read (wrong magic, truncated, trailing bytes, impossible values); the
// state is then unchanged.
func (p *Policy) UnmarshalBinary(data []byte) error {
	if len(data) < len(stateMagic) || string(data[:len(stateMagic)]) != stateMagic {
		return fmt.Errorf("%w: bad magic", ErrCorruptState)
	}
	off := len(stateMagic)
	var bad bool
	u := func() uint64 {
		if off+8 > len(data) {
			bad = true
			return 0
		}
		v := binary.LittleEndian.Uint64(data[off:])
		off += 8
		return v
	}
	i := func() int64 { return int64(u()) }
	f := func() float64 { return math.Float64frombits(u()) }
	count := func(per int) int {
		n := u()
		if n > uint64(len(data)-off)/uint64(per*8) || n >= maxSizes {
			bad = true
			return 0
		}
		return int(n)
	}
	var s state
	n := count(7)
	s.sizes = make([]sizeRecord, n)
	for k := range s.sizes {
		r := &s.sizes[k]
		r.steps, r.stepTime, r.compute, r.sync, r.batch, r.badUntil, r.backoff = i(), f(), f(), f(), f(), i(), i()
	}
	s.round = u()
	s.roundSize = int(i())
	s.roundSteps, s.measured = i(), i()
	n = count(2)
	s.slow, s.slowN = make([]float64, n), make([]int64, n)
	for r := range n {
		s.slow[r], s.slowN[r] = f(), i()
	}
	s.lastChange = i()
	s.lastFrom = int(i())
	s.holdUntil, s.holdNext = i(), i()
	s.pending = int(i())
	s.pendSince = i()
	s.probeFrom = int(i())
	s.capLow = int(i())
	s.cost, s.costN = f(), i()
	s.gns.n, s.gns.trace, s.gns.g2 = i(), f(), f()
	s.lastStep = f()
	s.fig.Throughput, s.fig.Efficiency, s.fig.NoiseScale, s.fig.Goodput = f(), f(), f(), f()
	s.fig.Recommended = int(i())
	switch {
	case bad:
		return fmt.Errorf("%w: truncated", ErrCorruptState)
	case off != len(data):
		return fmt.Errorf("%w: %d trailing bytes", ErrCorruptState, len(data)-off)
	case s.roundSize < 0 || s.roundSize >= maxSizes || s.pending < 0 || s.pending >= maxSizes ||
		s.probeFrom < 0 || s.probeFrom >= maxSizes || s.lastFrom < 0 || s.lastFrom >= maxSizes || s.fig.Recommended < 0 || s.fig.Recommended >= maxSizes:
		return fmt.Errorf("%w: world size out of range", ErrCorruptState)
	}
	p.st = s
	return nil
}
