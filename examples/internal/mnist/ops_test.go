package mnist

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/checkpoint"
	"github.com/elastictrain/elastictrain/trainer/driver"
)

// scrapeFamilies GETs a Prometheus text exposition and parses it with the
// Prometheus text-format parser (prometheus/common/expfmt), as a Prometheus
// server scraping the worker would.
func scrapeFamilies(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if ct := expfmt.ResponseFormat(resp.Header); ct.FormatType() != expfmt.TypeTextPlain {
		return nil, fmt.Errorf("GET %s: Content-Type %q is not the text format", url, resp.Header.Get("Content-Type"))
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// The real example, launched as a user would with -metrics and
// -log-format json: while it trains, its worker's /metrics parses as the
// Prometheus text format and carries the trainer's metrics with the job's
// label, /healthz answers, and every line the worker logs (at debug, so
// the rendezvous' and the transport's lines too) is one JSON object with
// the documented fields, the job among them once.
func TestMetricsScrapeAndJSONLogsOfARealRun(t *testing.T) {
	port := freeLoopbackPort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	job := "mnist-ops-" + strings.ReplaceAll(fmt.Sprint(time.Now().UnixNano()), "-", "")
	type out struct {
		code           int
		stdout, stderr string
	}
	done := make(chan out, 1)
	go func() {
		code, o, e := runMain(t, "-workers", "1", "-epochs", "1", "-batch", "256", "-job", job,
			"-metrics", fmt.Sprintf("127.0.0.1:%d", port), "-log-format", "json", "-log-level", "debug", "-quiet")
		done <- out{code, o, e}
	}()

	want := map[string]dto.MetricType{
		"elastictrain_step_duration_seconds":    dto.MetricType_HISTOGRAM,
		"elastictrain_samples_total":            dto.MetricType_COUNTER,
		"elastictrain_world_size":               dto.MetricType_GAUGE,
		"elastictrain_rounds_total":             dto.MetricType_COUNTER,
		"elastictrain_recoveries_total":         dto.MetricType_COUNTER,
		"elastictrain_stragglers_total":         dto.MetricType_COUNTER,
		"elastictrain_goodput_ratio":            dto.MetricType_GAUGE,
		"elastictrain_balance_share":            dto.MetricType_GAUGE,
		"elastictrain_balance_speed_per_second": dto.MetricType_GAUGE,
	}
	// Scrape until every one of them is there (goodput is recorded every
	// 100 steps; the job has 1 epoch of 234 steps).
	all := func(f map[string]*dto.MetricFamily) bool {
		for name := range want {
			if f[name] == nil {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var fams map[string]*dto.MetricFamily
	var scrapeErr error
	var res *out
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for res == nil && ctx.Err() == nil {
		fams, scrapeErr = scrapeFamilies(ctx, base+"/metrics")
		if scrapeErr == nil && all(fams) {
			break
		}
		select {
		case o := <-done:
			res = &o
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	require.Nil(t, res, "the run ended before a scrape showed every metric (last scrape error: %v; families %v)", scrapeErr, keysOf(fams))
	require.NoError(t, scrapeErr)

	for name, typ := range want {
		f := fams[name]
		require.NotNil(t, f, "%s missing from the scrape", name)
		require.Equal(t, typ, f.GetType(), name)
		require.NotEmpty(t, f.GetHelp(), "%s has no HELP", name)
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, job, labels["elastictrain_job"], "%s carries the job label", name)
	}
	require.Equal(t, 1.0, fams["elastictrain_world_size"].GetMetric()[0].GetGauge().GetValue())
	require.Positive(t, fams["elastictrain_samples_total"].GetMetric()[0].GetCounter().GetValue())
	require.Zero(t, fams["elastictrain_recoveries_total"].GetMetric()[0].GetCounter().GetValue(), "no failure, no recovery; but the series exists")
	require.Positive(t, fams["elastictrain_step_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount())

	resp, err := http.Get(base + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var o out
	select {
	case o = <-done:
	case <-ctx.Done():
		t.Fatal("the run did not end")
	}
	require.Equal(t, 0, o.code, "stdout:\n%s\nstderr:\n%s", o.stdout, o.stderr)

	// Every worker line is a JSON object with the documented fields.
	seen := map[string]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(o.stderr))
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "[launcher]") || line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "not a JSON log line: %q", line)
		// Once: a decoded map keeps the last of repeated keys (the
		// rendezvous' lines carried the job twice).
		require.Equal(t, 1, jsonKeyCount(t, line, "job"), "line %q", line)
		n++
		for _, k := range []string{"time", "level", "msg", "job", "worker", "pid"} {
			require.Contains(t, rec, k, "line %q", line)
		}
		require.Equal(t, job, rec["job"])
		_, err := time.Parse(time.RFC3339Nano, rec["time"].(string))
		require.NoError(t, err)
		seen[rec["msg"].(string)] = rec
	}
	require.Positive(t, n)
	round := seen["round formed"]
	require.NotNil(t, round, "messages: %v", keysOf(seen))
	for _, k := range []string{"round", "rank", "world_size"} {
		require.Contains(t, round, k)
	}
	fin := seen["job finished"]
	require.NotNil(t, fin, "messages: %v", keysOf(seen))
	require.Greater(t, fin["test_accuracy"].(float64), 0.8)
	require.EqualValues(t, 234, fin["step"])
}

// jsonKeyCount counts the top-level keys named key of the JSON object line.
func jsonKeyCount(t *testing.T, line, key string) int {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok)
	n := 0
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err)
		if k == key {
			n++
		}
		var v json.RawMessage
		require.NoError(t, dec.Decode(&v))
	}
	return n
}

func keysOf[V any](m map[string]V) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	return k
}

// stallingStore is a CheckpointStore whose Save blocks until released, as
// a slow volume or a large model would.
type stallingStore struct {
	driver.CheckpointStore
	saving  chan struct{} // closed when the first Save starts
	release chan struct{}
	once    sync.Once
}

func (s *stallingStore) Save(ctx context.Context, step int64, data []byte) error {
	s.once.Do(func() { close(s.saving) })
	select {
	case <-s.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.CheckpointStore.Save(ctx, step, data)
}

// The liveness probe's /healthz answers while the worker is stuck in a
// long checkpoint write: a kubelet never restarts a worker for that.
func TestHealthzAnswersDuringALongCheckpoint(t *testing.T) {
	tel, err := newTelemetry(context.Background(), "", "127.0.0.1:0", 0, "job-healthz")
	require.NoError(t, err)
	defer func() { require.NoError(t, tel.shutdown(context.Background())) }()
	dir, err := checkpoint.NewLocalDir(t.TempDir(), 0)
	require.NoError(t, err)
	st := &stallingStore{CheckpointStore: dir, saving: make(chan struct{}), release: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		trainLinReg(t, append(tel.options(), trainer.WithCheckpointStore(st))...)
	}()
	select {
	case <-st.saving:
	case <-time.After(time.Minute):
		t.Fatal("no checkpoint was written")
	}
	for range 3 {
		resp, err := http.Get("http://" + tel.addr + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "while the checkpoint write blocks")
	}
	close(st.release)
	<-done
}
