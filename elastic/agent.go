package elastic

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elastictrain/elastictrain/elastic/store"
)

// Agent is one worker process's handle on the rendezvous of a job: one Agent
// per process per Member. It joins rounds (Join), keeps the member's lease
// alive from a background goroutine independent of the training loop, learns
// of membership changes (Pub/Sub hints plus polling through the heartbeat),
// and fences itself for good once evicted.
//
// All methods are safe for concurrent use, except that only one Join may run
// at a time. Close stops every goroutine the Agent started and waits for
// them.
type Agent struct {
	store  store.Store
	self   Member
	cfg    Config
	params store.Params
	log    *slog.Logger
	start  time.Time // origin of leaseAt (monotonic)

	mu       sync.Mutex
	inc      string // incarnation of the job state we are registered in
	order    int64
	since    uint64 // first round this member held a rank in (View.Since)
	maxRound uint64 // highest closed round seen
	world    World
	hasWorld bool
	view     store.View // last view seen
	viewAt   time.Time  // when view was taken (its reply arrived)
	lost     bool       // the store answered CodeLost; re-registration pending
	// superseded is an open hint newer than view: the store opened round
	// supRound (version supVer) of our incarnation after the round of our
	// World, so a change is pending without a store call to say so.
	supRound, supVer uint64
	// offer is a hint of a closed round newer than our World that ranks
	// us (a round re-formed after a loss counts its survivors as arrived):
	// the next Join takes its World from it without a store call.
	offer       store.Hint
	err         error
	outageSince time.Time
	outageLog   time.Time // when the outage was last logged
	outageErr   error     // the last failed call's error of the outage under way (checkBudget names it)
	outageCause error     // the outage's last error other than the agent's own deadline (outageErrorLocked)
	// The outage budget's clock (outage.go), under mu.
	lastOK      time.Time            // when a store call was last answered
	inFlight    map[uint64]time.Time // store calls in flight: their start
	callSeq     uint64
	budgetTimer *time.Timer   // fires at budgetAt (checkBudget)
	budgetAt    time.Time     // zero: the timer is not armed
	gaveUp      chan struct{} // closed when the Agent gave the store up (ErrStoreUnavailable)
	joining     bool
	started     bool
	leaving     bool            // Leave (or the progress watch's leave) is evicting this member
	leavers     map[string]bool // members of the round that leave gracefully (ExpectLeave); noteGone logs them at INFO

	lease    leaseClock    // when the lease ends in the store, on our clock
	rtt      rttEstimate   // the store link's round trip, from heartbeats (opTimeout)
	prog     progressWatch // the worker loop's progress (Config.ProgressTimeout)
	pending  atomic.Bool
	changes  chan struct{}
	joinWake chan joinWake // wake-ups of a waiting Join (capacity 1; the more telling one wins)

	calls       sync.WaitGroup // store calls in flight (bounded); Close waits for them
	callsClosed bool           // under mu: Close began, no new store call starts
	beatSlots   chan struct{}  // one token per heartbeat in flight (maxBeatsInFlight)
	jobLeases   atomic.Int64   // the job's lease count in the last renewal's reply (Beat.Leases)

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// NewAgent returns an Agent for member self (usually NewMember(addr)) over
// the store s (store.NewRedis, or store.NewMemory in one process). It
// validates cfg and self and starts nothing: the background goroutine
// starts with the first Join.
func NewAgent(s store.Store, self Member, cfg Config) (*Agent, error) {
	if s == nil {
		return nil, errors.New("elastic: nil Store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := self.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{
		store:  s,
		self:   self,
		cfg:    cfg,
		params: cfg.params(),
		// The job is the caller's attribute: a logger that serves
		// several jobs carries it already (trainer workers' loggers do),
		// and adding it here repeated it on every line.
		log:      log.With("member", self.ID),
		start:    time.Now(),
		changes:  make(chan struct{}, 1),
		joinWake: make(chan joinWake, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		gaveUp:   make(chan struct{}),
	}
	a.beatSlots = make(chan struct{}, maxBeatsInFlight(cfg))
	a.pending.Store(true)
	return a, nil
}

// Member returns the member this Agent joins as.
func (a *Agent) Member() Member { return a.self }

// World returns the last World returned by Join and whether there is one.
func (a *Agent) World() (World, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.world, a.hasWorld
}

// LastRound returns the highest closed round this Agent has seen (held,
// or announced by the store), or what SeeRound recorded; 0 before any.
// Safe for concurrent use.
func (a *Agent) LastRound() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxRound
}

// SeeRound records that this process already took part in round (under an
// earlier Agent, e.g. one that was fenced), so every round this Agent joins
// is numbered above it: Join hands the highest round seen to the store,
// which numbers the rounds it opens later above that hint. It matters when
// the store lost the newest rounds (restarted empty, or failed over to a
// replica that lagged): without it a new Agent could be given a round
// number its process had already used with another membership. Call it
// before Join; a round below one already seen does nothing. Safe for
// concurrent use.
func (a *Agent) SeeRound(round uint64) {
	a.mu.Lock()
	a.maxRound = max(a.maxRound, round)
	a.mu.Unlock()
}

// Err returns the Agent's terminal error (ErrFenced, ErrJobFinished,
// ErrStoreUnavailable, ErrClosed), or nil while it is usable.
func (a *Agent) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// ChangePending reports, without blocking or I/O, whether the trainer should
// leave the current round at the next step boundary and call Join again: the
// round is superseded (a member was evicted or left, or a peer called Join),
// joiners wait to be admitted, the store lost its state, this member's lease
// may have lapsed in the store, or the Agent hit a terminal error (Join then
// returns it). It is true before the first Join.
//
// The lease is judged from the store's view: each heartbeat reply carries
// the store's clock, which the Agent maps to its own (see Beat.StoreTime), so
// the lease counts as lapsed only once the last renewal the store
// acknowledged is older than LeaseTTL on the store's clock. Latency on the
// store link, or a backlog ahead of the heartbeats, does not turn it on as
// long as renewals reach the store within the lease; the Agent keeps several
// heartbeats in flight for that.
func (a *Agent) ChangePending() bool {
	if a.pending.Load() {
		return true
	}
	return a.lease.expired(int64(time.Since(a.start)), a.cfg.LeaseTTL)
}

// Changes returns a channel (capacity 1) that receives a value when
// ChangePending may have become true. It is a hint: read ChangePending for
// the truth. The channel is never closed.
func (a *Agent) Changes() <-chan struct{} { return a.changes }

func (a *Agent) notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// fail sets the terminal error (first one wins). Called with a.mu held.
func (a *Agent) failLocked(err error) {
	if a.err != nil {
		return
	}
	a.err = err
	a.log.Debug("agent stopped", "err", err)
	a.updatePendingLocked()
	a.wakeJoin(joinWake{})
}

// joinWake is what wakes a waiting Join: a hint, or a heartbeat's answer
// that the version moved (a zero Hint), which with closing set said that
// the forming round the Join waits in has closed.
type joinWake struct {
	h store.Hint
	// closing: the close's own hint, which brings the World, is on its
	// way; the Join re-reads the store only if it does not come
	// (closeWait).
	closing bool
}

// telling orders wake-ups by what they let a Join do without the store.
func (w joinWake) telling() int {
	switch {
	case w.h.Members != nil:
		return 3 // a World, perhaps
	case w.h.Round != 0:
		return 2
	case w.closing:
		return 1
	}
	return 0
}

// wakeJoin hands a wake-up to a waiting Join. Several goroutines may call
// it; an unread wake-up is replaced only by a more telling one (a plain
// version change by the hint that brings the World), so a heartbeat's
// answer never pushes that hint out.
func (a *Agent) wakeJoin(w joinWake) {
	for {
		select {
		case a.joinWake <- w:
			return
		default:
		}
		select {
		case old := <-a.joinWake:
			if old.telling() > w.telling() {
				w = old
			}
		default:
		}
	}
}

// fencedLocked handles the store's answer that this member is no longer
// registered: ErrFenced, unless this member is leaving. Then the answer is
// the leave's own effect, seen by a heartbeat or refresh that ran after the
// leave's script (the member evicted itself), and the leaver sets the
// terminal error itself (ErrClosed, or ErrFenced wrapping ErrNoProgress).
func (a *Agent) fencedLocked() {
	if a.leaving {
		a.log.Debug("not registered any more: this member is leaving")
		return
	}
	a.failLocked(fmt.Errorf("%w (job %q, member %s)", ErrFenced, a.cfg.JobID, a.self.ID))
}

func (a *Agent) fail(err error) {
	a.mu.Lock()
	a.failLocked(err)
	a.mu.Unlock()
}

// updatePendingLocked recomputes the ChangePending flag; called with a.mu held.
func (a *Agent) updatePendingLocked() {
	v := a.view
	p := a.err != nil || a.lost || !a.hasWorld ||
		v.Round != a.world.Round || v.Open || v.Pending > 0 || v.Role != store.RoleRanked ||
		a.supRound > a.world.Round
	if p && !a.pending.Swap(true) {
		a.notify(a.changes)
	} else if !p {
		a.pending.Store(false)
	}
}

// handleView records what a store call returned; called with a.mu held.
func (a *Agent) handleViewLocked(v store.View, sent time.Time) {
	switch v.Code {
	case store.CodeFenced:
		a.fencedLocked()
		return
	case store.CodeFinished:
		a.failLocked(ErrJobFinished)
		return
	case store.CodeLost:
		a.lost = true
		a.updatePendingLocked()
		return
	}
	a.lost = false
	if v.Order > 0 {
		a.order = v.Order
	}
	if v.Since > 0 {
		a.since = v.Since
	}
	if !v.Open {
		a.maxRound = max(a.maxRound, v.Round)
	}
	a.lease.extend(int64(sent.Sub(a.start) + a.cfg.LeaseTTL))
	// Calls run concurrently (Join, the background refresh): keep the newest
	// view; versions only grow within an incarnation, so a reply with a
	// lower version to a call sent before the held view arrived is an
	// older answer overtaken by a newer one. A lower version in reply to a
	// call sent after it means the store itself went back to an older
	// state of the same incarnation: it lost its latest writes (a failover
	// to a replica that had not received them). That view is the truth
	// now; holding on to the lost one would leave this member deaf to
	// every change until the versions caught up again.
	now := time.Now()
	switch {
	case v.Incarnation != a.inc || v.Version >= a.view.Version:
	case sent.After(a.viewAt):
		a.log.Warn("the store went back to an older state of the job (its latest writes were lost, e.g. by a failover to a replica that lagged); following it",
			"version", v.Version, "held_version", a.view.Version, "round", v.Round, "held_round", a.view.Round)
	default:
		a.updatePendingLocked()
		return
	}
	if v.Incarnation != a.inc || v.Version >= a.supVer {
		a.supRound, a.supVer = 0, 0 // the view is at least as new as the hint
	}
	a.inc = v.Incarnation
	a.view, a.viewAt = v, now
	a.updatePendingLocked()
}

func newIncarnation() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (a *Agent) joinRequest(arrive bool) store.JoinRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := store.JoinRequest{
		JobID:          a.cfg.JobID,
		Member:         a.self,
		Incarnation:    a.inc,
		NewIncarnation: newIncarnation(),
		RoundHint:      a.maxRound,
		Arrive:         arrive,
		Params:         a.params,
	}
	if a.hasWorld {
		r.HaveRound = a.world.Round
	}
	if a.inc != "" {
		// Used by the store only if our incarnation is gone: re-register
		// with our old order and ask it to wait for our old peers.
		r.Order, r.Since = a.order, a.since
		if a.hasWorld {
			for _, m := range a.world.Members {
				if m.ID != a.self.ID {
					r.Peers = append(r.Peers, m.ID)
				}
			}
		}
	}
	return r
}

func (a *Agent) memberRequest() store.MemberRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := store.MemberRequest{JobID: a.cfg.JobID, MemberID: a.self.ID, Incarnation: a.inc, Params: a.params}
	if a.hasWorld {
		r.HaveRound = a.world.Round // the store need not send that round's roster again
	}
	return r
}

// opTimeout bounds one store call other than a heartbeat: the link's
// retransmission-style timeout (rttEstimate), at least LeaseTTL/2 (and
// 100 ms), at most a heartbeat's deadline.
func (a *Agent) opTimeout() time.Duration {
	return a.rtt.timeout(max(a.cfg.LeaseTTL/2, 100*time.Millisecond), a.beatTimeout())
}

// noteOutage records a failed store call that started at started; it
// returns the terminal ErrStoreUnavailable once the outage lasted longer than
// OutageBudget. The outage clock starts at the start of the first failed
// call, not at its end (a call may take its whole timeout to fail), and
// any call that gets through stops it. unreadable, when not zero, is when
// the retried call's run of answers it could not read (ErrBadState)
// began: the budget runs from it too, as the heartbeats that get through
// meanwhile say nothing of that call. An ErrWrongType or ErrNoPermission
// is no outage: it is terminal at once.
func (a *Agent) noteOutage(err error, started, unreadable time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if permanent(err) {
		// Not an outage: the same call fails the same way until someone
		// deletes the key or grants the permission, so waiting out the
		// budget only hides it.
		if a.err == nil {
			a.failLocked(&permanentError{err: err})
			a.log.Error("the store refuses the job's calls for good; giving up", "err", err)
		}
		return a.err
	}
	now := time.Now()
	err = a.outageErrorLocked(err)
	a.outageErr = err
	if started.Before(a.lastOK) {
		// A call answered since this one started: the store was
		// reachable then, whatever this one met before.
		started = a.lastOK
	}
	if a.outageSince.IsZero() || started.Before(a.outageSince) {
		if a.outageSince.IsZero() {
			a.outageLog = now
			a.log.Warn("store unreachable; retrying", "err", err, "budget", a.cfg.OutageBudget)
		}
		a.outageSince = started
	} else if now.Sub(a.outageLog) >= logEvery {
		a.outageLog = now
		a.log.Warn("store still unreachable; retrying", "err", err,
			"for", now.Sub(a.outageSince).Round(time.Millisecond), "budget", a.cfg.OutageBudget)
	}
	since := a.outageSince
	if !unreadable.IsZero() && unreadable.Before(since) {
		since = unreadable
	}
	if now.Sub(since) > a.cfg.OutageBudget && a.err == nil {
		if since.Equal(unreadable) {
			a.giveUpLocked(fmt.Errorf("%w: answers it cannot read for longer than the outage budget of %v: %w", ErrStoreUnavailable, a.cfg.OutageBudget, err))
		} else {
			a.giveUpLocked(fmt.Errorf("%w: unreachable for longer than the outage budget of %v: %v", ErrStoreUnavailable, a.cfg.OutageBudget, err))
		}
		a.log.Error("store unreachable for the whole outage budget; giving up", "err", err, "budget", a.cfg.OutageBudget)
	}
	return a.err
}

func (a *Agent) noteOK() {
	a.mu.Lock()
	a.lastOK = time.Now()
	if !a.outageSince.IsZero() {
		a.log.Info("store reachable again", "after", time.Since(a.outageSince))
		a.outageSince = time.Time{}
	}
	a.outageErr, a.outageCause = nil, nil
	a.mu.Unlock()
}

// outageErrorLocked is the error an outage's lines and its final
// ErrStoreUnavailable name for a failed call's err. A call the agent's
// own deadline cut off (bounded) says nothing of why: when an earlier
// call of the same outage failed with a cause (a name that does not
// resolve, a refused connection, a server of another protocol), the
// error names that cause too, so that a loaded machine, where the cause
// may take longer than the deadline to arrive, still tells an operator
// what to fix. Called with a.mu held.
func (a *Agent) outageErrorLocked(err error) error {
	if !agentDeadline(err) {
		a.outageCause = err
		return err
	}
	if a.outageCause == nil {
		return err
	}
	return fmt.Errorf("%w (the outage's last cause: %v)", err, a.outageCause)
}

// agentDeadline reports whether err is a store call cut off by the
// agent's own deadline (bounded), not an error the store or the network
// returned.
func agentDeadline(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && errors.Is(se.Err, errAgentDeadline)
}

// call runs one store operation, retrying with exponential backoff (10 ms to
// 1 s) while the store is unreachable, within the outage budget. It records
// the view and returns it. A run of answers it cannot read (ErrBadState)
// spends the budget even while other calls get through (noteOutage); a
// call that only times out does not: a slow store is an outage only while
// nothing gets through.
func (a *Agent) call(ctx context.Context, op string, f func(context.Context) (store.View, error)) (store.View, error) {
	backoff := 10 * time.Millisecond
	var unreadable time.Time // start of this call's run of ErrBadState answers
	for {
		sent := time.Now()
		v, err := bounded(a, ctx, op, a.opTimeout(), f, nil, nil)
		if errors.Is(err, ErrClosed) {
			return store.View{}, err
		}
		if err == nil {
			a.noteOK()
			a.mu.Lock()
			a.handleViewLocked(v, sent)
			a.mu.Unlock()
			return v, nil
		}
		if ctx.Err() != nil {
			return store.View{}, ctx.Err()
		}
		if !errors.Is(err, ErrBadState) {
			unreadable = time.Time{}
		} else if unreadable.IsZero() {
			unreadable = sent
		}
		if terr := a.noteOutage(err, sent, unreadable); terr != nil {
			return store.View{}, terr
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return store.View{}, ctx.Err()
		case <-a.stop:
			t.Stop()
			return store.View{}, ErrClosed
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// ensureStarted subscribes to change hints and starts the background
// goroutine, once.
func (a *Agent) ensureStarted(ctx context.Context) {
	a.mu.Lock()
	if a.started {
		a.mu.Unlock()
		return
	}
	a.started = true
	a.mu.Unlock()
	w, err := a.watch(ctx)
	if err != nil {
		a.log.Warn("watch failed; relying on polling until it succeeds", "err", err)
		w = nil
	}
	go a.run(w)
}

// Join blocks until this member holds a rank in a closed round, and returns
// that round's World. The first call registers the member; a later call
// (made because ChangePending is true) takes part in the next round, together
// with the other survivors and any waiting joiners. Join waits at most
// Config.JoinTimeout.
//
// Errors: ErrFenced (this member was evicted; make a new Agent with a new
// Member), ErrJobFinished, ErrJoinTimeout, ErrStoreUnavailable, ErrClosed,
// or the ctx error (wrapped). Only one Join may run at a time per Agent.
func (a *Agent) Join(ctx context.Context) (World, error) {
	a.mu.Lock()
	if err := a.err; err != nil {
		a.mu.Unlock()
		return World{}, err
	}
	if a.joining {
		a.mu.Unlock()
		return World{}, errors.New("elastic: Join already running on this Agent")
	}
	a.joining = true
	a.mu.Unlock()
	defer func() {
		a.restProgress() // waiting for a round is not a hang
		a.mu.Lock()
		a.joining = false
		a.mu.Unlock()
	}()
	// Drop a stale wake-up left by an earlier round.
	select {
	case <-a.joinWake:
	default:
	}
	a.ensureStarted(ctx)
	// The round that replaced ours may already rank us (re-formed after a
	// loss, announced by a hint): take it without a store call.
	a.mu.Lock()
	offer := a.offer
	a.offer = store.Hint{}
	fresh := offer.Version >= a.view.Version // nothing newer seen since
	a.mu.Unlock()
	if offer.Members != nil && fresh {
		if w, ok := a.worldFromHint(offer); ok {
			return w, nil
		}
	}

	jctx, cancel := context.WithTimeout(ctx, a.cfg.JoinTimeout)
	defer cancel()
	fail := func(err error) (World, error) {
		switch {
		case errors.Is(err, ErrStoreUnavailable), errors.Is(err, ErrClosed):
			return World{}, err
		case ctx.Err() != nil:
			return World{}, fmt.Errorf("elastic: join: %w", ctx.Err())
		case jctx.Err() != nil:
			return World{}, fmt.Errorf("%w after %v", ErrJoinTimeout, a.cfg.JoinTimeout)
		}
		return World{}, err
	}
	join := func(c context.Context) (store.View, error) { return a.store.Join(c, a.joinRequest(true)) }
	check := func(c context.Context) (store.View, error) { return a.store.Check(c, a.memberRequest()) }

	v, err := a.call(jctx, "join", join)
	immediate := false // the previous call was an immediate re-arrival (at most one per wait)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var wl waitLog
	defer wl.done(a.log)
	var wait time.Duration
	var callAt time.Time // when a slow wait's store call is due; zero: none pending
	for {
		if err != nil {
			return fail(err)
		}
		wl.note(a.log, v, a.cfg)
		if terr := a.Err(); terr != nil {
			return World{}, terr
		}
		arrive := false
		switch {
		case v.Code == store.CodeLost:
			// The job state is gone (store restarted empty): register and
			// arrive again at once, keeping our order.
			if !immediate {
				immediate = true
				v, err = a.call(jctx, "join", join)
				continue
			}
			arrive = true
		case v.Role == store.RoleRanked && !v.Open:
			a.mu.Lock()
			if !a.hasWorld || v.Round != a.world.Round {
				w := World{JobID: a.cfg.JobID, Round: v.Round, Rank: v.Rank, Size: v.Size, Members: v.Members}
				a.noteGone(a.world, a.hasWorld, w)
				a.world, a.hasWorld = w, true
				a.updatePendingLocked()
				a.mu.Unlock()
				a.log.Debug("joined", "round", w.Round, "rank", w.Rank, "size", w.Size)
				return w, nil
			}
			a.mu.Unlock()
			arrive = true // still ranked in the round we hold: arrive for the next
		case v.Role == store.RoleExpected:
			// The round we were about to be given was superseded before we
			// saw it closed (a peer already opened the next one, expecting
			// us): arrive in the forming round at once.
			if !immediate {
				immediate = true
				v, err = a.call(jctx, "join", join)
				continue
			}
			arrive = true
		case v.Role == store.RoleNone:
			arrive = true // registered but not arrived (re-registered after a loss)
		}
		immediate = false
		if !callAt.IsZero() {
			// Woken only to log (below): the store call stays due when it was.
			goto sleep
		}
		wait = min(a.cfg.PollInterval, logEvery)
		if v.Wait > 0 && v.Wait < wait {
			wait = v.Wait + time.Millisecond
		}
		if slow := a.gatherReread(v); v.Code == store.CodeOK && v.Open && v.Role == store.RoleArrived {
			// Arrived in a round that waits for more members: apart from
			// its last-call deadline (Wait), nothing changes for us until
			// the job's version does (a close, an eviction, a new round),
			// and the Pub/Sub hint and the heartbeat's version poll both
			// wake this loop when it does. Re-reading the store every
			// PollInterval too would cost the store n calls per
			// PollInterval while n members gather; a slow re-read remains
			// as a safety net.
			wait = slow
			if v.Wait > 0 && v.Wait < slow {
				wait = v.Wait + time.Millisecond
			}
			// The wait's log lines (waitLog) must not wait for the slow
			// re-read: the view in hand is current (a change of the job's
			// version wakes this loop), so a line that falls due is
			// logged from it, without a store call.
			callAt = time.Now().Add(wait)
		}
	sleep:
		logOnly := false
		if !callAt.IsZero() {
			wait = time.Until(callAt)
			if due := wl.due(a.cfg); !due.IsZero() && a.log.Enabled(jctx, slog.LevelInfo) && due.Before(callAt) {
				wait, logOnly = time.Until(due), true
			}
		}
		timer.Reset(max(wait, 0))
		select {
		case <-jctx.Done():
			return fail(jctx.Err())
		case <-a.stop:
			return World{}, ErrClosed
		case jw := <-a.joinWake:
			h := jw.h
			if w, ok := a.worldFromHint(h); ok {
				return w, nil
			}
			if h.Version != 0 && h.Version <= v.Version && h.Members == nil && !jw.closing {
				continue // a change the view in hand already shows (an older hint, read late)
			}
			d := a.rereadSpread(v, h)
			if jw.closing {
				d = a.closeWait(v)
			}
			if d > 0 {
				// Every member gathering sees the same hint: their
				// re-reads go out spread over d, not in one burst.
				if at := time.Now().Add(d); callAt.IsZero() || at.Before(callAt) {
					callAt = at
				}
				continue
			}
		case <-timer.C:
			if logOnly {
				continue // note logs the line from the view in hand
			}
		}
		callAt = time.Time{}
		if arrive {
			v, err = a.call(jctx, "join", join)
		} else {
			v, err = a.call(jctx, "check", check)
		}
	}
}

// gatherReread is how long a Join that arrived in a forming round (v)
// waits before it re-reads the store when nothing woke it: the safety net
// behind the Pub/Sub hint and the heartbeat's version poll, which both
// wake it on a change. At least max(PollInterval, LeaseTTL/2), and
// gatherRereadFactor x n / MaxHeartbeatRate seconds for n members in the
// job, so a gathering's safety-net re-reads stay a fraction of its
// heartbeats whatever its size: at a fixed LeaseTTL/2 the 4096 members
// of a gathering re-read 2700 times a second, more than they beat, and
// saturated a bench's two cores until leases lapsed.
func (a *Agent) gatherReread(v store.View) time.Duration {
	slow := max(a.cfg.PollInterval, a.cfg.LeaseTTL/2)
	if per := a.cfg.perMember(max(v.Arrived, int(a.jobLeases.Load()))); per > 0 {
		slow = max(slow, gatherRereadFactor*per)
	}
	return slow
}

// gatherRereadFactor: the members of a gathering re-read the store at most
// MaxHeartbeatRate / gatherRereadFactor times a second together.
const gatherRereadFactor = 4

// rereadSpread is how long a Join waiting in a forming round (v: arrived,
// open) waits at random before it re-reads the store after hint h, when h
// names no round (a version moved: a peer evicted or registered): up to
// n / MaxHeartbeatRate seconds for n members in the job, at most
// LeaseTTL/3, so the n re-reads reach the store at about the job's
// heartbeat rate instead of n at once (at 4096 members such bursts, one
// per eviction, saturated Redis until more leases lapsed). 0: re-read at
// once (a hint that names a round, another state, or no rate bound).
func (a *Agent) rereadSpread(v store.View, h store.Hint) time.Duration {
	if h.Round != 0 || v.Code != store.CodeOK || !v.Open || v.Role != store.RoleArrived {
		return 0
	}
	spread := a.cfg.rateSpread(max(v.Arrived, int(a.jobLeases.Load())))
	if spread <= 0 {
		return 0
	}
	return time.Duration(1 + mrand.Int64N(int64(spread)))
}

// closeWait is how long a Join whose heartbeat said that its forming round
// closed waits for the close's hint (which brings its World) before it
// reads the store itself: LeaseTTL/3, plus the gathering's re-read spread
// (rereadSpread), so that a hint lost to every member (a Pub/Sub
// reconnect) still does not send n reads at once.
func (a *Agent) closeWait(v store.View) time.Duration {
	d := a.cfg.LeaseTTL / 3
	if spread := a.cfg.rateSpread(max(v.Arrived, int(a.jobLeases.Load()))); spread > 0 {
		d += time.Duration(mrand.Int64N(int64(spread)))
	}
	return d
}

// worldFromHint takes this member's World from a hint that announces a
// closed round, if the round is newer than the World held, of our
// incarnation, and has us as a member.
func (a *Agent) worldFromHint(h store.Hint) (World, bool) {
	if h.Members == nil {
		return World{}, false
	}
	rank := slices.IndexFunc(h.Members, func(m Member) bool { return m.ID == a.self.ID })
	a.mu.Lock()
	defer a.mu.Unlock()
	if rank < 0 || a.err != nil || h.Incarnation != a.inc || (a.hasWorld && h.Round <= a.world.Round) {
		return World{}, false
	}
	w := World{JobID: a.cfg.JobID, Round: h.Round, Rank: rank, Size: len(h.Members), Members: h.Members}
	// A round closes with no admissible pending joiner (extras beyond
	// MaxWorkers stay pending only when the round is full), so Pending is 0.
	a.view = store.View{Code: store.CodeOK, Incarnation: h.Incarnation, Version: h.Version, Round: h.Round,
		Role: store.RoleRanked, Rank: rank, Size: len(h.Members), Members: h.Members}
	if a.since == 0 {
		a.since = h.Round // the store recorded the same: the first round we held a rank in
	}
	a.view.Since = a.since
	a.viewAt = time.Now()
	a.maxRound = max(a.maxRound, h.Round)
	a.noteGone(a.world, a.hasWorld, w)
	a.world, a.hasWorld = w, true
	a.updatePendingLocked()
	a.log.Debug("joined (from hint)", "round", w.Round, "rank", w.Rank, "size", w.Size)
	return w, true
}

// ReportFailure reports that member memberID failed while both held ranks in
// round (typically: its collective connection closed without an abort). If
// round is still current, the store evicts that member at once and opens the
// next round, without waiting for its lease to lapse; ChangePending turns
// true for every survivor. A report about an older round, or about a member
// that already arrived in the next round, is ignored (nil error).
//
// Errors: ErrFenced (the reporter itself was evicted), ErrJobFinished,
// ErrStoreUnavailable, ErrClosed, a ctx error, or an error for an empty ID or
// an Agent that never joined.
func (a *Agent) ReportFailure(ctx context.Context, round uint64, memberID string) error {
	if memberID == "" {
		return errors.New("elastic: ReportFailure: empty member ID")
	}
	a.mu.Lock()
	err, inc := a.err, a.inc
	a.mu.Unlock()
	if err != nil {
		return err
	}
	if inc == "" {
		return errors.New("elastic: ReportFailure before Join")
	}
	req := store.ReportRequest{MemberRequest: a.memberRequest(), Round: round, Target: memberID}
	v, err := a.call(ctx, "report", func(c context.Context) (store.View, error) { return a.store.Report(c, req) })
	if err != nil {
		return fmt.Errorf("elastic: report failure of %s in round %d: %w", memberID, round, err)
	}
	switch v.Code {
	case store.CodeFenced, store.CodeFinished:
		return a.Err()
	}
	return nil
}

// Leave removes this member from the job at once (no lease wait): if it held
// a rank, the next round opens for the survivors. The Agent is unusable
// afterwards (ErrClosed); Close it. Leaving an already evicted member is not
// an error.
func (a *Agent) Leave(ctx context.Context) error {
	a.mu.Lock()
	err, inc := a.err, a.inc
	a.mu.Unlock()
	if errors.Is(err, ErrClosed) || errors.Is(err, ErrStoreUnavailable) {
		return err
	}
	if inc != "" && err == nil {
		req := a.memberRequest()
		a.mu.Lock()
		a.leaving = true
		a.mu.Unlock()
		if _, err := a.call(ctx, "leave", func(c context.Context) (store.View, error) { return a.store.Leave(c, req) }); err != nil {
			a.mu.Lock()
			a.leaving = false
			a.mu.Unlock()
			return fmt.Errorf("elastic: leave: %w", err)
		}
	}
	a.mu.Lock()
	a.err = nil // a fenced or finished member leaving is done as well
	a.failLocked(ErrClosed)
	a.mu.Unlock()
	return nil
}

// LeaveUnlessRanked is Leave for a member outside any round it knows of
// (its Join cancelled, or between rounds), unless the store already ranked
// it in a round that closed after the last World Join returned. A member
// waiting in Join has arrived in the forming round; a Join cancelled just
// after that round closed leaves it ranked there, and a Leave then would
// fail the round for the others while it forms (they would count a
// recovery where a member only left). In one store call
// (MemberRequest.KeepRanked) it leaves, or, when it is so ranked, stays
// and returns ranked true: the caller then calls Join, which returns that
// round at once without a store call, and leaves the round gracefully (at
// its first step boundary) instead. A member whose first Join call was cut
// off before any answer holds no incarnation to call with: its lease
// lapses, as before. Errors: those of Leave.
func (a *Agent) LeaveUnlessRanked(ctx context.Context) (ranked bool, err error) {
	a.mu.Lock()
	aerr, inc, have := a.err, a.inc, uint64(0)
	if a.hasWorld {
		have = a.world.Round
	}
	a.mu.Unlock()
	if aerr != nil || inc == "" {
		return false, a.Leave(ctx)
	}
	req := a.memberRequest()
	req.KeepRanked = true
	a.mu.Lock()
	a.leaving = true
	a.mu.Unlock()
	v, err := a.call(ctx, "leave", func(c context.Context) (store.View, error) { return a.store.Leave(c, req) })
	if err != nil {
		a.mu.Lock()
		a.leaving = false
		a.mu.Unlock()
		if errors.Is(err, ErrClosed) {
			return false, err
		}
		return false, fmt.Errorf("elastic: leave: %w", err)
	}
	if v.Code == store.CodeOK && v.Role == store.RoleRanked && !v.Open && v.Round > have && v.Members != nil {
		// The next Join takes this round from the offer, without a store
		// call (which, from a member that never held a World, would open
		// the next round instead).
		a.mu.Lock()
		a.leaving = false
		a.offer = store.Hint{Version: v.Version, Round: v.Round, Incarnation: v.Incarnation, Members: v.Members}
		a.mu.Unlock()
		return true, nil
	}
	a.mu.Lock()
	a.err = nil // a fenced or finished member leaving is done as well
	a.failLocked(ErrClosed)
	a.mu.Unlock()
	return false, nil
}

// Finish marks the job finished for every member: their ChangePending turns
// true and Join returns ErrJobFinished, as does any later Join with this job
// ID (for Config.StateTTL). Errors: ErrFenced, ErrStoreUnavailable,
// ErrClosed, a ctx error, or an error for an Agent that never joined.
func (a *Agent) Finish(ctx context.Context) error {
	a.mu.Lock()
	err, inc := a.err, a.inc
	a.mu.Unlock()
	if errors.Is(err, ErrJobFinished) {
		return nil
	}
	if err != nil {
		return err
	}
	if inc == "" {
		return errors.New("elastic: Finish before Join")
	}
	req := a.memberRequest()
	v, err := a.call(ctx, "finish", func(c context.Context) (store.View, error) { return a.store.Finish(c, req) })
	if err != nil {
		return fmt.Errorf("elastic: finish: %w", err)
	}
	if v.Code == store.CodeOK {
		a.fail(ErrJobFinished)
		return nil
	}
	if v.Code == store.CodeFinished {
		return nil
	}
	if err := a.Err(); err != nil {
		return err
	}
	return fmt.Errorf("elastic: finish: store answered %v", v.Code)
}

// Close stops the background goroutine and the change subscription and waits
// for them. Store calls the Agent gave up on at its own deadline but whose
// client has not returned yet (go-redis with ContextTimeoutEnabled off
// returns at its ReadTimeout) get at most LeaseTTL/2 more: a worker cut off
// from the store stops promptly, and such a call ends on its own within the
// client's timeout, holding nothing of the Agent. It does not leave the job (call Leave first for a graceful exit;
// without it the member's lease lapses after LeaseTTL). Later calls return
// ErrClosed; Close itself is idempotent and returns nil.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.fail(ErrClosed)
		close(a.stop)
		a.mu.Lock()
		started := a.started
		a.started = true // no goroutine may start after Close
		a.mu.Unlock()
		if started {
			<-a.done
		}
		a.mu.Lock()
		a.callsClosed = true
		a.stopBudgetLocked()
		a.mu.Unlock()
		a.waitCalls(a.opTimeout())
	})
	return nil
}

// run is the background goroutine: lease renewal every HeartbeatInterval
// (which also polls the job's version), and a state refresh on every change
// hint. Heartbeats do not wait for each other: a new one starts every
// HeartbeatInterval while fewer than maxBeatsInFlight are in flight, so a
// slow link delays renewals by its latency but does not space them out by
// its round trip. It exits on Close or on a terminal error other than a
// finished job, after the heartbeats it started returned.
func (a *Agent) run(w store.Watcher) {
	defer close(a.done)
	defer func() {
		if w != nil {
			_ = w.Close()
		}
	}()
	results := make(chan bool, cap(a.beatSlots))
	var beats sync.WaitGroup
	defer beats.Wait()
	inFlight := 0
	// The first heartbeat at a random point of an interval, half an
	// interval to one and a half after the start (the first Join, which
	// registers and so renews the lease itself): members started together
	// would otherwise beat together for the whole job, and a lapsed lease
	// is swept by the first call after it lapsed, so the job's beats in
	// step would find it up to a HeartbeatInterval late; spread over the
	// interval, n members find it within about HeartbeatInterval/n. Not
	// sooner than half an interval: a renewal just after the Join's renews
	// nothing (members gathering for a round of thousands over a second or
	// two spent most of their heartbeats so), and the lease, at least three
	// intervals, still has one and a half to spare.
	hi := int64(a.cfg.HeartbeatInterval)
	timer := time.NewTimer(time.Duration(hi/2 + 1 + mrand.Int64N(hi)))
	defer timer.Stop()
	warmTick := time.NewTicker(warmEvery)
	defer warmTick.Stop()
	warm := func() {
		beats.Add(1)
		go func() {
			defer beats.Done()
			a.warm()
		}()
	}
	warm()
	backoff := 10 * time.Millisecond
	var lastSent time.Time
	for {
		var hints <-chan store.Hint
		if w != nil {
			hints = w.C()
		}
		select {
		case <-a.stop:
			return
		case h := <-hints:
			a.onHint(h)
		case <-warmTick.C:
			warm()
		case ok := <-results:
			inFlight--
			if !ok && inFlight == 0 {
				// Retry soon (the store may be back), backing off.
				timer.Reset(min(backoff, a.cfg.HeartbeatInterval))
				backoff = min(2*backoff, time.Second)
			} else if ok {
				backoff = 10 * time.Millisecond
				// An answer may let the next beat go sooner than the
				// pacing chose when it knew less (beatGap).
				timer.Reset(max(time.Until(lastSent.Add(a.beatGap())), 0))
			}
			if err := a.Err(); err != nil {
				// Terminal: nothing left to renew. Close still waits for us.
				<-a.stop
				return
			}
		case <-timer.C:
			if a.checkProgress() {
				<-a.stop // terminal, as below
				return
			}
			if w == nil {
				if nw, err := a.watch(context.Background()); err == nil {
					w = nw
				}
			}
			select {
			case a.beatSlots <- struct{}{}: // released when the store call returns
				inFlight++
				lastSent = time.Now()
				beats.Add(1)
				go func() {
					defer beats.Done()
					ok := a.beat()
					// The slot is released when the store call returns,
					// before the refresh a beat may run, so more beats than
					// results' capacity can be finishing at once: once this
					// loop stopped reading (a terminal error, or Close),
					// a plain send would block them, and Close with them.
					select {
					case results <- ok:
					case <-a.stop:
					}
				}()
			default: // maxBeatsInFlight renewals still on the way
			}
			timer.Reset(a.beatGap())
		}
	}
}

// beatGap is the time from one heartbeat to the next: beatInterval, or
// more on a link whose round trip needs more heartbeats in flight than
// maxBeatsInFlight allows. Sent every HeartbeatInterval there, the
// heartbeats would fill every slot within a fraction of the round trip and
// then wait for the first answer, so they would reach the store in bursts
// with gaps of nearly a round trip between them (a 2 s lease with 1.4 s of
// latency each way lapsed so). Spaced over the round trip instead, they
// reach the store evenly: SRTT / (slots - 1) apart; before the first answer
// (or once the oldest heartbeat in flight is older than SRTT: the link got
// slower), the free slots are spread over the time already waited, which
// the round trip exceeds. At most LeaseTTL/2.
func (a *Agent) beatGap() time.Duration {
	d := a.beatInterval()
	slots := cap(a.beatSlots)
	srtt := a.rtt.smoothed()
	if slots > 1 {
		d = max(d, srtt/time.Duration(slots-1))
	}
	if o := a.lease.oldest.Load(); o != 0 {
		age := time.Duration(int64(time.Since(a.start)) - (o - 1))
		if srtt == 0 || age > srtt {
			free := max(slots-len(a.beatSlots), 1)
			d = max(d, age/time.Duration(free))
		}
	}
	return min(d, max(a.cfg.LeaseTTL/2, a.cfg.HeartbeatInterval))
}

// beatInterval is the time to the next heartbeat: HeartbeatInterval, or
// longer in a round too large for the job's heartbeat rate
// (Config.MaxHeartbeatRate), up to LeaseTTL/3.
func (a *Agent) beatInterval() time.Duration {
	a.mu.Lock()
	// The job's size as known: the round held, the closed round seen, or
	// the members arrived in a forming one (a round of thousands gathers
	// for a while, its members beating all along).
	n := max(a.world.Size, a.view.Size, a.view.Arrived)
	a.mu.Unlock()
	// And the leases held in the job, which every renewal reports: a
	// member that arrived early in a gathering of thousands learns so how
	// many gathered after it (its view counts those before it).
	return a.cfg.HeartbeatEvery(max(n, int(a.jobLeases.Load())))
}

// onHint handles a change hint: a waiting Join re-reads the state itself;
// otherwise refresh the view so ChangePending is current.
func (a *Agent) onHint(h store.Hint) {
	a.mu.Lock()
	joining, inc := a.joining, a.inc
	// A hint of a version this member has seen already says nothing new
	// (the view came from a store call after the change, or from the hint
	// of a close); a version hint carries no incarnation, so one of a new
	// incarnation with a lower version is missed here, and the heartbeat's
	// version poll (any other version) catches it.
	known := h.Version != 0 && h.Version <= a.view.Version
	if !joining && (known || a.supersededLocked(h)) {
		// The hint says all a refresh would: our round is over. Not reading
		// the store here saves a call per member on every change of a
		// large round; the next heartbeat still reads it if its version
		// moved on again.
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if joining {
		a.wakeJoin(joinWake{h: h})
		return
	}
	if inc != "" {
		a.refresh()
	}
}

// supersededLocked records a hint that supersedes the round of our World
// (same incarnation, a later round, newer than the view held) and reports
// whether it did: an open round, or a closed one that ranks us (kept as
// the offer the next Join takes). A closed round without us says less (we
// may wait as a joiner, or be fenced): the caller reads the store. Called
// with a.mu held.
func (a *Agent) supersededLocked(h store.Hint) bool {
	if h.Incarnation == "" || h.Incarnation != a.inc || !a.hasWorld || a.err != nil || a.lost ||
		h.Round <= a.world.Round || h.Version <= a.view.Version {
		return false
	}
	switch {
	case h.Open:
	case h.Members != nil && slices.ContainsFunc(h.Members, func(m Member) bool { return m.ID == a.self.ID }):
		if h.Version > a.offer.Version {
			a.offer = h
		}
	default:
		return false
	}
	if h.Version > a.supVer {
		a.supRound, a.supVer = h.Round, h.Version
	}
	a.updatePendingLocked()
	return true
}

// refresh re-reads the caller's view (a Check); errors count as outage.
func (a *Agent) refresh() {
	sent := time.Now()
	req := a.memberRequest()
	v, err := bounded(a, context.Background(), "check", a.opTimeout(),
		func(c context.Context) (store.View, error) { return a.store.Check(c, req) }, nil, nil)
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			_ = a.noteOutage(err, sent, time.Time{})
		}
		return
	}
	a.noteOK()
	a.mu.Lock()
	a.handleViewLocked(v, sent)
	lost := a.lost
	a.mu.Unlock()
	if lost {
		a.reregister()
	}
}

// beat renews the lease once, holding a slot of beatSlots until the store
// call returns; it reports whether the store answered.
func (a *Agent) beat() bool {
	release := func() { <-a.beatSlots }
	req := a.memberRequest()
	if req.Incarnation == "" {
		release()
		return true // not registered yet (first Join in flight)
	}
	sent := time.Now()
	sentNs := int64(sent.Sub(a.start))
	a.lease.sending(sentNs)
	b, err := bounded(a, context.Background(), "heartbeat", a.beatTimeout(),
		func(c context.Context) (store.Beat, error) { return a.store.Heartbeat(c, req) }, nil, release)
	if err != nil || b.Code != store.CodeOK {
		a.lease.answered(sentNs) // a renewal below moves the lease end first
	}
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			_ = a.noteOutage(err, sent, time.Time{})
		}
		return false
	}
	recv := time.Now()
	a.rtt.sample(recv.Sub(sent))
	a.noteOK()
	switch b.Code {
	case store.CodeOK:
		a.jobLeases.Store(int64(b.Leases))
		if b.StoreTime > 0 {
			if _, jumped := a.lease.observe(sentNs, int64(recv.Sub(a.start)), b.StoreTime, a.cfg.LeaseTTL); jumped {
				a.log.Info("the store's clock jumped (failover?); lease estimate restarted")
			}
		} else {
			a.lease.extend(sentNs + int64(a.cfg.LeaseTTL))
		}
		a.lease.answered(sentNs)
		a.mu.Lock()
		// A version an open hint already explained (supersededLocked)
		// needs no refresh.
		stale := (b.Version != a.view.Version && (a.supVer == 0 || b.Version != a.supVer)) || a.lost
		joining := a.joining
		// The forming round this member arrived in has closed: the close's
		// hint brings the World to every member of the round; a read of the
		// store by each as its heartbeat comes (thousands when a large
		// round closes) would only race it.
		closing := stale && !a.lost && b.Round != 0 && !b.Open && a.view.Code == store.CodeOK && a.view.Open &&
			a.view.Role == store.RoleArrived && a.view.Round == b.Round && a.view.Incarnation == b.Incarnation
		a.mu.Unlock()
		if stale {
			if joining {
				a.wakeJoin(joinWake{closing: closing})
			} else {
				a.refresh()
			}
		}
	case store.CodeFenced:
		a.mu.Lock()
		a.fencedLocked()
		a.mu.Unlock()
	case store.CodeFinished:
		a.fail(ErrJobFinished)
	case store.CodeLost:
		a.mu.Lock()
		a.lost = true
		a.updatePendingLocked()
		a.mu.Unlock()
		a.reregister()
	}
	return true
}

// reregister registers this member again after the job state was lost
// (Redis restarted empty), keeping its order and asking the store to wait
// for its old peers; the trainer's next Join then arrives.
func (a *Agent) reregister() {
	sent := time.Now()
	req := a.joinRequest(false)
	v, err := bounded(a, context.Background(), "join", a.opTimeout(),
		func(c context.Context) (store.View, error) { return a.store.Join(c, req) }, nil, nil)
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			_ = a.noteOutage(err, sent, time.Time{})
		}
		return
	}
	a.noteOK()
	a.mu.Lock()
	a.handleViewLocked(v, sent)
	a.mu.Unlock()
	a.log.Info("re-registered after the job state was lost", "round", v.Round)
}
