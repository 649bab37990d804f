package grafana_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/trainer"
	"github.com/elastictrain/elastictrain/trainer/optim"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// dashboard is the part of Grafana's dashboard JSON model the test reads.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	require.NoError(t, err)
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var d dashboard
	require.NoError(t, dec.Decode(&d))
	return d
}

// exported runs a short real training job with the OpenTelemetry
// Prometheus exporter, as examples/mnist's -metrics does, and returns the
// scrape parsed with the Prometheus text parser.
func exported(t *testing.T, job string) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	px, err := otelprom.New(otelprom.WithRegisterer(reg))
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(px))
	defer mp.Shutdown(context.Background())

	prob := trainertest.NewProblem(512, 4, 0.05, 1)
	m := trainertest.NewModel(prob.Dim)
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = 4, 1
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	require.NoError(t, err)
	defer loader.Close()
	cfg := trainer.DefaultConfig()
	cfg.JobID = job
	cfg.Sync.Secret = []byte("a test secret of 32 bytes length")
	cfg.Elastic.LastCall = 0
	tr, err := trainer.New(m.Params(), optim.NewSGD(0.05), loader, m.Step, store.NewMemory(), cfg, trainer.WithMeterProvider(mp))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := tr.Run(ctx)
	require.NoError(t, err)
	require.True(t, res.Finished)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

var metricRef = regexp.MustCompile(`\belastictrain_[a-z_]+\b`)

// Every query of the dashboard names metrics the trainer exports, under
// the names the OpenTelemetry Prometheus exporter gives them, with the
// elastictrain_job label the dashboard filters on; the panels cover world
// size, samples per second, goodput, recoveries and stragglers.
func TestDashboardQueriesTheMetricsTheTrainerExports(t *testing.T) {
	d := loadDashboard(t)
	require.NotEmpty(t, d.Title)
	require.NotEmpty(t, d.UID)
	require.Positive(t, d.SchemaVersion)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	require.Subset(t, vars, []string{"datasource", "job"})

	const job = "grafana-dashboard-test"
	fams := exported(t, job)
	// A histogram's series are its family name plus _bucket, _sum, _count.
	series := map[string]*dto.MetricFamily{}
	for name, f := range fams {
		series[name] = f
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				series[name+s] = f
			}
		}
	}

	ids := map[int]bool{}
	queried := map[string]bool{}
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		require.Equal(t, "timeseries", p.Type, p.Title)
		require.Equal(t, "prometheus", p.Datasource.Type, p.Title)
		require.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		require.Positive(t, p.GridPos.W*p.GridPos.H, p.Title)
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			refs := metricRef.FindAllString(tg.Expr, -1)
			require.NotEmpty(t, refs, "%s: %s queries no elastictrain metric", p.Title, tg.Expr)
			for _, r := range refs {
				if r == "elastictrain_job" {
					continue // the label
				}
				f, ok := series[r]
				require.True(t, ok, "%s queries %s, which the trainer does not export; it exports %v", p.Title, r, keys(fams))
				queried[f.GetName()] = true
				require.Contains(t, tg.Expr, `elastictrain_job=~"$job"`, "%s filters on the job", p.Title)
				found := false
				for _, lp := range f.GetMetric()[0].GetLabel() {
					found = found || lp.GetName() == "elastictrain_job" && lp.GetValue() == job
				}
				require.True(t, found, "%s has no elastictrain_job label", r)
			}
			if strings.Contains(tg.Expr, "_total") {
				require.Regexp(t, `(rate|increase)\(elastictrain_[a-z_]+_total`, tg.Expr, "%s: a counter is read through rate or increase", p.Title)
			}
		}
	}
	// The topics an operator asks for, each by the metric that answers it.
	for topic, family := range map[string]string{
		"world size":  "elastictrain_world_size",
		"samples/s":   "elastictrain_samples_total",
		"recoveries":  "elastictrain_recoveries_total",
		"goodput":     "elastictrain_goodput_ratio",
		"stragglers":  "elastictrain_stragglers_total",
		"step time":   "elastictrain_step_duration_seconds",
		"round count": "elastictrain_rounds_total",
	} {
		require.True(t, queried[family], "no panel shows %s (%s)", topic, family)
	}
	var templateQueries []string
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			templateQueries = append(templateQueries, q["query"].(string))
		}
	}
	require.True(t, slices.ContainsFunc(templateQueries, func(q string) bool {
		return strings.Contains(q, "label_values(elastictrain_world_size, elastictrain_job)")
	}), "the job variable lists the jobs that report a world size")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
