package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/sync"
)

// Dynamic data shards (-dynamic): instead of the loader's fixed split of
// each global batch, every epoch's order is cut into shards leased from a
// queue in Redis (dataloader/redisqueue; DLRover's dynamic sharding), and
// each step every rank takes its share of the global batch from the shards
// it holds, leasing another when one runs out. The shares follow the
// ranks' measured speed (samples per second of their own compute, agreed
// through the step's allreduce, so every rank computes the same split):
// a slow worker takes fewer samples of each global batch, and the step no
// longer waits for it as long.
//
// Exactly once, across failures:
//
//   - The leases in progress, each with the next position to train, and
//     the shards consumed since the last commit are part of every commit
//     (gathered from all ranks by allgather). A shard is acked only once
//     every rank holds the commit that covers all of its samples (a barrier
//     after the commit), so an acked shard is never rolled back: no later
//     round can go on from an older commit.
//   - A new round re-acks the committed consumed shards (idempotent), hands
//     the committed leases in progress to its ranks (Renew keeps the token
//     alive), and its rank 0 revokes every other lease of the commit's
//     epoch and of the next one (dataloader.ShardReclaimer), before any
//     rank leases again (a barrier). Those leases were all taken after the
//     commit, by anyone, dead or alive (a survivor's own, a dead worker's,
//     the prefetch of a commit that failed), so none of their samples is
//     in the restored history: they go back to the queue at once, are
//     trained from the start by whoever leases them next, and the old
//     holder's late ack is refused (its token was revoked). Recovery thus
//     never waits for a dead worker's lease to expire.
//   - At every commit each rank first leases enough shards for the steps up
//     to the next commit, so that a step rarely waits for Redis.
//   - This assumes a failed round recovers within LeaseTTL (a committed
//     lease must not expire and be leased again before the next round
//     adopts it): keep -lease well above the detection time.

// dynState is the committed data state of -dynamic.
type dynState struct {
	// Gen is drawn when the job's state starts fresh; the queue's epochs
	// are numbered per generation, so a fresh start (e.g. after every
	// worker lost its state) never finds the acks of an abandoned history.
	Gen   uint32             `json:"gen"`
	Epoch int                `json:"epoch"`
	Open  []openShard        `json:"open"`
	Done  []dataloader.Shard `json:"done"`
}

// openShard is a lease in progress: the next position to train is Pos.
type openShard struct {
	S   dataloader.Shard `json:"s"`
	Pos int              `json:"pos"`
}

// shardQueue is what -dynamic needs of the queue: leases that a new round
// can revoke at once (redisqueue.Queue and dataloader.MemoryQueue).
type shardQueue interface {
	dataloader.ShardQueue
	dataloader.ShardReclaimer
}

// dyn is this rank's live dynamic-shard state.
type dyn struct {
	q         shardQueue
	cfg       dataloader.ShardConfig
	seed      uint64
	worker    string
	gen       uint32
	epoch     int
	order     []int
	mine      []openShard
	done      []dataloader.Shard
	lastRenew time.Time
	wait      bool // lease with LeaseWait (the last step trained nothing)
	log       *slog.Logger
	speed     []float64 // agreed samples/s per rank (EMA)
}

func (d *dyn) setEpoch(e int) {
	if e != d.epoch || d.order == nil {
		d.epoch, d.order = e, dataloader.Order(d.seed, e, d.cfg.DatasetLen)
	}
}

// qe is the queue's epoch number for the current epoch and generation.
func (d *dyn) qe() int { return d.qeOf(d.epoch) }

// qeOf is the queue's epoch number for epoch e of the current generation.
func (d *dyn) qeOf(e int) int { return int(d.gen%(1<<20))<<12 | e }

// install takes the committed state st for rank of size ranks at the start
// of a round; the live leases of this process not in st were taken after
// the commit and are dropped (startRound revokes them).
func (d *dyn) install(ctx context.Context, st dynState, rank, size int) error {
	d.gen = st.Gen
	d.setEpoch(st.Epoch)
	d.mine, d.done = nil, nil
	if rank == 0 {
		for _, s := range st.Done {
			if err := d.q.Ack(ctx, s); err != nil {
				return fmt.Errorf("acking committed shard %d of epoch %d: %w", s.Index, s.Epoch, err)
			}
		}
	}
	for i, o := range st.Open {
		if i%size == rank {
			d.mine = append(d.mine, o)
		}
	}
	d.speed = make([]float64, size)
	for i := range d.speed {
		d.speed[i] = 1
	}
	d.wait = false
	return d.renew(ctx)
}

// startRound takes the committed data state st at the start of a round on
// comm (collective: every rank of the round calls it before its first
// step).
func (d *dyn) startRound(ctx context.Context, comm sync.Synchronizer, st dynState) error {
	if err := d.install(ctx, st, comm.Rank(), comm.Size()); err != nil {
		return err
	}
	if comm.Rank() == 0 {
		// Every lease not in the commit was taken after it (see the top of
		// the file), in its epoch or, once every shard of that epoch was
		// acked, in the next one (a rank moves to the next epoch only at a
		// commit, so never beyond).
		keep := make([]dataloader.Shard, len(st.Open))
		for i, o := range st.Open {
			keep[i] = o.S
		}
		for _, e := range []int{d.epoch, d.epoch + 1} {
			n, err := d.q.Reclaim(ctx, d.qeOf(e), keep)
			if err != nil {
				return fmt.Errorf("revoking the leases taken after the commit: %w", err)
			}
			if n > 0 && d.log != nil {
				d.log.Info("revoked data shard leases taken after the restored commit", "epoch", e, "leases", n)
			}
		}
	}
	// Nobody leases before the leases to revoke are revoked.
	if err := comm.Barrier(ctx); err != nil {
		return fmt.Errorf("waiting for the revocation of leases: %w", err)
	}
	return nil
}

// renew extends every lease this rank holds (consumed ones too, until they
// are acked). A lease found lost (it expired and the shard was leased
// again: the recovery took longer than LeaseTTL) is dropped with a
// warning: its samples will be trained again by the new holder, which the
// audit reports as duplicates.
func (d *dyn) renew(ctx context.Context) error {
	keep := d.mine[:0]
	for _, o := range d.mine {
		s, err := d.q.Renew(ctx, o.S)
		if errors.Is(err, dataloader.ErrLeaseLost) {
			d.lost(o.S, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("renewing shard %d of epoch %d: %w", o.S.Index, o.S.Epoch, err)
		}
		o.S = s
		keep = append(keep, o)
	}
	d.mine = keep
	done := d.done[:0]
	for _, o := range d.done {
		s, err := d.q.Renew(ctx, o)
		if errors.Is(err, dataloader.ErrLeaseLost) {
			d.lost(o, err)
			continue
		}
		if err != nil {
			return fmt.Errorf("renewing shard %d of epoch %d: %w", o.Index, o.Epoch, err)
		}
		done = append(done, s)
	}
	d.done = done
	d.lastRenew = time.Now()
	return nil
}

func (d *dyn) lost(s dataloader.Shard, err error) {
	if d.log != nil {
		d.log.Warn("data shard lease lost (a recovery took longer than the lease TTL); its samples may be trained twice", "epoch", s.Epoch, "shard", s.Index, "err", err)
	}
}

func (d *dyn) renewIfDue(ctx context.Context) error {
	if time.Since(d.lastRenew) < d.cfg.LeaseTTL/4 {
		return nil
	}
	return d.renew(ctx)
}

// next returns this step's share of up to b samples (see take), renewing
// the leases first when they are due.
func (d *dyn) next(ctx context.Context, b int) (idx []int, epochDone bool, err error) {
	if err := d.renewIfDue(ctx); err != nil {
		return nil, false, err
	}
	return d.take(ctx, b)
}

// stepped takes the outcome of a step's allreduce: n samples trained by
// all ranks, doneRanks ranks that found the epoch done, and each rank's
// samples and compute seconds. It reports whether a commit is due now
// (besides the regular schedule): when the epoch ended, or when the step
// trained nothing (so the consumed shards are acked and the epoch can end).
func (d *dyn) stepped(n float64, doneRanks int, samples, seconds []float64) (commit bool) {
	d.observe(samples, seconds)
	d.wait = n == 0
	if doneRanks == len(d.speed) {
		d.setEpoch(d.epoch + 1) // every shard of the epoch is acked
		d.mine, d.done = nil, nil
		d.wait = false
		return true
	}
	return n == 0
}

// prepareCommit is the data part of a commit, before the model's:
// it leases shards for the steps up to the next commit (need samples of
// this rank) and gathers every rank's leases into the state to commit
// (collective on comm).
func (d *dyn) prepareCommit(ctx context.Context, comm sync.Synchronizer, need int) (dynState, error) {
	if err := d.prefetch(ctx, need); err != nil {
		return dynState{}, err
	}
	return d.gather(ctx, comm)
}

// committed is called once this rank's commit of the state from
// prepareCommit is done (collective on comm): once every rank of the round
// holds the commit (a barrier), it acks the shards the commit consumed.
// Acking after this rank's own commit alone loses samples: when a peer dies
// during the commit, a survivor whose commit failed holds only the
// previous one, the next round goes on from that, and the shards acked
// here would never be trained again although their last steps are rolled
// back. If the barrier fails, the next round's rank 0 acks them if the
// commit it restores is this one (install), and nobody does otherwise.
func (d *dyn) committed(ctx context.Context, comm sync.Synchronizer) error {
	if err := comm.Barrier(ctx); err != nil {
		return fmt.Errorf("waiting for every rank's commit: %w", err)
	}
	return d.ackDone(ctx)
}

// take returns the dataset indices of up to b samples from this rank's
// leases, leasing more as needed; epochDone is true when the queue says
// every shard of the epoch is acked and this rank holds nothing.
func (d *dyn) take(ctx context.Context, b int) (idx []int, epochDone bool, err error) {
	for len(idx) < b {
		if len(d.mine) == 0 {
			var s dataloader.Shard
			if d.wait {
				// Bounded, so a pending membership change is still taken
				// at the next step boundary.
				wctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
				s, err = dataloader.LeaseWait(wctx, d.q, d.qe(), d.worker, 100*time.Millisecond)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					err = &dataloader.BusyError{Epoch: d.qe()}
				}
			} else {
				s, err = d.q.Lease(ctx, d.qe(), d.worker)
			}
			switch {
			case errors.Is(err, dataloader.ErrEpochDone):
				return idx, len(idx) == 0, nil
			case errors.Is(err, dataloader.ErrNoShardFree):
				return idx, false, nil
			case err != nil:
				return idx, false, err
			}
			d.mine = append(d.mine, openShard{S: s, Pos: s.Lo})
		}
		o := &d.mine[0]
		n := min(b-len(idx), o.S.Hi-o.Pos)
		idx = append(idx, d.order[o.Pos:o.Pos+n]...)
		o.Pos += n
		if o.Pos >= o.S.Hi {
			d.done = append(d.done, o.S)
			d.mine = d.mine[1:]
		}
	}
	return idx, false, nil
}

// prefetch leases shards until this rank holds at least need untrained
// samples (or none are free), so that the steps up to the next commit
// rarely wait for the queue, and their leases are part of the coming
// commit (after a failure, the survivors adopt them).
func (d *dyn) prefetch(ctx context.Context, need int) error {
	have := 0
	for _, o := range d.mine {
		have += o.S.Hi - o.Pos
	}
	for have < need {
		s, err := d.q.Lease(ctx, d.qe(), d.worker)
		if errors.Is(err, dataloader.ErrEpochDone) || errors.Is(err, dataloader.ErrNoShardFree) {
			return nil
		}
		if err != nil {
			return err
		}
		d.mine = append(d.mine, openShard{S: s, Pos: s.Lo})
		have += s.Hi - s.Lo
	}
	return nil
}

// gather builds the committed state from every rank's leases (collective
// on comm).
func (d *dyn) gather(ctx context.Context, comm sync.Synchronizer) (dynState, error) {
	mine, err := json.Marshal(dynState{Gen: d.gen, Epoch: d.epoch, Open: d.mine, Done: d.done})
	if err != nil {
		return dynState{}, err
	}
	n := []float64{float64(len(mine))}
	if err := comm.AllReduceFloat64(ctx, n, sync.OpMax); err != nil {
		return dynState{}, err
	}
	rec := int(n[0]) + 4
	send := make([]byte, rec)
	binary.LittleEndian.PutUint32(send, uint32(len(mine)))
	copy(send[4:], mine)
	all := make([]byte, rec*comm.Size())
	ag, ok := comm.(sync.AllGatherer)
	if !ok {
		return dynState{}, errors.New("the synchronizer has no allgather")
	}
	if err := ag.AllGather(ctx, send, all); err != nil {
		return dynState{}, err
	}
	st := dynState{Gen: d.gen, Epoch: d.epoch}
	for r := 0; r < comm.Size(); r++ {
		b := all[r*rec : (r+1)*rec]
		l := int(binary.LittleEndian.Uint32(b))
		if l > rec-4 {
			return dynState{}, fmt.Errorf("rank %d sent a data state of %d bytes", r, l)
		}
		var part dynState
		if err := json.Unmarshal(b[4:4+l], &part); err != nil {
			return dynState{}, fmt.Errorf("rank %d's data state: %w", r, err)
		}
		st.Open = append(st.Open, part.Open...)
		st.Done = append(st.Done, part.Done...)
	}
	return st, nil
}

// ackDone acks the shards this rank consumed, once a commit covers them.
func (d *dyn) ackDone(ctx context.Context) error {
	for _, s := range d.done {
		if err := d.q.Ack(ctx, s); err != nil {
			return fmt.Errorf("acking shard %d of epoch %d: %w", s.Index, s.Epoch, err)
		}
	}
	d.done = nil
	return nil
}

// shares splits the global batch g over the ranks: each gets a floor of
// g/(8n) samples (at least 1, so a rank holding the last shard of an epoch
// always progresses), and the rest in proportion to the agreed speeds
// (largest remainder, so the shares sum to g exactly). Every rank computes
// the same split from the same speeds.
func shares(g int, speed []float64) []int {
	n := len(speed)
	floor := max(1, g/(8*n))
	if floor*n > g {
		floor = g / n
	}
	rest := g - floor*n
	total := 0.0
	for _, s := range speed {
		total += s
	}
	out := make([]int, n)
	type rem struct {
		r    int
		frac float64
	}
	var rems []rem
	sum := 0
	for r, s := range speed {
		x := float64(rest) * s / total
		out[r] = floor + int(math.Floor(x))
		sum += out[r]
		rems = append(rems, rem{r, x - math.Floor(x)})
	}
	for i := 1; i < len(rems); i++ { // insertion sort: by remainder desc, then rank
		for j := i; j > 0 && (rems[j].frac > rems[j-1].frac || (rems[j].frac == rems[j-1].frac && rems[j].r < rems[j-1].r)); j-- {
			rems[j], rems[j-1] = rems[j-1], rems[j]
		}
	}
	for i := 0; sum < g; i++ {
		out[rems[i%n].r]++
		sum++
	}
	return out
}

// observe updates the agreed speeds from the step's per-rank samples and
// compute seconds (exponential moving average; ranks that trained nothing
// keep theirs).
func (d *dyn) observe(samples, seconds []float64) {
	for r := range d.speed {
		if samples[r] > 0 && seconds[r] > 0 {
			d.speed[r] = 0.7*d.speed[r] + 0.3*(samples[r]/seconds[r])
			if d.speed[r] < 1 {
				d.speed[r] = 1
			}
		}
	}
}
