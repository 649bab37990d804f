package trainer

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/elastictrain/elastictrain/trainer/internal/enc"
	"github.com/stretchr/testify/require"
)

// The policy's state travels in a version 4 snapshot's "autoscale"
// section; a snapshot without it stays version 3 (older readers load it),
// a section of an unknown name is skipped, and a damaged section is
// ErrCorruptState.
func TestSnapshotAutoscaleSection(t *testing.T) {
	ps := testParams()
	s := testSnapshot(ps, NewSGD(0.1))
	plain := s.encode(nil, ps)
	require.Equal(t, snapshotMagic, string(plain[:8]), "no section: version 3")

	s.autoscale = []byte("policy state")
	b := s.encode(nil, ps)
	require.Equal(t, snapshotMagicV4, string(b[:8]))
	got, err := decodeSnapshot(b, ps)
	require.NoError(t, err)
	require.Equal(t, s.autoscale, got.autoscale)
	require.Equal(t, s.seq, got.seq)
	require.Equal(t, s.values, got.values)
	require.Equal(t, s.autoscale, s.clone().autoscale)

	// An unknown section before it is skipped.
	body := b[:len(b)-4]
	tail := 4 + 4 + len(sectionAutoscale) + 8 + len(s.autoscale) // count, name, data
	head := body[:len(body)-tail]
	withUnknown := binary.LittleEndian.AppendUint32(append([]byte{}, head...), 2)
	withUnknown = enc.AppendString(withUnknown, "from-the-future")
	withUnknown = enc.AppendBytes(withUnknown, []byte{1, 2, 3})
	withUnknown = enc.AppendString(withUnknown, sectionAutoscale)
	withUnknown = enc.AppendBytes(withUnknown, s.autoscale)
	withUnknown = binary.LittleEndian.AppendUint32(withUnknown, crc32.Checksum(withUnknown, castagnoli))
	got, err = decodeSnapshot(withUnknown, ps)
	require.NoError(t, err)
	require.Equal(t, s.autoscale, got.autoscale)

	// A section count past the input.
	bad := binary.LittleEndian.AppendUint32(append([]byte{}, head...), 1<<30)
	bad = binary.LittleEndian.AppendUint32(bad, crc32.Checksum(bad, castagnoli))
	_, err = decodeSnapshot(bad, ps)
	require.ErrorIs(t, err, ErrCorruptState)
}

// The control values of resource adjustment reach every rank unchanged
// through the sum-allreduce lanes of the default mode.
func TestScalingControlThroughLanes(t *testing.T) {
	const W = 3
	sum := make([]float32, ctlLanes*controlLen(W))
	ctl := make([]float64, controlLen(W))
	lanes := make([]float32, len(sum))
	for r := range W {
		putControl(ctl, r, control{samples: 4, scaling: scalingControl{interval: 0.01 * float64(r+1), syncPrev: 0.002,
			gradSq: 1.5 + float64(r), normSamples: 5, bigSq: 0.25, capacity: float64(2 + r), keep: r == 2}})
		packControl(lanes, ctl)
		for i := range sum {
			sum[i] += lanes[i]
		}
	}
	unpackControl(ctl, sum)
	var o stepOutcome
	readControl(ctl, W, false, &o)
	for r := range W {
		require.Equal(t, 0.01*float64(r+1), o.perInterval[r])
		require.Equal(t, 0.002, o.perSyncPrev[r])
		require.Equal(t, 1.5+float64(r), o.perGradSq[r])
		require.Equal(t, 5.0, o.perNormSamples[r])
		require.Equal(t, 0.25, o.perBigSq[r])
		require.Equal(t, float64(2+r), o.perCapacity[r])
		require.Equal(t, r == 2, o.perKeep[r])
	}
}
