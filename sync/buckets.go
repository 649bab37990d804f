package sync

import (
	"context"
	"fmt"
	"slices"
)

// DefaultBucketBytes is the bucket size NewBuckets uses for bucketBytes <= 0.
const DefaultBucketBytes = 4 << 20

// Buckets fuse many float32 tensors into a few buffers of a fixed size for
// allreduce (tensor fusion, as in Horovod: Sergeev & Del Balso 2018), so a
// model with hundreds of small tensors costs a few collective operations.
// Tensors are packed in order; a tensor larger than the bucket size is
// reduced in place on its own. Results land back in the caller's tensors.
//
// The fused buffers are allocated once by NewBuckets: AllReduce does not
// allocate. A Buckets is not safe for concurrent use.
type Buckets struct {
	tensors [][]float32
	buckets []bucket
}

type bucket struct {
	buf     []float32 // fused buffer; nil for a tensor reduced in place
	first   int       // index of the first tensor
	count   int       // number of tensors
	inPlace bool
}

// NewBuckets plans the fusion of tensors (kept by reference, not copied)
// into buckets of at most bucketBytes bytes (DefaultBucketBytes if <= 0).
// Every rank must build its Buckets from tensors of the same lengths in the
// same order. Empty tensors are skipped.
func NewBuckets(tensors [][]float32, bucketBytes int) *Buckets {
	if bucketBytes <= 0 {
		bucketBytes = DefaultBucketBytes
	}
	maxElems := max(1, bucketBytes/4)
	b := &Buckets{tensors: tensors}
	cur := bucket{first: -1}
	used := 0
	flush := func() {
		if cur.count > 0 {
			cur.buf = make([]float32, used)
			b.buckets = append(b.buckets, cur)
		}
		cur, used = bucket{first: -1}, 0
	}
	for i, t := range tensors {
		switch {
		case len(t) == 0:
			continue
		case len(t) > maxElems:
			flush()
			b.buckets = append(b.buckets, bucket{first: i, count: 1, inPlace: true})
			continue
		case used+len(t) > maxElems:
			flush()
		}
		if cur.first < 0 {
			cur.first = i
		}
		cur.count = i - cur.first + 1
		used += len(t)
	}
	flush()
	return b
}

// Len returns the number of buckets, i.e. collective operations per AllReduce.
func (b *Buckets) Len() int { return len(b.buckets) }

// AllReduce reduces every tensor over all ranks with op through s, one
// collective per bucket, and writes the results back into the tensors.
// Errors: those of s (wrapped with the bucket index).
func (b *Buckets) AllReduce(ctx context.Context, s Synchronizer, op Op) error {
	for bi := range b.buckets {
		bk := &b.buckets[bi]
		if bk.inPlace {
			if err := s.AllReduceFloat32(ctx, b.tensors[bk.first], op); err != nil {
				return fmt.Errorf("bucket %d: %w", bi, err)
			}
			continue
		}
		if tr, ok := s.(tensorsReducer); ok {
			// Reduced where they lie, when the Synchronizer can (no copy
			// into the bucket and back).
			handled, err := tr.allReduceTensors(ctx, b.tensors[bk.first:bk.first+bk.count], op)
			if err != nil {
				return fmt.Errorf("bucket %d: %w", bi, err)
			}
			if handled {
				continue
			}
		}
		off := 0
		for _, t := range b.tensors[bk.first : bk.first+bk.count] {
			off += copy(bk.buf[off:], t)
		}
		if err := s.AllReduceFloat32(ctx, bk.buf, op); err != nil {
			return fmt.Errorf("bucket %d: %w", bi, err)
		}
		off = 0
		for _, t := range b.tensors[bk.first : bk.first+bk.count] {
			off += copy(t, bk.buf[off:off+len(t)])
		}
	}
	return nil
}

// tensorsReducer is a Synchronizer that can reduce a list of tensors as
// their concatenation without copying them into one buffer, with the bits
// of AllReduceFloat32 on the concatenation (the Ring in a two-rank round:
// Ring.allReduceTensors). handled is false when it cannot; the tensors
// are then fused and reduced as usual.
type tensorsReducer interface {
	allReduceTensors(ctx context.Context, tensors [][]float32, op Op) (handled bool, err error)
}

// vecBuf is a list of float32 tensors seen as one byte buffer, their
// concatenation (Ring.allReduceTensors).
type vecBuf struct {
	parts [][]byte
	ends  []int // ends[i]: where parts[i] ends in the concatenation
	total int
}

// set makes v the concatenation of tensors (nil: empty), reusing its slices.
func (v *vecBuf) set(tensors [][]float32) {
	v.parts, v.ends, v.total = v.parts[:0], v.ends[:0], 0
	for _, t := range tensors {
		if len(t) == 0 {
			continue
		}
		v.total += 4 * len(t)
		v.parts = append(v.parts, f32Bytes(t))
		v.ends = append(v.ends, v.total)
	}
}

// each calls f, in order, with every piece of bytes [lo, hi) of the
// concatenation (a subslice of one tensor) and its offset from lo.
func (v *vecBuf) each(lo, hi int, f func(p []byte, off int)) {
	i, _ := slices.BinarySearch(v.ends, lo+1) // the first part ending after lo
	for pos := lo; pos < hi && i < len(v.parts); i++ {
		start := v.ends[i] - len(v.parts[i])
		end := min(hi, v.ends[i])
		f(v.parts[i][pos-start:end-start], pos-lo)
		pos = end
	}
}
