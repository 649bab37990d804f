package trainer

import (
	"context"
	"errors"
	"time"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/sync"
)

// Members whose transport layout differs (Config.Sync's ChunkBytes,
// DirectBytes, Streams or Hierarchy): their round cannot connect, so the
// settings agreement (settings.go), which runs over the round's
// collectives, cannot compare them. sync.Connect's handshake does: its
// *sync.LayoutError names the settings with every rank's value and says
// which ranks share this worker's layout. Members of one layout reach one
// another, so at most one group is more than half of the round, and it is
// the job (as with strangers, strangers.go): each of its members reports
// the members that differ, which are evicted, and it trains on in the
// next round. A group of exactly half is the job when it holds the job's
// trained state. Every other member waits to be evicted (at most
// layoutWait) and stops with a *SettingsError: Refused names it when the
// job evicted it; when nobody did (a fresh job split evenly, or into
// groups none of which is a majority), nobody could be told to be the job,
// and every member stops with a SettingsError without Refused.
//
// A Connect cut short by the round's end (a report of the job's members
// landed first), or one that did not learn every peer's layout within
// Sync.LayoutGrace (a peer late on a loaded host), may hold only part of
// the picture: such a member that is not a majority by what it learnt
// rejoins instead (an ordinary failed round); if the job evicted it, its
// next Join says so (fenced), and it stops then, refused.

// layoutWait is how long a member outside the job's layout waits to be
// evicted: the majority's Connect gives up at most Sync.LayoutGrace after
// it met the mismatch, reports at once, and this member's Agent learns of
// its eviction at its next heartbeat, within a lease.
func (t *Trainer[B]) layoutWait() time.Duration {
	lease := t.cfg.Elastic.LeaseTTL
	if lease <= 0 {
		lease = elastic.DefaultLeaseTTL
	}
	return t.cfg.Sync.LayoutGrace() + lease
}

// mayEvictLayout reports whether this worker's layout group is the job:
// more than half of the round, or exactly half and holding the job's
// trained state.
func mayEvictLayout(le *sync.LayoutError, trained bool) bool {
	k := 1 + len(le.Agree)
	return 2*k > le.Size || (trained && 2*k == le.Size)
}

// layoutSettingsError turns a round's *sync.LayoutError into the
// SettingsError of the round's members.
func layoutSettingsError(world elastic.World, le *sync.LayoutError) *SettingsError {
	ids := make([]string, world.Size)
	for r, m := range world.Members {
		ids[r] = m.ID
	}
	se := &SettingsError{Round: world.Round}
	for _, d := range le.Diffs {
		se.Diffs = append(se.Diffs, SettingDiff{Setting: d.Setting, Values: d.Values, Members: ids})
	}
	return se
}

// judgeLayout ends a round whose Connect failed on a layout mismatch:
// the job's members evict the members that differ and train on
// (endRefused); the others wait to be evicted and stop with a
// *SettingsError (endFatal). cut says that the Connect was cut short by
// the round's end: a member that is not the job then rejoins
// (endFailure, with the SettingsError; see layoutRefused), as it does
// when it did not learn every peer's layout.
func (t *Trainer[B]) judgeLayout(ctx context.Context, agent *elastic.Agent, world elastic.World, le *sync.LayoutError, cut bool) (roundEnd, error) {
	se := layoutSettingsError(world, le)
	if mayEvictLayout(le, t.latest != nil) {
		for _, r := range le.Differ {
			if r >= 0 && r < len(world.Members) && r != world.Rank {
				se.Refused = append(se.Refused, world.Members[r].ID)
			}
		}
		t.log.Warn("refused members whose sync transport layout differs from the job's; training on without them",
			"round", world.Round, "refused", se.Refused, "err", se)
		t.reportMembers(ctx, agent, world.Round, se.Refused)
		return endRefused, nil
	}
	if cut || 1+len(le.Agree)+len(le.Differ) < le.Size {
		return endFailure, se
	}
	if t.waitEvicted(ctx, agent, t.layoutWait()) {
		se.Refused = []string{world.Members[world.Rank].ID}
	}
	return endFatal, se
}

// waitEvicted waits up to d for this worker's member to be evicted and
// reports whether it was. The Agent learns of an eviction at a heartbeat
// (or sooner from a hint), so its error is read at every change and every
// heartbeat interval.
func (t *Trainer[B]) waitEvicted(ctx context.Context, agent *elastic.Agent, d time.Duration) bool {
	every := t.cfg.Elastic.HeartbeatInterval
	if every <= 0 {
		every = elastic.DefaultHeartbeatInterval
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if err := agent.Err(); err != nil {
			return errors.Is(err, elastic.ErrFenced)
		}
		select {
		case <-agent.Changes():
		case <-tick.C:
		case <-deadline.C:
			return errors.Is(agent.Err(), elastic.ErrFenced)
		case <-ctx.Done():
			return false
		}
	}
}

// layoutRefused is Run's error on a worker fenced after a round that
// failed on a layout mismatch and was cut short (judgeLayout): the job
// evicted it, and se (that round's SettingsError) now names it refused.
func layoutRefused(se *SettingsError, self string) error {
	out := *se
	out.Refused = []string{self}
	return &out
}
