package autoscale

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The policy is tested from scripts (testdata/*.txt) run against a small
// simulated job: each world size has a step time, a grow takes effect a
// few steps after the decision (a process starting), a shrink at the next
// step (a graceful leave), and every change starts a new round whose
// first step spans a pause. A command line is followed by the lines it
// must print, each starting with "= ". go test -run TestPolicyScripts
// -update rewrites them from what the policy does (review the diff!).
//
// Commands:
//
//	config key=value ...   interval warmup measure minchange hysteresis shrink horizon tolerance backoff pending cost
//	world size=W [min=N] [max=N] [batch=B]   a new job at W workers
//	times W=ms ...         the step time at each world size, in milliseconds
//	split compute=F sync=F the fractions of a step spent computing (slowest rank) and syncing
//	noise F                step times alternate by ±F (a fraction)
//	delay N                steps a grow takes to arrive (default 30); 0: never (the platform cannot)
//	gap S                  seconds the first step of a round spans (default 0.3)
//	cap N|none             the platform's capacity
//	slow rank=R factor=F   rank R computes F times slower per sample
//	keep R,...|none        ranks that hold state no other holds
//	run N                  N steps; prints each decision and the final size
//	restart                the policy's state through MarshalBinary/UnmarshalBinary into a new Policy (a whole-job restart)
//	measured               the measured sizes and their throughput
var update = flag.Bool("update", false, "rewrite the expected outputs of testdata")

func TestPolicyScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScript(t, f) })
	}
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sim := newSim()
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cmd string
	var cmdLine int
	var want []string
	flush := func() {
		if cmd == "" {
			return
		}
		got, err := sim.do(cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, cmdLine, cmd, err)
		}
		if !*update && strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n  %s\nwant:\n  %s", path, cmdLine, cmd, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		for _, g := range got {
			out.WriteString("= " + g + "\n")
		}
		cmd, want = "", nil
	}
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "= "):
			want = append(want, line[2:])
			continue
		case line == "" || strings.HasPrefix(line, "#"):
			flush()
			out.WriteString(line + "\n")
		default:
			flush()
			cmd, cmdLine = line, n
			out.WriteString(line + "\n")
		}
	}
	flush()
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// sim is a simulated job around one Policy.
type sim struct {
	p                 *Policy
	cfg               Config
	w, min, max       int
	batch             float64
	times             map[int]float64 // seconds per step by size
	compute, syncFrac float64
	noise             float64
	delay             int
	gap               float64
	capacity          int
	slowRank          int
	slowFactor        float64
	keep              []int
	step              int64
	round             uint64
	roundStep         int64
	target            int   // enacting
	at                int64 // step at which target arrives (0: none)
	remove            []int
}

func newSim() *sim {
	return &sim{cfg: Config{Enabled: true}, w: 1, batch: 64, times: map[int]float64{}, compute: 0.8, syncFrac: 0.1,
		delay: 30, gap: 0.3, slowRank: -1}
}

func (s *sim) do(line string) ([]string, error) {
	f := strings.Fields(line)
	args := map[string]string{}
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	num := func(k string) float64 {
		v, err := strconv.ParseFloat(args[k], 64)
		if err != nil {
			panic(fmt.Sprintf("%s: %v", k, err))
		}
		return v
	}
	switch f[0] {
	case "config":
		for k := range args {
			switch k {
			case "interval":
				s.cfg.DecisionInterval = int(num(k))
			case "warmup":
				s.cfg.WarmupSteps = int(num(k))
			case "measure":
				s.cfg.MeasureSteps = int(num(k))
			case "minchange":
				s.cfg.MinChangeInterval = int(num(k))
			case "hysteresis":
				s.cfg.Hysteresis = num(k)
			case "shrink":
				s.cfg.ShrinkFraction = num(k)
			case "horizon":
				s.cfg.HorizonSteps = int(num(k))
			case "tolerance":
				s.cfg.ProbeTolerance = num(k)
			case "backoff":
				s.cfg.ProbeBackoff = int(num(k))
			case "pending":
				s.cfg.PendingSteps = int(num(k))
			case "cost":
				s.cfg.ChangeCost = num(k)
			default:
				return nil, fmt.Errorf("unknown knob %q", k)
			}
		}
		if err := s.cfg.Validate(); err != nil {
			return []string{err.Error()}, nil
		}
		return nil, nil
	case "world":
		s.w, s.min, s.max = int(num("size")), 1, 0
		if _, ok := args["min"]; ok {
			s.min = int(num("min"))
		}
		if _, ok := args["max"]; ok {
			s.max = int(num("max"))
		}
		if _, ok := args["batch"]; ok {
			s.batch = num("batch")
		}
		s.p, s.step, s.round, s.roundStep, s.at = New(s.cfg), 0, 1, 0, 0
		return nil, nil
	case "times":
		for k, v := range args {
			w, err1 := strconv.Atoi(k)
			ms, err2 := strconv.ParseFloat(v, 64)
			if err := errors.Join(err1, err2); err != nil {
				return nil, err
			}
			s.times[w] = ms / 1000
		}
		return nil, nil
	case "split":
		s.compute, s.syncFrac = num("compute"), num("sync")
		return nil, nil
	case "noise":
		s.noise, _ = strconv.ParseFloat(f[1], 64)
		return nil, nil
	case "delay":
		v, _ := strconv.Atoi(f[1])
		s.delay = v
		return nil, nil
	case "gap":
		s.gap, _ = strconv.ParseFloat(f[1], 64)
		return nil, nil
	case "cap":
		s.capacity = 0
		if f[1] != "none" {
			s.capacity, _ = strconv.Atoi(f[1])
		}
		return nil, nil
	case "slow":
		s.slowRank, s.slowFactor = int(num("rank")), num("factor")
		return nil, nil
	case "keep":
		s.keep = nil
		if f[1] != "none" {
			for _, r := range strings.Split(f[1], ",") {
				v, _ := strconv.Atoi(r)
				s.keep = append(s.keep, v)
			}
		}
		return nil, nil
	case "run":
		n, _ := strconv.Atoi(f[1])
		return s.run(n), nil
	case "restart":
		b, err := s.p.MarshalBinary()
		if err != nil {
			return nil, err
		}
		q := New(s.cfg)
		if err := q.UnmarshalBinary(b); err != nil {
			return nil, err
		}
		b2, _ := q.MarshalBinary()
		if !bytes.Equal(b, b2) {
			return nil, errors.New("the state changed through MarshalBinary/UnmarshalBinary")
		}
		s.p = q
		s.round++ // the restarted job forms a new round
		s.roundStep = 0
		return []string{fmt.Sprintf("restored: measured %v", q.Measured())}, nil
	case "measured":
		var out []string
		for _, w := range s.p.Measured() {
			r := s.p.st.sizes[w]
			out = append(out, fmt.Sprintf("%d workers: %.0f samples/s", w, r.throughput()))
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}

// run simulates n steps.
func (s *sim) run(n int) []string {
	var out []string
	for range n {
		if s.at != 0 && s.step >= s.at {
			s.w, s.at = s.target, 0
			s.round++
			s.roundStep = 0
		}
		s.step++
		s.roundStep++
		base, ok := s.times[s.w]
		if !ok {
			panic(fmt.Sprintf("no time for %d workers", s.w))
		}
		if s.noise > 0 {
			if s.step%2 == 0 {
				base *= 1 + s.noise
			} else {
				base *= 1 - s.noise
			}
		}
		o := Observation{Step: s.step, Round: s.round, WorldSize: s.w, GlobalBatch: s.batch, Capacity: s.capacity,
			MinWorkers: s.min, MaxWorkers: s.max}
		share := s.batch / float64(s.w)
		for r := range s.w {
			iv := base
			if s.roundStep == 1 {
				iv = s.gap
			}
			c := base * s.compute
			if r == s.slowRank {
				c *= s.slowFactor
			}
			sy := 0.0
			if s.w > 1 && s.roundStep > 1 {
				sy = base * s.syncFrac
			}
			o.Interval = append(o.Interval, iv)
			o.Compute = append(o.Compute, c)
			o.Samples = append(o.Samples, share)
			o.Sync = append(o.Sync, sy)
			o.Keep = append(o.Keep, slices.Contains(s.keep, r))
		}
		d := s.p.Observe(o)
		if d == nil {
			continue
		}
		line := fmt.Sprintf("step %d: %d->%d %s", d.Step, d.From, d.To, d.Reason)
		if len(d.Remove) > 0 {
			line += fmt.Sprintf(" remove=%v", d.Remove)
		}
		out = append(out, line)
		switch {
		case d.To > s.w && s.delay > 0:
			s.target, s.at = d.To, s.step+int64(s.delay)
		case d.To < s.w:
			s.target, s.at = d.To, s.step+1
		}
	}
	if math.IsNaN(s.p.Figures().Throughput) {
		out = append(out, "NaN throughput")
	}
	return append(out, fmt.Sprintf("size %d", s.w))
}
