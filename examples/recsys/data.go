package main

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// GenConfig describes the generated click log. Every user and item has a
// hidden latent vector (coordinates N(0, s^2), s = (Signal^2/Latent)^(1/4),
// so <u, v> has standard deviation about Signal). An impression pairs a
// uniform user with an item of Zipf-like popularity (the item of
// popularity rank r, ranks a random permutation of the items, with
// probability proportional to 1/(r+1)^Zipf), clicked with probability
// sigmoid(<u, v> + Bias). Scoring the held-out impressions by their true
// click probability is the best any model can do: the oracle AUC.
type GenConfig struct {
	Users, Items int     // table sizes
	Latent       int     // dimension of the hidden vectors
	Impressions  int     // train + test impressions
	Zipf         float64 // popularity exponent (0 = uniform items)
	Signal       float64 // standard deviation of <u, v>
	Bias         float64 // added to every logit (sets the click rate)
	TestFraction float64 // held-out share of the impressions
	Seed         uint64
}

// DefaultGenConfig returns 1000 users, 500 items, hidden dimension 8, 600k
// impressions, Zipf exponent 1.05, signal 2, bias -1, 10% test.
func DefaultGenConfig() GenConfig {
	return GenConfig{Users: 1000, Items: 500, Latent: 8, Impressions: 600_000, Zipf: 1.05, Signal: 2, Bias: -1, TestFraction: 0.1, Seed: 1}
}

// Sample is one impression; P, the true click probability, is for the
// oracle only.
type Sample struct {
	User, Item int32
	Click      float32 // 1 clicked, 0 not
	P          float32
}

// Generate returns the train and test impressions of c, the same in every
// process.
func Generate(c GenConfig) (train, test []Sample) {
	rng := rand.New(rand.NewPCG(c.Seed, 0x7265637379730a))
	s := math.Pow(c.Signal*c.Signal/float64(c.Latent), 0.25)
	users, items := make([]float64, c.Users*c.Latent), make([]float64, c.Items*c.Latent)
	for i := range users {
		users[i] = s * rng.NormFloat64()
	}
	for i := range items {
		items[i] = s * rng.NormFloat64()
	}
	perm := rng.Perm(c.Items)
	cdf := make([]float64, c.Items)
	total := 0.0
	for r := range cdf {
		total += 1 / math.Pow(float64(r+1), c.Zipf)
		cdf[r] = total
	}
	all := make([]Sample, c.Impressions)
	for n := range all {
		u := rng.IntN(c.Users)
		it := perm[min(sort.SearchFloat64s(cdf, rng.Float64()*total), c.Items-1)]
		z := c.Bias
		for k := 0; k < c.Latent; k++ {
			z += users[u*c.Latent+k] * items[it*c.Latent+k]
		}
		p := 1 / (1 + math.Exp(-z))
		click := float32(0)
		if rng.Float64() < p {
			click = 1
		}
		all[n] = Sample{User: int32(u), Item: int32(it), Click: click, P: float32(p)}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	nTest := int(float64(len(all)) * c.TestFraction)
	return all[:len(all)-nTest], all[len(all)-nTest:]
}

// AUC returns the area under the ROC curve of score over samples (clicks
// positive): the Mann-Whitney U statistic over the product of the class
// sizes, ties counting one half; NaN when a class is empty. Scored by the
// true click probability P, it is the oracle AUC.
func AUC(samples []Sample, score func(Sample) float64) float64 {
	scores, idx := make([]float64, len(samples)), make([]int, len(samples))
	for i, s := range samples {
		scores[i], idx[i] = score(s), i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(scores[a], scores[b]) })
	var pos, neg, rankSum float64
	for i := 0; i < len(idx); {
		j := i
		for j < len(idx) && scores[idx[j]] == scores[idx[i]] {
			j++
		}
		mid := float64(i+j+1) / 2 // average 1-based rank of the tie group
		for _, k := range idx[i:j] {
			if samples[k].Click > 0.5 {
				pos++
				rankSum += mid
			} else {
				neg++
			}
		}
		i = j
	}
	if pos == 0 || neg == 0 {
		return math.NaN()
	}
	return (rankSum - pos*(pos+1)/2) / (pos * neg)
}
