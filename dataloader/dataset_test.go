package dataloader

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// writeRecords writes a header then n records of size bytes; record i is
// filled with byte(i) after a 4-byte big-endian i.
func writeRecords(t *testing.T, header []byte, n, size int) string {
	t.Helper()
	var buf bytes.Buffer
	buf.Write(header)
	for i := range n {
		rec := bytes.Repeat([]byte{byte(i)}, size)
		binary.BigEndian.PutUint32(rec, uint32(i))
		buf.Write(rec)
	}
	p := filepath.Join(t.TempDir(), "records.idx")
	mustNoError(t, os.WriteFile(p, buf.Bytes(), 0o600))
	return p
}

func TestRecords(t *testing.T) {
	for name, open := range map[string]func(string, int64, int64) (*Records, error){"read": OpenRecords, "mapped": OpenRecordsMapped} {
		t.Run(name, func(t *testing.T) { testRecords(t, open) })
	}
}

// TestRecordsMappedCloseUnderReads: Close while other goroutines read a
// mapped file gives them ErrClosed, never a fault.
func TestRecordsMappedCloseUnderReads(t *testing.T) {
	p := writeRecords(t, nil, 1000, 64)
	r, err := OpenRecordsMapped(p, 0, 64)
	mustNoError(t, err)
	if runtime.GOOS == "linux" {
		mustTrue(t, r.mapped, "the file is not mapped")
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 64)
			for i := w; ; i = (i + 4) % 1000 {
				if err := r.ReadRecord(context.Background(), i, dst); err != nil {
					mustErrorIs(t, err, ErrClosed)
					return
				}
				mustEqual(t, uint32(i), binary.BigEndian.Uint32(dst), "record %d", i)
			}
		}()
	}
	dst := make([]byte, 64)
	for i := range 1000 { // the readers run meanwhile
		mustNoError(t, r.ReadRecord(context.Background(), i, dst))
	}
	mustNoError(t, r.Close())
	wg.Wait()
}

func testRecords(t *testing.T, open func(string, int64, int64) (*Records, error)) {
	header := []byte{0, 0, 8, 3, 0, 0, 0, 100, 0, 0, 0, 4, 0, 0, 0, 5} // IDX-like, 16 bytes
	p := writeRecords(t, header, 100, 20)
	r, err := open(p, 16, 20)
	mustNoError(t, err)
	defer r.Close()
	mustEqual(t, 100, r.Len())
	mustEqual(t, 20, r.RecordBytes())
	h, err := r.Header()
	mustNoError(t, err)
	mustEqual(t, header, h)
	ctx := context.Background()

	// Concurrent Gets return distinct, correct buffers.
	var wg sync.WaitGroup
	got := make([][]byte, 100)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 100; i += 4 {
				b, err := r.Get(ctx, i)
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = b
			}
		}()
	}
	wg.Wait()
	for i, b := range got {
		mustEqual(t, uint32(i), binary.BigEndian.Uint32(b), "record %d", i)
		mustEqual(t, byte(i), b[19])
		if i > 0 {
			mustTrue(t, &got[i][0] != &got[i-1][0], "records share a buffer")
		}
	}
	dst := make([]byte, 32)
	mustNoError(t, r.ReadRecord(ctx, 7, dst))
	mustEqual(t, uint32(7), binary.BigEndian.Uint32(dst))
	mustErrorIs(t, r.ReadRecord(ctx, 7, dst[:19]), ErrInvalidConfig)

	_, err = r.Get(ctx, 100)
	mustErrorIs(t, err, ErrIndexOutOfRange)
	_, err = r.Get(ctx, -1)
	mustErrorIs(t, err, ErrIndexOutOfRange)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Get(cctx, 1)
	mustErrorIs(t, err, context.Canceled)

	mustNoError(t, r.Close())
	_, err = r.Get(ctx, 1)
	mustErrorIs(t, err, ErrClosed)
	mustNoError(t, r.Close())
}

func TestOpenRecordsRejectsBadFiles(t *testing.T) {
	p := writeRecords(t, []byte{1, 2, 3}, 10, 8) // 83 bytes
	for _, hr := range [][2]int64{{0, 8}, {4, 8}, {3, 7}, {100, 1}, {-1, 8}, {3, 0}} {
		_, err := OpenRecords(p, hr[0], hr[1])
		mustErrorIs(t, err, ErrBadRecords, "header %d record %d", hr[0], hr[1])
	}
	r, err := OpenRecords(p, 3, 8)
	mustNoError(t, err)
	mustEqual(t, 10, r.Len())
	mustNoError(t, r.Close())
	_, err = OpenRecords(filepath.Join(t.TempDir(), "missing"), 0, 1)
	mustErrorIs(t, err, os.ErrNotExist)
}

// TestLoaderOverRecords runs the Loader on a records file for two epochs
// and checks every record is served once per epoch.
func TestLoaderOverRecords(t *testing.T) {
	p := writeRecords(t, make([]byte, 8), 37, 12)
	r, err := OpenRecords(p, 8, 12)
	mustNoError(t, err)
	defer r.Close()
	collate := func(_ context.Context, samples [][]byte, indices []int) ([]uint32, error) {
		out := make([]uint32, len(samples))
		for i, s := range samples {
			out[i] = binary.BigEndian.Uint32(s)
		}
		return out, nil
	}
	cfg := Config{GlobalBatch: 5, Seed: 2, Shuffle: true, Prefetch: 2, Workers: 2}
	l, err := New[[]byte](r, collate, cfg)
	mustNoError(t, err)
	defer l.Close()
	seen := map[[2]int]int{}
	for range 2 * l.StepsPerEpoch() {
		b, err := l.Next(context.Background())
		mustNoError(t, err)
		for k, i := range b.Indices {
			mustEqual(t, uint32(i), b.Data[k])
			seen[[2]int{b.Epoch, i}]++
		}
		l.Commit(b)
	}
	for e := range 2 {
		for i := range 37 {
			mustEqual(t, 1, seen[[2]int{e, i}], "epoch %d record %d", e, i)
		}
	}
}

func TestFromFuncAndMap(t *testing.T) {
	ctx := context.Background()
	f := FromFunc(5, func(_ context.Context, i int) (int, error) { return i * i, nil })
	mustEqual(t, 5, f.Len())
	v, err := f.Get(ctx, 3)
	mustNoError(t, err)
	mustEqual(t, 9, v)
	_, err = f.Get(ctx, 5)
	mustErrorIs(t, err, ErrIndexOutOfRange)
	m := Map(f, func(_ context.Context, i, a int) (string, error) {
		return string(rune('a'+i)) + string(rune('0'+a)), nil
	})
	mustEqual(t, 5, m.Len())
	s, err := m.Get(ctx, 2)
	mustNoError(t, err)
	mustEqual(t, "c4", s)
	_, err = m.Get(ctx, -1)
	mustErrorIs(t, err, ErrIndexOutOfRange)
	_, err = FromSlice([]int{1}).Get(ctx, 1)
	mustErrorIs(t, err, ErrIndexOutOfRange)
}
