package trainer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The control values packed into lanes, summed over the ranks in float32
// in any order (as the gradient allreduce sums them), unpack to every
// rank's values bit for bit and to the shared flags, so every rank reads
// the step's outcome the max-allreduce of the values gave.
func TestPackedControlSumsToEveryRanksValues(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	odd := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 5e-324, math.MaxFloat64, 1e300, -3.25}
	for trial := range 200 {
		W := 1 + r.IntN(9)
		cs := make([]control, W)
		for i := range cs {
			cs[i] = control{change: r.IntN(4) == 0, stepErr: r.IntN(8) == 0, loss: r.NormFloat64() * 100, samples: r.IntN(1 << 20),
				compute: r.Float64(), work: r.Float64() * 1000, stop: r.IntN(5) == 0, epochDone: r.IntN(3) == 0}
			if trial%4 == 0 {
				cs[i].loss, cs[i].compute = odd[r.IntN(len(odd))], odd[r.IntN(len(odd))]
			}
		}
		maxed := make([]float64, controlLen(W))
		lanes := make([][]float32, W)
		for rank, c := range cs {
			ctl := make([]float64, controlLen(W))
			putControl(ctl, rank, c)
			for i, v := range ctl {
				if i < ctlFixed {
					maxed[i] = max(maxed[i], v)
				} else if rank == (i-ctlFixed)/ctlPerRank {
					maxed[i] = v // a per-rank slot: its rank's value
				}
			}
			lanes[rank] = make([]float32, ctlLanes*len(ctl))
			packControl(lanes[rank], ctl)
		}
		sum := make([]float32, len(lanes[0]))
		for _, rank := range r.Perm(W) {
			for i, x := range lanes[rank] {
				sum[i] += x
			}
		}
		got := make([]float64, controlLen(W))
		unpackControl(got, sum)
		for i := range got {
			require.Equal(t, math.Float64bits(maxed[i]), math.Float64bits(got[i]), "trial %d, W %d, slot %d: %v, want %v", trial, W, i, got[i], maxed[i])
		}
		var want, have stepOutcome
		readControl(maxed, W, false, &want)
		readControl(got, W, false, &have)
		if trial%4 != 0 { // (NaN is not equal to itself; the bits matched above)
			require.Equal(t, want, have)
		}
	}
}
