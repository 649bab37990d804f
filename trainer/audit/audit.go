// Package audit proves exactly-once (DESIGN.md invariant 3) for a job:
// each worker's trainer records, through a Recorder (trainer.WithAudit),
// which sample indices each rank trained in each step and which commit
// each round agreed on; Verify then reads the records back and reports
// every index of every epoch that is missing or trained twice in the
// final model's history. File keeps the records as JSON lines that
// several worker processes may append to; Memory keeps them in memory
// for workers in one process. Tests use it (trainer/trainertest, the
// fault suite), and so may a user's job. Standard library only.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// Recorder records which sample indices became part of the model's history, so
// that a test or a user can prove exactly-once per epoch (invariant 3). It
// is optional (trainer.WithAudit). The trainer calls it from its loop goroutine;
// implementations must be safe for use by several trainers at once (several
// workers of one job may share one Recorder).
//
// The protocol: before a rank contributes to a step's allreduce it records
// the indices it trained (RecordStep). When a round has agreed on the
// commit it continues from and every rank has installed it (the round's
// first exchange completed), each rank records that agreement
// (RecordAgreed) before it applies a step of the round, so the log holds
// the agreement of every round in which some rank applied a step,
// whichever rank dies when (the records of one round differ in Rank only).
// Steps after it recorded in older rounds of the same lineage were rolled
// back and no longer count. A lineage (Gen) is
// the history that began at one initial or checkpointed state (its base
// step), numbered by the wall-clock time it began; a restore starts a new one
// and drops every step of older lineages after the restored step. Every
// agreement carries its lineage's base, so the drop happens even when the
// restored round itself failed before its first step and the lineage goes on
// from a later round's commit. A step recorded by a rank that died before contributing
// cannot have been applied anywhere, so the next agreement always drops it.
// A round that ends by a decision every rank took from the same agreed
// values not to apply the step they recorded (a diverged step, a failed
// StepFunc) may be the run's last, so no later agreement would drop that
// step: each rank then records an agreement with Ended set, which drops the
// steps of its own round after its step.
// The rules depend on rounds and lineages only, never on the order of the
// lines, so workers may write concurrently.
type Recorder interface {
	// RecordStep records that rank, in round, trained indices (dataset
	// indices) of epoch as its share of global step step (1-based: the
	// count of steps applied once this one is).
	RecordStep(e Entry) error
	// RecordAgreed records that a round continues from the commit after
	// global step e.Step (e.Restored: from a durable checkpoint or the
	// initial values, starting a new lineage e.Gen). Every rank records it
	// once every rank of the round has installed that state, before it
	// applies a step of the round.
	RecordAgreed(e Entry) error
}

// Entry is one line of an audit log.
type Entry struct {
	// Kind is "step" or "agreed".
	Kind string `json:"kind"`
	// Gen identifies the lineage: the state history since one restore;
	// later lineages have larger values.
	Gen   uint64 `json:"gen"`
	Round uint64 `json:"round"`
	Rank  int    `json:"rank"`
	// Step is the global step: for "step", the step the indices belong to;
	// for "agreed", the commit the round continues from.
	Step int64 `json:"step"`
	// Epoch of the indices ("step" only).
	Epoch int `json:"epoch,omitempty"`
	// Indices are dataset indices ("step" only).
	Indices []int `json:"indices,omitempty"`
	// Base is, for "agreed", the step at which lineage Gen began: the step of
	// the durable checkpoint it was restored from, or 0 for a fresh start.
	Base int64 `json:"base"`
	// Restored marks an agreement that came from a durable checkpoint
	// (then Base equals Step).
	Restored bool `json:"restored,omitempty"`
	// Ended marks an agreement recorded as its round ended without
	// applying the step after Step, by a decision every rank took (the
	// step's gradients or loss were not finite, a StepFunc failed): the
	// steps of lineage Gen after Step recorded in Round itself do not
	// count either ("agreed" only).
	Ended bool `json:"ended,omitempty"`
}

// Memory is a Recorder kept in memory, for tests with several trainers in
// one process. Safe for concurrent use.
type Memory struct {
	mu      sync.Mutex
	entries []Entry
}

// RecordStep implements Recorder.
func (a *Memory) RecordStep(e Entry) error {
	e.Kind = "step"
	e.Indices = append([]int(nil), e.Indices...)
	a.mu.Lock()
	a.entries = append(a.entries, e)
	a.mu.Unlock()
	return nil
}

// RecordAgreed implements Recorder.
func (a *Memory) RecordAgreed(e Entry) error {
	e.Kind, e.Indices = "agreed", nil
	a.mu.Lock()
	a.entries = append(a.entries, e)
	a.mu.Unlock()
	return nil
}

// Entries returns a copy of the log in the order it was recorded.
func (a *Memory) Entries() []Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Entry(nil), a.entries...)
}

// File appends the log as JSON lines to one file that all worker
// processes of a job on one host share (each line is written with a single
// append-mode write). Safe for concurrent use.
type File struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte // the line being written, reused
}

// OpenFile opens (creating if needed) an audit log file for appending.
func OpenFile(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("trainer: open audit log: %w", err)
	}
	return &File{f: f}, nil
}

func (a *File) write(e Entry) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.buf = append(appendAuditJSON(a.buf[:0], e), '\n')
	if _, err := a.f.Write(a.buf); err != nil {
		return fmt.Errorf("trainer: audit: %w", err)
	}
	return nil
}

// appendAuditJSON appends e as encoding/json encodes it (the same bytes:
// field order, omitempty), without reflection: a line is written every
// step.
func appendAuditJSON(dst []byte, e Entry) []byte {
	dst = append(dst, `{"kind":`...)
	dst = appendJSONString(dst, e.Kind)
	dst = append(dst, `,"gen":`...)
	dst = strconv.AppendUint(dst, e.Gen, 10)
	dst = append(dst, `,"round":`...)
	dst = strconv.AppendUint(dst, e.Round, 10)
	dst = append(dst, `,"rank":`...)
	dst = strconv.AppendInt(dst, int64(e.Rank), 10)
	dst = append(dst, `,"step":`...)
	dst = strconv.AppendInt(dst, e.Step, 10)
	if e.Epoch != 0 {
		dst = append(dst, `,"epoch":`...)
		dst = strconv.AppendInt(dst, int64(e.Epoch), 10)
	}
	if len(e.Indices) > 0 {
		dst = append(dst, `,"indices":[`...)
		for i, ix := range e.Indices {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(ix), 10)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"base":`...)
	dst = strconv.AppendInt(dst, e.Base, 10)
	if e.Restored {
		dst = append(dst, `,"restored":true`...)
	}
	if e.Ended {
		dst = append(dst, `,"ended":true`...)
	}
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string; anything but plain
// printable ASCII without quotes, backslashes or HTML characters (which
// encoding/json escapes) goes through encoding/json.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// RecordStep implements Recorder.
func (a *File) RecordStep(e Entry) error {
	e.Kind = "step"
	return a.write(e)
}

// RecordAgreed implements Recorder.
func (a *File) RecordAgreed(e Entry) error {
	e.Kind, e.Indices = "agreed", nil
	return a.write(e)
}

// Close closes the file.
func (a *File) Close() error { return a.f.Close() }

// ReadLog reads a log written by File. Records cut short by a crash are
// skipped: the last line when it has no newline, and a piece of a record
// that other workers' lines continue (Linux may end a write to a file at a
// page boundary when a SIGKILL arrives, so a killed worker can leave part
// of its line, and the next append lands after it on the same line). Such a
// piece must be a prefix of a JSON value (or a whole one missing only its
// newline); any other malformed line is an error. A record its writer did
// not finish was written before that worker contributed the step or
// applied one after the agreement, so skipping it drops nothing the
// model's history holds: Verify's rules drop such a step anyway, and every
// rank that applies a step of a round has written the round's agreement
// first.
func ReadLog(r io.Reader) ([]Entry, error) {
	var out []Entry
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && line[len(line)-1] == '\n' {
			e, perr := parseLine(line)
			if perr != nil {
				return out, fmt.Errorf("trainer: audit log line %d: %w", n, perr)
			}
			out = append(out, e)
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("trainer: audit log: %w", err)
		}
	}
}

// recordStart begins every record File writes (and every Entry that
// encoding/json writes): Kind is the first field. A record holds no other
// '{', as the kinds File writes are "step" and "agreed".
var recordStart = []byte(`{"kind":`)

// parseLine parses one line of a log (with its newline): one record,
// after any pieces of records cut short by a crash, each beginning at a
// '{'.
func parseLine(line []byte) (Entry, error) {
	var e Entry
	err := json.Unmarshal(line, &e)
	if err == nil {
		return e, nil
	}
	last := bytes.LastIndex(line, recordStart)
	if last <= 0 || line[0] != '{' {
		return e, err // no record after a piece: the line itself is malformed
	}
	for rest := line[:last]; len(rest) > 0; {
		end := bytes.IndexByte(rest[1:], '{') + 1 // 0: the piece runs to the record
		if end == 0 {
			end = len(rest)
		}
		if !cutShort(rest[:end]) {
			return e, err
		}
		rest = rest[end:]
	}
	if err := json.Unmarshal(line[last:], &e); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// cutShort reports whether piece is what a write cut short leaves of a
// record: a prefix of one (a prefix of a JSON value), or a whole one
// without its newline.
func cutShort(piece []byte) bool {
	if !bytes.HasPrefix(recordStart, piece) && !bytes.HasPrefix(piece, recordStart) {
		return false
	}
	if json.Valid(piece) {
		return true
	}
	var v json.RawMessage
	return errors.Is(json.NewDecoder(bytes.NewReader(piece)).Decode(&v), io.ErrUnexpectedEOF)
}

// Report is the outcome of Verify.
type Report struct {
	// Missing counts expected (epoch, index) pairs that no surviving step holds.
	Missing int
	// Duplicates counts extra occurrences: an index held by more than one
	// surviving step of its epoch, or one that was not expected at all.
	Duplicates int
	// Steps is how many distinct global steps survive.
	Steps int
	// Samples is how many sample occurrences survive.
	Samples int
}

// Verify replays a log and checks exactly-once. It keeps the "step"
// entries that no agreement rolled back: an agreement of lineage G in round
// R at step c drops every step entry of G from a round before R (with
// Ended: up to and including R) with a step after c; an agreement of lineage G with base b drops every step entry of
// an older lineage (smaller Gen) with a step after b. expected(epoch) lists the
// indices each of epochs 0..epochs-1 must hold exactly once; occurrences of
// anything else count as duplicates.
func Verify(entries []Entry, epochs int, expected func(epoch int) []int) Report {
	dropped := make([]bool, len(entries))
	// Every rank of a round records the same agreement (Rank aside): each
	// is applied once.
	type agreement struct {
		gen, round      uint64
		step, base      int64
		restored, ended bool
	}
	applied := map[agreement]bool{}
	for _, m := range entries {
		if m.Kind != "agreed" {
			continue
		}
		k := agreement{m.Gen, m.Round, m.Step, m.Base, m.Restored, m.Ended}
		if applied[k] {
			continue
		}
		applied[k] = true
		for j, e := range entries {
			if e.Kind != "step" {
				continue
			}
			rolledBack := e.Gen == m.Gen && (e.Round < m.Round || m.Ended && e.Round == m.Round) && e.Step > m.Step
			olderLineage := e.Gen < m.Gen && e.Step > m.Base
			if rolledBack || olderLineage {
				dropped[j] = true
			}
		}
	}
	type key struct {
		epoch, index int
	}
	count := map[key]int{}
	steps := map[int64]bool{}
	var rep Report
	for j, e := range entries {
		if e.Kind != "step" || dropped[j] {
			continue
		}
		steps[e.Step] = true
		for _, ix := range e.Indices {
			count[key{e.Epoch, ix}]++
			rep.Samples++
		}
	}
	rep.Steps = len(steps)
	seen := 0
	for ep := range epochs {
		for _, ix := range expected(ep) {
			c := count[key{ep, ix}]
			if c == 0 {
				rep.Missing++
			} else {
				rep.Duplicates += c - 1
				seen += c
			}
		}
	}
	rep.Duplicates += rep.Samples - seen // occurrences of indices not expected at all
	return rep
}
