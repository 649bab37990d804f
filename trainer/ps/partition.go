package ps

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/paramserver"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// ErrNoRound is returned by Pull and Push outside a round (before the
// first Restore, after EndRound or a failed Restore).
var ErrNoRound = errors.New("ps: no parameter-server round")

// Config holds a Partition's settings. Start from DefaultConfig; New calls
// Validate.
type Config struct {
	// Name is the partition's name: the rendezvous endpoint under which
	// each worker advertises its parameter-server address, and the
	// partition's key in checkpoints. Default "ps".
	Name string
	// Tables are the embedding tables (see paramserver.TableSpec). Required; every
	// worker of the job must pass the same.
	Tables []paramserver.TableSpec
	// PS sets the parameter server's Mode (default paramserver.Sync),
	// MaxStaleness, FrameRows and Replicas (default 1: every commit of a
	// shard is kept in the memory of its host and of one other rank, on
	// another host when there is one). Its Store and KeepCommits are the
	// partition's own (Dir); values set there are ignored.
	PS paramserver.Config
	// Dir, when set, is a durable directory of the shards, shared by every
	// worker of the job (a local directory when they share a host, a
	// shared filesystem otherwise): every commit also writes each shard
	// there whole (with an fsync, on the training path), and checkpoints
	// link them (ckpt-*/) and are published synchronously. One job's
	// history per directory. Default "" (no shared filesystem): commits
	// live in the memory of the shards' hosts and replicas only; a round
	// restores a dead rank's rows from a live copy; a durable checkpoint
	// holds the shards themselves, encoded from memory, in the trainer's
	// CheckpointStore, written in the background; when a shard's host and
	// every replica died at once, the trainer rolls every rank back to the
	// last durable checkpoint (or, with none, Restore fails with
	// trainer.ErrPartitionLost).
	//
	// Deprecated: leave it empty; checkpoints need no shared directory
	// any more. It still works as before.
	Dir string
	// KeepTables makes rank 0 gather every row of the newest commit from
	// the shards' hosts at the end of each round (EndRound), so that
	// Tables can return the whole tables after Run without Dir (to
	// evaluate the model). It costs the tables' size in traffic and
	// memory on rank 0 per round end. Default false.
	KeepTables bool
	// KeepSteps is how many of the newest committed steps stay in Dir
	// (checkpoints are kept apart, see Checkpoints). At least 3, so that a
	// round never loses the commit it restores. Default 4.
	KeepSteps int
	// ListenAddr is where the parameter server's transport listens
	// (host:port; port 0 picks a free one). Default "127.0.0.1:0".
	ListenAddr string
	// Sync configures the parameter server's transport: JobID and Secret
	// (required, the job's), timeouts (OpTimeout bounds every pull, push,
	// commit and barrier), TLS. Default sync.DefaultConfig().
	Sync sync.Config
	// Checkpoints, when set, is the trainer's CheckpointStore (the one
	// given to trainer.WithCheckpointStore): the shards of every
	// checkpoint it lists are kept, so that a restart that finds the
	// newest checkpoint damaged can fall back to an older one. Default
	// nil: only the newest published checkpoint's shards (and later ones)
	// are kept.
	Checkpoints driver.CheckpointStore
	// Logger receives the partition's logs. Default: discard.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with the documented defaults; Tables, Dir
// and Sync.JobID and Sync.Secret must still be set.
func DefaultConfig() Config {
	return Config{Name: "ps", PS: paramserver.DefaultConfig(), KeepSteps: 4, ListenAddr: "127.0.0.1:0", Sync: sync.DefaultConfig()}
}

// Validate reports the first invalid field, wrapping trainer.ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: ps: "+format, append([]any{trainer.ErrInvalidConfig}, a...)...)
	}
	switch {
	case c.Name == "" || len(c.Name) > 64:
		return bad("Name %q must be 1..64 bytes", c.Name)
	case len(c.Tables) == 0:
		return bad("no Tables")
	case c.KeepSteps < 3:
		return bad("KeepSteps %d < 3", c.KeepSteps)
	case c.ListenAddr == "":
		return bad("ListenAddr is empty")
	}
	pc := c.PS
	pc.KeepCommits = max(pc.KeepCommits, 2)
	if err := pc.Validate(); err != nil {
		return fmt.Errorf("%w: ps: %w", trainer.ErrInvalidConfig, err)
	}
	for _, t := range c.Tables {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("%w: ps: %w", trainer.ErrInvalidConfig, err)
		}
	}
	if err := c.Sync.Validate(); err != nil {
		return fmt.Errorf("%w: ps: %w", trainer.ErrInvalidConfig, err)
	}
	return nil
}

// Partition is the parameter server's part on this worker: it implements
// driver.Partition, and gives the StepFunc the current round's Pull and
// Push. Every method is called from the trainer's loop goroutine (the
// StepFunc runs there too); Tables may be called after Run returned. Not
// safe for concurrent use otherwise.
type Partition struct {
	cfg        Config
	log        *slog.Logger
	store      *paramserver.DirShardStore
	view       *viewStore
	tablesHash string

	tables   [][]float32 // gathered at EndRound (KeepTables) at step tablesAt
	tablesAt int64

	restoredPeers, restoredStore int64   // rows, summed over the ranks of every round restored
	commitTime                   float64 // seconds in Commit
	ckptTime                     float64 // seconds in Checkpoint

	tr    *sync.Transport
	ps    *paramserver.Server
	round *paramserver.Round
	step  int64 // the shards' step: where the next Pull reads, the next Push applies
	rank  int   // in the last round restored
	size  int

	published int64 // the newest published checkpoint known (PartitionRound.Published, then this round's)
	pending   int64 // the step of this round's last Checkpoint, -1 none

	commits []commitRec // newest last
}

// commitRec maps a committed trainer step to the shards' step and layout.
type commitRec struct {
	step   int64  // the trainer's
	ps     int64  // the shards'
	shards int    // layout of the stored commit (0: find it in the store)
	round  uint64 // the round that took or restored it
}

// keepRecs bounds the commit records kept: more than the trainer's two
// commits, so a checkpoint of a slightly older commit still finds its own.
const keepRecs = 8

// New returns a Partition for cfg. It opens nothing yet (see Listen).
// Errors wrap trainer.ErrInvalidConfig, or report a Dir that cannot be
// created.
func New(cfg Config) (*Partition, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Partition{cfg: cfg, log: cfg.Logger, tablesHash: hashTables(cfg.Tables), published: -1, pending: -1, tablesAt: -1}
	p.cfg.Tables = slices.Clone(cfg.Tables)
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.view = &viewStore{}
	if cfg.Dir != "" {
		store, err := paramserver.NewDirShardStore(cfg.Dir, cfg.KeepSteps)
		if err != nil {
			return nil, fmt.Errorf("ps: %w", err)
		}
		p.store, p.view.dir = store, store
	}
	return p, nil
}

// hashTables identifies the table specs in manifests.
func hashTables(specs []paramserver.TableSpec) string {
	h := fnv.New64a()
	for _, t := range specs {
		fmt.Fprintf(h, "%q/%d/%d/%v;", t.Name, t.Rows, t.Dim, t.Optimizer.Kind)
	}
	return strconv.FormatUint(h.Sum64(), 16)
}

// Name implements driver.Partition.
func (p *Partition) Name() string { return p.cfg.Name }

// Listen implements driver.Partition: it opens the parameter server's
// transport and returns its address.
func (p *Partition) Listen(ctx context.Context) (string, error) {
	if p.tr != nil {
		return "", fmt.Errorf("%w: ps: Listen called twice", trainer.ErrInvalidConfig)
	}
	tr, err := sync.Listen(ctx, p.cfg.ListenAddr, p.cfg.Sync)
	if err != nil {
		return "", fmt.Errorf("ps: listen: %w", err)
	}
	pc := p.cfg.PS
	pc.Store, pc.KeepCommits = nil, 2
	if p.store != nil {
		pc.Store = p.view
	}
	ps, err := paramserver.New(tr, p.cfg.Tables, pc)
	if err != nil {
		tr.Close()
		return "", fmt.Errorf("ps: %w", err)
	}
	if p.store == nil {
		ps.SetRestoreSource(p.view) // a checkpoint's shards while Restore restores it; nothing else
	}
	p.tr, p.ps = tr, ps
	return tr.Addr(), nil
}

// Restore implements driver.Partition: it brings the tables to their value
// at r.Step, partitioned over r.World's ranks.
//
// The shards' step of r.Step comes from a commit record for Source
// "commit" (agreed over r.Comm: the ranks that committed it tell the
// others), from the manifests for "checkpoint" (every file verified against
// its size and SHA-256 before it is used), and is 0 for "init". Rank 0
// removes from Dir the commits of later steps (a rolled-back or abandoned
// history) and every rank forgets those it holds in memory. Then the round
// commits the restored step at once in its own layout, so that a rank lost
// before the next commit finds its rows on a replica (or in Dir).
//
// Errors: wrapping trainer.ErrPartitionLost when the rows of r.Step are on
// no live rank and nowhere in Dir, or the manifests or their files are
// damaged or of other tables; otherwise the round's errors (*sync.PeerError,
// sync.ErrTimeout, ...), which end the round.
func (p *Partition) Restore(ctx context.Context, r driver.PartitionRound) error {
	if p.ps == nil {
		return fmt.Errorf("%w: ps: Restore before Listen", trainer.ErrInvalidConfig)
	}
	p.closeRound()
	p.rank, p.size, p.published, p.pending = r.World.Rank, r.World.Size(), r.Published, -1
	var psStep int64
	switch r.Source {
	case "init":
		p.ps.ForgetCommitsAfter(-1)
		p.commits = nil
		psStep = -1 // for RemoveAfter: every step in Dir is another history's
	case "checkpoint":
		m, err := p.parseManifests(r.Step, r.Manifests)
		if err != nil {
			return fmt.Errorf("%w: %w", trainer.ErrPartitionLost, err)
		}
		psStep = m.psStep
		p.ps.ForgetCommitsAfter(-1)
		p.commits = nil
		p.view.set(m.psStep, m.shards, m.files)
		defer p.view.set(0, 0, nil)
	case "commit":
		var err error
		if psStep, err = p.agreeStep(ctx, r); err != nil {
			return err
		}
		p.ps.ForgetCommitsAfter(psStep)
		p.commits = slices.DeleteFunc(p.commits, func(c commitRec) bool { return c.step > r.Step || c.ps > psStep })
	default:
		return fmt.Errorf("%w: ps: unknown restore source %q", trainer.ErrInvalidConfig, r.Source)
	}
	if r.World.Rank == 0 && p.store != nil {
		if err := p.store.RemoveAfter(ctx, psStep); err != nil {
			return fmt.Errorf("ps: removing the commits of a rolled-back history: %w", err)
		}
	}
	psStep = max(psStep, 0)
	round, err := p.ps.Round(ctx, paramserver.World{World: r.World}, psStep)
	if err != nil {
		if errors.Is(err, paramserver.ErrRowsLost) || errors.Is(err, paramserver.ErrCorruptShard) {
			return fmt.Errorf("%w: step %d: %w", trainer.ErrPartitionLost, r.Step, err)
		}
		return fmt.Errorf("ps: round %d from step %d: %w", r.World.Round, r.Step, err)
	}
	p.round, p.step = round, psStep
	if err := p.countRestored(ctx, r); err != nil {
		return err
	}
	// Commit the restored step in this round's layout at once: its hosts
	// and replicas then hold it in memory (and Dir, if set), so a rank lost
	// before the round's first commit costs no rows even if the old
	// holders of a shard are lost too.
	if err := round.Commit(ctx, psStep); err != nil {
		return fmt.Errorf("ps: committing the restored step: %w", err)
	}
	p.record(commitRec{step: r.Step, ps: psStep, shards: round.Shards(), round: r.World.Round})
	p.log.Info("parameter-server round restored", "round", r.World.Round, "rank", r.World.Rank, "world_size", r.World.Size(),
		"step", r.Step, "ps_step", psStep, "source", r.Source, "shards", round.Shards())
	return nil
}

// countRestored adds the rows the round's ranks restored from memory and
// from Dir to the partition's totals (a sum over r.Comm), and logs the
// shards read from Dir: no live rank held them in memory.
func (p *Partition) countRestored(ctx context.Context, r trainer.PartitionRound) error {
	st := p.round.Stats()
	if len(st.StoreShards) > 0 && r.Source == "commit" {
		p.log.Warn("parameter-server shards restored from the shard directory: their host and every replica left", "round", r.World.Round,
			"step", r.Step, "old_shards", st.StoreShards, "rows", st.RestoredFromStore)
	}
	if r.Comm == nil {
		p.restoredPeers += st.RestoredFromPeers
		p.restoredStore += st.RestoredFromStore
		return nil
	}
	v := []float64{float64(st.RestoredFromPeers), float64(st.RestoredFromStore)}
	if err := r.Comm.AllReduceFloat64(ctx, v, sync.OpSum); err != nil {
		return fmt.Errorf("ps: counting the restored rows: %w", err)
	}
	p.restoredPeers += int64(v[0])
	p.restoredStore += int64(v[1])
	return nil
}

// Restored returns how many rows the rounds this process took part in
// restored, summed over their ranks: from commits in the ranks' memory
// (a live host or replica) and from Dir.
func (p *Partition) Restored() (peers, storage int64) { return p.restoredPeers, p.restoredStore }

// CommitSeconds returns the time this process spent in Commit, in seconds.
func (p *Partition) CommitSeconds() float64 { return p.commitTime }

// CheckpointSeconds returns the time this process spent in Checkpoint, in
// seconds: without Dir, encoding its shards from memory; with Dir,
// linking and reading back their files. (Result.CheckpointBlockedSeconds
// is the whole time checkpoints blocked training.)
func (p *Partition) CheckpointSeconds() float64 { return p.ckptTime }

// InlineCheckpoint implements driver.InlineCheckpointer: without Dir,
// Checkpoint's manifest holds this rank's shards themselves (encoded from
// the commit in memory), so the trainer writes the checkpoint in the
// background and the partition keeps nothing for it; with Dir it names
// files in Dir, which the trainer publishes synchronously.
func (p *Partition) InlineCheckpoint() bool { return p.store == nil }

// agreeStep returns the shards' step of the trainer's commit r.Step. Each
// rank that recorded that commit offers the round in which it took it; the
// ranks of the newest such round (one history: a member that was fenced
// and missed rounds may hold a record of the same step from a history
// since rolled back) then send its shards' step, the others nothing; two
// max-allreduces on r.Comm. A rank whose record lost drops its in-memory
// commits of that shards' step and later, which are another history's.
func (p *Partition) agreeStep(ctx context.Context, r driver.PartitionRound) (int64, error) {
	if r.Comm == nil {
		return 0, fmt.Errorf("%w: ps: restore of a commit without a Comm", trainer.ErrInvalidConfig)
	}
	const unknown = -math.MaxFloat64
	var mine *commitRec
	for i := range p.commits {
		if p.commits[i].step == r.Step {
			mine = &p.commits[i]
		}
	}
	v := []float64{unknown}
	if mine != nil {
		v[0] = float64(mine.round)
	} else if r.Step == 0 {
		v[0] = -1 // a fresh start: nothing was pushed before step 0
	}
	if err := r.Comm.AllReduceFloat64(ctx, v, sync.OpMax); err != nil {
		return 0, fmt.Errorf("ps: agreeing on the shards' step of step %d: %w", r.Step, err)
	}
	newest := v[0]
	v = []float64{unknown, unknown}
	switch {
	case mine != nil && float64(mine.round) == newest:
		v[0], v[1] = float64(mine.ps), -float64(mine.ps)
	case newest == -1:
		v[0], v[1] = 0, 0
	}
	if err := r.Comm.AllReduceFloat64(ctx, v, sync.OpMax); err != nil {
		return 0, fmt.Errorf("ps: agreeing on the shards' step of step %d: %w", r.Step, err)
	}
	switch {
	case newest == unknown || v[0] == unknown:
		return 0, fmt.Errorf("%w: no rank of round %d recorded the shards' step of commit %d", trainer.ErrPartitionLost, r.World.Round, r.Step)
	case v[0] != -v[1]:
		return 0, fmt.Errorf("ps: ranks of round %d recorded different shards' steps (%v..%v) for commit %d", r.World.Round, -v[1], v[0], r.Step)
	}
	psStep := int64(v[0])
	if mine != nil && (float64(mine.round) != newest || mine.ps != psStep) {
		p.ps.ForgetCommitsAfter(min(mine.ps, psStep) - 1)
		p.commits = nil
	}
	return psStep, nil
}

func (p *Partition) lastRec() *commitRec {
	if len(p.commits) == 0 {
		return nil
	}
	return &p.commits[len(p.commits)-1]
}

func (p *Partition) record(c commitRec) {
	p.commits = slices.DeleteFunc(p.commits, func(o commitRec) bool { return o.step == c.step })
	p.commits = append(p.commits, c)
	if len(p.commits) > keepRecs {
		p.commits = slices.Delete(p.commits, 0, len(p.commits)-keepRecs)
	}
}

// Pull fills every batch's Values with the current values of its rows
// (see paramserver.Round.Pull). Call it from the StepFunc. Errors: ErrNoRound,
// and the round's, after which the round is broken (return the error from
// the StepFunc).
func (p *Partition) Pull(ctx context.Context, batches ...paramserver.Rows) error {
	if p.round == nil {
		return ErrNoRound
	}
	defer trainer.Busy(ctx, "parameter server pull")() // waiting for shards is no hang
	return p.round.Pull(ctx, batches...)
}

// Push sends this rank's sparse gradients of the step (see
// paramserver.Round.Push): in PSSync mode exactly once per StepFunc call, also
// with no rows. Send the gradient of the loss you minimise, already
// scaled (e.g. divided by the global batch size). Errors: ErrNoRound, the
// round's, and in PSAsync mode paramserver.ErrStale (the round stays usable; the
// refusing shards dropped their part).
func (p *Partition) Push(ctx context.Context, grads ...paramserver.Rows) error {
	if p.round == nil {
		return ErrNoRound
	}
	defer trainer.Busy(ctx, "parameter server push")() // waiting for shards is no hang
	err := p.round.Push(ctx, grads...)
	if err == nil || (p.cfg.PS.Mode == paramserver.Async && errors.Is(err, paramserver.ErrStale) && p.round.Err() == nil) {
		p.step++
	}
	return err
}

// Stats returns the current round's traffic counters (zero outside a round).
func (p *Partition) Stats() paramserver.Stats {
	if p.round == nil {
		return paramserver.Stats{}
	}
	return p.round.Stats()
}

// Commit implements trainer.Partition: every shard keeps its rows at the
// current step in memory and sends the rows changed since the last commit
// to its replicas (and, with Dir, writes itself there whole); it returns
// once every shard of the round did.
func (p *Partition) Commit(ctx context.Context, step int64) error {
	if p.round == nil {
		return fmt.Errorf("ps: commit of step %d: %w", step, ErrNoRound)
	}
	start := time.Now()
	err := p.round.Commit(ctx, p.step)
	p.commitTime += time.Since(start).Seconds()
	if err != nil {
		return fmt.Errorf("ps: commit of step %d: %w", step, err)
	}
	p.record(commitRec{step: step, ps: p.step, shards: p.round.Shards(), round: p.round.Round()})
	return nil
}

// EndRound implements driver.Partition: a barrier of the parameter
// server's round (every rank's requests to this rank's shards are
// answered), then the round is closed.
func (p *Partition) EndRound(ctx context.Context) error {
	if p.round == nil {
		return nil
	}
	var err error
	// Only a commit this round's shards took is in their hosts' memory
	// in this round's layout.
	if c := p.lastRec(); p.cfg.KeepTables && p.rank == 0 && c != nil && c.round == p.round.Round() && c.shards == p.round.Shards() {
		if tabs, gerr := p.round.Gather(ctx, c.ps); gerr == nil {
			p.tables, p.tablesAt = tabs, c.ps
		} else {
			err = gerr
		}
	}
	if err == nil {
		err = p.round.Barrier(ctx)
	}
	p.closeRound()
	if err != nil {
		return fmt.Errorf("ps: end of round: %w", err)
	}
	return nil
}

func (p *Partition) closeRound() {
	if p.round != nil {
		p.round.Close()
		p.round = nil
	}
}

// Close implements driver.Partition: it closes the round, the parameter
// server and its transport. Dir stays.
func (p *Partition) Close() error {
	p.closeRound()
	if p.ps != nil {
		p.ps.Close()
	}
	if p.tr != nil {
		return p.tr.Close()
	}
	return nil
}

// LastCommit returns the trainer step of the newest commit this partition
// took or restored, and false when there is none.
func (p *Partition) LastCommit() (int64, bool) {
	if len(p.commits) == 0 {
		return 0, false
	}
	return p.commits[len(p.commits)-1].step, true
}

// Tables returns every row of every table at the newest commit this
// partition took or restored (see LastCommit), by table: Rows*Dim values,
// row r at [r*Dim, (r+1)*Dim). It reads Dir and this process's memory
// only (with KeepTables, rank 0's memory holds every row of the newest
// commit once a round ended), so it works once Run has returned (to
// evaluate the final model).
// Errors: ErrNoRound when nothing was committed, paramserver.ErrRowsLost,
// paramserver.ErrCorruptShard, I/O errors.
func (p *Partition) Tables(ctx context.Context) ([][]float32, error) {
	if len(p.commits) == 0 || p.ps == nil {
		return nil, fmt.Errorf("%w: nothing committed", ErrNoRound)
	}
	c := p.commits[len(p.commits)-1]
	if p.tables != nil && p.tablesAt == c.ps {
		return p.tables, nil
	}
	return p.ps.ReadTables(ctx, c.ps)
}

// randomSuffix names a checkpoint directory uniquely without agreement.
func randomSuffix() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ckptDirPrefix names checkpoint directories: ckpt-<step>-<random>.
const ckptDirPrefix = "ckpt-"

func parseCkptDir(name string) (int64, bool) {
	v, ok := strings.CutPrefix(name, ckptDirPrefix)
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(v, "-")
	if !ok {
		return 0, false
	}
	s, err := strconv.ParseInt(num, 10, 64)
	return s, err == nil && s >= 0
}

// listCkptDirs returns the checkpoint directories in Dir with their steps.
func (p *Partition) listCkptDirs() (map[string]int64, error) {
	ents, err := os.ReadDir(p.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	out := map[string]int64{}
	for _, e := range ents {
		if s, ok := parseCkptDir(e.Name()); ok && e.IsDir() {
			out[filepath.Join(p.cfg.Dir, e.Name())] = s
		}
	}
	return out, nil
}
