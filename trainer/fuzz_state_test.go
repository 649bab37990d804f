package trainer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/elastictrain/elastictrain/trainer/internal/enc"
)

// Fuzz targets for state that comes from outside a worker: snapshots a peer
// broadcasts or a durable checkpoint holds (past their checksum, which a
// crafted file or a faulty peer can get right), optimizer state inside them,
// and audit logs read from disk.

func fuzzOptimizers() []Optimizer {
	return []Optimizer{NewSGD(0.1), NewMomentum(0.1, 0.9), NewAdam(0.01)}
}

// FuzzSnapshotBody: any snapshot body with a valid checksum decodes and
// restores into the model, or fails with ErrCorruptState or
// ErrShapeMismatch; never a panic, and a failed restore leaves the
// parameters untouched.
func FuzzSnapshotBody(f *testing.F) {
	ps := testParams()
	for _, opt := range fuzzOptimizers() {
		b := testSnapshot(ps, opt).encode(nil, ps)
		f.Add(b[:len(b)-4])
		_ = opt.Step(cloneParams(ps))
		b = testSnapshot(ps, opt).encode(nil, ps)
		f.Add(b[:len(b)-4])
	}
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		s, err := decodeSnapshot(b, ps)
		if err != nil {
			if !errors.Is(err, ErrCorruptState) && !errors.Is(err, ErrShapeMismatch) {
				t.Fatalf("decode error %v wraps neither ErrCorruptState nor ErrShapeMismatch", err)
			}
			return
		}
		for _, opt := range fuzzOptimizers() {
			live := cloneParams(ps)
			if err := s.restoreInto(live, opt); err != nil {
				if !errors.Is(err, ErrCorruptState) && !errors.Is(err, ErrShapeMismatch) {
					t.Fatalf("restore error %v wraps neither ErrCorruptState nor ErrShapeMismatch", err)
				}
				for i := range live {
					if !bytes.Equal(f32bytes(live[i].Value), f32bytes(ps[i].Value)) {
						t.Fatalf("a failed restore changed parameter %q", live[i].Name)
					}
				}
			}
		}
	})
}

func f32bytes(v []float32) []byte { return enc.AppendFloats(nil, v) }

// FuzzReadAuditLog: an audit log of any content reads (records cut short
// by a crash ignored) or fails with an error naming the line, and its
// verification never panics.
func FuzzReadAuditLog(f *testing.F) {
	f.Add([]byte(`{"kind":"step","gen":1,"round":1,"rank":0,"step":1,"epoch":0,"indices":[3,1,2]}` + "\n" +
		`{"kind":"agreed","gen":1,"round":2,"step":0,"restored":true}` + "\n"))
	f.Add([]byte(`{"kind":"step","indices":[-1,99999999999]}` + "\n" + `{"kind":`))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"kind":"step","gen":1,"indices":[4,` + `{"kind":"agreed","gen":1,"round":2,"step":0}` + "\n")) // a piece a kill left
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := ReadAuditLog(bytes.NewReader(b))
		if err != nil {
			return
		}
		rep := VerifyAudit(entries, 2, func(int) []int { return []int{0, 1, 2, 3} })
		if rep.Missing < 0 || rep.Duplicates < 0 || rep.Missing > 8 {
			t.Fatalf("impossible report %+v", rep)
		}
	})
}
