package elastic

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// errAgentDeadline is what a store call cut off by the Agent's own
// deadline (bounded) wraps: it reads and unwraps as
// context.DeadlineExceeded, and tells such a call from one whose client
// or network returned that error (agentDeadline).
var errAgentDeadline error = agentDeadlineError{}

type agentDeadlineError struct{}

func (agentDeadlineError) Error() string { return context.DeadlineExceeded.Error() }
func (agentDeadlineError) Unwrap() error { return context.DeadlineExceeded }

// bounded runs one store call f under a deadline of d that the Agent
// enforces itself: f gets a context with that deadline, and bounded returns
// when f does or when the deadline passes, whichever comes first. A client
// that ignores context deadlines (go-redis applies them only with
// Options.ContextTimeoutEnabled; without it a call through a blackholed link
// waits for ReadTimeout, 3 s by default) then cannot stretch the Agent's
// timeouts. f keeps running in its goroutine until the client gives up; the
// Agent owns that goroutine (Close waits for it) and hands a result that
// arrives too late to late (if not nil), e.g. to close an unused Watcher.
// done, if not nil, runs when f has returned (it releases a heartbeat slot).
//
// Errors: f's error; on the Agent's deadline a StoreError (op, the job)
// wrapping context.DeadlineExceeded; the parent's error if ctx ended first;
// ErrClosed once Close began (a call in flight returns at once); the
// Agent's ErrStoreUnavailable once it gave the store up (outage.go).
func bounded[T any](a *Agent, ctx context.Context, op string, d time.Duration, f func(context.Context) (T, error), late func(T), done func()) (T, error) {
	var zero T
	a.mu.Lock()
	if a.callsClosed {
		a.mu.Unlock()
		if done != nil {
			done()
		}
		return zero, ErrClosed
	}
	a.calls.Add(1)
	a.mu.Unlock()
	defer a.callEnd(a.callBegin(time.Now())) // the outage budget's clock (outage.go)
	cctx, cancel := context.WithTimeout(ctx, d)
	type result struct {
		v   T
		err error
	}
	ch := make(chan result) // unbuffered: a result nobody waits for goes to late
	abandoned := make(chan struct{})
	go func() {
		defer a.calls.Done()
		defer cancel()
		v, err := f(cctx)
		if done != nil {
			done()
		}
		select {
		case ch <- result{v, err}:
		case <-abandoned:
			if err == nil && late != nil {
				late(v)
			}
		}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-a.stop:
		close(abandoned)
		return zero, ErrClosed
	case <-a.gaveUp:
		close(abandoned)
		cancel() // nothing waits for the answer any more
		return zero, a.Err()
	case <-cctx.Done():
		close(abandoned)
		if err := ctx.Err(); err != nil {
			return zero, err
		}
		return zero, &StoreError{Op: op, JobID: a.cfg.JobID,
			Err: fmt.Errorf("no answer within the agent's deadline of %v: %w", d, errAgentDeadline)}
	}
}

// rttEstimate follows the round trip of the Agent's store calls, measured
// on its answered heartbeats, as TCP's retransmission timer does (RFC 6298,
// section 2: SRTT and RTTVAR with gains 1/8 and 1/4, RTO = SRTT + 4 x
// RTTVAR). Store calls other than heartbeats (Join, Check, Leave) use it for
// their deadline: a link whose round trip is longer than the floor (half a
// lease) but within the heartbeat's deadline then still answers a Join, so
// latency below the lease never keeps a member out of a round; a blackholed
// link that was fast still fails a call after the floor.
type rttEstimate struct {
	mu     sync.Mutex
	have   bool
	srtt   time.Duration
	rttvar time.Duration
}

// sample records one measured round trip.
func (e *rttEstimate) sample(r time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.have {
		e.have, e.srtt, e.rttvar = true, r, r/2
		return
	}
	d := e.srtt - r
	if d < 0 {
		d = -d
	}
	e.rttvar = (3*e.rttvar + d) / 4
	e.srtt = (7*e.srtt + r) / 8
}

// smoothed returns SRTT, 0 before any sample.
func (e *rttEstimate) smoothed() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srtt
}

// timeout returns the retransmission-style timeout SRTT + 4 x RTTVAR,
// clamped to [floor, ceil]; floor before any sample.
func (e *rttEstimate) timeout(floor, ceil time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.have {
		return floor
	}
	return min(max(e.srtt+4*e.rttvar, floor), ceil)
}

// beatTimeout bounds one heartbeat: twice the lease, so a link whose round
// trip is longer than the lease still renews it (the heartbeats overlap; see
// maxBeatsInFlight) while the Agent's deadline stays its own.
func (a *Agent) beatTimeout() time.Duration { return max(2*a.cfg.LeaseTTL, 100*time.Millisecond) }

// maxBeatsInFlight is how many heartbeats the Agent keeps in flight at most:
// about one lease's worth of heartbeats plus one, between 2 and 10. Each
// takes a connection of the client's pool while it is in flight (go-redis'
// default PoolSize is 10 per CPU).
func maxBeatsInFlight(cfg Config) int {
	n := int((cfg.LeaseTTL+cfg.HeartbeatInterval-1)/max(cfg.HeartbeatInterval, 1)) + 1
	return min(max(n, 2), 10)
}

// watch subscribes to the job's change hints within the Agent's own
// deadline; a subscription that arrives after it is closed at once.
func (a *Agent) watch(ctx context.Context) (store.Watcher, error) {
	return bounded(a, ctx, "watch", a.opTimeout(),
		func(c context.Context) (store.Watcher, error) { return a.store.Watch(c, a.cfg.JobID) },
		func(w store.Watcher) { _ = w.Close() }, nil)
}

// poolWarmer is the optional capability of a Store to open connections
// ahead of need (store.Redis.Warm).
type poolWarmer interface {
	Warm(ctx context.Context, n int) error
}

// warmEvery is how often the Agent warms the store's connection pool: well
// within go-redis' default ConnMaxIdleTime (30 min), after which idle
// connections are dropped.
const warmEvery = 10 * time.Minute

// warm opens one connection per heartbeat that may be in flight, plus one
// for Join and Check (see store.Redis.Warm), within the Agent's deadline.
func (a *Agent) warm() {
	pw, ok := a.store.(poolWarmer)
	if !ok {
		return
	}
	n := cap(a.beatSlots) + 1
	if _, err := bounded(a, context.Background(), "warm", a.beatTimeout(), func(c context.Context) (struct{}, error) {
		return struct{}{}, pw.Warm(c, n)
	}, nil, nil); err != nil && !errors.Is(err, ErrClosed) {
		a.log.Debug("warming the store's connection pool failed", "err", err)
	}
}

// waitCalls waits until the store calls in flight returned, or d passed.
func (a *Agent) waitCalls(d time.Duration) {
	done := make(chan struct{})
	go func() {
		a.calls.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		a.log.Debug("closing with store calls in flight; they end at the client's own timeout")
	}
}
