package trainer

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync"
)

// The deterministic core is tested from scripts (testdata/core/*.txt), in
// the way etcd raft tests its RawNode: each case is a command with
// arguments, input lines, a "----" line and the expected output, ending
// at a blank line. A failing case prints the script position, its input
// and both outputs; go test -run TestCoreScripts -update rewrites the
// expected outputs from what the core does (review the diff!).
//
// Commands:
//
//	agree                        one input line per rank: [fp=F] (none | round=R seq=S [commits=S1,S2]) [recovered] [owed]
//	step W=N [det]               one line per rank: [samples=N] [loss=X] [compute=X] [grad=X|inf|nan] [change] [steperr] [stop] [epochdone]
//	boundary step=N every=C [ckpt=K] [asked] [evict=R] [rank=R] [preempted]   (on the last step's outcome)
//	stragglers factor=F steps=N [evict]   one line per step: compute seconds of each rank
//	unformed max=N               one line per round: fail | fail reported | train
//	report rank=R size=W [holds] one line per error: peer R (lost|aborted|closed) | other
//	recoveries now=MS window=D   one line: recovery times in unix ms
var update = flag.Bool("update", false, "rewrite the expected outputs of testdata/core")

func TestCoreScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "core", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptCase struct {
	line   int // of the command
	cmd    string
	args   map[string]string
	input  []string
	want   []string
	header []string // comments and the command line, kept for -update
}

func parseScript(t *testing.T, path string) []scriptCase {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []scriptCase
	var cur *scriptCase
	var pending []string
	inWant := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && (line == "" || strings.HasPrefix(line, "#")):
			pending = append(pending, line)
		case cur == nil:
			fields := strings.Fields(line)
			cur = &scriptCase{line: n, cmd: fields[0], args: map[string]string{}, header: append(pending, line)}
			pending = nil
			for _, a := range fields[1:] {
				k, v, ok := strings.Cut(a, "=")
				if !ok {
					v = "true" // a bare flag
				}
				cur.args[k] = v
			}
		case line == "----":
			inWant = true
		case line == "":
			cases = append(cases, *cur)
			cur, inWant = nil, false
			pending = []string{""}
		case inWant:
			cur.want = append(cur.want, line)
		default:
			cur.input = append(cur.input, line)
		}
	}
	if cur != nil {
		cases = append(cases, *cur)
	}
	return cases
}

func runScript(t *testing.T, path string) {
	cases := parseScript(t, path)
	var out strings.Builder
	env := &scriptEnv{}
	for _, c := range cases {
		got := env.run(t, c)
		if !*update && strings.Join(got, "\n") != strings.Join(c.want, "\n") {
			t.Errorf("%s:%d: %s %v\ninput:\n  %s\ngot:\n  %s\nwant:\n  %s", path, c.line, c.cmd, c.args,
				strings.Join(c.input, "\n  "), strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
		}
		for _, h := range c.header {
			out.WriteString(h + "\n")
		}
		for _, in := range c.input {
			out.WriteString(in + "\n")
		}
		out.WriteString("----\n")
		for _, g := range got {
			out.WriteString(g + "\n")
		}
	}
	if *update {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// scriptEnv carries state between the cases of one script (the last
// step's outcome, for boundary).
type scriptEnv struct {
	outcome stepOutcome
}

// words parses "k=v" and bare flags of one input line.
func words(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			v = "true"
		}
		m[k] = v
	}
	return m
}

func num(t *testing.T, m map[string]string, k string, def float64) float64 {
	v, ok := m[k]
	if !ok {
		return def
	}
	switch v {
	case "inf":
		return math.Inf(1)
	case "nan":
		return math.NaN()
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", k, v, err)
	}
	return f
}

func maxReduce(vs [][]float64) []float64 {
	out := append([]float64(nil), vs[0]...)
	for _, v := range vs[1:] {
		for i := range out {
			out[i] = math.Max(out[i], v[i])
		}
	}
	return out
}

func (e *scriptEnv) run(t *testing.T, c scriptCase) []string {
	switch c.cmd {
	case "agree":
		return scriptAgree(t, c)
	case "step":
		return e.scriptStep(t, c)
	case "boundary":
		return e.scriptBoundary(t, c)
	case "stragglers":
		return scriptStragglers(t, c)
	case "unformed":
		return scriptUnformed(t, c)
	case "report":
		return scriptReport(t, c)
	case "recoveries":
		return scriptRecoveries(t, c)
	}
	t.Fatalf("line %d: unknown command %q", c.line, c.cmd)
	return nil
}

// scriptAgree runs both phases of the state agreement over the ranks'
// claims, reducing as the max-allreduce does, and prints what every rank
// decided (which must be the same).
func scriptAgree(t *testing.T, c scriptCase) []string {
	W := len(c.input)
	claims := make([]stateClaim, W)
	commits := make([][]*snapshot, W)
	for r, line := range c.input {
		m := words(line)
		cl := stateClaim{fingerprint: num(t, m, "fp", 1), recovered: m["recovered"] == "true", owed: m["owed"] == "true"}
		if m["none"] != "true" {
			cl.holds = true
			cl.stateRound = uint64(num(t, m, "round", 0))
			cl.latestSeq = uint64(num(t, m, "seq", 0))
			seqs := []string{m["seq"]}
			if s, ok := m["commits"]; ok {
				seqs = strings.Split(s, ",")
			}
			for _, s := range seqs {
				n, _ := strconv.ParseUint(s, 10, 64)
				commits[r] = append(commits[r], &snapshot{seq: n})
			}
		}
		claims[r] = cl
	}
	v1 := make([][]float64, W)
	for r, cl := range claims {
		v1[r] = agreementPhase1(cl)
	}
	red1 := maxReduce(v1)
	var p1 phase1
	for r, cl := range claims {
		p := decidePhase1(red1, cl.fingerprint)
		if p.mismatch {
			return []string{fmt.Sprintf("mismatch (seen by rank %d)", r)}
		}
		p1 = p
	}
	flags := fmt.Sprintf("recovered=%v counted=%v", p1.recovered, p1.counted)
	if !p1.held {
		return []string{"init from rank 0 " + flags}
	}
	v2 := make([][]float64, W)
	for r, cl := range claims {
		v2[r] = agreementPhase2(cl, p1, r, W)
	}
	root, seq := decidePhase2(maxReduce(v2))
	if root < 0 || root >= W {
		return []string{fmt.Sprintf("no root (%d)", root)}
	}
	out := fmt.Sprintf("commit seq=%d from rank %d %s", seq, root, flags)
	if pickCommit(seq, commits[root]...) == nil {
		out += " MISSING at the root"
	}
	var holdsAll []string
	for r, cs := range commits {
		if len(cs) > 0 && claims[r].stateRound == uint64(p1.fresh) && pickCommit(seq, cs...) == nil {
			holdsAll = append(holdsAll, strconv.Itoa(r))
		}
	}
	if len(holdsAll) > 0 {
		out += " (fresh ranks lacking it: " + strings.Join(holdsAll, ",") + ")"
	}
	return []string{out}
}

// scriptStep reduces every rank's control values as the step's allreduce
// does and prints what every rank reads.
func (e *scriptEnv) scriptStep(t *testing.T, c scriptCase) []string {
	W := int(num(t, c.args, "W", float64(len(c.input))))
	if W != len(c.input) {
		t.Fatalf("line %d: W=%d with %d rank lines", c.line, W, len(c.input))
	}
	det := c.args["det"] != ""
	bufs := make([][]float64, W)
	for r, line := range c.input {
		m := words(line)
		bufs[r] = make([]float64, controlLen(W))
		putControl(bufs[r], r, control{change: m["change"] == "true", stepErr: m["steperr"] == "true", gradMax: num(t, m, "grad", 0),
			loss: num(t, m, "loss", 0), samples: int(num(t, m, "samples", 0)), compute: num(t, m, "compute", 0),
			stop: m["stop"] == "true", epochDone: m["epochdone"] == "true"})
	}
	readControl(maxReduce(bufs), W, det, &e.outcome)
	o := &e.outcome
	return []string{
		fmt.Sprintf("failed=%v diverged=%v change=%v samples=%v loss=%v stop=%v first-stop=%d",
			o.stepFailed, o.diverged, o.change, o.samples, o.lossSum, o.stop, o.firstStop),
		fmt.Sprintf("per-rank samples=%v compute=%v epoch-done=%v", o.perSamples, o.perCompute, o.epochDone),
	}
}

func (e *scriptEnv) scriptBoundary(t *testing.T, c scriptCase) []string {
	a := c.args
	in := boundaryIn{step: int64(num(t, a, "step", 0)), commitEvery: int(num(t, a, "every", 1)), checkpointEvery: int(num(t, a, "ckpt", 0)),
		commitAsked: a["asked"] != "", evict: int(num(t, a, "evict", -1)), rank: int(num(t, a, "rank", 0)), preempted: a["preempted"] != "", unsynced: a["unsynced"] != ""}
	b := decideBoundary(&e.outcome, in)
	end := map[roundEnd]string{endNone: "go on", endRejoin: "rejoin", endPreempted: "leave (preempted)", endEvicted: "leave (evicted)"}[b.end]
	return []string{fmt.Sprintf("commit=%v checkpoint=%v then %s", b.commit, b.checkpoint, end)}
}

func scriptStragglers(t *testing.T, c scriptCase) []string {
	s := stragglers{factor: num(t, c.args, "factor", 2), steps: int(num(t, c.args, "steps", 3))}
	evict := c.args["evict"] != ""
	var out []string
	for i, line := range c.input {
		var compute []float64
		for _, f := range strings.Fields(line) {
			v, err := strconv.ParseFloat(f, 64)
			if err != nil {
				t.Fatal(err)
			}
			compute = append(compute, v)
		}
		if i == 0 {
			s.reset(len(compute))
		}
		var rep []string
		ev := s.observe(compute, evict, func(r int, ratio float64) { rep = append(rep, fmt.Sprintf("%d(x%.2f)", r, ratio)) })
		o := fmt.Sprintf("step %d: slow=%v", i+1, s.slow)
		if len(rep) > 0 {
			o += " reported " + strings.Join(rep, " ")
		}
		if ev >= 0 {
			o += fmt.Sprintf(" evict %d", ev)
		}
		out = append(out, o)
	}
	return out
}

func scriptUnformed(t *testing.T, c scriptCase) []string {
	u := unformed{max: int(num(t, c.args, "max", 20))}
	var out []string
	for _, line := range c.input {
		switch strings.TrimSpace(line) {
		case "train":
			u.trained()
			out = append(out, fmt.Sprintf("trained: in a row %d", u.n))
		case "fail", "fail reported":
			giveUp, pause := u.failed(strings.Contains(line, "reported"))
			o := fmt.Sprintf("failed: in a row %d, pause %v", u.n, pause)
			if giveUp {
				o += ", give up"
			}
			out = append(out, o)
		default:
			t.Fatalf("unformed: %q", line)
		}
	}
	return out
}

func scriptReport(t *testing.T, c scriptCase) []string {
	rank, size := int(num(t, c.args, "rank", 0)), int(num(t, c.args, "size", 2))
	holds := c.args["holds"] != ""
	var out []string
	for _, line := range c.input {
		var err error
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "peer" {
			r, _ := strconv.Atoi(f[1])
			cause := map[string]error{"lost": errors.New("connection reset"), "aborted": sync.ErrAborted, "closed": sync.ErrClosed}[f[2]]
			err = fmt.Errorf("trainer: step 3: %w", &sync.PeerError{Rank: r, Err: cause})
		} else {
			err = errors.New(line)
		}
		r := reportTarget(err, rank, size, holds)
		if r < 0 {
			out = append(out, line+": report nobody")
		} else {
			out = append(out, fmt.Sprintf("%s: report rank %d", line, r))
		}
	}
	return out
}

func scriptRecoveries(t *testing.T, c scriptCase) []string {
	now := time.UnixMilli(int64(num(t, c.args, "now", 0)))
	window, err := time.ParseDuration(c.args["window"])
	if err != nil {
		t.Fatal(err)
	}
	var recs []int64
	for _, f := range strings.Fields(strings.Join(c.input, " ")) {
		v, _ := strconv.ParseInt(f, 10, 64)
		recs = append(recs, v)
	}
	return []string{fmt.Sprintf("within the window: %d", recoveriesWithin(recs, now, window))}
}

// The agreement hammered with random rounds: survivors of the freshest
// round are at most one commit apart (each keeps its last two), fenced
// members hold older rounds with any numbers, joiners hold nothing. The
// agreed commit is held by every survivor of the freshest round, it is
// the newest such, and the root is the lowest survivor.
func TestAgreementPicksTheNewestCommitEverySurvivorHolds(t *testing.T) {
	rng := splitmix(1)
	for it := range 20000 {
		W := 1 + int(rng.next()%8)
		fresh := 2 + rng.next()%50
		base := rng.next() % 1000
		claims := make([]stateClaim, W)
		held := make([][]uint64, W)
		any := false
		for r := range claims {
			c := stateClaim{fingerprint: 3}
			switch rng.next() % 4 {
			case 0: // joiner
			case 1: // fenced member of an older round
				c.holds, c.stateRound, c.latestSeq = true, rng.next()%fresh, rng.next()%5000
			default: // survivor
				c.holds, c.stateRound, c.latestSeq = true, fresh, base+rng.next()%2
				any = true
			}
			if c.holds {
				held[r] = []uint64{c.latestSeq}
				if c.latestSeq > 0 {
					held[r] = append(held[r], c.latestSeq-1)
				}
			}
			claims[r] = c
		}
		if !any && it%2 == 0 {
			// Make one survivor, so that the fenced are not the freshest
			// (the generator's fenced members break the one-commit-apart
			// rule among themselves; those of one real round keep it).
			claims[0] = stateClaim{fingerprint: 3, holds: true, stateRound: fresh, latestSeq: base}
			held[0] = []uint64{base}
			any = true
		}
		if !any {
			for r := range claims {
				claims[r].holds = false
			}
		}
		v1 := make([][]float64, W)
		for r, c := range claims {
			v1[r] = agreementPhase1(c)
		}
		p1 := decidePhase1(maxReduce(v1), 3)
		if !p1.held {
			for _, c := range claims {
				if c.holds {
					t.Fatalf("iteration %d: a holder, but nobody holds state: %+v", it, claims)
				}
			}
			continue
		}
		v2 := make([][]float64, W)
		for r, c := range claims {
			v2[r] = agreementPhase2(c, p1, r, W)
		}
		root, seq := decidePhase2(maxReduce(v2))
		lowest, newest := -1, uint64(math.MaxUint64)
		for r, c := range claims {
			if c.holds && float64(c.stateRound) == p1.fresh {
				if lowest < 0 {
					lowest = r
				}
				newest = min(newest, c.latestSeq)
				if !slicesContains(held[r], seq) {
					t.Fatalf("iteration %d: survivor %d lacks agreed commit %d: %+v", it, r, seq, claims)
				}
			}
		}
		if root != lowest || seq != newest {
			t.Fatalf("iteration %d: root %d seq %d, want %d %d (any survivor %v): %+v", it, root, seq, lowest, newest, any, claims)
		}
	}
}

func slicesContains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// splitmix is a tiny deterministic generator for the property tests.
type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
