package faultinject_test

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
)

// Bugs found in other packages by this suite and its fuzz targets. Each
// test failed until the bug was fixed in its package (both in 95f234b);
// they stay as regression tests.

// Bug in optim.Adam: LoadState accepts a state that holds first moments
// (m) but no second moments (v: tensor count 0), and the next Step then
// indexes the nil v and panics (index out of range). Such state comes from
// a durable checkpoint or a peer's snapshot (its checksum does not protect
// against a crafted file or a faulty peer), so a worker crashes on input
// from disk or the network. Fix: LoadState must refuse m and v of
// different presence (ErrCorruptState), or Step must create the missing one.
func TestAdamStateWithMomentsHalfMissingIsRefused(t *testing.T) {
	params := []trainer.Param{{Name: "w", Shape: []int{3}, Value: []float32{1, 2, 3}, Grad: []float32{.1, .2, .3}}}
	a := optim.NewAdam(0.01)
	if err := a.Step(params); err != nil {
		t.Fatal(err)
	}
	state := a.AppendState(nil)
	// Layout: hyper-parameters and t, then the m tensor list, then the v
	// tensor list of the same size; a fresh Adam has two empty lists
	// (a uint32 count of 0 each).
	head := len(optim.NewAdam(0.01).AppendState(nil)) - 8
	half := (len(state) - head) / 2
	bad := binary.LittleEndian.AppendUint32(append([]byte(nil), state[:head+half]...), 0)

	b := optim.NewAdam(0.01)
	if err := b.LoadState(bad, params); err != nil {
		return // refused: fixed that way
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("Adam.Step panicked after LoadState accepted state with first but without second moments: %v", r)
		}
	}()
	_ = b.Step(params) // an error or a valid step, never a panic
}

// Bug in dataloader/redisqueue: Queue.Progress trusts the counters of the
// epoch's meta hash in Redis. A corrupt "acked" (here 99 of 3 shards) comes
// back as ShardProgress{Acked: 99, Pending: -96} without an error, so a
// caller's "epoch done" test (Pending == 0 && Leased == 0) or its progress
// display reads nonsense instead of learning that the store is corrupt.
// Fix: refuse counters outside 0..Total (and Acked+Leased > Total) with an
// error.
func TestRedisQueueProgressRefusesCorruptCounters(t *testing.T) {
	ctx := context.Background()
	c := testredis.Client(t)
	job := testredis.JobID(t)
	cfg := redisqueue.DefaultConfig()
	cfg.JobID = job
	cfg.Shards.DatasetLen, cfg.Shards.ShardSize = 10, 4
	q, err := redisqueue.New(c, cfg)
	require.NoError(t, err)
	s, err := q.Lease(ctx, 0, "w")
	require.NoError(t, err)
	require.NoError(t, q.Ack(ctx, s))
	meta := cfg.Prefix + "{" + job + "}:shards:0:meta"
	defer c.Del(ctx, meta, cfg.Prefix+"{"+job+"}:shards:0:leases", cfg.Prefix+"{"+job+"}:shards:0:state")
	require.NoError(t, c.HSet(ctx, meta, "acked", 99).Err())
	p, err := q.Progress(ctx, 0)
	if err == nil && (p.Acked > p.Total || p.Pending < 0) {
		t.Errorf("Progress returned %+v from a corrupt counter instead of an error", p)
	}
}
