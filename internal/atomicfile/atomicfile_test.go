package atomicfile

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

var errCrash = errors.New("simulated crash")

// crashAt returns a hook that lets the first n points pass and fails the
// n+1-th and every later one (the process is dead), counting the points.
func crashAt(n int, seen *int) func(Op, string) error {
	return func(Op, string) error {
		*seen++
		if *seen > n {
			return errCrash
		}
		return nil
	}
}

// A crash at every point of a Write leaves the old content or the new
// content under the name, whole, and never anything else; once the write
// returns nil the new content is there.
func TestWriteCrashAtEveryPoint(t *testing.T) {
	old := bytes.Repeat([]byte("old "), 1000)
	parts := [][]byte{[]byte("new header "), bytes.Repeat([]byte("new body "), 2000), []byte(" new trailer")}
	want := bytes.Join(parts, nil)
	for n := 0; ; n++ {
		dir := t.TempDir()
		p := filepath.Join(dir, "file.bin")
		if _, err := Write(p, old); err != nil {
			t.Fatal(err)
		}
		seen := 0
		restore := SetFaultHook(crashAt(n, &seen))
		sum, err := Write(p, parts...)
		restore()
		got, rerr := os.ReadFile(p)
		if rerr != nil {
			t.Fatalf("crash after %d points: %v", n, rerr)
		}
		if err == nil {
			if !bytes.Equal(got, want) || sum != SumOf(want) {
				t.Fatalf("a write that returned nil left %d bytes, not the new content", len(got))
			}
			if n < 6 {
				t.Fatalf("the write passed only %d points", n)
			}
			return
		}
		if !errors.Is(err, errCrash) {
			t.Fatalf("crash after %d points: %v", n, err)
		}
		if !bytes.Equal(got, old) && !bytes.Equal(got, want) {
			t.Fatalf("crash after %d points left %d bytes that are neither the old nor the new content", n, len(got))
		}
	}
}

func TestWriteReadVerified(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a")
	sum, err := Write(p, []byte("hello "), []byte("world"))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Size != 11 {
		t.Fatalf("size %d", sum.Size)
	}
	got, err := ReadVerified(p, sum)
	if err != nil || string(got) != "hello world" {
		t.Fatalf("%q %v", got, err)
	}
	fsum, err := SumFile(p)
	if err != nil || fsum != sum {
		t.Fatalf("SumFile %v %v, want %v", fsum, err, sum)
	}
	parsed, err := ParseSum(sum.Size, sum.Hex())
	if err != nil || parsed != sum {
		t.Fatalf("ParseSum %v %v", parsed, err)
	}
	if _, err := ParseSum(1, "zz"); !errors.Is(err, ErrMismatch) {
		t.Fatalf("ParseSum of garbage: %v", err)
	}
	// Damaged in place, same size: the checksum catches it.
	if err := os.WriteFile(p, []byte("hello World"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadVerified(p, sum); !errors.Is(err, ErrMismatch) {
		t.Fatalf("damaged file: %v", err)
	}
	// Truncated: refused before reading.
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadVerified(p, sum); !errors.Is(err, ErrMismatch) {
		t.Fatalf("truncated file: %v", err)
	}
	if _, err := ReadVerified(filepath.Join(dir, "missing"), sum); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	// A directory is not a regular file.
	if _, err := ReadVerified(dir, sum); !errors.Is(err, ErrMismatch) {
		t.Fatalf("directory: %v", err)
	}
	// No temporary file stays behind after successful writes.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if IsTemp(e.Name()) {
			t.Fatalf("temporary file %s left", e.Name())
		}
	}
}

func TestLinkAndRemoveAll(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	sum, err := Write(src, []byte("shard rows"))
	if err != nil {
		t.Fatal(err)
	}
	if err := MkdirAll(filepath.Join(dir, "ckpt", "a", "b")); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "ckpt", "a", "b", "dst")
	if err := Link(src, dst); err != nil {
		t.Fatal(err)
	}
	// Replacing the source by a new write leaves the link's content.
	if _, err := Write(src, []byte("other rows")); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadVerified(dst, sum); err != nil || string(got) != "shard rows" {
		t.Fatalf("link after the source was replaced: %q %v", got, err)
	}
	// Linking over an existing name replaces it.
	if err := Link(src, dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); string(got) != "other rows" {
		t.Fatalf("link over an existing name: %q", got)
	}
	if err := Link(dir, filepath.Join(dir, "x")); err == nil {
		t.Fatalf("linking a directory succeeded")
	}
	if err := RemoveAll(filepath.Join(dir, "ckpt")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dst); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after RemoveAll: %v", err)
	}
	if err := RemoveAll(filepath.Join(dir, "ckpt")); err != nil {
		t.Fatalf("RemoveAll of a missing path: %v", err)
	}
	if err := MkdirAll(src); err == nil {
		t.Fatalf("MkdirAll over a file succeeded")
	}
}

// A crash while linking leaves the old content of dst or the new one.
func TestLinkCrashAtEveryPoint(t *testing.T) {
	for n := 0; ; n++ {
		dir := t.TempDir()
		src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
		if _, err := Write(src, []byte("new")); err != nil {
			t.Fatal(err)
		}
		if _, err := Write(dst, []byte("old")); err != nil {
			t.Fatal(err)
		}
		seen := 0
		restore := SetFaultHook(crashAt(n, &seen))
		err := Link(src, dst)
		restore()
		got, rerr := os.ReadFile(dst)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if err == nil {
			if string(got) != "new" {
				t.Fatalf("link returned nil, dst holds %q", got)
			}
			return
		}
		if string(got) != "old" && string(got) != "new" {
			t.Fatalf("crash after %d points left %q", n, got)
		}
		// The next link succeeds despite the leftover temporary name.
		if err := Link(src, dst); err != nil {
			t.Fatalf("link after a crashed one: %v", err)
		}
	}
}
