package paramserver

import (
	"context"
	"errors"
	"fmt"
	"github.com/elastictrain/elastictrain/sync/mesh"
	"hash/fnv"
	"math"
	"slices"
	gosync "sync"
)

// Parameter-server errors, in addition to the package's other sentinels.
var (
	// ErrStale: an asynchronous push was computed on rows pulled more than
	// Config.MaxStaleness shard updates ago; the shard refused it and
	// applied nothing of it. The round stays usable: pull again and
	// recompute.
	ErrStale = errors.New("paramserver: push too stale")
	// ErrRowsLost: the rows of a committed shard can be found neither on a
	// live host of the round nor in the ShardStore, so the table cannot be
	// restored to the requested step.
	ErrRowsLost = errors.New("paramserver: rows lost")
	// ErrCorruptShard: encoded shard bytes (from a ShardStore or a peer) did
	// not decode or do not match the tables.
	ErrCorruptShard = errors.New("paramserver: corrupt shard")
)

// Mode selects when a parameter server applies pushed gradients.
type Mode uint8

const (
	// Sync: every worker pushes once per step (possibly no rows) to every
	// shard; a shard sums the pushes of all workers for step t, in worker
	// rank order, applies the optimizer once per touched row and only then
	// serves pulls of step t+1. Results do not depend on timing.
	Sync Mode = iota
	// Async: a shard applies each push at once, counting updates; a push
	// computed on rows pulled more than Config.MaxStaleness updates ago
	// is refused with ErrStale (bounded staleness, as in the stale
	// synchronous parallel model of Ho et al., NIPS 2013).
	Async
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Sync:
		return "sync"
	case Async:
		return "async"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// SparseKind names a sparse optimizer algorithm.
type SparseKind uint8

// Sparse optimizers. Each updates only the rows present in a step's
// gradient; their state lives with the rows on the shards.
const (
	// SparseSGD: w -= LR * g, in float32. No state.
	SparseSGD SparseKind = iota + 1
	// SparseAdagrad (Duchi, Hazan & Singer, JMLR 2011): a += g*g;
	// w -= LR * g / (sqrt(a) + Eps), a starting at InitialAccumulator.
	// State: dim floats per row. A row without gradient is unchanged, so
	// it equals dense Adagrad. Arithmetic in float32.
	SparseAdagrad
	// SparseAdam (Kingma & Ba, ICLR 2015) in its lazy form (as TensorFlow's
	// LazyAdam and PyTorch's SparseAdam): a row's moments and its own step
	// count t advance only when the row has a gradient; m = B1*m + (1-B1)*g,
	// v = B2*v + (1-B2)*g*g, w -= LR * (m/(1-B1^t)) / (sqrt(v/(1-B2^t)) + Eps).
	// State: 2*dim+1 floats per row. Equal to dense Adam when every row has
	// a gradient at every step. Arithmetic in float64, stored as float32.
	SparseAdam
)

// String names the algorithm.
func (k SparseKind) String() string {
	switch k {
	case SparseSGD:
		return "sgd"
	case SparseAdagrad:
		return "adagrad"
	case SparseAdam:
		return "adam"
	}
	return fmt.Sprintf("SparseKind(%d)", uint8(k))
}

// SparseOptimizer configures the optimizer a shard applies to its rows.
// Build one with NewSparseSGD, NewSparseAdagrad or NewSparseAdam, which set
// the documented defaults.
type SparseOptimizer struct {
	// Kind is the algorithm. Required.
	Kind SparseKind
	// LR is the learning rate (step size), > 0.
	LR float64
	// Beta1 and Beta2 are Adam's decay rates of the first and second
	// moments, in [0, 1). Defaults 0.9 and 0.999.
	Beta1, Beta2 float64
	// Eps is added to the denominator of Adagrad and Adam, > 0. Default
	// 1e-8 (Adam) and 1e-10 (Adagrad).
	Eps float64
	// InitialAccumulator is Adagrad's starting sum of squares, >= 0.
	// Default 0.1 (as TensorFlow).
	InitialAccumulator float64
}

// NewSparseSGD returns plain SGD with learning rate lr.
func NewSparseSGD(lr float64) SparseOptimizer { return SparseOptimizer{Kind: SparseSGD, LR: lr} }

// NewSparseAdagrad returns Adagrad with learning rate lr, Eps 1e-10 and
// InitialAccumulator 0.1.
func NewSparseAdagrad(lr float64) SparseOptimizer {
	return SparseOptimizer{Kind: SparseAdagrad, LR: lr, Eps: 1e-10, InitialAccumulator: 0.1}
}

// NewSparseAdam returns lazy Adam with learning rate lr, Beta1 0.9, Beta2
// 0.999 and Eps 1e-8.
func NewSparseAdam(lr float64) SparseOptimizer {
	return SparseOptimizer{Kind: SparseAdam, LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
}

// StateDim returns the optimizer state in float32 values per row of a
// table of dim columns: 0 (SGD), dim (Adagrad), 2*dim+1 (Adam).
func (o SparseOptimizer) StateDim(dim int) int {
	switch o.Kind {
	case SparseAdagrad:
		return dim
	case SparseAdam:
		return 2*dim + 1
	}
	return 0
}

// Validate reports the first invalid field with an error wrapping ErrInvalid.
func (o SparseOptimizer) Validate() error {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case o.Kind < SparseSGD || o.Kind > SparseAdam:
		return fmt.Errorf("%w: unknown sparse optimizer %v", mesh.ErrInvalid, o.Kind)
	case !(o.LR > 0) || !finite(o.LR):
		return fmt.Errorf("%w: sparse optimizer LR %v must be positive", mesh.ErrInvalid, o.LR)
	}
	switch o.Kind {
	case SparseAdagrad:
		if !(o.Eps > 0) || !finite(o.Eps) || !(o.InitialAccumulator >= 0) || !finite(o.InitialAccumulator) {
			return fmt.Errorf("%w: Adagrad needs Eps > 0 and InitialAccumulator >= 0 (got %v, %v)", mesh.ErrInvalid, o.Eps, o.InitialAccumulator)
		}
	case SparseAdam:
		if !(o.Beta1 >= 0 && o.Beta1 < 1) || !(o.Beta2 >= 0 && o.Beta2 < 1) || !(o.Eps > 0) || !finite(o.Eps) {
			return fmt.Errorf("%w: Adam needs Beta1, Beta2 in [0,1) and Eps > 0 (got %v, %v, %v)", mesh.ErrInvalid, o.Beta1, o.Beta2, o.Eps)
		}
	}
	return nil
}

// TableSpec describes one embedding table: Rows rows of Dim float32 values,
// partitioned by row over the shards of a parameter server.
type TableSpec struct {
	// Name identifies the table in checkpoints; unique per parameter
	// server, at most 255 bytes.
	Name string
	// Rows is the number of rows (row IDs are 0..Rows-1), > 0.
	Rows int64
	// Dim is the number of float32 values per row, 1..65536.
	Dim int
	// Optimizer is applied by the shards to pushed gradients.
	Optimizer SparseOptimizer
	// InitScale: row values start uniform in [-InitScale, InitScale],
	// drawn from a hash of (Seed, table name, row, column), so every
	// process computes the same initial rows. Default 0 (zeros).
	InitScale float32
	// Seed seeds the initial values.
	Seed uint64
}

// Validate reports the first invalid field with an error wrapping ErrInvalid.
func (s TableSpec) Validate() error {
	switch {
	case s.Name == "" || len(s.Name) > 255:
		return fmt.Errorf("%w: table name %q must be 1..255 bytes", mesh.ErrInvalid, s.Name)
	case s.Rows <= 0 || s.Rows > 1<<40:
		return fmt.Errorf("%w: table %q has %d rows, want 1..2^40", mesh.ErrInvalid, s.Name, s.Rows)
	case s.Dim < 1 || s.Dim > 1<<16:
		return fmt.Errorf("%w: table %q has dim %d, want 1..65536", mesh.ErrInvalid, s.Name, s.Dim)
	case !(s.InitScale >= 0) || math.IsInf(float64(s.InitScale), 0):
		return fmt.Errorf("%w: table %q InitScale %v must be finite and >= 0", mesh.ErrInvalid, s.Name, s.InitScale)
	}
	if err := s.Optimizer.Validate(); err != nil {
		return fmt.Errorf("table %q: %w", s.Name, err)
	}
	return nil
}

// Config holds the settings of a Server. Start from
// DefaultConfig. Every process of a job must use the same Mode and
// MaxStaleness; Round checks it.
type Config struct {
	// Mode is Sync (default) or Async.
	Mode Mode
	// MaxStaleness (Async only) is how many updates a shard may have
	// applied since the pull a push was computed on; a staler push is
	// refused with ErrStale. Default 8.
	MaxStaleness int64
	// Replicas is how many ranks other than a shard's host keep a copy of
	// its commits in memory (ranks on other hosts first, see Round.Commit),
	// so that the rows of a rank that died come back from a live copy.
	// A commit sends each copy only the rows changed since the previous
	// commit. 0 keeps commits on their host only. Default 1.
	Replicas int
	// Store, when set, also receives every committed shard whole
	// (Round.Commit waits for it), so that a whole job can restart from it
	// onto any number of shards and a shard whose host and every replica
	// died can still be restored. Every process must see the same store
	// (e.g. a directory on a shared filesystem, see NewDirShardStore).
	// Default nil: commits live in the memory of the hosts and their
	// replicas only, and nothing on the training path touches a disk.
	Store ShardStore
	// KeepCommits is how many of the latest committed steps each process
	// keeps in memory to serve restores. At least 2, since ranks may be one
	// commit apart when a round fails. Default 2.
	KeepCommits int
	// FrameRows bounds the rows in one request frame; larger requests are
	// split and pipelined. 0 (the default) fits each frame within the
	// Transport's Config.MaxFrameBytes.
	FrameRows int
}

// DefaultConfig returns a Config with the documented defaults.
func DefaultConfig() Config {
	return Config{Mode: Sync, MaxStaleness: 8, KeepCommits: 2, Replicas: 1}
}

// Validate reports the first invalid field with an error wrapping ErrInvalid.
func (c Config) Validate() error {
	switch {
	case c.Mode != Sync && c.Mode != Async:
		return fmt.Errorf("%w: unknown Config.Mode %v", mesh.ErrInvalid, c.Mode)
	case c.MaxStaleness < 0:
		return fmt.Errorf("%w: Config.MaxStaleness %d is negative", mesh.ErrInvalid, c.MaxStaleness)
	case c.KeepCommits < 2:
		return fmt.Errorf("%w: Config.KeepCommits %d, want at least 2", mesh.ErrInvalid, c.KeepCommits)
	case c.Replicas < 0 || c.Replicas > 1<<16:
		return fmt.Errorf("%w: Config.Replicas %d, want 0..65536", mesh.ErrInvalid, c.Replicas)
	case c.FrameRows < 0:
		return fmt.Errorf("%w: Config.FrameRows %d is negative", mesh.ErrInvalid, c.FrameRows)
	}
	return nil
}

// World is one round of a parameter server: the round's World (addresses
// of the ranks' parameter-server Transports) and the roles of its ranks.
// Every rank of the round must pass the same Hosts, Workers and Shards.
type World struct {
	mesh.World
	// Hosts are the ranks that host shards; shard s lives on
	// Hosts[s % len(Hosts)]. Nil means every rank (shards colocated with
	// the workers).
	Hosts []int
	// Workers are the ranks that pull and push. In Sync mode a shard
	// waits for one push per worker per step. Nil means every rank. A rank
	// in Hosts but not in Workers is a dedicated parameter-server process.
	Workers []int
	// Shards is the number of shards; 0 means len(Hosts). Row r of every
	// table lives in shard r % Shards.
	Shards int
}

// layout returns the resolved hosts, workers and shard count, checked.
func (w World) layout() (hosts, workers []int, shards int, err error) {
	n := w.Size()
	all := func() []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	hosts, workers = w.Hosts, w.Workers
	if hosts == nil {
		hosts = all()
	}
	if workers == nil {
		workers = all()
	}
	check := func(what string, s []int) error {
		if len(s) == 0 {
			return fmt.Errorf("%w: World.%s is empty", mesh.ErrInvalid, what)
		}
		seen := map[int]bool{}
		for _, r := range s {
			if r < 0 || r >= n || seen[r] {
				return fmt.Errorf("%w: World.%s %v: ranks must be distinct and within world size %d", mesh.ErrInvalid, what, s, n)
			}
			seen[r] = true
		}
		return nil
	}
	if err := check("Hosts", hosts); err != nil {
		return nil, nil, 0, err
	}
	if err := check("Workers", workers); err != nil {
		return nil, nil, 0, err
	}
	shards = w.Shards
	if shards == 0 {
		shards = len(hosts)
	}
	if shards < 1 || shards > 1<<16 {
		return nil, nil, 0, fmt.Errorf("%w: World.Shards %d, want 1..65536", mesh.ErrInvalid, shards)
	}
	workers = slices.Clone(workers)
	slices.Sort(workers)
	return slices.Clone(hosts), workers, shards, nil
}

// ShardOf returns the shard that holds row of a table partitioned over
// shards shards, and the row's index within that shard: row % shards and
// row / shards.
func ShardOf(row int64, shards int) (shard int, local int64) {
	return int(row % int64(shards)), row / int64(shards)
}

// ShardRows returns how many rows of a table of rows rows shard s of
// shards holds: those r with r % shards == s.
func ShardRows(rows int64, s, shards int) int64 {
	if int64(s) >= rows {
		return 0
	}
	return (rows - int64(s) + int64(shards) - 1) / int64(shards)
}

// Server is this process's part of a parameter server for sparse
// embedding tables (Li et al., "Scaling Distributed Machine Learning with
// the Parameter Server", OSDI 2014): it hosts shards of the tables and is
// the client through which the process pulls rows and pushes sparse
// gradients. It lives as long as the process; each round of the job gets a
// Round from Server.Round. The commits it took (its shards' rows and optimizer
// state at committed steps) outlive rounds, so the next round can move rows
// from their old owner.
//
// A Server is safe for concurrent use, but Round calls must not
// overlap, and a Round's methods are called from one goroutine.
type Server struct {
	tr     mesh.Dialer
	cfg    Config
	tables []TableSpec
	fp     uint64

	mu     gosync.Mutex
	images map[memKey]*image // commits held in memory: own shards' and replicas'
	round  *Round
	pinned int64 // restore step of the current round: its commits stay
	closed bool
	source ShardStore // SetRestoreSource's, read besides cfg.Store; nil: none
}

// New returns the parameter server of this process for tables,
// exchanging frames over tr. tr must be used by this Server only (its
// rounds are the parameter server's rounds; the collectives of the job use
// another Transport): its handshake, secret, TLS and timeouts (OpTimeout
// bounds every pull, push and commit) apply to every parameter-server
// connection. Errors wrap ErrInvalid.
func New(tr mesh.Dialer, tables []TableSpec, cfg Config) (*Server, error) {
	if tr == nil {
		return nil, fmt.Errorf("%w: nil Dialer", mesh.ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(tables) == 0 || len(tables) > 1<<16 {
		return nil, fmt.Errorf("%w: %d tables, want 1..65536", mesh.ErrInvalid, len(tables))
	}
	names := map[string]bool{}
	for _, t := range tables {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if names[t.Name] {
			return nil, fmt.Errorf("%w: duplicate table name %q", mesh.ErrInvalid, t.Name)
		}
		names[t.Name] = true
	}
	ps := &Server{tr: tr, cfg: cfg, tables: slices.Clone(tables), pinned: -1, images: map[memKey]*image{}}
	ps.fp = psFingerprint(ps.tables, cfg)
	return ps, nil
}

// psFingerprint hashes what every process of a job must agree on.
func psFingerprint(tables []TableSpec, cfg Config) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%v/%d/", cfg.Mode, cfg.MaxStaleness)
	for _, t := range tables {
		fmt.Fprintf(h, "%q/%d/%d/%+v/%v/%d;", t.Name, t.Rows, t.Dim, t.Optimizer, t.InitScale, t.Seed)
	}
	return h.Sum64() & (1<<52 - 1) // exact in a float64
}

// Tables returns the table specs (a copy).
func (ps *Server) Tables() []TableSpec { return slices.Clone(ps.tables) }

// Config returns the configuration.
func (ps *Server) Config() Config { return ps.cfg }

// Commits returns the committed steps of which this process holds shards
// in memory (as their host or as a replica), newest first.
func (ps *Server) Commits() []int64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var steps []int64
	for _, im := range ps.images {
		a, b := im.steps()
		for _, s := range []int64{a, b} {
			if s >= 0 && !slices.Contains(steps, s) {
				steps = append(steps, s)
			}
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps
}

// ForgetCommitsAfter drops the commits held in memory of every step after
// step (step < 0 drops them all): they belong to a history that was rolled
// back, and must not be offered to a round restoring an older step under
// the same step numbers later. Call it between rounds.
func (ps *Server) ForgetCommitsAfter(step int64) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, im := range ps.images {
		if !im.rollback(step) {
			delete(ps.images, k)
		}
	}
}

// held returns the shards of which this process holds the commit of step.
func (ps *Server) held(step int64) []memKey {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []memKey
	for k, im := range ps.images {
		if a, b := im.steps(); a == step || b == step {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(x, y memKey) int { return cmpKey(x, y) })
	return out
}

func cmpKey(x, y memKey) int {
	if x.shards != y.shards {
		return x.shards - y.shards
	}
	return x.shard - y.shard
}

// image returns the image of k, created (empty, at no step) if create.
func (ps *Server) image(k memKey, create bool) *image {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	im := ps.images[k]
	if im == nil && create && !ps.closed {
		im = newImage(ps.tables, k)
		ps.images[k] = im
	}
	return im
}

// ReadTables returns every row of every table at the committed step, by
// table: Rows*Dim values, row r at [r*Dim, (r+1)*Dim). The shards come from
// the commits this process holds in memory and from Config.Store: one
// complete layout of step must be found there (a commit's shards are all
// in the store once any worker's Commit returned). It does not talk to
// other processes, so it can run after the job's last round (even after
// Close, from the store). Errors: ErrRowsLost (no complete layout of
// step), ErrCorruptShard, the store's errors, ctx errors.
func (ps *Server) ReadTables(ctx context.Context, step int64) ([][]float32, error) {
	mem := map[int]map[int]*image{} // shards -> shard -> image holding step
	for _, k := range ps.held(step) {
		if mem[k.shards] == nil {
			mem[k.shards] = map[int]*image{}
		}
		mem[k.shards][k.shard] = ps.image(k, false)
	}
	stored := map[int]map[int]bool{}
	if st := ps.readStore(); st != nil {
		keys, err := st.ListShards(ctx, step)
		if err != nil {
			return nil, fmt.Errorf("paramserver: store: %w", err)
		}
		for _, k := range keys {
			if k.Shards >= 1 && k.Shards <= 1<<16 && k.Shard >= 0 && k.Shard < k.Shards {
				if stored[k.Shards] == nil {
					stored[k.Shards] = map[int]bool{}
				}
				stored[k.Shards][k.Shard] = true
			}
		}
	}
	best, bestMem := 0, -1
	for n := range stored {
		mem[n] = mem[n] // make every layout a candidate
	}
	for n, m := range mem {
		complete := true
		for j := 0; j < n && complete; j++ {
			complete = m[j] != nil || stored[n][j]
		}
		if complete && (len(m) > bestMem || (len(m) == bestMem && n < best)) {
			best, bestMem = n, len(m)
		}
	}
	if best == 0 {
		return nil, fmt.Errorf("%w: no complete layout of step %d in memory or in the store", ErrRowsLost, step)
	}
	out := make([][]float32, len(ps.tables))
	for t, sp := range ps.tables {
		out[t] = make([]float32, sp.Rows*int64(sp.Dim))
	}
	for j := 0; j < best; j++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		copyOut := func(d *psShardData) {
			for t, sp := range ps.tables {
				tab, dim := &d.tables[t], int64(sp.Dim)
				for l := int64(0); l < tab.n; l++ {
					row := l*int64(best) + int64(j)
					copy(out[t][row*dim:(row+1)*dim], tab.val[l*dim:(l+1)*dim])
				}
			}
		}
		if im := mem[best][j]; im != nil && im.view(step, copyOut) {
			continue
		}
		key := ShardKey{Step: step, Shards: best, Shard: j}
		st := ps.readStore()
		if st == nil {
			return nil, fmt.Errorf("%w: shard %d of %d at step %d left this process's memory", ErrRowsLost, j, best, step)
		}
		b, err := st.LoadShard(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("%w: loading %+v: %w", ErrRowsLost, key, err)
		}
		d, err := decodeShard(b, ps.tables)
		if err != nil {
			return nil, fmt.Errorf("shard %+v: %w", key, err)
		}
		if d.shards != best || d.shard != j {
			return nil, fmt.Errorf("%w: stored %+v holds shard %d of %d", ErrCorruptShard, key, d.shard, d.shards)
		}
		copyOut(d)
	}
	return out, nil
}

// Close closes the current round, if any, and drops the commits held in
// memory. It does not close the Transport. Safe to call more than once.
func (ps *Server) Close() error {
	ps.mu.Lock()
	r := ps.round
	ps.closed = true
	ps.images = map[memKey]*image{}
	ps.mu.Unlock()
	if r != nil {
		r.Close()
	}
	return nil
}

// pruneImages forgets the commits older than the KeepCommits newest
// steps held (except the current round's restore step). ps.mu is held.
func (ps *Server) pruneImages() {
	var steps []int64
	for _, im := range ps.images {
		if a, _ := im.steps(); a >= 0 && !slices.Contains(steps, a) {
			steps = append(steps, a)
		}
	}
	slices.Sort(steps)
	if len(steps) <= ps.cfg.KeepCommits {
		return
	}
	cut := steps[len(steps)-ps.cfg.KeepCommits]
	for k, im := range ps.images {
		a, b := im.steps()
		switch {
		case a < cut && a != ps.pinned && b != ps.pinned:
			delete(ps.images, k)
		case b >= 0 && b < cut && b != ps.pinned && a != ps.pinned:
			im.dropPrev()
		}
	}
}
