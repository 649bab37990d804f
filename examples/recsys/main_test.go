package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/examples/internal/launcher"
)

func TestMain(m *testing.M) {
	if os.Getenv(launcher.EnvWorker) != "" {
		// A worker re-executed by the launcher from this test binary.
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// naiveAUC counts positive/negative pairs directly.
func naiveAUC(scores []float64, labels []float32) float64 {
	var num, den float64
	for i := range scores {
		for j := range scores {
			if labels[i] > 0.5 && labels[j] < 0.5 {
				den++
				switch {
				case scores[i] > scores[j]:
					num++
				case scores[i] == scores[j]:
					num += 0.5
				}
			}
		}
	}
	return num / den
}

func TestAUCMatchesPairCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 2; n < 300; n += 37 {
		scores := make([]float64, n)
		labels := make([]float32, n)
		for i := range scores {
			scores[i] = float64(rng.IntN(10)) // many ties
			if rng.IntN(3) == 0 {
				labels[i] = 1
			}
		}
		labels[0], labels[1] = 1, 0
		if got, want := AUC(scores, labels), naiveAUC(scores, labels); math.Abs(got-want) > 1e-12 {
			t.Fatalf("n=%d: AUC %v, pair count %v", n, got, want)
		}
	}
	if !math.IsNaN(AUC([]float64{1, 2}, []float32{1, 1})) {
		t.Fatal("AUC with one class should be NaN")
	}
}

func TestGeneratorIsDeterministicWithKnownOracle(t *testing.T) {
	g := DefaultGenConfig()
	g.Impressions = 50_000
	tr1, te1 := Generate(g)
	tr2, te2 := Generate(g)
	if len(te1) != 5000 || len(tr1) != 45_000 {
		t.Fatalf("split %d/%d", len(tr1), len(te1))
	}
	for i := range tr1 {
		if tr1[i] != tr2[i] {
			t.Fatal("not deterministic")
		}
	}
	if te1[0] != te2[0] {
		t.Fatal("not deterministic")
	}
	// The oracle ranks far better than chance, and clicks follow P.
	if o := OracleAUC(te1); o < 0.8 || o > 0.95 {
		t.Fatalf("oracle AUC %v", o)
	}
	var clicks, p float64
	counts := make([]int, g.Items)
	for _, s := range tr1 {
		clicks += float64(s.Click)
		p += float64(s.P)
		counts[s.Item]++
	}
	if math.Abs(clicks-p) > 4*math.Sqrt(p) {
		t.Fatalf("%v clicks, expected %v", clicks, p)
	}
	// Zipf-like popularity: the most popular item is far above the median.
	max, zero := 0, 0
	for _, c := range counts {
		max = maxInt(max, c)
		if c == 0 {
			zero++
		}
	}
	if float64(max) < 20*float64(len(tr1))/float64(g.Items) {
		t.Fatalf("most popular item has %d impressions of %d: not Zipf-like", max, len(tr1))
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// TestBackwardMatchesFiniteDifferences checks the model's gradients.
func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	const dim = 4
	m := NewModel(dim)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range m.Dense {
		m.Dense[i] = float32(rng.NormFloat64())
	}
	samples := []Sample{{User: 0, Item: 1, Click: 1}, {User: 1, Item: 1, Click: 0}, {User: 0, Item: 2, Click: 0}}
	var l Lookup
	l.Prepare(samples, dim)
	for i := range l.UVals {
		l.UVals[i] = float32(rng.NormFloat64())
	}
	for i := range l.IVals {
		l.IVals[i] = float32(rng.NormFloat64())
	}
	m.Backward(samples, &l)
	ug, ig, dg := append([]float32(nil), l.UGrad...), append([]float32(nil), l.IGrad...), append([]float32(nil), m.Grad...)
	check := func(what string, vals []float32, grads []float32) {
		for i := range vals {
			old := vals[i]
			const h = 1e-3
			vals[i] = old + h
			up := m.Backward(samples, &l)
			vals[i] = old - h
			down := m.Backward(samples, &l)
			vals[i] = old
			num := (up - down) / (2 * h)
			if math.Abs(num-float64(grads[i])) > 1e-3*math.Max(1, math.Abs(num)) {
				t.Fatalf("%s[%d]: backward %v, finite difference %v", what, i, grads[i], num)
			}
		}
	}
	check("user", l.UVals, ug)
	check("item", l.IVals, ig)
	check("dense", m.Dense, dg)
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-workers", "0"}, {"-lr", "0"}, {"-users", "0"}, {"-max", "1", "-workers", "2"}} {
		t.Setenv(launcher.EnvWorker, "")
		var o, e bytes.Buffer
		if code := run(args, &o, &e); code != 2 {
			t.Fatalf("%v: exit %d, want 2 (%s)", args, code, e.String())
		}
	}
}

// runCmd runs the command as the launcher and returns its exit code
// and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return jobenv.RunAsLauncher(t, run, args...)
}

func TestBadFlagsSayWhy(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-lr", "Inf"}, "-lr +Inf and -dense-lr 0.01 must be positive and finite"},
		{[]string{"-dense-lr", "+Inf"}, "-lr 0.2 and -dense-lr +Inf must be positive and finite"},
		{[]string{"-join", "100000@1"}, "-join: 3 workers plus 100000 joining would start 100003, above -max 64 (at most 61 may join)"},
		{[]string{"-max", "4", "-join", "1@5", "-join", "1@9"}, "-join: 3 workers plus 2 joining would start 5, above -max 4"},
		{[]string{"-job", "a}b{c"}, `-job: JobID "a}b{c" has a forbidden character at byte 1`},
	} {
		code, stdout, stderr := runCmd(t, tc.args...)
		if code != 2 || stdout != "" || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "[launcher] job") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want 2 and %q before any worker starts", tc.args, code, stdout, stderr, tc.want)
		}
	}
}

// A learning rate far too large makes the gradients non-finite: the
// workers stop and say that training diverged, rather than forming new
// rounds for good.
func TestADivergedRunStopsAndSaysSo(t *testing.T) {
	code, _, stderr := runCmd(t, "-workers", "1", "-epochs", "1", "-lr", "1e30", "-dense-lr", "1e30", "-impressions", "20000", "-quiet")
	if code != 1 || !strings.Contains(stderr, "training diverged: the embedding gradients are not finite") {
		t.Fatalf("exit %d, want 1 and the divergence named\n%s", code, stderr)
	}
	if strings.Contains(stderr, "round 2") {
		t.Fatalf("a diverged job formed another round\n%s", stderr)
	}
}

// Running a job ID again while the store still says the job finished
// trains nothing: the command says which job, how to run again, and
// exits 1.
func TestRerunningAFinishedJobSaysSo(t *testing.T) {
	srv, err := standalone.Start(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	job := "recsys-rerun-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	finishJob(t, srv.Addr(), job)
	code, stdout, stderr := runCmd(t, "-redis", srv.Addr(), "-job", job, "-workers", "2", "-impressions", "20000", "-quiet")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "recsys: job "+job+" already finished") ||
		!strings.Contains(stderr, "pass another -job") || strings.Contains(stderr, "none reported the job done") {
		t.Fatalf("exit %d, stdout %q; want 1 and the job named as finished\n%s", code, stdout, stderr)
	}
}

// finishJob marks job finished in the store at addr, as the final rank 0
// of an earlier run of that job ID does.
func finishJob(t *testing.T, addr, job string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jobenv.MarkFinished(ctx, addr, job); err != nil {
		t.Fatal(err)
	}
}

// runJob runs the example with real worker processes and returns its
// final JSON line.
func runJob(t *testing.T, args ...string) result {
	t.Helper()
	t.Setenv(launcher.EnvWorker, "")
	var o, e bytes.Buffer
	if code := run(append(args, "-json", "-quiet"), &o, &e); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, o.String(), e.String())
	}
	for _, l := range strings.Split(e.String(), "\n") {
		if strings.Contains(l, "round") && !strings.Contains(l, "loss") {
			t.Log(l)
		}
	}
	lines := strings.Split(strings.TrimSpace(o.String()), "\n")
	var r result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	return r
}

// TestKilledShardHostRecovers: 3 worker processes, each hosting a shard,
// with the loader's fixed split (so both runs train the same steps);
// the one holding rank 1 is SIGKILLed off a commit boundary. Training goes
// on without it (its rows come back from the shard store), and the final
// AUC is within 0.01 of an uninterrupted run and within 0.02 of the oracle.
func TestKilledShardHostRecovers(t *testing.T) {
	small := []string{"-dynamic=false", "-epochs", "2", "-workers", "3", "-detect", "3s"}
	base := runJob(t, small...)
	killed := runJob(t, append(small, "-kill", "1@311")...)
	t.Logf("uninterrupted: auc %.4f oracle %.4f; killed: auc %.4f, recoveries %d, world sizes %v, recovery %v s",
		base.AUC, base.OracleAUC, killed.AUC, killed.Recoveries, killed.WorldSizes, killed.RecoverySeconds)
	if killed.Recoveries != 1 || len(killed.WorldSizes) < 2 || killed.WorldSizes[1] != 2 {
		t.Fatalf("want one recovery onto 2 workers, got %d recoveries, world sizes %v", killed.Recoveries, killed.WorldSizes)
	}
	if killed.Steps != base.Steps {
		t.Fatalf("steps %d with a kill, %d without", killed.Steps, base.Steps)
	}
	if d := math.Abs(killed.AUC - base.AUC); d > 0.01 {
		t.Fatalf("AUC %v with a kill, %v without (difference %v > 0.01)", killed.AUC, base.AUC, d)
	}
	if gap := base.OracleAUC - base.AUC; gap > 0.02 {
		t.Fatalf("AUC %v is %v below the oracle %v", base.AUC, gap, base.OracleAUC)
	}
	for _, r := range []result{base, killed} {
		if r.AuditMissing != 0 || r.AuditDuplicates != 0 || r.SamplesApplied != 2*(r.TrainImpr/1024*1024) {
			t.Fatalf("audit: %d samples, %d missing, %d duplicates", r.SamplesApplied, r.AuditMissing, r.AuditDuplicates)
		}
	}
}

// TestDynamicShardsExactlyOnceWithSlowWorkerAndKill: with leased data
// shards, a worker slowed down by 50us per sample takes a small share of
// every global batch, and a SIGKILLed worker's shards are adopted by the
// survivors: every training sample of every epoch is applied exactly once,
// and the AUC stays within 0.01 of an undisturbed run and 0.02 of the
// oracle.
func TestDynamicShardsExactlyOnceWithSlowWorkerAndKill(t *testing.T) {
	base := runJob(t, "-epochs", "2", "-workers", "3", "-detect", "3s")
	r := runJob(t, "-epochs", "2", "-workers", "3", "-detect", "3s", "-slow", "0:50us", "-kill", "1@400")
	if d := math.Abs(r.AUC - base.AUC); d > 0.01 {
		t.Fatalf("AUC %v with a slow worker and a kill, %v without (difference %v > 0.01)", r.AUC, base.AUC, d)
	}
	t.Logf("auc %.4f oracle %.4f; %d samples, %d missing, %d duplicates; shares %v; world sizes %v; %.1f s",
		r.AUC, r.OracleAUC, r.SamplesApplied, r.AuditMissing, r.AuditDuplicates, r.MeanShare, r.WorldSizes, r.WallSeconds)
	if r.AuditMissing != 0 || r.AuditDuplicates != 0 || r.SamplesApplied != 2*r.TrainImpr {
		t.Fatalf("audit: %d samples (want %d), %d missing, %d duplicates", r.SamplesApplied, 2*r.TrainImpr, r.AuditMissing, r.AuditDuplicates)
	}
	if r.Recoveries != 1 {
		t.Fatalf("%d recoveries, want 1", r.Recoveries)
	}
	// The survivors never wait for the dead worker's leases (-lease 20 s)
	// to expire: only the epochs' ends train nothing, briefly.
	if r.EmptySeconds > 5 {
		t.Fatalf("%d steps trained nothing, for %.1f s: the survivors waited for a lease to expire", r.EmptySteps, r.EmptySeconds)
	}
	if gap := r.OracleAUC - r.AUC; gap > 0.02 {
		t.Fatalf("AUC %v is %v below the oracle %v", r.AUC, gap, r.OracleAUC)
	}
}

func TestSharesSplitTheBatchBySpeed(t *testing.T) {
	for _, c := range []struct {
		g     int
		speed []float64
	}{{1024, []float64{1, 1, 1}}, {1024, []float64{1e6, 1e6, 1}}, {7, []float64{5, 1, 1, 1}}, {3, []float64{1, 2, 3, 4, 5}}} {
		got := shares(c.g, c.speed)
		sum := 0
		for _, x := range got {
			sum += x
			if c.g >= len(c.speed) && x < 1 {
				t.Fatalf("shares(%d, %v) = %v: a rank gets nothing", c.g, c.speed, got)
			}
		}
		if sum != c.g {
			t.Fatalf("shares(%d, %v) = %v: sum %d", c.g, c.speed, got, sum)
		}
	}
	got := shares(1024, []float64{1e6, 1e6, 1})
	if got[2] != 1024/24 || got[0] < 480 {
		t.Fatalf("a rank a million times slower gets %v", got)
	}
}
