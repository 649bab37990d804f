package launch

import (
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
)

// ErrCapacity is Add's error when the workers would exceed what the
// capacity file allows (Config.CapacityFile).
var ErrCapacity = errors.New("launch: above the capacity")

// This file holds the supervisor's side of scaling: the capacity file's
// changes and the workers' control requests. Every function here runs on
// the supervisor goroutine.

// live counts the running workers that were not told to leave.
func (j *Job) live() int {
	n := 0
	for p := range j.running {
		if !p.released && !p.shrunk {
			n++
		}
	}
	return n
}

// want is the number of workers the job should run now: the goal, within
// the capacity and MaxWorkers.
func (j *Job) want() int {
	w := min(j.goal, j.cfg.MaxWorkers)
	if j.capacity > 0 {
		w = min(w, j.capacity)
	}
	return max(w, 0)
}

// ReleaseWait is how long, with Config.Autoscale, the launcher leaves the
// workers' own policy to shrink the job after the capacity dropped before
// it tells the newest workers above the capacity to leave itself: the
// policy reads the capacity every few steps (autoscale's decision
// interval, 25 steps by default: well under a second for the examples'
// models) and names the ranks that go (never one holding state no other
// holds); the workers it releases count toward the drop, so the job never
// loses more workers than the drop asks. Without Autoscale the launcher
// shrinks at once.
const ReleaseWait = 2 * time.Second

// setCapacity applies a new value of the capacity file.
func (j *Job) setCapacity(n int) {
	old := j.capacity
	j.capacity = n
	j.log.Info("capacity changed", "from", old, "to", n, "running", j.live(), "aim", j.goal)
	if j.stopping || j.finished {
		return
	}
	if j.cfg.Autoscale && j.live() > n {
		// The workers' policy shrinks first; what is left above the
		// capacity after ReleaseWait is the launcher's.
		if j.shrinkTimer == nil {
			j.shrinkTimer = time.NewTimer(ReleaseWait)
		} else {
			j.shrinkTimer.Reset(ReleaseWait)
		}
		j.shrinkTime = j.shrinkTimer.C
		return
	}
	j.reconcile("capacity")
}

// reconcile makes the workers running and not leaving match want: above
// the capacity, the newest get a SIGTERM (a graceful leave: they commit
// and go, and are not restarted); below want, workers start, on the
// indices of workers that left by release or a capacity drop first. It
// never stops workers merely for being above the goal: a Resize down is
// carried out by the workers the decision names (Release).
func (j *Job) reconcile(reason string) {
	live, want := j.live(), j.want()
	sc := Scale{From: live, Reason: reason, Capacity: j.capacity}
	switch {
	case j.capacity > 0 && live > j.capacity:
		var ps []*proc
		for p := range j.running {
			if !p.released && !p.shrunk {
				ps = append(ps, p)
			}
		}
		// Newest first: the workers that joined last hold the least
		// (nothing that the others do not hold after a commit).
		slices.SortFunc(ps, func(a, b *proc) int {
			if c := b.started.Compare(a.started); c != 0 {
				return c
			}
			return b.Worker - a.Worker
		})
		for _, p := range ps[:live-j.capacity] {
			p.shrunk = true
			j.log.Info("the capacity dropped: telling the newest worker to leave gracefully (SIGTERM)",
				"worker", p.Worker, "pid", p.PID, "capacity", j.capacity)
			j.signal(p, syscall.SIGTERM)
			sc.Leaving = append(sc.Leaving, p.Worker)
		}
	case live < want:
		n := want - live
		if j.capacity > 0 && len(j.running)-live > 0 {
			// Workers told to leave hold their share of the capacity
			// until they exit (they commit and checkpoint first): start
			// no more processes than it allows, and the rest as they
			// exit (handleExit reconciles again).
			if room := max(0, j.capacity-len(j.running)); room < n {
				j.log.Info("waiting for the workers still leaving before starting more", "leaving", len(j.running)-live,
					"capacity", j.capacity, "starting", room, "waiting", n-room)
				n = room
			}
		}
		for range n {
			i, restart := j.freeIndex()
			if i < 0 {
				j.log.Warn("cannot start more workers: Config.MaxWorkers indices are used", "max_workers", j.cfg.MaxWorkers)
				break
			}
			if err := j.spawn(i, restart); err != nil {
				j.log.Error("starting a worker failed", "worker", i, "reason", reason, "err", err)
				break
			}
			if restart == 0 {
				j.next++
			}
			delete(j.free, i)
			sc.Started = append(sc.Started, i)
		}
	}
	sc.To = live - len(sc.Leaving) + len(sc.Started)
	if sc.To != sc.From {
		j.log.Info("scaled the job", "reason", reason, "from", sc.From, "to", sc.To, "capacity", j.capacity,
			"started", sc.Started, "leaving", sc.Leaving)
		j.scaled(sc)
	}
}

// freeIndex returns the index and restart number of the next worker to
// start when the job grows: the lowest index whose last process left by
// release or a capacity drop (one restart higher), else a new index
// (restart 0); -1 when MaxWorkers indices are used.
func (j *Job) freeIndex() (int, int) {
	best := -1
	for i := range j.free {
		if best < 0 || i < best {
			best = i
		}
	}
	if best >= 0 {
		return best, j.procs[best].Restart + 1
	}
	if j.next >= j.cfg.MaxWorkers {
		return -1, 0
	}
	return j.next, 0
}

// scaled calls the OnScale hook.
func (j *Job) scaled(sc Scale) {
	if j.hooks.OnScale != nil {
		j.hooks.OnScale(sc)
	}
}

// control answers one request of the control socket.
func (j *Job) control(req controlRequest) controlReply {
	refuse := func(format string, a ...any) controlReply {
		msg := "launch: control: " + fmt.Sprintf(format, a...)
		j.log.Warn("control request refused", "op", req.Op, "why", msg)
		return controlReply{Error: msg}
	}
	switch req.Op {
	case "capacity":
		n := j.cfg.MaxWorkers
		if j.capacity > 0 {
			n = min(n, j.capacity)
		}
		return controlReply{Capacity: n, Bounded: true}
	case "resize":
		switch {
		case j.stopping:
			return refuse("resize to %d: the job is stopping", req.Target)
		case j.finished:
			return refuse("resize to %d: the job finished", req.Target)
		}
		old := j.goal
		j.goal = min(req.Target, j.cfg.MaxWorkers)
		j.log.Info("resize requested by a worker", "target", req.Target, "aim_from", old, "aim_to", j.goal,
			"running", j.live(), "capacity", j.capacity)
		j.reconcile("resize")
		return controlReply{Workers: j.want()}
	case "release":
		p := j.procs[req.Worker]
		if p == nil || p.Restart != req.Restart || !j.running[p] {
			return refuse("release: worker %d (restart %d) is not running", req.Worker, req.Restart)
		}
		if p.released {
			return controlReply{}
		}
		live := j.live()
		if !p.shrunk {
			j.goal = max(1, min(j.goal, live-1))
		}
		p.released = true
		j.log.Info("worker released by a scaling decision: it leaves gracefully and is not restarted",
			"worker", p.Worker, "pid", p.PID, "aim", j.goal)
		if !p.shrunk {
			j.scaled(Scale{From: live, To: live - 1, Reason: "release", Capacity: j.capacity, Leaving: []int{p.Worker}})
		}
		return controlReply{}
	}
	return refuse("unknown op %q", req.Op)
}

// closeScaling stops the capacity watcher and the control socket.
func (j *Job) closeScaling() {
	if j.shrinkTimer != nil {
		j.shrinkTimer.Stop()
	}
	if j.capw != nil {
		j.capw.close()
	}
	if j.ctl != nil {
		j.ctl.close()
	}
}

// leaveReason says why the launcher told p to leave.
func leaveReason(p *proc) string {
	if p.released {
		return "released by a scaling decision"
	}
	return "the capacity dropped"
}
