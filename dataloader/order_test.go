package dataloader

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The published SplitMix64 reference outputs for state 1234567 (Vigna's
// splitmix64.c; also Rosetta Code "Pseudo-random numbers/Splitmix64").
func TestSplitMix64ReferenceVector(t *testing.T) {
	g := SplitMix64{State: 1234567}
	want := []uint64{6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821}
	for i, w := range want {
		mustEqual(t, w, g.Uint64(), "output %d", i)
	}
}

func TestBelowIsInRangeAndUnbiasedEnough(t *testing.T) {
	g := SplitMix64{State: 7}
	mustEqual(t, uint64(0), g.Below(0))
	mustEqual(t, uint64(0), g.Below(1))
	const n, draws = 6, 60000
	var counts [n]int
	for range draws {
		v := g.Below(n)
		mustTrue(t, v < uint64(n))
		counts[v]++
	}
	for i, c := range counts {
		// Expected 10000 each; 5 sigma is about 456.
		mustTrue(t, c > draws/n-500 && c < draws/n+500, "value %d drawn %d times", i, c)
	}
	// A bound just above 2^63 rejects about half the draws: still in range.
	big := uint64(1)<<63 + 12345
	for range 1000 {
		mustTrue(t, g.Below(big) < big)
	}
}

func TestOrderIsAPermutation(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 10, 1000, 4097} {
		for epoch := range 3 {
			o := Order(99, epoch, n)
			mustEqual(t, n, len(o))
			seen := make([]bool, n)
			for _, i := range o {
				mustTrue(t, !seen[i], "index %d twice", i)
				seen[i] = true
			}
		}
	}
	mustEqual(t, 0, len(Order(1, 0, -5)))
}

// TestOrderGolden pins the order for a few (seed, epoch) pairs: if this
// changes, every saved cursor in the world would resume into another order.
// The expected values come from an independent Python implementation of the
// algorithm as documented on Order (arbitrary-precision integers, masked to
// 64 bits), not from this code.
func TestOrderGolden(t *testing.T) {
	mustEqual(t, []int{0, 6, 9, 1, 5, 7, 8, 2, 4, 3}, Order(42, 0, 10))
	mustEqual(t, []int{3, 8, 7, 1, 9, 0, 2, 6, 5, 4}, Order(42, 1, 10))
	mustEqual(t, "f6ae1b3a89f0a973", orderDigest(1, 0, 60000)[:16])
}

func TestOrderDiffersBetweenEpochsAndSeeds(t *testing.T) {
	const n = 1000
	seen := map[string]string{}
	for seed := uint64(0); seed < 4; seed++ {
		for epoch := range 8 {
			d := orderDigest(seed, epoch, n)
			key := fmt.Sprintf("seed %d epoch %d", seed, epoch)
			_, dup := seen[d]
			mustTrue(t, !dup, "%s has the same order as %s", key, seen[d])
			seen[d] = key
		}
	}
	mustEqual(t, Order(5, 3, n), Order(5, 3, n))
	// Not the identity either.
	mustTrue(t, !slices.IsSorted(Order(0, 0, n)))
}

func orderDigest(seed uint64, epoch, n int) string {
	h := sha256.New()
	var b [8]byte
	for _, v := range Order(seed, epoch, n) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

const orderChildEnv = "DATALOADER_ORDER_CHILD"

// TestOrderChildProcess is the child side of TestOrderSameInFreshProcess:
// it prints the digests of the orders named in its environment.
func TestOrderChildProcess(t *testing.T) {
	spec := os.Getenv(orderChildEnv)
	if spec == "" {
		return // not a child: nothing to do
	}
	for _, item := range strings.Split(spec, ";") {
		f := strings.Split(item, ",")
		seed, _ := strconv.ParseUint(f[0], 10, 64)
		epoch, _ := strconv.Atoi(f[1])
		n, _ := strconv.Atoi(f[2])
		fmt.Printf("ORDER %s %s\n", item, orderDigest(seed, epoch, n))
	}
}

// TestOrderSameInFreshProcess re-executes the test binary and checks that
// a fresh process computes the same orders.
func TestOrderSameInFreshProcess(t *testing.T) {
	items := []string{"0,0,1000", "0,1,1000", "12345,7,60000", "18446744073709551615,2,513"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrderChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), orderChildEnv+"="+strings.Join(items, ";"))
	out, err := cmd.Output()
	mustNoError(t, err, "child output: %s", out)
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "ORDER" {
			got[f[1]] = f[2]
		}
	}
	mustEqual(t, len(items), len(got), "child output: %s", out)
	for _, it := range items {
		f := strings.Split(it, ",")
		seed, _ := strconv.ParseUint(f[0], 10, 64)
		epoch, _ := strconv.Atoi(f[1])
		n, _ := strconv.Atoi(f[2])
		mustEqual(t, orderDigest(seed, epoch, n), got[it], "order %s", it)
	}
	mustTrue(t, got["0,0,1000"] != got["0,1,1000"], "epochs 0 and 1 have the same order")
}

func TestShareOf(t *testing.T) {
	for g := 0; g <= 40; g++ {
		for w := 1; w <= 9; w++ {
			next := 0
			for r := range w {
				lo, hi := ShareOf(g, r, w)
				mustEqual(t, next, lo, "g=%d w=%d r=%d", g, w, r)
				mustTrue(t, hi-lo == g/w || hi-lo == g/w+1)
				if r > 0 {
					plo, phi := ShareOf(g, r-1, w)
					mustTrue(t, phi-plo >= hi-lo, "earlier ranks get the extra samples")
				}
				next = hi
			}
			mustEqual(t, g, next)
		}
	}
	for _, bad := range [][3]int{{-1, 0, 1}, {4, 0, 0}, {4, -1, 2}, {4, 2, 2}} {
		lo, hi := ShareOf(bad[0], bad[1], bad[2])
		mustEqual(t, [2]int{0, 0}, [2]int{lo, hi}, "%v", bad)
	}
}

func TestMicroShareOf(t *testing.T) {
	mustEqual(t, 0, MicroBatches(0, 4))
	mustEqual(t, 0, MicroBatches(10, 0))
	mustEqual(t, 3, MicroBatches(10, 4))
	mustEqual(t, 2, MicroBatches(8, 4))
	for g := 0; g <= 30; g++ {
		for m := 1; m <= 7; m++ {
			nm := MicroBatches(g, m)
			for w := 1; w <= 6; w++ {
				next := 0
				for r := range w {
					first, cnt := MicroShareOf(g, m, r, w)
					mustEqual(t, next, first)
					mustTrue(t, cnt == nm/w || cnt == nm/w+1)
					next = first + cnt
				}
				mustEqual(t, nm, next)
			}
		}
	}
}

// TestKey pins Key against an independent Python implementation of its
// documented formula, and checks that parts and their order matter.
func TestKey(t *testing.T) {
	mustEqual(t, uint64(0xbdd732262feb6e95), Key(42))
	mustEqual(t, uint64(0xb593dcad4c0efec5), Key(42, 3, 1000))
	seen := map[uint64]bool{}
	for _, k := range []uint64{Key(42), Key(43), Key(42, 0), Key(42, 1), Key(42, 0, 1), Key(42, 1, 0), Key(42, 0, 0)} {
		mustTrue(t, !seen[k], "key %#x repeats", k)
		seen[k] = true
	}
}
