package stepdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elastictrain/elastictrain/internal/atomicfile"
)

func mustNew(t *testing.T, kind Kind, keep int) *Store {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "store"), "ckpt-", map[Kind]string{File: ".etc"}[kind], kind, keep)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func write(t *testing.T, s *Store, step int64) {
	t.Helper()
	rel := ""
	if s.kind == Dir {
		rel = filepath.Join("of-00002", "shard-00001.bin")
	}
	if _, err := s.Write(step, rel, []byte(fmt.Sprint("step ", step))); err != nil {
		t.Fatalf("Write(%d): %v", step, err)
	}
}

func steps(t *testing.T, s *Store) string {
	t.Helper()
	st, err := s.Steps()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(st)
}

// TestPrune: Prune keeps the step just written and keep-1 older ones;
// later steps (another history) are neither removed nor counted; keep <= 0
// keeps everything. The same for file and directory entries.
func TestPrune(t *testing.T) {
	cases := []struct {
		name    string
		keep    int
		written []int64
		just    int64
		want    string
	}{
		{"keeps the newest", 3, []int64{1, 2, 3, 4, 5}, 5, "[3 4 5]"},
		{"later steps are left alone and not counted", 2, []int64{1, 2, 3, 10, 11}, 3, "[2 3 10 11]"},
		{"keep 1", 1, []int64{4, 7, 9}, 9, "[9]"},
		{"keep all", 0, []int64{1, 2, 3}, 3, "[1 2 3]"},
		{"fewer than keep", 5, []int64{1, 2}, 2, "[1 2]"},
	}
	for _, kind := range []Kind{File, Dir} {
		for _, c := range cases {
			t.Run(fmt.Sprint(kind, "/", c.name), func(t *testing.T) {
				s := mustNew(t, kind, c.keep)
				for _, st := range c.written {
					write(t, s, st)
				}
				if err := s.Prune(c.just); err != nil {
					t.Fatal(err)
				}
				if got := steps(t, s); got != c.want {
					t.Fatalf("steps after Prune(%d) = %s, want %s", c.just, got, c.want)
				}
			})
		}
	}
}

// TestStepsListsOnlyCanonicalEntries: names Write does not produce, entries
// of the other kind, and other files are not steps (so never pruned).
func TestStepsListsOnlyCanonicalEntries(t *testing.T) {
	s := mustNew(t, File, 1)
	write(t, s, 5)
	for _, name := range []string{"ckpt-5.etc", "ckpt--0000000000000000001.etc", "other.txt", "ckpt-00000000000000000007.etc.corrupt"} {
		if err := os.WriteFile(filepath.Join(s.Dir(), name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(s.Path(6), 0o755); err != nil { // a directory named like a file entry
		t.Fatal(err)
	}
	if got := steps(t, s); got != "[5]" {
		t.Fatalf("Steps = %s, want [5]", got)
	}
	write(t, s, 8)
	if err := s.Prune(8); err != nil {
		t.Fatal(err)
	}
	if got := steps(t, s); got != "[8]" {
		t.Fatalf("Steps after Prune = %s, want [8]", got)
	}
	for _, name := range []string{"ckpt-5.etc", "other.txt", filepath.Base(s.Path(6))} {
		if _, err := os.Lstat(filepath.Join(s.Dir(), name)); err != nil {
			t.Fatalf("Prune removed %s, which is not an entry: %v", name, err)
		}
	}

	d := mustNew(t, Dir, 0)
	write(t, d, 3)
	if err := os.WriteFile(d.Path(4), nil, 0o644); err != nil { // a file named like a directory entry
		t.Fatal(err)
	}
	if got := steps(t, d); got != "[3]" {
		t.Fatalf("Dir Steps = %s, want [3]", got)
	}
}

// TestRemoveAfter removes exactly the later steps.
func TestRemoveAfter(t *testing.T) {
	s := mustNew(t, Dir, 0)
	for _, st := range []int64{1, 2, 3, 4} {
		write(t, s, st)
	}
	if err := s.RemoveAfter(2); err != nil {
		t.Fatal(err)
	}
	if got := steps(t, s); got != "[1 2]" {
		t.Fatalf("Steps after RemoveAfter(2) = %s, want [1 2]", got)
	}
	b, err := os.ReadFile(filepath.Join(s.Path(2), "of-00002", "shard-00001.bin"))
	if err != nil || string(b) != "step 2" {
		t.Fatalf("kept entry reads %q, %v", b, err)
	}
}

// TestInvalid: bad arguments are ErrInvalid, never a write outside the entry.
func TestInvalid(t *testing.T) {
	if _, err := New("", "p-", "", File, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("New with an empty dir: %v", err)
	}
	f := mustNew(t, File, 1)
	if _, err := f.Write(-1, ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative step: %v", err)
	}
	if _, err := f.Write(1, "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a file entry with a name inside: %v", err)
	}
	d := mustNew(t, Dir, 1)
	for _, rel := range []string{"", "../escape", "/abs"} {
		if _, err := d.Write(1, rel); !errors.Is(err, ErrInvalid) {
			t.Fatalf("rel %q: %v", rel, err)
		}
	}
}

// TestCleanTemp: a Write that crashed before its rename leaves its
// temporary file; CleanTemp removes it and nothing else (entries, other
// files, a directory or another store's temporary file with a temp name),
// and stops at a cancelled context.
func TestCleanTemp(t *testing.T) {
	s := mustNew(t, File, 0)
	write(t, s, 1)
	restore := atomicfile.SetFaultHook(func(op atomicfile.Op, _ string) error {
		if op == atomicfile.OpRename {
			return errors.New("crash")
		}
		return nil
	})
	_, err := s.Write(2, "", []byte("lost"))
	restore()
	if err == nil {
		t.Fatal("the crashed Write returned nil")
	}
	for _, name := range []string{"notes.txt", ".tmp-other-1"} {
		if err := os.WriteFile(filepath.Join(s.Dir(), name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(s.Dir(), ".tmp-ckpt-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.CleanTemp(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("CleanTemp(cancelled) = %v, want context.Canceled", err)
	}
	removed, err := s.CleanTemp(context.Background())
	if err != nil || len(removed) != 1 || !strings.HasPrefix(removed[0], ".tmp-ckpt-00000000000000000002.etc-") {
		t.Fatalf("CleanTemp = %v, %v: want the crashed write's temporary file", removed, err)
	}
	left, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if got := fmt.Sprint(names); got != "[.tmp-ckpt-dir .tmp-other-1 ckpt-00000000000000000001.etc notes.txt]" {
		t.Fatalf("left %s", got)
	}
}
