package dataloader

import "math/bits"

// SplitMix64 is the SplitMix64 pseudo-random generator of Steele, Lea and
// Flood ("Fast splittable pseudorandom number generators", OOPSLA 2014), in
// the 64-bit form with Stafford's "Mix13" finalizer. Its output for a given
// State is fixed by the arithmetic below and never changes across Go
// versions or platforms, unlike math/rand; this package uses it for every
// shuffle.
//
// The zero value is a valid generator (state 0). A SplitMix64 is a plain
// value: not safe for concurrent use, cheap to copy.
type SplitMix64 struct {
	// State is the generator's whole state; it advances by the golden gamma
	// 0x9e3779b97f4a7c15 per output.
	State uint64
}

const (
	goldenGamma = 0x9e3779b97f4a7c15
	mixMul1     = 0xbf58476d1ce4e5b9
	mixMul2     = 0x94d049bb133111eb
)

// mix64 is Stafford's Mix13 finalizer, a bijection on uint64.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * mixMul1
	z = (z ^ (z >> 27)) * mixMul2
	return z ^ (z >> 31)
}

// Uint64 returns the next 64 pseudo-random bits.
func (g *SplitMix64) Uint64() uint64 {
	g.State += goldenGamma
	return mix64(g.State)
}

// Below returns a uniformly distributed value in [0, n) without modulo bias,
// by Lemire's multiply-and-reject method ("Fast Random Integer Generation in
// an Interval", ACM TOMACS 2019). It returns 0 when n is 0.
func (g *SplitMix64) Below(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	hi, lo := bits.Mul64(g.Uint64(), n)
	if lo < n {
		threshold := -n % n // 2^64 mod n
		for lo < threshold {
			hi, lo = bits.Mul64(g.Uint64(), n)
		}
	}
	return hi
}

// Key derives a well-mixed 64-bit key from a seed and any number of
// integers (epoch, sample index, step...), for randomness that must be a
// pure function of those values and never of the rank, process or time
// (augmentation, dropout masks): seed a SplitMix64 with it. Each part is
// folded in as state = mix64(state ^ (part + gamma)) starting from the seed,
// so the result is stable across Go versions and platforms.
func Key(seed uint64, parts ...uint64) uint64 {
	k := mix64(seed + goldenGamma)
	for _, p := range parts {
		k = mix64(k ^ (p + goldenGamma))
	}
	return k
}

// epochState is the SplitMix64 state that generates the order of epoch.
// It is seed XOR mix64(epoch + gamma): for a fixed seed, distinct epochs get
// distinct states because mix64 is a bijection.
func epochState(seed uint64, epoch int) uint64 {
	return seed ^ mix64(uint64(epoch)+goldenGamma)
}

// Order returns the permutation of 0..n-1 used as the order of epoch
// (position -> dataset index) for seed: a pure function of (seed, epoch, n).
//
// Algorithm: start from the identity and run the Fisher-Yates shuffle in
// Durstenfeld's form (for i from n-1 down to 1, swap a[i] with a[j], j
// uniform in [0, i]), drawing j with SplitMix64.Below from a generator whose
// state starts at seed XOR mix64(epoch + 0x9e3779b97f4a7c15). Nothing here
// depends on math/rand, so the order is the same in every process, Go
// version and platform. The cost is n words of memory and O(n) time.
//
// n <= 0 gives an empty slice. Safe for concurrent use.
func Order(seed uint64, epoch, n int) []int {
	if n <= 0 {
		return []int{}
	}
	a := make([]int, n)
	for i := range a {
		a[i] = i
	}
	g := SplitMix64{State: epochState(seed, epoch)}
	for i := n - 1; i > 0; i-- {
		j := int(g.Below(uint64(i) + 1))
		a[i], a[j] = a[j], a[i]
	}
	return a
}

// identityOrder returns 0..n-1, the order of every epoch when shuffling is off.
func identityOrder(n int) []int {
	a := make([]int, n)
	for i := range a {
		a[i] = i
	}
	return a
}

// ShareOf returns the positions [lo, hi) of a global batch of globalSize
// samples that rank owns in a world of worldSize ranks: a balanced,
// contiguous split in rank order. Each rank gets globalSize/worldSize
// samples and the first globalSize%worldSize ranks one more, so shares
// differ by at most one sample and rank r's share ends where rank r+1's
// begins. With globalSize < worldSize some ranks get an empty share
// (lo == hi), which is valid.
//
// Invalid arguments (globalSize < 0, worldSize < 1, rank outside
// 0..worldSize-1) give (0, 0). Safe for concurrent use.
func ShareOf(globalSize, rank, worldSize int) (lo, hi int) {
	if globalSize < 0 || worldSize < 1 || rank < 0 || rank >= worldSize {
		return 0, 0
	}
	base, extra := globalSize/worldSize, globalSize%worldSize
	lo = rank*base + min(rank, extra)
	hi = lo + base
	if rank < extra {
		hi++
	}
	return lo, hi
}

// MicroBatches returns how many micro-batches of micro samples a global
// batch of globalSize samples is cut into: ceil(globalSize/micro). Micro-batch
// k covers positions [k*micro, min((k+1)*micro, globalSize)) of the global
// batch, so only the last one can be smaller, and the cut never depends on
// the world size. Returns 0 when globalSize <= 0 or micro <= 0.
func MicroBatches(globalSize, micro int) int {
	if globalSize <= 0 || micro <= 0 {
		return 0
	}
	return (globalSize + micro - 1) / micro
}

// MicroShareOf returns the whole micro-batches [firstMicro,
// firstMicro+nMicro) of a global batch of globalSize samples cut into
// micro-batches of micro samples (see MicroBatches) that rank owns in a world
// of worldSize ranks: ShareOf applied to the micro-batch count, so shares are
// balanced (they differ by at most one micro-batch) and contiguous, and a
// micro-batch is never split between ranks. The rank's samples are the
// global batch positions [firstMicro*micro, min((firstMicro+nMicro)*micro,
// globalSize)). Invalid arguments give (0, 0).
//
// This is what deterministic training needs: every micro-batch has the same
// samples and shape whatever the world size, so its gradient is the same
// bits wherever it is computed.
func MicroShareOf(globalSize, micro, rank, worldSize int) (firstMicro, nMicro int) {
	lo, hi := ShareOf(MicroBatches(globalSize, micro), rank, worldSize)
	return lo, hi - lo
}
