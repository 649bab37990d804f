package sync

import (
	"fmt"

	"github.com/elastictrain/elastictrain/sync/internal/hostaddr"
)

// Hierarchy selects how an AllReduce of more than Config.DirectBytes runs
// when the ranks of a round share hosts. Two ranks are on the same host
// when the host parts of their addresses (World.Addrs) are equal (IP
// addresses compared as addresses, names case-insensitively); every rank
// computes the same layout from the same World.
type Hierarchy uint8

const (
	// HierarchyAuto (the default) runs a hierarchical allreduce when the
	// round spans at least two hosts and some host holds at least two
	// ranks, else the flat ring: HierarchyStriped when every host holds as
	// many ranks, else HierarchyLeaders. (Measured between hosts on links
	// of 1 Gbit/s, examples/allreduce-bench -hosts, 2 hosts of 2 ranks, 64
	// MiB: striped at 85-91 % of the links' bound, leaders at 74-87 %, in
	// the same runs; striped spreads the work between hosts, TCP and
	// reductions, over every rank of a host.)
	HierarchyAuto Hierarchy = iota
	// HierarchyOff always runs the flat ring over all ranks in rank order.
	HierarchyOff
	// HierarchyLeaders: the ranks of each host reduce their buffers to the
	// host's leader (its lowest rank) along a pipelined chain over the
	// host's links (Unix sockets and shared memory); the leaders allreduce
	// over a ring between hosts; each leader broadcasts the result along a
	// chain within its host. Every host link carries 2(H-1)/H of the
	// buffer each way (H hosts), as a flat ring of H ranks would, whatever
	// the number of ranks per host. The buffer is cut into pieces that flow
	// through the three phases one after another, so the phases of
	// different pieces overlap.
	HierarchyLeaders
	// HierarchyStriped: the ranks of each host reduce-scatter the buffer
	// within the host (local rank q ends with the host's sum of stripe q),
	// the q-th ranks of all hosts allreduce stripe q over a ring of their
	// own (L rings between hosts, L ranks per host), and each host
	// allgathers the stripes. The same bytes cross the host links as with
	// HierarchyLeaders, spread over more connections and processes. It
	// needs the same number of ranks on every host; a round that does not
	// have it runs HierarchyLeaders.
	HierarchyStriped
	maxHierarchy = HierarchyStriped
)

// String names the mode.
func (h Hierarchy) String() string {
	switch h {
	case HierarchyAuto:
		return "auto"
	case HierarchyOff:
		return "off"
	case HierarchyLeaders:
		return "leaders"
	case HierarchyStriped:
		return "striped"
	}
	return fmt.Sprintf("Hierarchy(%d)", uint8(h))
}

// layout is how a round's ranks sit on hosts, and the allreduce that the
// round runs (mode: HierarchyOff, HierarchyLeaders or HierarchyStriped).
type layout struct {
	mode   Hierarchy
	hosts  [][]int // ranks by host, in rank order; hosts in order of their lowest rank
	hostOf []int   // by rank: index into hosts
}

// newLayout groups the ranks of addrs by host and resolves want to the
// allreduce the round runs.
func newLayout(addrs []string, want Hierarchy) layout {
	l := layout{mode: HierarchyOff, hostOf: make([]int, len(addrs))}
	index := map[string]int{}
	for r, a := range addrs {
		k := hostaddr.Key(a)
		h, ok := index[k]
		if !ok {
			h = len(l.hosts)
			index[k] = h
			l.hosts = append(l.hosts, nil)
		}
		l.hosts[h] = append(l.hosts[h], r)
		l.hostOf[r] = h
	}
	shared, even := false, true
	for _, h := range l.hosts {
		if len(h) > 1 {
			shared = true
		}
		if len(h) != len(l.hosts[0]) {
			even = false
		}
	}
	if want == HierarchyOff || len(l.hosts) < 2 || !shared {
		return l
	}
	l.mode = HierarchyLeaders
	if (want == HierarchyStriped || want == HierarchyAuto) && even {
		l.mode = HierarchyStriped
	}
	return l
}

// groups returns, by group, the members (ranks in ring order) of the rings
// rank belongs to; nil where it belongs to none.
func (l layout) groups(rank int) [numGroups][]int {
	var g [numGroups][]int
	n := len(l.hostOf)
	g[groupFlat] = make([]int, n)
	for i := range g[groupFlat] {
		g[groupFlat][i] = i
	}
	if l.mode == HierarchyOff {
		return g
	}
	mine := l.hosts[l.hostOf[rank]]
	g[groupHost] = mine
	local := 0
	for i, r := range mine {
		if r == rank {
			local = i
		}
	}
	switch l.mode {
	case HierarchyLeaders:
		if local == 0 {
			for _, h := range l.hosts {
				g[groupCross] = append(g[groupCross], h[0])
			}
		}
	case HierarchyStriped:
		for _, h := range l.hosts {
			g[groupCross] = append(g[groupCross], h[local])
		}
	}
	return g
}
