package paramserver_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"testing"

	elsync "github.com/elastictrain/elastictrain/sync"
	"github.com/elastictrain/elastictrain/sync/internal/wire"
	"github.com/elastictrain/elastictrain/sync/paramserver"
)

// TestPSRestoreFromReplicas: with no store, 4 ranks commit twice (the
// second commit sends the replicas only the rows changed since the
// first); one rank dies and 3 ranks restore the last commit onto 3 shards,
// the dead rank's rows from its replica's memory; the commit before it is
// served too (ranks one commit apart when a round fails).
func TestPSRestoreFromReplicas(t *testing.T) {
	specs := paramserver.PSTables()
	pcfg := paramserver.DefaultConfig() // Replicas 1, no Store
	pcfg.FrameRows = 5
	nodes := newPSNodes(t, 4, psTestConfig(t), specs, pcfg)
	rng := mrand.New(mrand.NewPCG(7, 7))
	var total int64
	for _, sp := range specs {
		total += sp.Rows
	}

	r1 := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	trainSteps(t, r1, specs, rng, 3)
	commitAll(t, r1, 3)
	at3 := dumpShards(t, specs, r1)
	var first int64
	for _, r := range r1 {
		first += r.Stats().ReplicatedRows
	}
	if first != total {
		t.Fatalf("the first commit sent %d rows to replicas, want every row (%d) once", first, total)
	}
	trainSteps(t, r1, specs, rng, 2)
	commitAll(t, r1, 5)
	at5 := dumpShards(t, specs, r1)
	var second int64
	for _, r := range r1 {
		second += r.Stats().ReplicatedRows
	}
	second -= first
	changed := int64(0)
	for tb := range at5 {
		for row := range at5[tb] {
			if at5[tb][row].String() != at3[tb][row].String() {
				changed++
			}
		}
	}
	// Each step pushes at most 20 rows per table per rank (trainSteps).
	if second < changed || second > 2*4*20*int64(len(specs)) || second >= total {
		t.Fatalf("the second commit sent %d rows; %d rows changed, %d exist", second, changed, total)
	}
	// One rank gathers the whole tables of the commit from the hosts.
	g, err := r1[0].Gather(context.Background(), 5)
	if err != nil {
		t.Fatal(err)
	}
	for tb, sp := range specs {
		for row := range at5[tb] {
			if got, want := fmt.Sprint(g[tb][int64(row)*int64(sp.Dim):][:sp.Dim]), fmt.Sprint(at5[tb][row].val); got != want {
				t.Fatalf("Gather: table %d row %d = %s, want %s", tb, row, got, want)
			}
		}
	}
	trainSteps(t, r1, specs, rng, 1) // never committed
	nodes[1].ps.Close()
	for _, r := range r1 {
		r.Close()
	}

	live := []*psNode{nodes[0], nodes[2], nodes[3]}
	r2 := mustPSRounds(t, live, 2, paramserver.World{}, 5)
	sameRows(t, "step 5 onto 3 shards", dumpShards(t, specs, r2), at5)
	var peers, stored int64
	for _, r := range r2 {
		peers += r.Stats().RestoredFromPeers
		stored += r.Stats().RestoredFromStore
	}
	if peers != total || stored != 0 {
		t.Fatalf("restored %d rows from peers and %d from storage, want %d and 0", peers, stored, total)
	}
	for _, r := range r2 {
		r.Close()
	}
	r3 := mustPSRounds(t, live, 3, paramserver.World{}, 3)
	sameRows(t, "step 3 (the commit before) onto 3 shards", dumpShards(t, specs, r3), at3)
}

// TestPSRowsLostOwnerAndReplica: a shard whose host and every replica died
// cannot be restored from memory: with no store every rank of the new
// round gets ErrRowsLost naming the shard.
func TestPSRowsLostOwnerAndReplica(t *testing.T) {
	specs := paramserver.PSTables()
	nodes := newPSNodes(t, 4, psTestConfig(t), specs, paramserver.DefaultConfig())
	r1 := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
	trainSteps(t, r1, specs, mrand.New(mrand.NewPCG(2, 2)), 1)
	commitAll(t, r1, 1)
	for _, r := range r1 {
		r.Close()
	}
	// One host: shard 2's copy is on rank 3 (the next rank).
	nodes[2].ps.Close()
	nodes[3].ps.Close()
	_, errs := psRounds(nodes[:2], 2, paramserver.World{}, 1)
	for i, err := range errs {
		if !errors.Is(err, paramserver.ErrRowsLost) || !strings.Contains(err.Error(), "shard 2 of 4") {
			t.Fatalf("rank %d: got %v, want ErrRowsLost naming shard 2 of 4", i, err)
		}
	}
}

// TestPSBadReplicaFrames: replica frames that lie (a shard the sender does
// not host, a row outside the shard, a payload shorter than its rows, a
// continuation of a commit never begun) are refused with an error reply,
// never a panic, and leave the receiver's copies as they were: the
// sender, which sent no such request, fails the round on the reply.
func TestPSBadReplicaFrames(t *testing.T) {
	specs := paramserver.PSTables()
	for name, f := range map[string]func() (wire.PSHeader, []byte){
		"foreign shard": func() (wire.PSHeader, []byte) {
			return wire.PSHeader{Kind: wire.PSReplicate, Flags: wire.PSFlagBegin | wire.PSFlagFull, Step: 1, Aux: 2<<32 | 1}, make([]byte, 8)
		},
		"row outside": func() (wire.PSHeader, []byte) {
			p := make([]byte, 8+8+4*(specs[0].Dim+specs[0].Optimizer.StateDim(specs[0].Dim)))
			p[8+7] = 0x40 // local row 2^62
			return wire.PSHeader{Kind: wire.PSReplicate, Flags: wire.PSFlagBegin | wire.PSFlagFull, Step: 1, Aux: 2 << 32, Count: 1}, p
		},
		"short payload": func() (wire.PSHeader, []byte) {
			return wire.PSHeader{Kind: wire.PSReplicate, Flags: wire.PSFlagBegin | wire.PSFlagFull, Step: 1, Aux: 2 << 32, Count: 1000}, make([]byte, 16)
		},
		"not begun": func() (wire.PSHeader, []byte) {
			return wire.PSHeader{Kind: wire.PSReplicate, Step: 7, Aux: 2 << 32}, make([]byte, 8)
		},
	} {
		t.Run(name, func(t *testing.T) {
			nodes := newPSNodes(t, 2, psTestConfig(t), specs, paramserver.DefaultConfig())
			rs := mustPSRounds(t, nodes, 1, paramserver.World{}, 0)
			commitAll(t, rs, 0)
			before := nodes[1].ps.Commits()
			h, p := f()
			h.Round, h.ID, h.Length = 1, 1<<40, uint32(len(p))
			var hb [wire.PSHeaderSize]byte
			h.Put(hb[:])
			paramserver.WriteRaw(rs[0], 1, append(hb[:], p...))
			<-rs[0].Done()
			if err := rs[0].Err(); !errors.Is(err, elsync.ErrBadFrame) {
				t.Fatalf("the sender: %v, want ErrBadFrame (an error reply to a request it never sent)", err)
			}
			if got := nodes[1].ps.Commits(); fmt.Sprint(got) != fmt.Sprint(before) {
				t.Fatalf("the receiver's commits went from %v to %v", before, got)
			}
		})
	}
}
