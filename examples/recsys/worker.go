package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/dataloader/redisqueue"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/examples/internal/launcher"
	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/trainer"
)

// The elastic loop below is the trainer's loop (package trainer) reduced to
// what this model needs, plus the parameter server: the trainer's commits
// are one snapshot per rank, broadcast from one rank on recovery, which
// cannot carry state partitioned over the ranks. Here each round:
//
//  1. joins the rendezvous and connects two transports: the Ring for the
//     dense allreduce and the parameter server's own;
//  2. agrees on the newest commit every survivor holds (step c), and
//     broadcasts the dense state of step c from the lowest rank holding it;
//  3. forms the parameter-server round restoring step c: rows move from
//     their old owners when alive, from the shard store otherwise, and are
//     re-partitioned over the round's ranks;
//  4. trains: pull the batch's rows, forward/backward, push the sparse
//     gradients (applied in sync mode once every worker pushed), allreduce
//     the dense gradients with the control values (loss, sample count, a
//     pending membership change), Adam on the dense part; commit every
//     -commit-every steps (the shards to the store, the dense state in
//     memory) and whenever the round is about to change.
//
// With -dynamic, the data shards' part of each of these (dynamic.go) is
// dyn.startRound, next, stepped, prepareCommit and committed;
// TestDynamicShardsSurviveFaults calls them in the same order.
//
// A failure anywhere (a dead peer seen on either transport) ends the round;
// survivors report the lost member and rejoin; the next round rolls back
// to step c, so the data cursor and the tables agree again.

// snapshot is a commit of the dense state; the parameter server keeps the
// shards' own commits of the same step.
type snapshot struct {
	step       int64
	recoveries int64
	cursor     []byte
	dense      []float32
	opt        []byte
	data       []byte // -dynamic: the JSON of the dynState
}

func (s *snapshot) encode() []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(s.step))
	b = binary.LittleEndian.AppendUint64(b, uint64(s.recoveries))
	for _, part := range [][]byte{s.cursor, f32Bytes(s.dense), s.opt, s.data} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(part)))
		b = append(b, part...)
	}
	return b
}

func decodeSnapshot(b []byte) (*snapshot, error) {
	if len(b) < 16 {
		return nil, errors.New("snapshot truncated")
	}
	s := &snapshot{step: int64(binary.LittleEndian.Uint64(b)), recoveries: int64(binary.LittleEndian.Uint64(b[8:]))}
	b = b[16:]
	var parts [4][]byte
	for i := range parts {
		if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) > len(b)-4 {
			return nil, errors.New("snapshot truncated")
		}
		n := int(binary.LittleEndian.Uint32(b))
		parts[i], b = b[4:4+n], b[4+n:]
	}
	s.cursor, s.opt, s.data = parts[0], parts[2], parts[3]
	if len(parts[1])%4 != 0 {
		return nil, errors.New("snapshot: bad dense length")
	}
	s.dense = make([]float32, len(parts[1])/4)
	for i := range s.dense {
		s.dense[i] = math.Float32frombits(binary.LittleEndian.Uint32(parts[1][4*i:]))
	}
	return s, nil
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

type worker struct {
	c      *config
	ev     *launcher.Emitter
	log    *slog.Logger
	test   []Sample
	model  *Model
	opt    *trainer.Adam
	loader *dataloader.Loader[Sample, []Sample]
	ringTr *sync.Transport
	ps     *sync.ParamServer
	agent  *elastic.Agent
	store  elastic.Store

	latest, prev *snapshot
	step         int64
	recoveries   int64
	cursor       dataloader.Cursor
	lastLoss     float64
	look         Lookup
	pulled       int64
	train        []Sample
	dyn          *dyn     // -dynamic
	data         dynState // -dynamic: the data state of the live commit
	audit        *os.File
	slow         time.Duration // injected compute time per sample
}

type roundEnd int

const (
	endFinished roundEnd = iota
	endRejoin
	endFailure
	endFatal
)

var errChange = errors.New("recsys: membership changed while waiting in a collective")

func runWorker(c *config, stderr io.Writer) int {
	ev := launcher.NewEmitter()
	fail := func(err error) int {
		ev.Emit(launcher.Event{Ev: "error", Message: err.Error()})
		fmt.Fprintf(stderr, "recsys worker %d: %v\n", os.Getpid(), err)
		return 1
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	secret, err := jobenv.Secret()
	if err != nil {
		return fail(err)
	}
	train, test := Generate(c.gen)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = c.batch, c.gen.Seed
	loader, err := dataloader.New[Sample, []Sample](dataloader.FromSlice(train),
		func(_ context.Context, s []Sample, _ []int) ([]Sample, error) {
			return append([]Sample(nil), s...), nil
		}, dcfg)
	if err != nil {
		return fail(err)
	}
	defer loader.Close()

	scfg := sync.DefaultConfig()
	scfg.JobID, scfg.Secret, scfg.OpTimeout = c.job, secret, 30*time.Second
	ringTr, err := sync.Listen(ctx, "127.0.0.1:0", scfg)
	if err != nil {
		return fail(err)
	}
	defer ringTr.Close()
	psTr, err := sync.Listen(ctx, "127.0.0.1:0", scfg)
	if err != nil {
		return fail(err)
	}
	defer psTr.Close()
	shards, err := sync.NewDirShardStore(c.shardDir, 3)
	if err != nil {
		return fail(err)
	}
	pcfg := sync.DefaultPSConfig()
	pcfg.Store = shards
	ps, err := sync.NewParamServer(psTr, Tables(c.gen.Users, c.gen.Items, c.dim, c.lr, c.gen.Seed), pcfg)
	if err != nil {
		return fail(err)
	}
	defer ps.Close()

	client := redis.NewClient(&redis.Options{Addr: c.redis, DialTimeout: 2 * time.Second})
	defer client.Close()
	store := elastic.NewRedisStore(client)
	w := &worker{c: c, ev: ev, log: log, test: test, model: NewModel(c.dim), opt: trainer.NewAdam(c.denseLR),
		loader: loader, ringTr: ringTr, ps: ps, store: store, train: train}
	if c.audit != "" {
		f, err := os.OpenFile(c.audit, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		w.audit = f
	}
	if c.slowWorker >= 0 && os.Getenv(launcher.EnvWorker) == fmt.Sprint(c.slowWorker) {
		w.slow = c.slowPerSample
	}
	if c.dynamic {
		scfg := dataloader.DefaultShardConfig()
		scfg.DatasetLen, scfg.ShardSize, scfg.LeaseTTL = len(train), c.shardSize, c.lease
		q, err := redisqueue.New(client, redisqueue.Config{Shards: scfg, JobID: c.job, KeyTTL: time.Hour})
		if err != nil {
			return fail(err)
		}
		w.dyn = &dyn{q: q, cfg: scfg, seed: c.gen.Seed, log: log}
	}
	w.agent, err = elastic.NewAgent(store, elastic.NewMember(ringTr.Addr()+"|"+psTr.Addr()), w.ecfg())
	if err != nil {
		return fail(err)
	}
	if w.dyn != nil {
		w.dyn.worker = w.agent.Member().ID
	}
	defer func() { w.agent.Close() }()
	if err := w.run(ctx, len(train)); err != nil {
		return fail(err)
	}
	return 0
}

func (w *worker) ecfg() elastic.Config {
	e := elastic.DefaultConfig()
	e.JobID, e.MinWorkers, e.MaxWorkers = w.c.job, w.c.min, w.c.max
	e.LeaseTTL, e.HeartbeatInterval, e.LastCall = w.c.detect, w.c.detect/6, time.Second
	return e
}

// run takes part in rounds until the job is finished.
func (w *worker) run(ctx context.Context, nTrain int) error {
	recovered, rounds := false, 0
	for {
		world, err := w.agent.Join(ctx)
		switch {
		case errors.Is(err, elastic.ErrFenced):
			w.log.Warn("fenced; rejoining as a new member", "err", err)
			addr := w.agent.Member().Addr
			w.agent.Close()
			w.latest, w.prev = nil, nil
			if w.agent, err = elastic.NewAgent(w.store, elastic.NewMember(addr), w.ecfg()); err != nil {
				return err
			}
			continue
		case errors.Is(err, elastic.ErrJobFinished):
			if rounds == 0 {
				// Over before this worker joined: an earlier run of
				// this job ID finished it.
				w.ev.Emit(launcher.Event{Ev: launcher.EvFinished})
			}
			return nil
		case err != nil:
			return fmt.Errorf("join: %w", err)
		}
		rounds++
		end, rerr := w.round(ctx, world, recovered, nTrain)
		switch end {
		case endFinished:
			fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if world.Rank == 0 {
				err = w.agent.Finish(fctx)
			} else {
				err = w.agent.Leave(fctx)
			}
			cancel()
			if err != nil && !errors.Is(err, elastic.ErrJobFinished) {
				w.log.Warn("leaving", "err", err)
			}
			return nil
		case endRejoin:
			recovered = false
		case endFailure:
			recovered = true
			w.log.Warn("round failed", "round", world.Round, "err", rerr)
			var pe *sync.PeerError
			var ae *sync.AuthError
			if errors.As(rerr, &ae) {
				// Members that failed authentication are evicted only by
				// the majority that proved the secret to one another: a
				// stranger must never report the job's members.
				if ae.Majority() {
					for _, r := range ae.Failed {
						if r < len(world.Members) && r != world.Rank {
							rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
							if err := w.agent.ReportFailure(rctx, world.Round, world.Members[r].ID); err != nil {
								w.log.Warn("failure report", "err", err)
							}
							cancel()
						}
					}
				}
			} else if errors.As(rerr, &pe) && !errors.Is(rerr, sync.ErrAborted) && !errors.Is(rerr, sync.ErrClosed) &&
				pe.Rank >= 0 && pe.Rank < len(world.Members) && pe.Rank != world.Rank {
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if err := w.agent.ReportFailure(rctx, world.Round, world.Members[pe.Rank].ID); err != nil {
					w.log.Warn("failure report", "err", err)
				}
				cancel()
			}
		default:
			return rerr
		}
	}
}

// round runs one round; see the comment at the top of the file.
func (w *worker) round(ctx context.Context, world elastic.World, recovered bool, nTrain int) (roundEnd, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	failure := func(err error) (roundEnd, error) {
		if c := context.Cause(rctx); errors.Is(c, errChange) {
			err = fmt.Errorf("%w: %w", c, err)
		}
		return endFailure, err
	}
	ringAddrs, psAddrs := make([]string, world.Size), make([]string, world.Size)
	for i, m := range world.Members {
		a, b, ok := strings.Cut(m.Addr, "|")
		if !ok {
			return endFatal, fmt.Errorf("member %s advertises %q, want ring|ps addresses", m.ID, m.Addr)
		}
		ringAddrs[i], psAddrs[i] = a, b
	}
	comm, err := w.ringTr.Connect(rctx, sync.World{Round: world.Round, Rank: world.Rank, Addrs: ringAddrs})
	if err != nil {
		return failure(fmt.Errorf("connect: %w", err))
	}
	defer comm.Close()
	stop := w.watch(cancel)
	defer stop()

	// Agree on the commit to continue from.
	none := -math.MaxFloat64
	v := []float64{none, 0}
	if w.latest != nil {
		v[0] = -float64(w.latest.step)
	}
	if recovered {
		v[1] = 1
	}
	if err := comm.AllReduceFloat64(rctx, v, sync.OpMax); err != nil {
		return failure(fmt.Errorf("agreement: %w", err))
	}
	recovered = v[1] > 0
	var root int
	var sn *snapshot
	source := "init"
	if v[0] > none {
		c := int64(-v[0])
		source = "commit"
		mine := none
		for _, s := range []*snapshot{w.latest, w.prev} {
			if s != nil && s.step == c {
				mine, sn = -float64(world.Rank), s
			}
		}
		u := []float64{mine}
		if err := comm.AllReduceFloat64(rctx, u, sync.OpMax); err != nil {
			return failure(fmt.Errorf("agreement: %w", err))
		}
		if u[0] == none {
			return endFatal, fmt.Errorf("no rank holds the agreed commit of step %d", c)
		}
		root = int(-u[0])
	} else if world.Rank == 0 {
		cur, _ := w.loader.NewCursor().MarshalBinary()
		var g [4]byte
		rand.Read(g[:])
		data, _ := json.Marshal(dynState{Gen: binary.LittleEndian.Uint32(g[:])})
		sn = &snapshot{cursor: cur, dense: NewModel(w.c.dim).Dense, opt: trainer.NewAdam(w.c.denseLR).AppendState(nil), data: data}
	}
	var blob []byte
	lenBuf := make([]byte, 8)
	if world.Rank == root {
		s := *sn
		if recovered {
			s.recoveries++
		}
		blob = s.encode()
		binary.LittleEndian.PutUint64(lenBuf, uint64(len(blob)))
	}
	if err := comm.Broadcast(rctx, lenBuf, root); err != nil {
		return failure(fmt.Errorf("state broadcast: %w", err))
	}
	if world.Rank != root {
		n := binary.LittleEndian.Uint64(lenBuf)
		if n > 1<<30 {
			return endFatal, fmt.Errorf("state of %d bytes announced", n)
		}
		blob = make([]byte, n)
	}
	if err := comm.Broadcast(rctx, blob, root); err != nil {
		return failure(fmt.Errorf("state broadcast: %w", err))
	}
	got, err := decodeSnapshot(blob)
	if err != nil {
		return endFatal, err
	}
	rolledBack := int64(0)
	if w.latest != nil {
		rolledBack = w.step - got.step
	}
	if err := w.install(got, world); err != nil {
		return endFatal, err
	}
	if w.dyn != nil {
		if err := w.dyn.startRound(rctx, comm, w.data); err != nil {
			return failure(fmt.Errorf("data shards: %w", err))
		}
	}
	w.auditf("R %d %d\n", world.Round, w.step)

	// The parameter server's round, rows restored to the same step.
	psr, err := w.ps.Round(rctx, sync.PSWorld{World: sync.World{Round: world.Round, Rank: world.Rank, Addrs: psAddrs}}, w.step)
	if err != nil {
		return failure(fmt.Errorf("parameter server: %w", err))
	}
	defer psr.Close()
	w.ev.Emit(launcher.Event{Ev: "round", Round: world.Round, Rank: world.Rank, WorldSize: world.Size, Step: w.step,
		Epoch: w.cursor.Epoch, Source: source, Recovery: recovered, RolledBack: rolledBack})

	dim, W := w.c.dim, world.Size
	// Control values summed by the allreduce: a pending membership change,
	// the loss, the samples, the dense gradients, how many ranks found the
	// epoch done (-dynamic), then each rank's samples and compute seconds.
	const cChange, cLoss, cN, cGrad = 0, 1, 2, 3
	cDone := cGrad + dim + 1
	cSamples, cCompute := cDone+1, cDone+1+W
	ctl := make([]float64, cCompute+W)
	for {
		var samples []Sample
		var indices []int
		var epoch int
		var next dataloader.Cursor
		epochDone := false
		if d := w.dyn; d != nil {
			if d.epoch >= w.c.epochs {
				return w.finish(rctx, comm, psr, world, nTrain)
			}
			epoch = d.epoch
			indices, epochDone, err = d.next(rctx, shares(w.c.batch, d.speed)[world.Rank])
			if err != nil {
				return failure(fmt.Errorf("data shards: %w", err))
			}
			samples = make([]Sample, len(indices))
			for i, x := range indices {
				samples[i] = w.train[x]
			}
		} else {
			b, err := w.loader.Next(rctx)
			if err != nil {
				return failure(fmt.Errorf("data: %w", err))
			}
			if b.Epoch >= w.c.epochs {
				return w.finish(rctx, comm, psr, world, nTrain)
			}
			samples, indices, epoch, next = b.Data, b.Indices, b.Epoch, b.Next
		}
		l := &w.look
		l.Prepare(samples, dim)
		if err := psr.Pull(rctx, sync.Rows{Table: tableUsers, IDs: l.Users, Values: l.UVals},
			sync.Rows{Table: tableItems, IDs: l.Items, Values: l.IVals}); err != nil {
			return failure(fmt.Errorf("step %d: pull: %w", w.step+1, err))
		}
		w.pulled += int64(len(l.Users) + len(l.Items))
		t0 := time.Now()
		loss := w.model.Backward(samples, l)
		if w.slow > 0 {
			time.Sleep(w.slow * time.Duration(len(samples))) // an injected slow machine
		}
		compute := time.Since(t0).Seconds()
		if !finite32(l.UGrad) || !finite32(l.IGrad) {
			// The shards refuse such a push, and every later round
			// would compute the same: the job cannot go on.
			return endFatal, fmt.Errorf("step %d: training diverged: the embedding gradients are not finite (loss %v); try a smaller -lr or -dense-lr", w.step+1, loss)
		}
		if err := psr.Push(rctx, sync.Rows{Table: tableUsers, IDs: l.Users, Values: l.UGrad},
			sync.Rows{Table: tableItems, IDs: l.Items, Values: l.IGrad}); err != nil {
			return failure(fmt.Errorf("step %d: push: %w", w.step+1, err))
		}
		clear(ctl)
		if w.agent.ChangePending() {
			ctl[cChange] = 1
		}
		ctl[cLoss], ctl[cN] = loss, float64(len(samples))
		for k, g := range w.model.Grad {
			ctl[cGrad+k] = float64(g)
		}
		if epochDone {
			ctl[cDone] = 1
		}
		ctl[cSamples+world.Rank], ctl[cCompute+world.Rank] = float64(len(samples)), compute
		if err := comm.AllReduceFloat64(rctx, ctl, sync.OpSum); err != nil {
			return failure(fmt.Errorf("step %d: allreduce: %w", w.step+1, err))
		}
		n := ctl[cN]
		if n > 0 {
			for k := range w.model.Grad {
				w.model.Grad[k] = float32(ctl[cGrad+k] / n)
			}
			if err := w.opt.Step(w.model.Params()); err != nil {
				return endFatal, err
			}
			w.lastLoss = ctl[cLoss] / n
		}
		w.step++
		w.auditf("S %d %d %d %d %s\n", world.Round, w.step, world.Rank, epoch, joinInts(indices))
		leaving := ctl[cChange] > 0
		due := leaving || w.step%int64(w.c.commitEvery) == 0
		if d := w.dyn; d != nil {
			if d.stepped(n, int(ctl[cDone]), ctl[cSamples:cSamples+W], ctl[cCompute:cCompute+W]) {
				due = true
			}
		} else {
			w.cursor = next
		}
		if due {
			if d := w.dyn; d != nil {
				st, err := d.prepareCommit(rctx, comm, w.c.commitEvery*shares(w.c.batch, d.speed)[world.Rank])
				if err != nil {
					return failure(fmt.Errorf("step %d: data state: %w", w.step, err))
				}
				w.data = st
			}
			if err := psr.Commit(rctx, w.step); err != nil {
				return failure(fmt.Errorf("step %d: commit: %w", w.step, err))
			}
			w.commit()
			if w.dyn != nil {
				if err := w.dyn.committed(rctx, comm); err != nil {
					return failure(fmt.Errorf("step %d: %w", w.step, err))
				}
			}
		}
		if leaving {
			// Every worker's commit requests must be answered before any
			// shard host closes its round.
			if err := comm.Barrier(rctx); err != nil {
				return failure(fmt.Errorf("step %d: barrier: %w", w.step, err))
			}
		}
		if world.Rank == 0 {
			w.ev.Emit(launcher.Event{Ev: "step", Round: world.Round, Rank: 0, WorldSize: world.Size, Step: w.step,
				Epoch: epoch, Loss: w.lastLoss, Samples: int(n),
				Extra: map[string]any{"shares": ctl[cSamples : cSamples+W]}})
		}
		if leaving {
			return endRejoin, nil
		}
	}
}

// finite32 reports whether every value of v is a finite number.
func finite32(v []float32) bool {
	for _, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return false
		}
	}
	return true
}

func joinInts(v []int) string {
	b := make([]byte, 0, 8*len(v))
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(x), 10)
	}
	if len(b) == 0 {
		return "-"
	}
	return string(b)
}

// watch cancels the round when a membership change stays pending for a
// while (a peer hung while this rank waits in a collective); planned
// changes are taken at the next step boundary well before.
func (w *worker) watch(cancel context.CancelCauseFunc) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		var since time.Time
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			if !w.agent.ChangePending() {
				since = time.Time{}
				continue
			}
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > 2*time.Second {
				cancel(errChange)
				return
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// install makes sn the live dense state and the latest commit.
func (w *worker) install(sn *snapshot, world elastic.World) error {
	var cur dataloader.Cursor
	if err := cur.UnmarshalBinary(sn.cursor); err != nil {
		return err
	}
	if len(sn.dense) != len(w.model.Dense) {
		return fmt.Errorf("dense state of %d values, model has %d", len(sn.dense), len(w.model.Dense))
	}
	copy(w.model.Dense, sn.dense)
	if err := w.opt.LoadState(sn.opt, w.model.Params()); err != nil {
		return err
	}
	if err := w.loader.Reset(cur, world.Rank, world.Size); err != nil {
		return err
	}
	w.data = dynState{}
	if len(sn.data) > 0 {
		if err := json.Unmarshal(sn.data, &w.data); err != nil {
			return fmt.Errorf("data state: %w", err)
		}
	}
	w.step, w.recoveries, w.cursor = sn.step, sn.recoveries, cur
	w.latest, w.prev = sn, nil
	return nil
}

// auditf appends a line to the exactly-once audit log, if any.
func (w *worker) auditf(format string, a ...any) {
	if w.audit != nil {
		fmt.Fprintf(w.audit, format, a...)
	}
}

// commit snapshots the dense state (the parameter server committed its
// shards of the same step just before).
func (w *worker) commit() {
	cur, _ := w.cursor.MarshalBinary()
	w.prev = w.latest
	data, _ := json.Marshal(w.data)
	w.latest = &snapshot{step: w.step, recoveries: w.recoveries, cursor: cur,
		dense: append([]float32(nil), w.model.Dense...), opt: w.opt.AppendState(nil), data: data}
}

// finish ends the job: a last commit, rank 0 evaluates on the test split
// (pulling every row), and a barrier keeps every shard up until it is done.
func (w *worker) finish(ctx context.Context, comm sync.Synchronizer, psr *sync.PSRound, world elastic.World, nTrain int) (roundEnd, error) {
	if err := psr.Commit(ctx, w.step); err != nil {
		return endFailure, fmt.Errorf("final commit: %w", err)
	}
	w.commit()
	var auc float64
	if world.Rank == 0 {
		var err error
		if auc, err = w.evaluate(ctx, psr); err != nil {
			return endFailure, fmt.Errorf("evaluate: %w", err)
		}
	}
	if err := comm.Barrier(ctx); err != nil {
		return endFailure, fmt.Errorf("final barrier: %w", err)
	}
	if world.Rank == 0 {
		w.ev.Emit(launcher.Event{Ev: "done", Rank: 0, Step: w.step, Epoch: w.c.epochs, Loss: w.lastLoss,
			Extra: map[string]any{"auc": auc, "oracle_auc": OracleAUC(w.test), "train": nTrain, "test": len(w.test),
				"pulled_rows": w.pulled, "recoveries": w.recoveries}})
	}
	return endFinished, nil
}

// evaluate pulls every user and item row and returns the test AUC.
func (w *worker) evaluate(ctx context.Context, psr *sync.PSRound) (float64, error) {
	d := w.c.dim
	all := func(n int) sync.Rows {
		r := sync.Rows{IDs: make([]int64, n), Values: make([]float32, n*d)}
		for i := range r.IDs {
			r.IDs[i] = int64(i)
		}
		return r
	}
	u, it := all(w.c.gen.Users), all(w.c.gen.Items)
	u.Table, it.Table = tableUsers, tableItems
	if err := psr.Pull(ctx, u, it); err != nil {
		return 0, err
	}
	scores := make([]float64, len(w.test))
	labels := make([]float32, len(w.test))
	for i, s := range w.test {
		scores[i] = w.model.Logit(u.Values[int(s.User)*d:int(s.User+1)*d], it.Values[int(s.Item)*d:int(s.Item+1)*d])
		labels[i] = s.Click
	}
	return AUC(scores, labels), nil
}
