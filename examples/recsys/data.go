package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// GenConfig describes the generated click log.
//
// The generator draws a hidden latent vector for every user and every
// item, each coordinate N(0, s^2) with s = (Signal^2/Latent)^(1/4), so the
// dot product <u, v> has standard deviation about Signal. An impression
// pairs a user drawn uniformly with an item drawn from a Zipf-like
// popularity law: the item at popularity rank r (0-based, ranks assigned
// by a random permutation of the item IDs) is drawn with probability
// proportional to 1/(r+1)^Zipf. The impression is clicked with probability
// sigmoid(<u, v> + Bias). The impressions are shuffled and the last
// TestFraction of them held out as the test split.
//
// Since the clicks are drawn from that hidden model, scoring the test
// impressions by their true click probability is the best any model can
// do: its AUC is the oracle AUC the trained model is measured against.
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

// DefaultGenConfig returns the example's default log: 1000 users, 500
// items, hidden dimension 8, 600k impressions, Zipf exponent 1.05, signal
// 2, bias -1, 10% test.
func DefaultGenConfig() GenConfig {
	return GenConfig{Users: 1000, Items: 500, Latent: 8, Impressions: 600_000, Zipf: 1.05, Signal: 2, Bias: -1, TestFraction: 0.1, Seed: 1}
}

// Validate reports the first bad field.
func (c GenConfig) Validate() error {
	switch {
	case c.Users < 1 || c.Items < 1:
		return fmt.Errorf("users %d and items %d must be positive", c.Users, c.Items)
	case c.Latent < 1:
		return fmt.Errorf("latent dimension %d must be positive", c.Latent)
	case c.Impressions < 10:
		return fmt.Errorf("impressions %d: want at least 10", c.Impressions)
	case !(c.Zipf >= 0) || !(c.Signal > 0):
		return fmt.Errorf("zipf %v must be >= 0 and signal %v > 0", c.Zipf, c.Signal)
	case !(c.TestFraction > 0 && c.TestFraction < 1):
		return fmt.Errorf("test fraction %v must be in (0, 1)", c.TestFraction)
	}
	return nil
}

// Sample is one impression: a user, an item, whether it was clicked, and
// (for the oracle only; the model never sees it) the true click probability.
type Sample struct {
	User, Item int32
	Click      float32 // 1 clicked, 0 not
	P          float32 // true click probability
}

// Generate returns the train and test impressions of c, the same for the
// same c in every process.
func Generate(c GenConfig) (train, test []Sample) {
	rng := rand.New(rand.NewPCG(c.Seed, 0x7265637379730a))
	s := math.Pow(c.Signal*c.Signal/float64(c.Latent), 0.25)
	users := make([]float64, c.Users*c.Latent)
	items := make([]float64, c.Items*c.Latent)
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
		r := sort.SearchFloat64s(cdf, rng.Float64()*total)
		it := perm[min(r, c.Items-1)]
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

// AUC returns the area under the ROC curve of scores against labels (1 =
// positive): the probability that a random positive scores above a random
// negative, ties counting one half (the Mann-Whitney U statistic over the
// product of the class sizes). It returns NaN when a class is empty.
func AUC(scores []float64, labels []float32) float64 {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case scores[a] < scores[b]:
			return -1
		case scores[a] > scores[b]:
			return 1
		}
		return 0
	})
	var pos, neg, rankSum float64
	for i := 0; i < len(idx); {
		j := i
		for j < len(idx) && scores[idx[j]] == scores[idx[i]] {
			j++
		}
		mid := float64(i+j+1) / 2 // average 1-based rank of the tie group
		for _, k := range idx[i:j] {
			if labels[k] > 0.5 {
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

// OracleAUC is the AUC of the true click probabilities on samples.
func OracleAUC(samples []Sample) float64 {
	scores := make([]float64, len(samples))
	labels := make([]float32, len(samples))
	for i, s := range samples {
		scores[i], labels[i] = float64(s.P), s.Click
	}
	return AUC(scores, labels)
}
