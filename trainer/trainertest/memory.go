package trainertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	gosync "sync"
	"time"

	"github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/synctest"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// Network connects the in-memory Backends of one test: each Backend gets
// an address ("mem-1", "mem-2", ...), and the ranks that Connect to the
// same round with the same addresses form one synctest.Group. Safe for
// concurrent use.
type Network struct {
	cfg NetworkConfig

	mu       gosync.Mutex
	next     int
	backends map[string]*Backend
	rounds   map[string]*pendingRound
}

// NetworkConfig tunes a Network. The zero value is valid.
type NetworkConfig struct {
	// OpTimeout bounds every collective (synctest.Config.OpTimeout).
	// Default 10 s.
	OpTimeout time.Duration
	// ConnectTimeout bounds Connect's wait for every rank of a round.
	// Default 10 s.
	ConnectTimeout time.Duration
	// OnGroup, when set, is called with every round's Group once all its
	// ranks connected, before any of them uses it: the place to inject
	// faults (Group.FailAt, Delay, Drop). It must not block.
	OnGroup func(w sync.World, g *synctest.Group)
}

// pendingRound is a round whose ranks are connecting.
type pendingRound struct {
	addrs  []string
	group  *synctest.Group
	joined []bool
	count  int
	ready  chan struct{} // closed when every rank joined
	failed chan struct{} // closed with err set when the round cannot form
	err    error
	failer int // the rank err names
}

// NewNetwork returns an empty Network.
func NewNetwork(cfg NetworkConfig) *Network {
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 10 * time.Second
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	return &Network{cfg: cfg, backends: map[string]*Backend{}, rounds: map[string]*pendingRound{}}
}

// Backend returns a new in-memory driver.Backend on the Network.
func (n *Network) Backend() *Backend {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	b := &Backend{net: n, addr: fmt.Sprintf("mem-%d", n.next)}
	n.backends[b.addr] = b
	return b
}

// ErrUnreachable is the cause inside the *sync.PeerError that Connect
// returns for a peer address no live Backend holds.
var ErrUnreachable = errors.New("trainertest: peer unreachable")

// Backend is an in-memory driver.Backend: its rounds' Synchronizers are
// synctest ranks (with sync.AllGatherer). Kill makes it vanish as a
// killed process's transport does. Safe for concurrent use.
type Backend struct {
	net  *Network
	addr string

	mu       gosync.Mutex
	listened bool
	dead     bool // killed or closed
	killed   bool
	groups   []memberOf
	connects int
}

type memberOf struct {
	g    *synctest.Group
	rank int
}

// Addr returns the Backend's address.
func (b *Backend) Addr() string { return b.addr }

// Connects returns how many rounds this Backend connected.
func (b *Backend) Connects() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.connects
}

// Listen implements driver.Backend.
func (b *Backend) Listen(context.Context) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead {
		return "", fmt.Errorf("%w: trainertest backend %s", sync.ErrClosed, b.addr)
	}
	b.listened = true
	return b.addr, nil
}

// Connect implements driver.Backend: it waits until every rank of w
// connected (ConnectTimeout), or fails at once with a *sync.PeerError
// naming a rank whose address no live Backend holds, or that gave up.
func (b *Backend) Connect(ctx context.Context, w sync.World) (sync.Synchronizer, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	n := b.net
	if w.Addrs[w.Rank] != b.addr {
		return nil, fmt.Errorf("%w: rank %d's address is %q, this backend's %q", sync.ErrInvalid, w.Rank, w.Addrs[w.Rank], b.addr)
	}
	key := fmt.Sprintf("%s\x00%d\x00%s", w.JobID, w.Round, strings.Join(w.Addrs, "\x00"))
	n.mu.Lock()
	b.mu.Lock()
	dead, listened := b.dead, b.listened
	b.mu.Unlock()
	if dead || !listened {
		n.mu.Unlock()
		return nil, fmt.Errorf("%w: trainertest backend %s is closed or not listening", sync.ErrClosed, b.addr)
	}
	pr := n.rounds[key]
	if pr == nil {
		pr = &pendingRound{addrs: w.Addrs, joined: make([]bool, len(w.Addrs)), ready: make(chan struct{}), failed: make(chan struct{})}
		n.rounds[key] = pr
	}
	if pr.err == nil {
		for i, a := range w.Addrs {
			if peer := n.backends[a]; peer == nil || peer.isDead() {
				pr.fail(i, &sync.PeerError{Rank: i, Round: w.Round, Err: fmt.Errorf("%w: %s", ErrUnreachable, a)})
				break
			}
		}
	}
	if pr.err == nil && !pr.joined[w.Rank] {
		pr.joined[w.Rank] = true
		pr.count++
		if pr.count == len(pr.addrs) {
			pr.group = synctest.NewGroup(len(pr.addrs), synctest.Config{Round: w.Round, OpTimeout: n.cfg.OpTimeout})
			if n.cfg.OnGroup != nil {
				n.cfg.OnGroup(w, pr.group)
			}
			close(pr.ready)
		}
	}
	n.mu.Unlock()

	timer := time.NewTimer(n.cfg.ConnectTimeout)
	defer timer.Stop()
	select {
	case <-pr.ready:
	case <-pr.failed:
	case <-ctx.Done():
		n.mu.Lock()
		pr.fail(w.Rank, &sync.PeerError{Rank: w.Rank, Round: w.Round, Err: fmt.Errorf("%w: %w", sync.ErrAborted, ctx.Err())})
		n.mu.Unlock()
	case <-timer.C:
		n.mu.Lock()
		pr.fail(-1, fmt.Errorf("%w: round %d did not form within %v", sync.ErrTimeout, w.Round, n.cfg.ConnectTimeout))
		n.mu.Unlock()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if pr.group == nil {
		if pr.failer == w.Rank {
			var pe *sync.PeerError
			if errors.As(pr.err, &pe) {
				return nil, pe.Err // this rank gave up itself
			}
		}
		return nil, pr.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead {
		pr.group.Kill(w.Rank)
		return nil, fmt.Errorf("%w: trainertest backend %s", sync.ErrClosed, b.addr)
	}
	b.groups = append(b.groups, memberOf{pr.group, w.Rank})
	b.connects++
	return pr.group.Rank(w.Rank), nil
}

// fail marks the round as unable to form (the first cause wins). Called
// under the Network's lock.
func (pr *pendingRound) fail(rank int, err error) {
	if pr.err != nil || pr.group != nil {
		return
	}
	pr.err, pr.failer = err, rank
	close(pr.failed)
}

func (b *Backend) isDead() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dead
}

// Kill makes the Backend vanish as a killed process's transport does:
// every round it is in fails on its peers with a *sync.PeerError naming
// its rank (synctest.ErrKilled), its own operations with sync.ErrClosed,
// and rounds that name its address no longer form.
func (b *Backend) Kill() {
	n := b.net
	n.mu.Lock()
	b.mu.Lock()
	b.dead, b.killed = true, true
	groups := b.groups
	b.groups = nil
	b.mu.Unlock()
	for _, pr := range n.rounds {
		for i, a := range pr.addrs {
			if a == b.addr {
				pr.fail(i, &sync.PeerError{Rank: i, Err: fmt.Errorf("%w: %s", synctest.ErrKilled, a)})
			}
		}
	}
	n.mu.Unlock()
	for _, m := range groups {
		m.g.Kill(m.rank)
	}
}

// Close implements driver.Backend: the Backend no longer connects rounds
// (its rounds' Synchronizers are closed by the trainer).
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dead = true
	b.groups = nil
	return nil
}

var _ driver.Backend = (*Backend)(nil)
