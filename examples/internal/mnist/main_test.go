package mnist

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/standalone"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/examples/internal/jobenv"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/launch/monitor"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/telemetry"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

func TestMain(m *testing.M) {
	if os.Getenv(launch.EnvWorker) != "" || os.Getenv(envAsMain) != "" {
		// A worker re-executed by the launcher from this test binary, or
		// the command itself run by a test as a process of its own.
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// runMain runs the command's run function as main would, with the
// launcher's worker variable cleared so it acts as the launcher.
func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return jobenv.RunAsLauncher(t, run, args...)
}

func TestBadFlagsExitWithStatus2AndSayWhy(t *testing.T) {
	cases := []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"-workers", "0"}, "-workers 0: want at least 1"},
		{[]string{"-workers", "-3"}, "-workers -3: want at least 1"},
		{[]string{"-workers", "x"}, `invalid value "x" for flag -workers`},
		{[]string{"-min", "0"}, "-min 0: want at least 1"},
		{[]string{"-min", "3", "-max", "2"}, "-max 2 is below -min 3"},
		{[]string{"-workers", "5", "-max", "4"}, "-workers 5 is above -max 4"},
		{[]string{"-epochs", "0"}, "-epochs 0: want at least 1"},
		{[]string{"-batch", "0"}, "-batch 0: want at least 1"},
		{[]string{"-lr", "0"}, "-lr 0: want a positive learning rate"},
		{[]string{"-lr", "-0.1"}, "-lr -0.1: want a positive learning rate"},
		{[]string{"-lr", "NaN"}, "-lr NaN: want a positive learning rate"},
		{[]string{"-lr", "Inf"}, "-lr +Inf: want a finite learning rate"},
		{[]string{"-lr", "+inf"}, "-lr +Inf: want a finite learning rate"},
		{[]string{"-model", "foo"}, `-model "foo": want mlp or cnn`},
		{[]string{"-detect", "1ms"}, "-detect 1ms: want at least 100ms"},
		{[]string{"-kill", "x"}, `want -kill RANK@STEP, got "x"`},
		{[]string{"-kill", "1@0"}, `bad kill step "0": want a step >= 1`},
		{[]string{"-kill", "-1@5"}, `bad -kill RANK "-1"`},
		{[]string{"-kill", "1@x"}, `bad kill step "x"`},
		{[]string{"-stop", "1@"}, `bad stop step ""`},
		{[]string{"-term", "a@3"}, `bad -term RANK "a"`},
		{[]string{"-join", "0@5"}, "bad join count 0: want at least 1"},
		{[]string{"-plot", "foo.jpg"}, `-plot "foo.jpg": want a .png file name`},
		{[]string{"-slow", "1"}, `want -slow RANK@FACTOR, got "1"`},
		{[]string{"-slow", "x@2"}, `bad -slow rank "x"`},
		{[]string{"-slow", "1@0.5"}, `bad -slow factor "0.5": want a number >= 1`},
		{[]string{"-slow", "1@NaN"}, `bad -slow factor "NaN"`},
		{[]string{"-micro", "0"}, "-micro 0: want at least 1"},
		{[]string{"-sync", "gossip"}, `-sync "gossip": want ring, localsgd or diloco`},
		{[]string{"-sync", "diloco", "-sync-every", "0"}, "-sync-every 0: want at least 1"},
		{[]string{"-sync", "diloco", "-outer-lr", "0"}, "-outer-lr 0: want a positive finite rate"},
		{[]string{"-sync", "diloco", "-outer-momentum", "1"}, "-outer-momentum 1: want [0, 1)"},
		{[]string{"-metrics", "9464"}, `-metrics "9464": want host:port`},
		{[]string{"-metrics", "localhost:http"}, `-metrics "localhost:http": want a port number`},
		{[]string{"-metrics", ":70000"}, `-metrics ":70000": want a port number`},
		{[]string{"-otlp", "collector"}, `-otlp "collector": want host:port or an http(s):// URL`},
		{[]string{"-otlp", "grpc://collector:4317"}, `-otlp "grpc://collector:4317": want an http:// or https:// URL`},
		{[]string{"-otlp", "localhost:0"}, `-otlp "localhost:0": want a port number from 1 to 65535`},
		{[]string{"-no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{[]string{"-min", "3"}, "-min 3 is above -workers 2: the first round could never form"},
		{[]string{"-kill", "5@300"}, "-kill 5@300: no worker can hold rank 5 (ranks 0..1"},
		{[]string{"-stop", "3@10", "-join", "1@5"}, "-stop 3@10: no worker can hold rank 3 (ranks 0..2"},
		{[]string{"-term", "3@10", "-workers", "4", "-max", "3"}, "-workers 4 is above -max 3"},
		{[]string{"-join", "100000@1"}, "-join: 2 workers plus 100000 joining would start 100002, above -max 64 (at most 62 may join)"},
		{[]string{"-join", "30@5", "-join", "33@9"}, "-join: 2 workers plus 63 joining would start 65, above -max 64"},
		{[]string{"-workers", "3", "-max", "4", "-join", "2@5"}, "-join: 3 workers plus 2 joining would start 5, above -max 4 (at most 1 may join)"},
		{[]string{"-job", "a}b{c"}, `-job: JobID "a}b{c" has a forbidden character at byte 1`},
		{[]string{"-job", "has space"}, `-job: JobID "has space" has a forbidden character at byte 3`},
		{[]string{"-job", strings.Repeat("j", elastic.MaxJobIDLen+1)}, "-job: JobID longer than 128 bytes"},
		{[]string{"extra"}, `unexpected arguments: ["extra"]`},
		{[]string{"-worker", "-redis", "redis:6379"}, "-worker needs -job"},
		{[]string{"-worker", "-job", "j"}, "-redis: want host:port"},
		{[]string{"-worker", "-job", "j", "-redis", "redis:6379", "-kill", "1@5"}, "-worker runs one worker: -kill, -stop, -term, -join and -plot belong to the launcher"},
		{[]string{"-worker", "-job", "j", "-redis", "redis:6379", "-capacity", "cap"}, "-worker runs one worker: -capacity belongs to the launcher"},
		{[]string{"-listen", "10.0.0.1"}, `-listen "10.0.0.1": want host:port`},
		{[]string{"-grace", "0s"}, "-grace 0s: want a positive duration"},
		{[]string{"-log-format", "xml"}, `-log-format "xml": want text or json`},
		{[]string{"-log-level", "loud"}, `-log-level "loud": want debug, info, warn or error`},
		{[]string{"-redis-master", "m"}, "-redis-master needs -redis"},
		{[]string{"-redis", "a:1,b:2"}, `-redis "a:1,b:2": several addresses are Redis Sentinels, and need -redis-master`},
		{[]string{"-redis", "a:1", "-redis-ca", "/no/such/ca.pem"}, "-redis-ca: open /no/such/ca.pem"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runMain(t, tc.args...)
			require.Equal(t, 2, code, "stderr: %s", stderr)
			require.Contains(t, stderr, tc.want)
			require.Empty(t, stdout)
			require.NotContains(t, stderr, "SIGKILL the worker", "a bad flag prints one hint, not the flag list")
		})
	}
}

// Output paths that cannot be written fail before any worker starts, not
// after the training.
func TestUnwritableOutputPathsFailBeforeAnyWorker(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-plot", filepath.Join(t.TempDir(), "missing-dir", "x.png")}, "-plot: open "},
		{[]string{"-checkpoint", filepath.Join(file, "ckpt")}, "-checkpoint: mkdir "},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			code, stdout, stderr := runMain(t, tc.args...)
			require.Equal(t, 1, code, "stderr: %s", stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "[launcher] job", "no worker may start")
		})
	}
}

// A run whose loss turns NaN (a learning rate far too large) stops at that
// step (the trainer's ErrDiverged on every rank), gets its steps through
// to the launcher, and ends saying that it diverged, with status 1, rather
// than looking like a success.
func TestADivergedRunSaysSoAndFails(t *testing.T) {
	code, stdout, stderr := runMain(t, "-workers", "1", "-epochs", "1", "-batch", "20000", "-lr", "1e30", "-json", "-quiet")
	require.Equal(t, 1, code, "stderr: %s", stderr)
	require.Contains(t, stdout, "training diverged: the last loss is NaN (try a smaller -lr than 1e+30)")
	require.Contains(t, stderr, "mnist: training diverged (last loss NaN)")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var res map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), stdout)
	require.Equal(t, true, res["diverged"])
	require.Contains(t, res, "loss")
	require.Nil(t, res["loss"], "a NaN loss is null in the JSON line")
	steps, _ := res["steps"].(float64)
	require.Less(t, steps, 3.0, "it stopped at the first step whose loss was not finite, before the epoch's last")
}

// A deterministic run of two worker processes whose gradients turn
// non-finite stops at that step on both; each recorded its share of the
// step's samples before the control exchange, and no later round drops
// them. The audit holds the samples of the applied steps only: it once
// counted the diverged step's too (samples_applied one global batch too
// many, and an audit of the applied steps found those as extras).
func TestTheAuditOfADivergedRunHoldsTheAppliedStepsOnly(t *testing.T) {
	const batch = 2000
	code, stdout, stderr := runMain(t, "-workers", "2", "-epochs", "1", "-batch", fmt.Sprint(batch), "-lr", "1e30",
		"-deterministic", "-json", "-quiet")
	require.Equal(t, 1, code, "stderr: %s", stderr)
	require.Contains(t, stderr, "non-finite gradient", "it diverged in the control exchange")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	var res struct {
		Steps           int64 `json:"steps"`
		Diverged        bool  `json:"diverged"`
		SamplesApplied  int   `json:"samples_applied"`
		AuditMissing    int   `json:"audit_missing"`
		AuditDuplicates int   `json:"audit_duplicates"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &res), stdout)
	require.True(t, res.Diverged)
	require.Positive(t, res.Steps, "a step was applied before the diverged one")
	require.Less(t, res.Steps, int64(TrainSamples/batch), "it stopped before the epoch's end")
	require.Equal(t, int(res.Steps)*batch, res.SamplesApplied, "the audit counts the applied steps' samples")
	require.Zero(t, res.AuditMissing)
	require.Zero(t, res.AuditDuplicates, "no sample of the unapplied step")
	require.Contains(t, stdout, fmt.Sprintf("audit of the steps up to %d (the last one applied): 0 missing, 0 duplicates", res.Steps))
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

// Running a job ID again while the store still says the job finished
// trains nothing: the command says which job, how to run again, and
// exits 1.
func TestRerunningAFinishedJobSaysSo(t *testing.T) {
	srv, err := standalone.Start(context.Background(), "127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	job := "mnist-rerun-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	finishJob(t, srv.Addr(), job)

	code, stdout, stderr := runMain(t, "-redis", srv.Addr(), "-job", job, "-workers", "2", "-quiet")
	require.Equal(t, 1, code, "stderr: %s", stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "mnist: job "+job+" already finished")
	require.Contains(t, stderr, "pass another -job")
	require.Contains(t, stderr, "wait for the keys to expire")
	require.NotContains(t, stderr, "none reported the job done")
}

func TestHelpExitsWithStatus0AndDocumentsTelemetryFlags(t *testing.T) {
	code, _, stderr := runMain(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, stderr, "-metrics")
	require.Contains(t, stderr, "port+i")
	require.Contains(t, stderr, "-otlp")
}

func TestMissingDataDirIsAClearError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "no-such-dir")
	code, stdout, stderr := runMain(t, "-data", dir)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "pass -data DIR holding the four MNIST IDX files")
	require.Contains(t, stderr, dir)
	require.NotContains(t, stderr, "[launcher] job", "no worker may start")
}

func TestRedisOnAClosedPortIsAClearErrorBeforeAnyWorker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	start := time.Now()
	code, stdout, stderr := runMain(t, "-redis", addr)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "-redis "+addr+" does not answer")
	require.Contains(t, stderr, "connection refused")
	require.NotContains(t, stderr, "[launcher] job", "no worker may start")
	// Not a hang: the refusal comes back within jobenv.OpenStore's own 3 s bound.
	require.Less(t, time.Since(start), 10*time.Second)
}

// --- telemetry ---

// stepSpanEvery is the trainer's step span sampling in trainLinReg.
const stepSpanEvery = 4

// trainLinReg runs a short single-worker job (linear regression, in-memory
// store) with opts and returns its result and the global batch size.
func trainLinReg(t *testing.T, opts ...trainer.Option) (trainer.Result, int) {
	t.Helper()
	const batch = 16
	prob := trainertest.NewProblem(256, 4, 0.05, 1)
	m := trainertest.NewModel(prob.Dim)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = batch, 1
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	require.NoError(t, err)
	defer loader.Close()
	cfg := trainer.DefaultConfig()
	cfg.JobID = "mnist-telemetry-" + strings.ReplaceAll(t.Name(), "/", "-")
	cfg.Epochs = 2
	cfg.Sync.Secret = []byte("a test secret of 32 bytes length")
	cfg.Elastic.LeaseTTL = time.Second
	cfg.Elastic.HeartbeatInterval = 100 * time.Millisecond
	cfg.Elastic.LastCall = 0
	cfg.StepSpanEvery = stepSpanEvery
	tr, err := trainer.New(m.Params(), optim.NewSGD(0.1), loader, m.Step, store.NewMemory(), cfg, opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := tr.Run(ctx)
	require.NoError(t, err)
	require.True(t, res.Finished)
	require.EqualValues(t, 2*(256/batch), res.Step)
	return res, batch
}

// scrape reads a Prometheus text exposition into sample lines by metric
// name (the part before '{' or ' ').
func scrape(t *testing.T, url string) map[string][]string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out := map[string][]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		out[name] = append(out[name], line)
	}
	require.NoError(t, sc.Err())
	return out
}

// sampleValue is the value of a sample line (its last field).
func sampleValue(t *testing.T, line string) float64 {
	t.Helper()
	f := strings.Fields(line)
	v, err := strconv.ParseFloat(f[len(f)-1], 64)
	require.NoError(t, err, line)
	return v
}

func TestPrometheusEndpointServesTheTrainerMetrics(t *testing.T) {
	tel, err := newTelemetry(context.Background(), "", "127.0.0.1:0", 0, "job-prom")
	require.NoError(t, err)
	defer func() { require.NoError(t, tel.shutdown(context.Background())) }()
	require.NotEmpty(t, tel.addr)
	require.Len(t, tel.options(), 1, "a meter provider, no tracer provider without -otlp")

	res, batch := trainLinReg(t, tel.options()...)
	got := scrape(t, "http://"+tel.addr+"/metrics")

	// The trainer's documented instruments under the names the OTel
	// Prometheus exporter gives them (unit suffixes, _total on counters).
	// The recovery duration appears only once a recovery happens, which a
	// one-worker job without faults never has; the recoveries and
	// stragglers counters exist from the start, at 0.
	for otelName, promName := range map[string]string{
		telemetry.MetricRecoveries:   "elastictrain_recoveries_total",
		telemetry.MetricStragglers:   "elastictrain_stragglers_total",
		telemetry.MetricStepDuration: "elastictrain_step_duration_seconds_count",
		telemetry.MetricSamples:      "elastictrain_samples_total",
		telemetry.MetricWorldSize:    "elastictrain_world_size",
		telemetry.MetricRounds:       "elastictrain_rounds_total",
		telemetry.MetricGoodput:      "elastictrain_goodput_ratio",
	} {
		require.Contains(t, got, promName, "%s is not served; got %v", otelName, keys(got))
	}
	require.Equal(t, float64(res.Step)*float64(batch), sampleValue(t, got["elastictrain_samples_total"][0]))
	require.Equal(t, float64(res.Step), sampleValue(t, got["elastictrain_step_duration_seconds_count"][0]))
	require.Equal(t, 1.0, sampleValue(t, got["elastictrain_world_size"][0]))
	require.Equal(t, 1.0, sampleValue(t, got["elastictrain_rounds_total"][0]))
	g := sampleValue(t, got["elastictrain_goodput_ratio"][0])
	require.True(t, g > 0 && g <= 1, "goodput %v", g)
	require.Contains(t, got["target_info"][0], `service_name="elastictrain-mnist"`)
}

func TestWorkerIBindsMetricsPortPlusI(t *testing.T) {
	a, err := newTelemetry(context.Background(), "", "127.0.0.1:0", 0, "job-ports")
	require.NoError(t, err)
	defer func() { require.NoError(t, a.shutdown(context.Background())) }()
	_, port, err := net.SplitHostPort(a.addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	// With -metrics one below the port a holds, worker 1 asks for a's
	// port itself: it binds port+1 for real, and says clearly that it is taken.
	base := net.JoinHostPort("127.0.0.1", strconv.Itoa(p-1))
	_, err = newTelemetry(context.Background(), "", base, 1, "job-ports")
	require.ErrorContains(t, err, "-metrics: listen tcp 127.0.0.1:"+port)
	require.ErrorContains(t, err, "address already in use")
}

// collector is a fake OTLP/HTTP collector recording what it is sent.
type collector struct {
	mu      sync.Mutex
	spans   map[string]int // span name -> count
	metrics map[string]int // metric name -> data points seen in requests
	paths   map[string]int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paths[r.URL.Path]++
	var resp proto.Message
	switch r.URL.Path {
	case "/v1/traces":
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					c.spans[s.Name]++
				}
			}
		}
		resp = &coltracepb.ExportTraceServiceResponse{}
	case "/v1/metrics":
		var req colmetricpb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					c.metrics[m.Name]++
				}
			}
		}
		resp = &colmetricpb.ExportMetricsServiceResponse{}
	default:
		http.NotFound(w, r)
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func TestOTLPExportsTheTrainerSpansAndMetricsOnShutdown(t *testing.T) {
	col := &collector{spans: map[string]int{}, metrics: map[string]int{}, paths: map[string]int{}}
	srv := httptest.NewServer(col)
	defer srv.Close()

	tel, err := newTelemetry(context.Background(), srv.URL, "", 0, "job-otlp")
	require.NoError(t, err)
	require.Len(t, tel.options(), 2, "a tracer and a meter provider")
	res, _ := trainLinReg(t, tel.options()...)
	// Shutdown flushes: everything is at the collector when it returns.
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	require.NoError(t, tel.shutdown(ctx))

	col.mu.Lock()
	defer col.mu.Unlock()
	require.Equal(t, int(res.Step)/stepSpanEvery, col.spans[telemetry.SpanStep], "one step span every %d steps; spans %v", stepSpanEvery, col.spans)
	require.Positive(t, col.spans[telemetry.SpanJoin], "spans %v", col.spans)
	for _, name := range []string{telemetry.MetricStepDuration, telemetry.MetricSamples, telemetry.MetricWorldSize, telemetry.MetricRounds} {
		require.Positive(t, col.metrics[name], "%s not exported; got %v", name, col.metrics)
	}
}

func TestOTLPToAnUnreachableCollectorDoesNotHoldUpShutdown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	tel, err := newTelemetry(context.Background(), addr, "", 0, "job-otlp-down")
	require.NoError(t, err)
	trainLinReg(t, tel.options()...)
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	err = tel.shutdown(ctx)
	require.Error(t, err, "the failed export is reported")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "a refused connection fails fast, without using up the shutdown bound")
}

func TestNoTelemetryFlagsInstallNothing(t *testing.T) {
	tel, err := newTelemetry(context.Background(), "", "", 0, "job")
	require.NoError(t, err)
	require.Empty(t, tel.options())
	require.Empty(t, tel.addr)
	require.NoError(t, tel.shutdown(context.Background()))
}

func keys(m map[string][]string) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// --- plot ---

// syntheticSummary is a 3-worker job that lost rank 1 at step 300 (rolled
// back to 298, went on with 2) and grew back to 3 at step 601.
func syntheticSummary() monitor.Summary {
	var sum monitor.Summary
	sum.Rounds = []monitor.RoundSeen{
		{Round: 1, WorldSize: 3},
		{Round: 2, WorldSize: 2, Step: 298, Recovery: true},
		{Round: 3, WorldSize: 3, Step: 601},
	}
	add := func(from, to int64, round uint64, ws int) {
		for s := from; s <= to; s++ {
			loss := 2.3*math.Exp(-float64(s)/40) + 0.08 + 0.04*math.Sin(float64(s))
			sum.Steps = append(sum.Steps, monitor.StepSeen{Step: s, Round: round, WorldSize: ws, Loss: loss})
		}
	}
	add(1, 300, 1, 3)
	add(299, 601, 2, 2)
	add(602, 937, 3, 3)
	return sum
}

func decodePNG(t *testing.T, path string) (w, h int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	return img.Bounds().Dx(), img.Bounds().Dy()
}

func TestWritePlotDrawsAPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "job.png")
	require.NoError(t, writePlot(path, syntheticSummary()))
	w, h := decodePNG(t, path)
	// 24 x 16 cm at 120 dpi.
	require.InDelta(t, 24/2.54*plotDPI, w, 1)
	require.InDelta(t, 16/2.54*plotDPI, h, 1)
}

func TestFinalHistoryKeepsTheRetrainedStep(t *testing.T) {
	h := finalHistory(syntheticSummary().Steps)
	require.Len(t, h, 937)
	for i, s := range h {
		require.EqualValues(t, i+1, s.Step)
	}
	// Steps 299 and 300 were trained in round 1, rolled back, and trained
	// again with world size 2 in round 2: the later ones are history.
	require.Equal(t, uint64(2), h[298].Round)
	require.Equal(t, 2, h[299].WorldSize)
	require.Equal(t, uint64(1), h[297].Round)
}

func TestWritePlotHandlesDegenerateSummaries(t *testing.T) {
	dir := t.TempDir()
	one := monitor.Summary{Steps: []monitor.StepSeen{{Step: 1, Round: 1, WorldSize: 1, Loss: 2}}}
	flat := monitor.Summary{Rounds: []monitor.RoundSeen{{Round: 1, WorldSize: 2}}}
	bad := monitor.Summary{Rounds: []monitor.RoundSeen{{Round: 1, WorldSize: 2}, {Round: 2, WorldSize: 1, Step: 3, Recovery: true}}}
	for s := int64(1); s <= 5; s++ {
		flat.Steps = append(flat.Steps, monitor.StepSeen{Step: s, Round: 1, WorldSize: 2, Loss: 0.5})
		bad.Steps = append(bad.Steps, monitor.StepSeen{Step: s, Round: 1, WorldSize: 2, Loss: []float64{math.NaN(), math.Inf(1), 0, -1, math.NaN()}[s-1]})
	}
	for name, sum := range map[string]monitor.Summary{"one step, no rounds": one, "constant loss": flat, "no finite positive loss": bad} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".png")
		require.NoError(t, writePlot(path, sum), name)
		decodePNG(t, path)
	}
	err := writePlot(filepath.Join(dir, "none.png"), monitor.Summary{})
	require.True(t, errors.Is(err, errNoSteps), "%v", err)
	require.ErrorContains(t, writePlot(filepath.Join(dir, "no-such-dir", "x.png"), syntheticSummary()), "no such file or directory")
}

func TestLogTicksLabelOneTwoFive(t *testing.T) {
	var labels []string
	for _, tk := range (logTicks125{}).Ticks(0.03, 2.5) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	require.Equal(t, []string{"0.05", "0.1", "0.2", "0.5", "1", "2"}, labels)
	require.Empty(t, (logTicks125{}).Ticks(0, 1))
	require.Empty(t, (logTicks125{}).Ticks(1, 1))
}

// startMain starts cmd (this test binary, os.Args[0], with the example's
// flags) as the example's main and returns its standard error line by
// line (the channel closes at its end; what a line too long to scan
// leaves is read and dropped, so the process never blocks on a full
// pipe). A process still running when the test ends is killed.
func startMain(t *testing.T, cmd *exec.Cmd) <-chan string {
	t.Helper()
	cmd.Env = append(os.Environ(), envAsMain+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		io.Copy(io.Discard, stderr)
	}()
	return lines
}

// TestWorkersAcceptTheFlagsTheLauncherPassesThem: for every world-size
// flag set the launcher accepts, its workers accept the flags it passes
// them (they checked -min and -max against their default -workers 2, so
// -max 1 and -min 3 failed every worker with status 2).
func TestWorkersAcceptTheFlagsTheLauncherPassesThem(t *testing.T) {
	for _, args := range [][]string{
		{"-workers", "1", "-max", "1"},
		{"-workers", "3", "-min", "3", "-max", "3"},
		{"-workers", "4", "-min", "4", "-autoscale"},
		{"-sync", "diloco", "-sync-every", "8", "-outer-lr", "0.5", "-outer-momentum", "0.8"},
	} {
		c, err := parseFlags(args, io.Discard)
		require.NoError(t, err, "%q", args)
		w, err := parseFlags(workerArgs(c), io.Discard)
		require.NoError(t, err, "a worker of %q", args)
		require.Equal(t, [4]any{c.sync, c.syncEvery, c.outerLR, c.outerMu}, [4]any{w.sync, w.syncEvery, w.outerLR, w.outerMu}, "a worker of %q", args)
	}
}

// -sync diloco across a SIGKILL and a join between outer steps: worker
// processes over TCP roll back to the last outer step and the audit is
// exact; the result names the mode.
func TestDiLoCoRunSurvivesAKillAndAJoinWithAnExactAudit(t *testing.T) {
	code, stdout, stderr := runMain(t, "-workers", "2", "-epochs", "1", "-batch", "2000", "-sync", "diloco", "-sync-every", "4",
		"-kill", "1@10", "-join", "1@18", "-json", "-quiet")
	require.Equal(t, 0, code, "stderr: %s", stderr)
	var res result // the launcher's JSON line, the last of stdout
	out := strings.TrimSpace(stdout)
	require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), &res), stdout)
	require.Equal(t, "diloco", res.Sync)
	require.Equal(t, 4, res.SyncEvery)
	require.Equal(t, 0.7, res.OuterLR)
	require.Equal(t, 1, res.Recoveries, "the kill")
	require.Equal(t, [4]int{TrainSamples / 2000, TrainSamples, 0, 0},
		[4]int{int(res.Steps), res.SamplesApplied, res.AuditMissing, res.AuditDuplicates}, "steps, samples, audit missing, duplicates")
	require.Greater(t, res.TestAccuracy, 0.5, "it trained")
}

// The default mode is deterministic (#32): with no flag, two runs of two
// workers, a run of three workers with a SIGKILL and a join, and a run of
// two in which one worker computes twice as slowly (so the balancer gives
// it fewer micro-batches) end with the same parameter bits, and say they
// ran deterministically. -deterministic=false says it did not.
func TestTheDefaultRunGivesTheSameBitsWhateverTheWorldSizeFaultsAndShares(t *testing.T) {
	runJSON := func(args ...string) result {
		t.Helper()
		code, stdout, stderr := runMain(t, append([]string{"-epochs", "1", "-json", "-quiet"}, args...)...)
		require.Equal(t, 0, code, "%q: stderr: %s", args, stderr)
		var res result
		out := strings.TrimSpace(stdout)
		require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndexByte(out, '\n')+1:]), &res), stdout)
		require.Equal(t, [2]int{0, 0}, [2]int{res.AuditMissing, res.AuditDuplicates}, "%q: audit missing, duplicates", args)
		return res
	}
	first := runJSON("-workers", "2")
	require.True(t, first.Deterministic, "the default run is deterministic")
	require.Len(t, first.ParamsSHA256, 64)
	for _, args := range [][]string{
		{"-workers", "2"},
		{"-workers", "3", "-kill", "1@300", "-join", "1@600"},
		{"-workers", "2", "-slow", "1@2"},
	} {
		res := runJSON(args...)
		require.True(t, res.Deterministic, "%q", args)
		if args[1] == "3" {
			require.Equal(t, 1, res.Recoveries, "%q: the kill", args)
		}
		require.Equal(t, first.ParamsSHA256, res.ParamsSHA256, "%q against -workers 2", args)
	}
	require.False(t, runJSON("-workers", "2", "-deterministic=false").Deterministic, "-deterministic=false")
}
