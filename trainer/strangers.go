package trainer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
)

// Strangers: members with the job ID but another secret (a pod with a stale
// Secret). A round with one fails to connect; sync.Connect's *AuthError
// says which ranks proved the secret to this worker and which failed. Only
// members that hold the same secret prove it to one another, so at most one
// group of a round can be more than half of it. A worker in that group
// reports the members that failed, and they are evicted; the rest of the
// group trains on. A worker that nobody authenticated reports nobody: it
// waits to be evicted and then stops with ErrStranger.
//
// A worker that holds the job's trained state also reports when its group
// is exactly half of the round (one member of two, two of four): a stranger
// arriving at a running job with two members is evicted as before. A
// minority never reports, so strangers that share a wrong secret cannot
// evict the job's members; when neither side is a majority (one honest
// member and one stranger in a fresh job), every member gives up after
// MaxRecoveries rounds with ErrFailureBudget.
//
// The majority is the job even when it holds no trained state: more
// workers of another secret than of the job's in one round evict the job's
// (and resume from the last durable checkpoint). Nothing a worker can
// verify before authenticating says who holds state, and an unverified
// claim must not stop the majority.

// strangerWait is how long a worker that nobody authenticated waits, at
// least, for the members that authenticate one another to evict it before
// it rejoins (rejoining first would make their reports about a round that
// is over).
const strangerWait = time.Second

// authVerdict is what a round that failed authentication means for Run.
type authVerdict struct {
	auth     bool // the round failed authentication (a *sync.AuthError)
	reported bool // this worker reported the members that failed
	shutOut  bool // nobody proved the secret to this worker; some peer it dialed failed
}

// mayReportStrangers reports whether a worker may evict the members that
// failed authentication with it: it and the members that proved the secret
// to it are more than half of the round, or exactly half and it holds the
// job's trained state.
func mayReportStrangers(ae *sync.AuthError, trained bool) bool {
	k := 1 + len(ae.Proved)
	return 2*k > ae.Size || (trained && 2*k == ae.Size)
}

// judgeAuth handles a round that ended with rerr: when it failed
// authentication, it reports the members that failed if this worker may.
func (t *Trainer[B]) judgeAuth(ctx context.Context, agent *elastic.Agent, world elastic.World, rerr error) authVerdict {
	var ae *sync.AuthError
	if !errors.As(rerr, &ae) || ae.Round != world.Round || ae.Size != world.Size {
		return authVerdict{}
	}
	v := authVerdict{auth: true, shutOut: len(ae.Proved) == 0 && len(ae.Failed) > 0}
	if !mayReportStrangers(ae, t.latest != nil) {
		return v
	}
	for _, r := range ae.Failed {
		if r < 0 || r >= len(world.Members) || r == world.Rank {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := agent.ReportFailure(rctx, world.Round, world.Members[r].ID)
		cancel()
		if err != nil {
			t.log.Warn("failure report failed", "err", err)
			continue
		}
		t.log.Warn("reported a member that does not hold the job secret", "round", world.Round, "rank", r,
			"member", world.Members[r].ID, "authenticated", len(ae.Proved)+1, "world_size", world.Size)
		v.reported = true
	}
	return v
}

// pauseUnformed waits d before rejoining after a round that failed before
// a step, and a worker that was shut out at least strangerWait unless it is
// evicted sooner. A ctx error is returned.
func pauseUnformed(ctx context.Context, agent *elastic.Agent, d time.Duration, shutOut bool) error {
	if !shutOut {
		return sleepCtx(ctx, d)
	}
	tm := time.NewTimer(max(d, strangerWait))
	defer tm.Stop()
	for agent.Err() == nil { // evicted: Join returns ErrFenced at once
		select {
		case <-agent.Changes():
		case <-tm.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// strangerError is Run's error on a worker that was evicted after a round
// in which nobody authenticated it.
func (t *Trainer[B]) strangerError(unformed int) error {
	return &BudgetError{Unformed: unformed, Stranger: true, Last: slices.Clone(t.failures)}
}

// abandoned reports whether a round that failed before a step left this
// worker with nobody who could authenticate it: an earlier round of this
// run of failed rounds failed authentication with nobody on its side
// (doubted: it could report nobody), and this one, a pair, ended because
// the other member was lost while they connected (the round was
// superseded, errAbortChange, or the peer's connection failed other than
// by authentication). Of one worker and one stranger in a fresh job,
// neither may evict the other and the first to spend its budget leaves
// while the other's connect is in flight; that other counts the round and
// stops too (ErrFailureBudget), rather than rejoin alone below MinWorkers
// and wait out JoinTimeout. A pair that never failed authentication (a
// peer that crash-loops) is not stopped this way.
func abandoned(doubted bool, rerr error, size int) bool {
	if !doubted || size != 2 {
		return false
	}
	var ae *sync.AuthError
	var pe *sync.PeerError
	return !errors.As(rerr, &ae) && (errors.Is(rerr, errAbortChange) || errors.As(rerr, &pe))
}

// refuse is the side of the members that go on in a round whose settings
// agreement refused members (SettingsError.Refused, see
// ErrSettingsMismatch): like strangers, the refused are evicted (the
// lowest rank that goes on reports them, so the next round forms without
// waiting for them to leave by themselves, which they do), and the round
// ends before any state moved.
func (t *Trainer[B]) refuse(ctx context.Context, agent *elastic.Agent, world elastic.World, se *SettingsError) {
	reporter := -1
	for r, m := range world.Members {
		if !slices.Contains(se.Refused, m.ID) {
			reporter = r
			break
		}
	}
	t.log.Warn("refused members whose settings differ from the job's; training on without them",
		"round", world.Round, "refused", se.Refused, "err", se)
	if reporter != world.Rank {
		return
	}
	t.reportMembers(ctx, agent, world.Round, se.Refused)
}

// reportMembers reports the members ids as failed in round (each report
// bounded by 5 s); a report that fails is logged.
func (t *Trainer[B]) reportMembers(ctx context.Context, agent *elastic.Agent, round uint64, ids []string) {
	for _, id := range ids {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := agent.ReportFailure(rctx, round, id)
		cancel()
		if err != nil {
			t.log.Warn("failure report failed", "member", id, "err", err)
		}
	}
}
