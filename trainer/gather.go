package trainer

import (
	"context"
	"fmt"
	"math"

	"github.com/elastictrain/elastictrain/sync"
)

// maxGatherBytes bounds one rank's part in gatherBytes (a loader state or
// a partition's manifest), so that a faulty peer cannot make every rank
// allocate without limit.
const maxGatherBytes = 1 << 32

// gatherBytes gives every rank every rank's mine, in rank order
// (collective: every rank of comm calls it at the same point). The lengths
// travel in one max-allreduce (each rank fills its own slot); the bytes in
// one allgather of parts padded to the longest, or, on a Synchronizer
// without sync.AllGatherer, in one broadcast from each rank. The parts
// returned alias one buffer.
func gatherBytes(ctx context.Context, comm sync.Synchronizer, mine []byte) ([][]byte, error) {
	W, rank := comm.Size(), comm.Rank()
	lens := make([]float64, W)
	lens[rank] = float64(len(mine))
	if err := comm.AllReduceFloat64(ctx, lens, sync.OpMax); err != nil {
		return nil, err
	}
	longest := 0
	for r, l := range lens {
		if l < 0 || l > maxGatherBytes || l != math.Trunc(l) {
			return nil, fmt.Errorf("%w: rank %d announced a part of %v bytes", ErrCorruptState, r, l)
		}
		longest = max(longest, int(l))
	}
	parts := make([][]byte, W)
	if longest == 0 {
		for r := range parts {
			parts[r] = []byte{}
		}
		return parts, nil
	}
	if ag, ok := comm.(sync.AllGatherer); ok {
		send := make([]byte, longest)
		copy(send, mine)
		recv := make([]byte, longest*W)
		if err := ag.AllGather(ctx, send, recv); err != nil {
			return nil, err
		}
		for r := range parts {
			parts[r] = recv[r*longest : r*longest+int(lens[r])]
		}
		return parts, nil
	}
	for r := range parts {
		buf := make([]byte, int(lens[r]))
		if r == rank {
			copy(buf, mine)
		}
		if len(buf) > 0 {
			if err := comm.Broadcast(ctx, buf, r); err != nil {
				return nil, err
			}
		}
		parts[r] = buf
	}
	return parts, nil
}
