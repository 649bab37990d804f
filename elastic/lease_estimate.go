package elastic

import (
	"sync"
	"sync/atomic"
	"time"
)

// leaseClock is the Agent's estimate, on its own monotonic clock, of when its
// lease expires in the store. It judges the lease from the store's own view:
// a renewal the store stamps with its clock (Beat.StoreTime) expires at that
// time plus LeaseTTL on the store's clock, and leaseClock maps store time to
// local time through bounds on the offset between the two clocks. The
// bounds come from every stamped reply, as in NTP's clock filter (RFC 5905,
// section 10; Cristian 1989): a call sent at local time s and answered at r
// ran in the store at some local time in [s, r], so the offset
// store - local lies in [stamp - r, stamp - s]; the intersection over all
// replies is kept, and it is as tight as the fastest round trip seen. Later
// round trips may be long (a slow link, a backlog of bulk writes ahead of
// the heartbeat) without moving the estimate: only the store's stamp counts.
//
// The estimate is conservative: it takes the upper bound of the offset, so
// the local deadline is never later than the true one by more than the
// drift allowance. Replies without a stamp (views of Join and Check) bound
// the lease by their send time plus LeaseTTL, which is safe to within the
// store clock's resolution (1 ms). The deadline only moves forward, except
// when the store's clock jumped (a failover to a host whose clock differs):
// then the bounds restart from the reply that showed the jump.
type leaseClock struct {
	until  atomic.Int64 // local ns since the Agent's start: estimated lease end (0 = none)
	oldest atomic.Int64 // 1 + send time (local ns) of the oldest heartbeat awaiting its answer; 0 = none

	flight []int64 // under mu: send times of heartbeats awaiting their answer, oldest first

	mu         sync.Mutex
	have       bool
	lo, hi     int64 // offset bounds (store ns - local ns)
	loAt, hiAt int64 // local ns when lo, hi were last set (drift allowance grows from there)
}

// leaseDrift is the allowance for the rate difference between the store's
// clock and the Agent's monotonic clock, in ns per ns (100 ppm: far above
// what quartz oscillators and NTP-slewed clocks show). The offset bounds
// widen by it as they age, so drift alone never makes them disagree.
const leaseDrift = 1e-4

// extend moves the estimated lease end to at least until (local ns).
func (l *leaseClock) extend(until int64) {
	for {
		cur := l.until.Load()
		if until <= cur || l.until.CompareAndSwap(cur, until) {
			return
		}
	}
}

// expired reports whether the lease may have lapsed in the store at now
// (local ns): the estimated lease end is behind now, and no heartbeat that
// was sent before it still awaits its answer. Such a heartbeat may have
// reached the store in time and renewed the lease; on a link whose latency
// is near the lease its answer comes back after the lease end it extends.
// The Agent waits for it (at most the heartbeat's deadline) before counting
// the lease as lapsed: latency is not death. A heartbeat sent after the
// estimated end (a process resumed after a pause, a partition) cannot save
// the lease and does not hold the verdict back.
func (l *leaseClock) expired(now int64, ttl time.Duration) bool {
	u := l.until.Load()
	if u == 0 {
		// Never renewed: fall back to "no renewal within a lease since start".
		u = int64(ttl)
	}
	if now <= u {
		return false
	}
	o := l.oldest.Load()
	return o == 0 || o-1 >= u
}

// sending records a heartbeat sent at sent (local ns); answered must follow
// when its answer arrived or the Agent gave up on it.
func (l *leaseClock) sending(sent int64) {
	l.mu.Lock()
	l.flight = append(l.flight, sent)
	l.oldest.Store(l.flight[0] + 1)
	l.mu.Unlock()
}

// answered removes the heartbeat sent at sent from those awaiting an answer.
func (l *leaseClock) answered(sent int64) {
	l.mu.Lock()
	for i, s := range l.flight {
		if s == sent {
			l.flight = append(l.flight[:i], l.flight[i+1:]...)
			break
		}
	}
	if len(l.flight) > 0 {
		l.oldest.Store(l.flight[0] + 1)
	} else {
		l.oldest.Store(0)
	}
	l.mu.Unlock()
}

// observe records a renewal the store stamped with storeMs (its clock, ms)
// for a call sent at sent and answered at recv (local ns since the Agent's
// start), and returns the new lease end (local ns) and whether the stamp
// contradicted the offset bounds held (the store's clock jumped).
func (l *leaseClock) observe(sent, recv, storeMs int64, ttl time.Duration) (until int64, jumped bool) {
	store := storeMs * int64(time.Millisecond)
	sLo := store - recv
	sHi := store + int64(time.Millisecond) - sent // TIME is truncated to the ms
	l.mu.Lock()
	if l.have {
		lo := l.lo - int64(leaseDrift*float64(recv-l.loAt))
		hi := l.hi + int64(leaseDrift*float64(recv-l.hiAt))
		if sLo > hi || sHi < lo {
			jumped = true
		} else {
			sLo, sHi = max(lo, sLo), min(hi, sHi)
		}
	}
	l.have = true
	l.lo, l.hi, l.loAt, l.hiAt = sLo, sHi, recv, recv
	until = store + int64(ttl) - sHi
	l.mu.Unlock()
	if jumped {
		l.until.Store(until)
	} else {
		l.extend(until)
	}
	return until, jumped
}
