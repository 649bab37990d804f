// Package stepdir is the module's one keep-N atomic directory store:
// entries named by a step ("<prefix><step, 20 digits><suffix>") in one
// directory, each written through internal/atomicfile (temporary file,
// fsync, rename, fsync of the directory), of which the newest N are kept.
// An entry is a regular file (the trainer's checkpoints, checkpoint.LocalDir)
// or a directory of files (the parameter server's shards committed at a
// step, paramserver.DirShardStore); the store lists, prunes and removes
// only entries of its kind under their canonical names, never anything
// else that sits in the directory.
//
// It lives in internal because both users need it and neither may import
// the other (sync never imports the trainer); it knows nothing of what the
// bytes are (formats, checksums of the payload and manifests stay with
// its users). A Store is safe for concurrent use by goroutines and
// processes as far as the file system's rename and remove are atomic:
// two writers of one entry race as rename(2) does, the last one wins.
package stepdir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/elastictrain/elastictrain/internal/atomicfile"
)

// Kind says what an entry is.
type Kind uint8

const (
	// File: every entry is one regular file.
	File Kind = iota
	// Dir: every entry is a directory holding the step's files.
	Dir
)

// ErrInvalid reports a bad argument (an empty directory name, a negative
// step, a name that leaves the entry).
var ErrInvalid = errors.New("stepdir: invalid argument")

// Store is a directory of entries named by step. See the package doc.
type Store struct {
	dir            string
	prefix, suffix string
	kind           Kind
	keep           int
}

// New returns the store of entries of kind named prefix<step>suffix in
// dir, created when missing, that keeps the newest keep steps (keep <= 0
// keeps every step). Errors: ErrInvalid for an empty dir or prefix, the
// file system's errors.
func New(dir, prefix, suffix string, kind Kind, keep int) (*Store, error) {
	if dir == "" || prefix == "" {
		return nil, fmt.Errorf("%w: empty directory or prefix", ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("stepdir: %w", err)
	}
	return &Store{dir: dir, prefix: prefix, suffix: suffix, kind: kind, keep: keep}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Keep returns how many steps Prune keeps (<= 0: all).
func (s *Store) Keep() int { return s.keep }

// Path returns the entry of step: dir/prefix<step, 20 digits>suffix.
func (s *Store) Path(step int64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%s%020d%s", s.prefix, step, s.suffix))
}

// Write stores the concatenation of parts atomically, as the entry of step
// (File; rel must be "") or as the file rel inside it (Dir; rel a relative
// path within the entry, its directories created and fsynced). When it
// returns nil, a crash at any later instant leaves the file whole. It does
// not prune. Errors: ErrInvalid, the file system's.
func (s *Store) Write(step int64, rel string, parts ...[]byte) (atomicfile.Sum, error) {
	if step < 0 {
		return atomicfile.Sum{}, fmt.Errorf("%w: negative step %d", ErrInvalid, step)
	}
	p := s.Path(step)
	if s.kind == File {
		if rel != "" {
			return atomicfile.Sum{}, fmt.Errorf("%w: a file entry has no file %q", ErrInvalid, rel)
		}
	} else {
		if rel == "" || !filepath.IsLocal(rel) {
			return atomicfile.Sum{}, fmt.Errorf("%w: %q is not a path within the entry", ErrInvalid, rel)
		}
		p = filepath.Join(p, rel)
		if err := atomicfile.MkdirAll(filepath.Dir(p)); err != nil {
			return atomicfile.Sum{}, err
		}
	}
	return atomicfile.Write(p, parts...)
}

// Steps returns the steps with an entry of the store's kind under its
// canonical name, ascending. Names Write does not produce (an unpadded
// step, a negative one) and entries of the other kind, links or FIFOs are
// not listed, so they are never loaded, counted or pruned.
func (s *Store) Steps() ([]int64, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("stepdir: %w", err)
	}
	var steps []int64
	for _, e := range entries {
		name := e.Name()
		v, ok := strings.CutPrefix(name, s.prefix)
		if !ok {
			continue
		}
		if v, ok = strings.CutSuffix(v, s.suffix); !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || name != filepath.Base(s.Path(n)) {
			continue
		}
		if (s.kind == File && !e.Type().IsRegular()) || (s.kind == Dir && !e.IsDir()) {
			continue
		}
		steps = append(steps, n)
	}
	slices.Sort(steps)
	return steps, nil
}

// Prune keeps the entry of step just and the keep-1 newest entries of
// older steps, and removes the other older ones. Entries of later steps
// belong to another history (a job restored an older step, or another
// model shares the directory): they are left alone and do not count, so
// they can never cause the entries of this history to be removed. A store
// that keeps every step prunes nothing.
func (s *Store) Prune(just int64) error {
	if s.keep <= 0 {
		return nil
	}
	steps, err := s.Steps()
	if err != nil {
		return err
	}
	kept := 1 // just
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		if st >= just {
			continue
		}
		if kept < s.keep {
			kept++
			continue
		}
		if err := atomicfile.RemoveAll(s.Path(st)); err != nil {
			return fmt.Errorf("stepdir: prune: %w", err)
		}
	}
	return nil
}

// RemoveAfter removes the entries of every step after step: those of a
// history that was rolled back or abandoned, which must not be mistaken
// for the new history's entries of the same step numbers. Call it while
// nothing writes to the store.
func (s *Store) RemoveAfter(step int64) error {
	steps, err := s.Steps()
	if err != nil {
		return err
	}
	for _, st := range steps {
		if st > step {
			if err := atomicfile.RemoveAll(s.Path(st)); err != nil {
				return fmt.Errorf("stepdir: %w", err)
			}
		}
	}
	return nil
}

// CleanTemp removes the temporary files that an interrupted Write of a
// File entry left in the directory (atomicfile's ".tmp-<prefix>..."
// regular files), never an entry or a file of another name, and returns
// their names. It stops at ctx's end. Errors: ctx's, the file system's.
func (s *Store) CleanTemp(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("stepdir: %w", err)
	}
	var removed []string
	for _, e := range entries {
		name := e.Name()
		if !atomicfile.IsTemp(name) || !strings.HasPrefix(name, ".tmp-"+s.prefix) || !e.Type().IsRegular() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return removed, fmt.Errorf("stepdir: %w", err)
		}
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("stepdir: %w", err)
		}
		removed = append(removed, name)
	}
	return removed, nil
}
