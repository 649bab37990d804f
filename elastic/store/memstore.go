package store

import (
	"context"
	"sync"
	"time"
)

// Memory is a Store kept in process memory, with the same semantics as the
// Redis store (the same transitions, see core.go), for fast unit tests and
// for members that are goroutines of one process. Leases and key TTLs follow
// the store's clock (time.Now unless set with SetClock). SetClock, SetDown
// and Drop are for tests that drive time, outages and a store restarted
// empty. Safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	now      func() time.Time
	jobs     map[string]*memJob
	watchers map[string]map[*memWatcher]struct{}
	down     error
}

type memJob struct {
	coreJob
	expireAt int64 // ms; every key of the job shares this TTL
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{
		now:      time.Now,
		jobs:     map[string]*memJob{},
		watchers: map[string]map[*memWatcher]struct{}{},
	}
}

// SetClock replaces the store's clock (for tests that drive time).
func (s *Memory) SetClock(now func() time.Time) {
	s.mu.Lock()
	s.now = now
	s.mu.Unlock()
}

// SetDown makes every call fail with an *Error wrapping err (a simulated
// outage) until SetDown(nil).
func (s *Memory) SetDown(err error) {
	s.mu.Lock()
	s.down = err
	s.mu.Unlock()
}

// Drop deletes every key of a job, as a Redis restarted empty would.
func (s *Memory) Drop(jobID string) {
	s.mu.Lock()
	delete(s.jobs, jobID)
	s.mu.Unlock()
}

// job returns the job's data, or an empty job if it is missing or expired.
func (s *Memory) job(jobID string, nowMS int64) *memJob {
	j := s.jobs[jobID]
	if j != nil && nowMS >= j.expireAt {
		delete(s.jobs, jobID)
		j = nil
	}
	if j == nil {
		j = &memJob{}
	}
	return j
}

// commit stores the job back (if it has state), renews its TTL when asked,
// and notifies watchers of a visible change. Called with s.mu held.
func (s *Memory) commit(jobID string, j *memJob, nowMS int64, p Params, renew bool, c opCtx) {
	if j.st == nil {
		return
	}
	if renew || s.jobs[jobID] == nil {
		j.expireAt = nowMS + ms(p.StateTTL)
	}
	s.jobs[jobID] = j
	if c.changed {
		h := j.hint(c)
		for w := range s.watchers[jobID] {
			w.notify(h)
		}
	}
}

func (s *Memory) begin(ctx context.Context, op, jobID string) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, &Error{Op: op, JobID: jobID, Err: err}
	}
	if s.down != nil {
		return 0, &Error{Op: op, JobID: jobID, Err: s.down}
	}
	return s.now().UnixMilli(), nil
}

// Join implements Store.
func (s *Memory) Join(ctx context.Context, r JoinRequest) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, err := s.begin(ctx, "join", r.JobID)
	if err != nil {
		return View{}, err
	}
	j := s.job(r.JobID, now)
	v, changed := j.join(r, now)
	s.commit(r.JobID, j, now, r.Params, v.Code == CodeOK || v.Code == CodeFenced, changed)
	return wrapView(v, "join", r.JobID)
}

// Check implements Store.
func (s *Memory) Check(ctx context.Context, r MemberRequest) (View, error) {
	return s.memberOp(ctx, "check", r, func(j *memJob, now int64) (rawView, opCtx) { return j.check(r, now) })
}

// Report implements Store.
func (s *Memory) Report(ctx context.Context, r ReportRequest) (View, error) {
	return s.memberOp(ctx, "report", r.MemberRequest, func(j *memJob, now int64) (rawView, opCtx) { return j.report(r, now) })
}

// Leave implements Store.
func (s *Memory) Leave(ctx context.Context, r MemberRequest) (View, error) {
	return s.memberOp(ctx, "leave", r, func(j *memJob, now int64) (rawView, opCtx) { return j.leave(r, now) })
}

// Finish implements Store.
func (s *Memory) Finish(ctx context.Context, r MemberRequest) (View, error) {
	return s.memberOp(ctx, "finish", r, func(j *memJob, now int64) (rawView, opCtx) { return j.finish(r, now) })
}

func (s *Memory) memberOp(ctx context.Context, op string, r MemberRequest, f func(*memJob, int64) (rawView, opCtx)) (View, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, err := s.begin(ctx, op, r.JobID)
	if err != nil {
		return View{}, err
	}
	j := s.job(r.JobID, now)
	v, changed := f(j, now)
	s.commit(r.JobID, j, now, r.Params, v.Code == CodeOK || v.Code == CodeFenced, changed)
	return wrapView(v, op, r.JobID)
}

// Heartbeat implements Store.
func (s *Memory) Heartbeat(ctx context.Context, r MemberRequest) (Beat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, err := s.begin(ctx, "heartbeat", r.JobID)
	if err != nil {
		return Beat{}, err
	}
	j := s.job(r.JobID, now)
	b, changed := j.heartbeat(r, now)
	s.commit(r.JobID, j, now, r.Params, b.Code == CodeOK || b.Code == CodeFenced, changed)
	return b, nil
}

func wrapView(v rawView, op, jobID string) (View, error) {
	out, err := v.toView()
	if err != nil {
		return View{}, &Error{Op: op, JobID: jobID, Err: err}
	}
	return out, nil
}

// Watch implements Store.
func (s *Memory) Watch(ctx context.Context, jobID string) (Watcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: "watch", JobID: jobID, Err: err}
	}
	w := &memWatcher{s: s, jobID: jobID, c: make(chan Hint, 1)}
	if s.watchers[jobID] == nil {
		s.watchers[jobID] = map[*memWatcher]struct{}{}
	}
	s.watchers[jobID][w] = struct{}{}
	return w, nil
}

type memWatcher struct {
	s     *Memory
	jobID string
	c     chan Hint
	once  sync.Once
}

// notify is called with the store's mutex held, so sends are serialised.
func (w *memWatcher) notify(h Hint) { offer(w.c, h) }

func (w *memWatcher) C() <-chan Hint { return w.c }

func (w *memWatcher) Close() error {
	w.once.Do(func() {
		w.s.mu.Lock()
		delete(w.s.watchers[w.jobID], w)
		if len(w.s.watchers[w.jobID]) == 0 {
			delete(w.s.watchers, w.jobID)
		}
		w.s.mu.Unlock()
	})
	return nil
}
