package paramserver

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// TestReplicasOf: copies go to ranks on other hosts first, in rank order
// after the owner, then to the owner's own host; never to the owner, never
// more than the other ranks.
func TestReplicasOf(t *testing.T) {
	two := []string{"10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1", "10.0.0.2:2"}
	one := []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}
	for _, c := range []struct {
		owner int
		addrs []string
		k     int
		want  []int
	}{
		{0, two, 1, []int{2}},
		{1, two, 1, []int{2}},
		{2, two, 1, []int{0}},
		{3, two, 1, []int{0}},
		{0, two, 2, []int{2, 3}},
		{0, two, 3, []int{2, 3, 1}},
		{0, two, 9, []int{2, 3, 1}},
		{2, one, 1, []int{0}},
		{0, one, 2, []int{1, 2}},
		{0, []string{"a:1"}, 1, nil},
		{0, two, 0, nil},
		{7, two, 1, nil},
		{1, []string{"[::ffff:10.0.0.1]:5", "10.0.0.1:6", "host-b:1"}, 1, []int{2}},
	} {
		if got := replicasOf(c.owner, c.addrs, c.k); !slices.Equal(got, c.want) {
			t.Errorf("replicasOf(%d, %v, %d) = %v, want %v", c.owner, c.addrs, c.k, got, c.want)
		}
	}
}

// fillRow sets every value of local row l of table t of d to x.
func fillRow(d *psShardData, t int, l int64, x float32) []float32 {
	tab := &d.tables[t]
	row := make([]float32, tab.dim+tab.sdim)
	for i := range row {
		row[i] = x
	}
	return row
}

// TestImageCommits: an image serves its newest commit and the one before
// it, copying only the rows a commit changes, and a commit only once all
// of it arrived (before, the one before it); a commit that does not
// start from the image's step is refused unless it is full; rollback keeps
// the commits at or before a step.
func TestImageCommits(t *testing.T) {
	specs := psTables()
	k := memKey{shards: 2, shard: 1}
	im := newImage(specs, k)
	live := newShardData(specs, k.shard, k.shards)
	initShardData(specs, live)
	full := func(step int64) {
		if err := im.begin(step, -1, true); err != nil {
			t.Fatal(err)
		}
		for ti := range live.tables {
			tab := &live.tables[ti]
			var locals []int64
			var rows []float32
			for l := int64(0); l < tab.n; l++ {
				locals = append(locals, l)
				rows = append(rows, tab.val[l*int64(tab.dim):(l+1)*int64(tab.dim)]...)
				rows = append(rows, tab.st[l*int64(tab.sdim):(l+1)*int64(tab.sdim)]...)
			}
			if err := im.put(ti, locals, rows); err != nil {
				t.Fatal(err)
			}
		}
		im.end()
	}
	snap := func() string { return fmt.Sprint(live.tables) }
	got := func(step int64) string {
		var s string
		if !im.view(step, func(d *psShardData) { s = fmt.Sprint(d.tables) }) {
			return "absent"
		}
		return s
	}
	full(10)
	at10 := snap()
	// Commit 12 changes rows 0 and 3 of table 0 (row 3 twice) and row 1 of table 1.
	change := func(step, base int64, x float32) {
		if err := im.begin(step, base, false); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			t int
			l int64
		}{{0, 0}, {0, 3}, {1, 1}, {0, 3}} {
			row := fillRow(live, c.t, c.l, x)
			tab := &live.tables[c.t]
			copy(tab.val[c.l*int64(tab.dim):], row[:tab.dim])
			copy(tab.st[c.l*int64(tab.sdim):], row[tab.dim:])
			x++
			row = fillRow(live, c.t, c.l, x-1)
			if err := im.put(c.t, []int64{c.l}, row); err != nil {
				t.Fatal(err)
			}
			if got(step) != "absent" || got(base) == "absent" {
				t.Fatalf("while commit %d arrives the image serves it, or not %d", step, base)
			}
		}
		im.end()
	}
	change(12, 10, 100)
	at12 := snap()
	if got(12) != at12 || got(10) != at10 || got(11) != "absent" {
		t.Fatalf("after commit 12: 12 ok %v, 10 ok %v, 11 %q", got(12) == at12, got(10) == at10, got(11))
	}
	if n := len(im.undo[0].locals) + len(im.undo[1].locals) + len(im.undo[2].locals); n != 4 {
		t.Fatalf("commit 12 kept %d old rows, want the 4 it put", n)
	}
	change(15, 12, 200)
	at15 := snap()
	if got(15) != at15 || got(12) != at12 || got(10) != "absent" {
		t.Fatal("after commit 15 the image does not serve 15 and 12 only")
	}
	// A delta from a step the image is not at is refused, and leaves it unusable.
	if err := im.begin(20, 17, false); !errors.Is(err, ErrCorruptShard) {
		t.Fatalf("delta from a wrong base: %v", err)
	}
	if got(15) != "absent" {
		t.Fatal("an image that refused a delta still serves")
	}
	full(16)
	if got(16) != at15 {
		t.Fatal("a full commit does not rebuild the image")
	}
	change(18, 16, 300)
	// Rollback to 17 keeps 16 (the commit before 18), as the newest.
	if !im.rollback(17) || got(16) != at15 || got(18) != "absent" {
		t.Fatal("rollback to 17 does not leave commit 16")
	}
	if im.rollback(3) {
		t.Fatal("rollback before every commit leaves one")
	}
	// Bad input is an error, never a panic.
	if err := im.put(0, []int64{1 << 40}, make([]float32, specs[0].Dim+specs[0].Optimizer.StateDim(specs[0].Dim))); !errors.Is(err, ErrCorruptShard) {
		t.Fatalf("row out of range: %v", err)
	}
	if err := im.put(9, nil, nil); !errors.Is(err, ErrCorruptShard) {
		t.Fatalf("table out of range: %v", err)
	}
	if err := applyFrame(im, 0, 5, make([]byte, 12)); !errors.Is(err, ErrCorruptShard) {
		t.Fatalf("short frame: %v", err)
	}
}
