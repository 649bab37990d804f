package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/elastictrain/elastictrain/dataloader"
)

// The audit log proves exactly-once training. Every worker appends, to one
// file shared by the job:
//
//	R <round> <step>                            a round starts from commit <step>
//	S <round> <step> <rank> <epoch> <i,j,...>   rank's samples of applied step <step> ("-" for none)
//
// A round's records all come after the previous round's (a round forms
// only once its survivors left the previous one). Replaying the file, an R
// record discards every step after its commit (those steps were rolled
// back); what remains is the model's history, in which every training
// sample of every epoch must appear exactly once.

type auditReport struct {
	Samples    int       // sample occurrences in the final history
	Missing    int       // expected samples never trained
	Duplicates int       // samples trained more than once (or unexpected)
	MeanShare  []float64 // per rank: mean samples per step with data, over the final history
}

func verifyAudit(path string, c *config, nTrain int) (auditReport, error) {
	var rep auditReport
	f, err := os.Open(path)
	if err != nil {
		return rep, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	type entry struct {
		epoch int
		idx   []int
	}
	history := map[int64]map[int]entry{} // step -> rank -> samples
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		fs := strings.Fields(sc.Text())
		bad := func() error { return fmt.Errorf("audit line %d: %q", line, sc.Text()) }
		switch {
		case len(fs) == 3 && fs[0] == "R":
			step, err := strconv.ParseInt(fs[2], 10, 64)
			if err != nil {
				return rep, bad()
			}
			for s := range history {
				if s > step {
					delete(history, s)
				}
			}
		case len(fs) == 6 && fs[0] == "S":
			step, err1 := strconv.ParseInt(fs[2], 10, 64)
			rank, err2 := strconv.Atoi(fs[3])
			epoch, err3 := strconv.Atoi(fs[4])
			if err1 != nil || err2 != nil || err3 != nil {
				return rep, bad()
			}
			var idx []int
			if fs[5] != "-" {
				for _, x := range strings.Split(fs[5], ",") {
					i, err := strconv.Atoi(x)
					if err != nil {
						return rep, bad()
					}
					idx = append(idx, i)
				}
			}
			if history[step] == nil {
				history[step] = map[int]entry{}
			}
			history[step][rank] = entry{epoch, idx}
		default:
			return rep, bad()
		}
	}
	if err := sc.Err(); err != nil {
		return rep, err
	}
	counts := make([][]int, c.epochs)
	for e := range counts {
		counts[e] = make([]int, nTrain)
	}
	steps := make([]int64, 0, len(history))
	for s := range history {
		steps = append(steps, s)
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	var shareSum, shareN []float64
	for _, s := range steps {
		for rank, e := range history[s] {
			for len(shareSum) <= rank {
				shareSum, shareN = append(shareSum, 0), append(shareN, 0)
			}
			if len(e.idx) > 0 {
				shareSum[rank] += float64(len(e.idx))
				shareN[rank]++
			}
			for _, i := range e.idx {
				rep.Samples++
				if e.epoch < 0 || e.epoch >= c.epochs || i < 0 || i >= nTrain {
					rep.Duplicates++
					continue
				}
				counts[e.epoch][i]++
			}
		}
	}
	for r := range shareSum {
		if shareN[r] > 0 {
			rep.MeanShare = append(rep.MeanShare, shareSum[r]/shareN[r])
		} else {
			rep.MeanShare = append(rep.MeanShare, 0)
		}
	}
	for e := range counts {
		expected := make([]bool, nTrain)
		if c.dynamic {
			for i := range expected {
				expected[i] = true
			}
		} else {
			// The loader drops the last partial global batch of an epoch.
			order := dataloader.Order(c.gen.Seed, e, nTrain)
			for _, i := range order[:nTrain/c.batch*c.batch] {
				expected[i] = true
			}
		}
		for i, n := range counts[e] {
			switch {
			case !expected[i]:
				rep.Duplicates += n
			case n == 0:
				rep.Missing++
			case n > 1:
				rep.Duplicates += n - 1
			}
		}
	}
	return rep, nil
}
