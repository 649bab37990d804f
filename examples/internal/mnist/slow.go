package mnist

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// slowFlag is -slow RANK@FACTOR, a test knob: the worker holding RANK (in
// its current round) computes FACTOR times slower per sample, by sleeping
// after each step function call for FACTOR-1 times as long as the call
// took, so that its slowness is in proportion to its share of the global
// batch (a slower or shared host). It sleeps for all but the last
// millisecond, which it waits out on the clock: a timer overshoots short
// sleeps by up to a millisecond or more on a loaded machine, which would
// make a worker with a small share far slower than FACTOR.
type slowFlag struct {
	rank   int     // -1: nobody is slow
	factor float64 // >= 1
}

func (f *slowFlag) String() string {
	if f == nil || f.rank < 0 {
		return ""
	}
	return fmt.Sprintf("%d@%s", f.rank, strconv.FormatFloat(f.factor, 'g', -1, 64))
}

func (f *slowFlag) Set(s string) error {
	a, b, ok := strings.Cut(s, "@")
	if !ok {
		return fmt.Errorf("want -slow RANK@FACTOR, got %q", s)
	}
	r, err := strconv.Atoi(a)
	if err != nil || r < 0 {
		return fmt.Errorf("bad -slow rank %q: want a whole number >= 0", a)
	}
	x, err := strconv.ParseFloat(b, 64)
	if err != nil || !(x >= 1) || math.IsInf(x, 1) {
		return fmt.Errorf("bad -slow factor %q: want a number >= 1", b)
	}
	f.rank, f.factor = r, x
	return nil
}

// slowDown sleeps after a step function call that took took on a worker
// of rank rank, when the flag makes that rank slow; it returns early with
// ctx's error.
func (f *slowFlag) slowDown(ctx context.Context, rank int, took time.Duration) error {
	if f.rank < 0 || rank != f.rank || f.factor <= 1 {
		return nil
	}
	deadline := time.Now().Add(time.Duration(float64(took) * (f.factor - 1)))
	if d := time.Until(deadline) - time.Millisecond; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
