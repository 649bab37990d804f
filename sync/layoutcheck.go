package sync

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// ErrLayoutMismatch: ranks of a round disagree on the transport's wire
// layout (Config.ChunkBytes, DirectBytes, Streams or Hierarchy). Connect
// returns it as a *LayoutError naming the settings and the ranks.
var ErrLayoutMismatch = errors.New("sync: ranks disagree on the transport layout")

// LayoutError is Connect's error when peers of the round, having proved
// the job secret, configured another wire layout than this rank:
// Config.ChunkBytes (compared as used, rounded down to a multiple of 8),
// DirectBytes, Streams or Hierarchy. Each connection's handshake carries
// the dialer's layout after its proof, and the listener refuses one that
// differs with its own, so both ends learn both values without waiting:
// Connect goes on forming the round's other connections (as for an
// AuthError) until it knows every peer's layout or its side is a
// majority, for at most Config.LayoutGrace, to learn which ranks agree
// with this one, then fails. A peer whose Connect of the round failed
// already refuses this rank's dial with the layouts it learnt, by rank,
// so a rank that learns of the mismatch only from such a peer names the
// settings and values all the same. errors.Is(err, ErrLayoutMismatch)
// holds.
//
// Ranks that agree with one another see the same layout, so at most one
// group of agreeing ranks is more than half of the round (Majority): a
// caller may take that group for the job and evict the ranks in Differ,
// as it would strangers (see AuthError).
type LayoutError struct {
	Round uint64 // the round of the Connect
	Rank  int    // this rank
	Size  int    // the world size
	// Diffs holds one entry per setting on which this rank and a peer in
	// Differ disagree, in the order chunk bytes, direct bytes, streams,
	// hierarchy.
	Diffs []LayoutDiff
	// Agree lists, in ascending order, the peers whose layout this rank
	// checked (on a connection either side dialed), or a peer that failed
	// the round first reported, and found equal to its own.
	Agree []int
	// Differ lists, in ascending order, the peers that proved the secret
	// and sent a layout that differs from this rank's, or that a peer
	// that failed the round first (one that proved the secret too)
	// reported with such a layout.
	Differ []int
}

// LayoutDiff is one layout setting on which the ranks of a round differ.
type LayoutDiff struct {
	// Setting names it: "sync chunk bytes", "sync direct bytes", "sync
	// streams" or "sync hierarchy" (Config.ChunkBytes, DirectBytes,
	// Streams, Hierarchy).
	Setting string
	// Values holds each rank's value as configured, in rank order
	// (Size entries); "unknown" for a rank this rank did not learn it of.
	Values []string
}

// Error implements error.
func (e *LayoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sync: connect round %d rank %d: the transport layout differs between ranks (Config.ChunkBytes, DirectBytes, Streams and Hierarchy must be equal on every rank):", e.Round, e.Rank)
	parts := make([]string, len(e.Diffs))
	for i, d := range e.Diffs {
		vals := make([]string, len(d.Values))
		for r, v := range d.Values {
			vals[r] = fmt.Sprintf("%s on rank %d", v, r)
			if r == e.Rank {
				vals[r] += " (this rank)"
			}
		}
		parts[i] = " " + d.Setting + ": " + strings.Join(vals, ", ")
	}
	b.WriteString(strings.Join(parts, ";"))
	fmt.Fprintf(&b, "; ranks %v agree with this rank, ranks %v differ (%d of the round's %d members share this rank's layout)",
		e.Agree, e.Differ, 1+len(e.Agree), e.Size)
	return b.String()
}

// Unwrap returns ErrLayoutMismatch.
func (e *LayoutError) Unwrap() error { return ErrLayoutMismatch }

// Majority reports whether this rank and the ranks in Agree are more than
// half of the round's members.
func (e *LayoutError) Majority() bool { return 2*(1+len(e.Agree)) > e.Size }

// layoutSetting is one field of wire.Layout: its name and how its value
// reads as configured.
type layoutSetting struct {
	name   string
	get    func(wire.Layout) uint32
	format func(uint32) string
}

func formatUint(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

var layoutSettings = []layoutSetting{
	{"sync chunk bytes", func(l wire.Layout) uint32 { return l.ChunkBytes &^ 7 }, formatUint},
	{"sync direct bytes", func(l wire.Layout) uint32 { return l.DirectBytes }, formatUint},
	{"sync streams", func(l wire.Layout) uint32 { return uint32(l.Streams) }, formatUint},
	{"sync hierarchy", func(l wire.Layout) uint32 { return uint32(l.Hierarchy) }, func(v uint32) string { return Hierarchy(v).String() }},
}

// configured is the value of setting s in l as configured (ChunkBytes
// before rounding).
func (s layoutSetting) configured(l wire.Layout) string {
	if s.name == layoutSettings[0].name {
		return formatUint(l.ChunkBytes)
	}
	return s.format(s.get(l))
}

// wireLayout is c's layout as the handshake carries it (Validate bounds
// every field to its width).
func (c Config) wireLayout() wire.Layout {
	return wire.Layout{ChunkBytes: uint32(c.ChunkBytes), DirectBytes: uint32(c.DirectBytes), Streams: uint8(c.Streams), Hierarchy: uint8(c.Hierarchy)}
}

// sameLayout reports whether two layouts shape the wire traffic the same.
func sameLayout(a, b wire.Layout) bool {
	for _, s := range layoutSettings {
		if s.get(a) != s.get(b) {
			return false
		}
	}
	return true
}

// describeLayoutDiff names the settings on which theirs differs from mine.
func describeLayoutDiff(mine, theirs wire.Layout) string {
	var parts []string
	for _, s := range layoutSettings {
		if s.get(mine) != s.get(theirs) {
			parts = append(parts, fmt.Sprintf("%s %s (this rank: %s)", s.name, s.configured(theirs), s.configured(mine)))
		}
	}
	return strings.Join(parts, ", ")
}

// layoutTally is what one Connect learnt of its peers' layouts, under
// Transport.mu.
type layoutTally struct {
	agree  map[int]bool        // peers whose layout equals this rank's
	differ map[int]wire.Layout // peers whose layout differs, with it
	// peerFailed is a refusal by a peer whose Connect of this round
	// failed on another rank's layout (wire.RejectLayoutRound): the round
	// is doomed even if this rank meets no differing layout itself (the
	// layouts the peer reported are in agree and differ).
	peerFailed error
}

// knows reports whether this rank learnt rank's layout.
func (l *layoutTally) knows(rank int) bool {
	_, ok := l.differ[rank]
	return ok || l.agree[rank]
}

// report is what l knows of the peers' layouts, as a RejectLayoutRound
// carries it (mine for the peers that agree): the peers that differ
// first, then those that agree, at most wire.MaxRoundLayouts of them, in
// ascending rank order.
func (l *layoutTally) report(mine wire.Layout) []wire.RankLayout {
	var ls []wire.RankLayout
	for _, p := range slices.Sorted(maps.Keys(l.differ)) {
		ls = append(ls, wire.RankLayout{Rank: uint32(p), Layout: l.differ[p]})
	}
	for _, p := range slices.Sorted(maps.Keys(l.agree)) {
		if _, ok := l.differ[p]; !ok {
			ls = append(ls, wire.RankLayout{Rank: uint32(p), Layout: mine})
		}
	}
	ls = ls[:min(len(ls), wire.MaxRoundLayouts)]
	slices.SortFunc(ls, func(a, b wire.RankLayout) int { return cmp.Compare(a.Rank, b.Rank) })
	return ls
}

// learnt records the layouts a peer that failed the round reported, for
// the ranks of the round this rank has not learnt of itself.
func (l *layoutTally) learnt(st *connectState, mine wire.Layout, ls []wire.RankLayout) {
	for _, e := range ls {
		switch p := int(e.Rank); {
		case !st.peer(p) || l.knows(p):
		case sameLayout(mine, e.Layout):
			l.agreeWith(p)
		default:
			l.differs(p, e.Layout)
		}
	}
}

func (l *layoutTally) agreeWith(rank int) {
	if l.agree == nil {
		l.agree = map[int]bool{}
	}
	l.agree[rank] = true
}

func (l *layoutTally) differs(rank int, theirs wire.Layout) {
	if l.differ == nil {
		l.differ = map[int]wire.Layout{}
	}
	l.differ[rank] = theirs
}

func (l *layoutTally) doomed() bool { return len(l.differ) > 0 || l.peerFailed != nil }

// layoutBook is the Transport's memory of layouts, under Transport.mu:
// mismatches met by handshakes of rounds this rank has not reached yet
// (a peer that proved the secret dialed early), and the last round whose
// Connect failed on a mismatch.
type layoutBook struct {
	pending     map[connKey]wire.Layout // kind and lane zero
	failed      bool
	failedRound uint64
	failedKnown []wire.RankLayout // what that Connect learnt (layoutTally.report)
}

// peerLayoutError is a dialed peer's RejectLayout: it proved the secret
// and its layout (Layout) differs from this rank's.
type peerLayoutError struct {
	layout wire.Layout
	text   string
}

func (e *peerLayoutError) Error() string {
	return fmt.Sprintf("%v: refused by peer: %s", ErrLayoutMismatch, e.text)
}

func (e *peerLayoutError) Unwrap() error { return ErrLayoutMismatch }

// peerRoundLayoutError is a dialed peer's RejectLayoutRound: it proved the
// secret and found this rank's layout equal to its own, but its Connect of
// the round failed on the layouts of other ranks, which it reports (all
// it learnt, by rank).
type peerRoundLayoutError struct {
	layouts []wire.RankLayout
	text    string
}

func (e *peerRoundLayoutError) Error() string {
	return fmt.Sprintf("%v: refused by peer: %s", ErrLayoutMismatch, e.text)
}

func (e *peerRoundLayoutError) Unwrap() error { return ErrLayoutMismatch }

// layoutRefusal is the listener's refusal of a dialer's proof on its
// layout: the error and the MsgReject payload.
type layoutRefusal struct {
	err     error
	payload []byte
}

// judgeLayout checks the layout a dialer sent after its proof (lb, already
// covered by the verified proof) against this rank's. A legacy proof
// without a layout is malformed unless its round is one this rank has left
// (refused as such, as before layouts). A differing layout is remembered
// for the Connect of its round and refused with this rank's own.
func (t *Transport) judgeLayout(key connKey, lb []byte) *layoutRefusal {
	mine := t.cfg.wireLayout()
	if len(lb) == 0 {
		t.mu.Lock()
		stale, cur := t.haveRound && key.round < t.round, t.round
		t.mu.Unlock()
		if stale {
			err := fmt.Errorf("%w: dialer is in round %d, this rank has moved on to round %d", ErrRoundMismatch, key.round, cur)
			return &layoutRefusal{err, wire.AppendReject(nil, wire.RejectRound, err.Error())}
		}
		err := fmt.Errorf("%w: the dialer's proof carries no transport layout (%d bytes, want %d: a peer of an older release?)", ErrBadFrame, wire.ProofSize, wire.ProofSize+wire.LayoutSize)
		return &layoutRefusal{err, wire.AppendReject(nil, wire.RejectMalformed, err.Error())}
	}
	theirs, err := wire.ParseLayout(lb)
	if err != nil {
		err = fmt.Errorf("%w: %v", ErrBadFrame, err)
		return &layoutRefusal{err, wire.AppendReject(nil, wire.RejectMalformed, err.Error())}
	}
	if sameLayout(mine, theirs) {
		return nil
	}
	t.noteLayoutMismatch(key, theirs)
	err = fmt.Errorf("%w: rank %d of round %d has %s", ErrLayoutMismatch, key.from, key.round, describeLayoutDiff(mine, theirs))
	return &layoutRefusal{err, wire.AppendLayoutReject(nil, &mine, fmt.Sprintf("rank %d of round %d has %s", key.to, key.round, describeLayoutDiff(theirs, mine)))}
}

// maxPendingLayouts bounds the mismatches remembered for future rounds.
const maxPendingLayouts = 1024

// noteLayoutMismatch records that the dialer of key (which proved the
// secret) has layout theirs: for the Connect in progress, or for the
// Connect of a round this rank has not reached.
func (t *Transport) noteLayoutMismatch(key connKey, theirs wire.Layout) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.connecting; st != nil && key.round == st.w.Round {
		if key.to == st.w.Rank && st.peer(key.from) {
			st.layout.differs(key.from, theirs)
			notify(st.note)
		}
		return
	}
	if t.haveRound && key.round <= t.round {
		return
	}
	if t.lays.pending == nil {
		t.lays.pending = map[connKey]wire.Layout{}
	}
	if len(t.lays.pending) < maxPendingLayouts {
		t.lays.pending[connKey{round: key.round, from: key.from, to: key.to}] = theirs
	}
}

// takePendingLayoutsLocked hands the Connect of st the mismatches met
// before it began, and forgets those of rounds up to its own.
func (t *Transport) takePendingLayoutsLocked(st *connectState) {
	for k, l := range t.lays.pending {
		if k.round == st.w.Round && k.to == st.w.Rank && st.peer(k.from) {
			st.layout.differs(k.from, l)
		}
		if k.round <= st.w.Round {
			delete(t.lays.pending, k)
		}
	}
}

// noteDialLayout records what a dial's outcome says of peer's layout and
// reports whether err is a layout failure (which dooms the round).
func (t *Transport) noteDialLayout(st *connectState, peer int, err error) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	var pl *peerLayoutError
	var rl *peerRoundLayoutError
	switch {
	case err == nil:
		st.layout.agreeWith(peer)
		return false
	case errors.As(err, &pl):
		st.layout.differs(peer, pl.layout)
		return true
	case errors.As(err, &rl):
		// The peer checked this rank's layout, found it equal, and its
		// Connect failed on another rank's, which it tells.
		st.layout.agreeWith(peer)
		st.layout.learnt(st, t.cfg.wireLayout(), rl.layouts)
		if st.layout.peerFailed == nil {
			st.layout.peerFailed = err
		}
		return true
	}
	return false
}

// layoutDoomed reports whether the Connect of st met a layout failure.
func (t *Transport) layoutDoomed(st *connectState) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return st.layout.doomed()
}

// layoutSettled reports whether a Connect doomed by a layout mismatch has
// learnt enough (as authSettled): no dial in flight, and every peer's
// layout known, or this rank's side a majority, or not even half of the
// round able to share this rank's layout any more.
func (t *Transport) layoutSettled(st *connectState, dialing int) bool {
	if dialing > 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	differs := func(p int) bool { _, ok := st.layout.differ[p]; return ok }
	return st.settledLocked(func(p int) bool { return st.layout.agree[p] && !differs(p) }, differs)
}

// layoutError builds the error of a Connect doomed by a layout mismatch:
// a *LayoutError when this rank learnt of a differing layout (itself, or
// from a peer whose Connect of the round failed on one), else that peer's
// refusal (it reported no layout of a rank of this rank's World).
func (t *Transport) layoutError(st *connectState) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(st.layout.differ) == 0 {
		return st.layout.peerFailed
	}
	n, mine := st.w.Size(), t.cfg.wireLayout()
	e := &LayoutError{Round: st.w.Round, Rank: st.w.Rank, Size: n}
	known := make([]*wire.Layout, n)
	known[st.w.Rank] = &mine
	for p := range n {
		if !st.peer(p) {
			continue
		}
		if l, ok := st.layout.differ[p]; ok {
			e.Differ = append(e.Differ, p)
			known[p] = &l
		} else if st.layout.agree[p] {
			e.Agree = append(e.Agree, p)
			known[p] = &mine
		}
	}
	for _, s := range layoutSettings {
		if !slices.ContainsFunc(e.Differ, func(p int) bool { return s.get(*known[p]) != s.get(mine) }) {
			continue
		}
		d := LayoutDiff{Setting: s.name, Values: make([]string, n)}
		for p, l := range known {
			d.Values[p] = "unknown"
			if l != nil {
				d.Values[p] = s.configured(*l)
			}
		}
		e.Diffs = append(e.Diffs, d)
	}
	return e
}

// layoutFailedLocked remembers that the Connect of st failed on a layout
// mismatch, and what it learnt of its peers' layouts, so that peers still
// dialing its round learn why (wire.RejectLayoutRound) instead of
// "already formed".
func (t *Transport) layoutFailedLocked(st *connectState) {
	t.lays.failed, t.lays.failedRound = true, st.w.Round
	t.lays.failedKnown = st.layout.report(t.cfg.wireLayout())
}

// layoutRoundRefusalLocked is the refusal of a dialer of round, which
// failed on this rank on a layout mismatch (the dialer's layout, judged
// already, is this rank's): it carries the layouts this rank learnt.
func (t *Transport) layoutRoundRefusalLocked(round uint64) *refusal {
	err := fmt.Errorf("%w: round %d failed on this rank: its ranks' transport layouts differ", ErrLayoutMismatch, round)
	return &refusal{code: wire.RejectLayoutRound, err: err, payload: wire.AppendLayoutRoundReject(nil, t.lays.failedKnown, err.Error())}
}

// doomedError is the error of a Connect doomed by an authentication
// failure (which takes precedence) or a layout mismatch.
func (t *Transport) doomedError(st *connectState, auth *authTally) error {
	if auth.first != nil {
		return t.authError(st, auth)
	}
	return t.layoutError(st)
}

// LayoutGrace is how long a Connect that met a layout mismatch goes on
// learning its other peers' layouts when they do not all arrive (it ends
// sooner once it learnt enough: every peer's layout known, or this rank's
// side a majority): HandshakeTimeout (the time a peer is given to complete
// a handshake, so that a loaded host's late peers still count), at least
// a second.
func (c Config) LayoutGrace() time.Duration { return max(authGrace, c.handshakeTimeout()) }
