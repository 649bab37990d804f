// Package atomicfile writes files so that a crash at any instant leaves,
// under a file's name, either its previous content or its new content,
// whole, never a part (the last durable checkpoint stays readable whatever
// instant a crash hits): the new content goes to a
// temporary file in the same directory, which is fsynced, renamed over the
// name, and the directory is fsynced so the rename itself is durable. The
// trainer's durable checkpoints (checkpoint.LocalDir), the parameter server's
// shard store (paramserver.DirShardStore) and the checkpoints of partitioned state
// (trainer/ps) all write through it, so one implementation is tested for
// every crash point (see SetFaultHook).
//
// Every function returns the content's Sum (size and SHA-256) where it
// writes or reads one, so callers can record checksums in their manifests
// and verify them on load. Functions are safe for concurrent use on
// distinct names; two writers of one name race as rename(2) does (the
// last one wins, whole).
package atomicfile

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	stdsync "sync"
)

// ErrMismatch reports content that does not match the Sum it was expected
// to have (truncated, damaged, or another file).
var ErrMismatch = errors.New("atomicfile: content does not match its checksum")

// Sum identifies a file's content: its size in bytes and its SHA-256.
type Sum struct {
	Size   int64
	SHA256 [sha256.Size]byte
}

// Hex returns the SHA-256 in lowercase hexadecimal.
func (s Sum) Hex() string { return hex.EncodeToString(s.SHA256[:]) }

// ParseSum returns the Sum of size bytes with the hexadecimal SHA-256 h.
func ParseSum(size int64, h string) (Sum, error) {
	var s Sum
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size || size < 0 {
		return s, fmt.Errorf("%w: bad checksum %q of %d bytes", ErrMismatch, h, size)
	}
	s.Size = size
	copy(s.SHA256[:], b)
	return s, nil
}

// SumOf returns the Sum of the concatenation of parts.
func SumOf(parts ...[]byte) Sum {
	h := sha256.New()
	var n int64
	for _, p := range parts {
		h.Write(p)
		n += int64(len(p))
	}
	s := Sum{Size: n}
	h.Sum(s.SHA256[:0])
	return s
}

// Op names a point of a write at which a test may simulate a crash (see
// SetFaultHook).
type Op string

// The points of a write, in order, and of the other mutations.
const (
	OpMkdir   Op = "mkdir"    // before creating a missing directory
	OpCreate  Op = "create"   // before creating the temporary file
	OpWrite   Op = "write"    // before writing the content (an empty temporary file is left)
	OpPartial Op = "partial"  // after writing half of the content
	OpSync    Op = "fsync"    // before fsyncing the temporary file
	OpRename  Op = "rename"   // before renaming it over the name
	OpSyncDir Op = "sync-dir" // before fsyncing the directory
	OpLink    Op = "link"     // before creating a hard link
	OpRemove  Op = "remove"   // before removing a file or directory tree
)

var (
	hookMu stdsync.RWMutex
	hook   func(op Op, path string) error
)

// SetFaultHook makes every later mutation of this package call f before
// each of its points (Op) with the path concerned; when f returns an error
// the mutation stops right there, as a crashed process would: it returns
// that error and cleans nothing up (a temporary file may stay behind). It
// returns a function that removes the hook. For crash tests only; the
// tests that set it must not run in parallel with other writers of the
// process.
func SetFaultHook(f func(op Op, path string) error) (restore func()) {
	hookMu.Lock()
	prev := hook
	hook = f
	hookMu.Unlock()
	return func() {
		hookMu.Lock()
		hook = prev
		hookMu.Unlock()
	}
}

// crashed is a hook's error, wrapped so that the write skips its cleanup.
type crashed struct{ err error }

func (c *crashed) Error() string { return c.err.Error() }
func (c *crashed) Unwrap() error { return c.err }

func at(op Op, path string) error {
	hookMu.RLock()
	f := hook
	hookMu.RUnlock()
	if f == nil {
		return nil
	}
	if err := f(op, path); err != nil {
		return &crashed{err}
	}
	return nil
}

// Write replaces the file at path with the concatenation of parts,
// atomically and durably: when it returns nil, a crash at any later
// instant leaves the new content under path; a crash before leaves the
// previous content (or no file). The parent directory must exist (see
// MkdirAll). The temporary file is named ".tmp-<name>-*" in the same
// directory and removed on error. It returns the Sum of what it wrote.
func Write(path string, parts ...[]byte) (Sum, error) {
	sum := SumOf(parts...)
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if err := at(OpCreate, path); err != nil {
		return sum, err
	}
	f, err := os.CreateTemp(dir, ".tmp-"+name+"-*")
	if err != nil {
		return sum, fmt.Errorf("atomicfile: %w", err)
	}
	tmp := f.Name()
	err = writeParts(f, path, sum.Size, parts)
	if err == nil {
		if err = at(OpSync, path); err == nil {
			if err = f.Sync(); err != nil {
				err = fmt.Errorf("atomicfile: fsync %s: %w", tmp, err)
			}
		}
	}
	var c *crashed
	if errors.As(err, &c) {
		f.Close()
		return sum, err
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("atomicfile: %w", cerr)
	}
	if err == nil {
		if err = at(OpRename, path); err == nil {
			if err = os.Rename(tmp, path); err != nil {
				err = fmt.Errorf("atomicfile: %w", err)
			}
		}
	}
	if err != nil {
		if !errors.As(err, &c) {
			os.Remove(tmp)
		}
		return sum, err
	}
	return sum, syncDir(dir, path)
}

func writeParts(f *os.File, path string, size int64, parts [][]byte) error {
	if err := at(OpWrite, path); err != nil {
		return err
	}
	half, written := size/2, int64(0)
	for _, p := range parts {
		if written <= half && written+int64(len(p)) > half {
			k := half - written
			if _, err := f.Write(p[:k]); err != nil {
				return fmt.Errorf("atomicfile: write %s: %w", f.Name(), err)
			}
			if err := at(OpPartial, path); err != nil {
				return err
			}
			p, written = p[k:], written+k
		}
		if _, err := f.Write(p); err != nil {
			return fmt.Errorf("atomicfile: write %s: %w", f.Name(), err)
		}
		written += int64(len(p))
	}
	if size == 0 {
		return at(OpPartial, path)
	}
	return nil
}

// syncDir fsyncs dir, where the entry for path changed.
func syncDir(dir, path string) error {
	if err := at(OpSyncDir, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("atomicfile: fsync directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("atomicfile: fsync directory %s: %w", dir, err)
	}
	return nil
}

// MkdirAll creates dir and any missing parents (mode 0755), fsyncing the
// parent of each directory it creates so that the new entries survive a
// crash. An existing directory is fine; an existing file is an error.
func MkdirAll(dir string) error {
	dir = filepath.Clean(dir)
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("atomicfile: %s exists and is not a directory", dir)
		}
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent); err != nil {
			return err
		}
	}
	if err := at(OpMkdir, dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("atomicfile: %w", err)
	}
	return syncDir(parent, dir)
}

// Link makes dst a durable name for the content of the regular file src,
// replacing dst atomically: a hard link under a temporary name renamed
// over dst, then the directory fsynced. src must be durable already (as
// after Write). Where hard links are unavailable (another filesystem, or
// one without them) it copies src with Write. The temporary name is
// ".tmp-<name>-link": two Links to one dst must not overlap.
func Link(src, dst string) error {
	dir, name := filepath.Split(dst)
	if dir == "" {
		dir = "."
	}
	st, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("atomicfile: %s is not a regular file", src)
	}
	if err := at(OpLink, dst); err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".tmp-"+name+"-link")
	os.Remove(tmp) // a crashed link's leftover
	if err := os.Link(src, tmp); err != nil {
		b, rerr := os.ReadFile(src)
		if rerr != nil {
			return fmt.Errorf("atomicfile: %w", rerr)
		}
		_, err = Write(dst, b)
		return err
	}
	if err := at(OpRename, dst); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("atomicfile: %w", err)
	}
	if err := syncDir(dir, dst); err != nil {
		return err
	}
	return nil
}

// RemoveAll removes path (a file, or a directory and everything in it) and
// fsyncs its parent directory. A missing path is not an error. A crash
// part-way leaves some of a directory's files: callers remove directories
// whose content nobody needs any more, and readers must not take a
// directory's presence for its completeness.
func RemoveAll(path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := at(OpRemove, path); err != nil {
		return err
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	return syncDir(filepath.Dir(path), path)
}

// SumFile returns the Sum of the regular file at path.
func SumFile(path string) (Sum, error) {
	f, err := openRegular(path)
	if err != nil {
		return Sum{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Sum{}, fmt.Errorf("atomicfile: read %s: %w", path, err)
	}
	s := Sum{Size: n}
	h.Sum(s.SHA256[:0])
	return s, nil
}

// ReadVerified returns the content of the regular file at path after
// checking it against want: a file of another size is refused before it is
// read (so a damaged or foreign file of any size costs no allocation of its
// size), one of another SHA-256 after. Errors wrap ErrMismatch for content
// that does not match, fs.ErrNotExist for a missing file.
func ReadVerified(path string, want Sum) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("atomicfile: %w", err)
	}
	if st.Size() != want.Size {
		return nil, fmt.Errorf("%w: %s is %d bytes, want %d", ErrMismatch, path, st.Size(), want.Size)
	}
	b := make([]byte, want.Size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMismatch, path, err)
	}
	if got := SumOf(b); got != want {
		return nil, fmt.Errorf("%w: %s has SHA-256 %s, want %s", ErrMismatch, path, got.Hex(), want.Hex())
	}
	return b, nil
}

// openRegular opens path for reading after checking that it is a regular
// file (opening a FIFO would block for ever).
func openRegular(path string) (*os.File, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("atomicfile: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%v)", ErrMismatch, path, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("atomicfile: %w", err)
	}
	if st2, err := f.Stat(); err != nil || !st2.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrMismatch, path)
	}
	return f, nil
}

// IsTemp reports whether name (a base name) is one of this package's
// temporary files, which a listing of a directory should skip.
func IsTemp(name string) bool { return strings.HasPrefix(name, ".tmp-") }
