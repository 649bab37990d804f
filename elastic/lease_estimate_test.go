package elastic

import (
	"testing"
	"time"
)

const msNs = int64(time.Millisecond)

// The lease end follows the store's stamp, not the round trip: after one
// fast reply fixed the clock offset, a reply that took 1.4 leases to come
// back (0.7 each way) still puts the lease end at the store's renewal plus
// the lease, on our clock.
func TestLeaseClockFollowsStoreStampNotRoundTrip(t *testing.T) {
	const ttl = time.Second
	offset := int64(5_000_000) * msNs // store clock = local + 5000 s
	var l leaseClock
	// Fast reply: sent at 100 ms, store ran it at 100.2 ms, back at 100.4 ms.
	until, jumped := l.observe(100*msNs, 100*msNs+400_000, (offset+100*msNs+200_000)/msNs, ttl)
	if jumped {
		t.Fatal("first reply reported a jump")
	}
	if want := int64(100*msNs) + int64(ttl); until < want-2*msNs || until > want+msNs {
		t.Fatalf("fast reply: lease end %v, want about %v", time.Duration(until), time.Duration(want))
	}
	// Slow reply: sent at 1000 ms, reached the store at 1700 ms, back at 2400 ms.
	until, jumped = l.observe(1000*msNs, 2400*msNs, (offset+1700*msNs)/msNs, ttl)
	if jumped {
		t.Fatal("slow reply reported a jump")
	}
	if want := int64(1700*msNs) + int64(ttl); until < want-2*msNs || until > want {
		t.Fatalf("slow reply: lease end %v, want %v (the store's renewal + lease), not %v (send + lease)",
			time.Duration(until), time.Duration(want), time.Duration(1000*msNs+int64(ttl)))
	}
	if l.expired(2500*msNs, ttl) {
		t.Fatal("lease counted as lapsed 0.8 s after the store renewed it")
	}
	if !l.expired(2701*msNs, ttl) {
		t.Fatal("lease not counted as lapsed 1.001 s after the store renewed it")
	}
}

// Without a stamp from a fast reply the estimate falls back to the send
// time: it is never later than the store's own deadline.
func TestLeaseClockConservativeWithoutFastSample(t *testing.T) {
	const ttl = time.Second
	var l leaseClock
	// Only slow replies: sent at 0, store at 700 ms, back at 1400 ms.
	until, _ := l.observe(0, 1400*msNs, 700, ttl)
	if until > int64(ttl) {
		t.Fatalf("lease end %v after send + lease: the store may already have dropped it", time.Duration(until))
	}
}

// A reply whose stamp contradicts the offset bounds (the store's clock
// jumped, as after a failover to a host whose clock differs) restarts the
// bounds, and the lease end follows the new clock even if it is earlier.
func TestLeaseClockStoreClockJump(t *testing.T) {
	const ttl = time.Second
	var l leaseClock
	l.observe(0, msNs, 10_000, ttl) // offset about 10 s
	before := l.until.Load()
	// 500 ms later the store says its clock is at 5 s: it went back 5.5 s.
	until, jumped := l.observe(500*msNs, 501*msNs, 5_000, ttl)
	if !jumped {
		t.Fatal("jump not detected")
	}
	if until != l.until.Load() || until < 500*msNs || until > 501*msNs+int64(ttl) {
		t.Fatalf("after the jump the lease end is %v (held %v)", time.Duration(l.until.Load()), time.Duration(before))
	}
}

// Clock drift within the allowance is no jump: a day of 50 ppm drift keeps
// the bounds consistent.
func TestLeaseClockDriftIsNoJump(t *testing.T) {
	const ttl = time.Second
	var l leaseClock
	day := int64(24 * time.Hour)
	for i := int64(0); i <= 24; i++ {
		local := i * day / 24
		store := local + local/20_000 // 50 ppm fast
		if _, jumped := l.observe(local, local+msNs/2, store/msNs, ttl); jumped {
			t.Fatalf("hour %d: drift of %v reported as a jump", i, time.Duration(local/20_000))
		}
	}
}

// A slow store call that finishes after a newer heartbeat does not move the
// lease end back (the smaller point of issue 14).
func TestLeaseClockNeverMovesBack(t *testing.T) {
	const ttl = time.Second
	var l leaseClock
	l.observe(0, msNs, 1_000, ttl) // offset bound fixed
	newer, _ := l.observe(900*msNs, 901*msNs, 1_900, ttl)
	l.extend(100*msNs + int64(ttl)) // a Check sent at 100 ms answers late
	if got := l.until.Load(); got != newer {
		t.Fatalf("lease end moved from %v to %v", time.Duration(newer), time.Duration(got))
	}
}

// A heartbeat sent while the lease held may still renew it: the lease does
// not count as lapsed while it awaits its answer. One sent after the
// estimated end (a resumed process) does not hold the verdict back.
func TestLeaseClockWaitsForHeartbeatInFlight(t *testing.T) {
	const ttl = time.Second
	var l leaseClock
	l.observe(0, msNs, 1_000, ttl) // lease ends at about 1 s
	l.sending(900 * msNs)
	if l.expired(1500*msNs, ttl) {
		t.Fatal("lapsed while a heartbeat sent at 0.9 s awaits its answer")
	}
	l.answered(900 * msNs) // it failed (timed out)
	if !l.expired(1500*msNs, ttl) {
		t.Fatal("not lapsed after the heartbeat in flight failed")
	}
	l.sending(1400 * msNs) // sent after the estimated end
	if !l.expired(1500*msNs, ttl) {
		t.Fatal("a heartbeat sent after the lease end held the verdict back")
	}
}
