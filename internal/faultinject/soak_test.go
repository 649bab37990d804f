package faultinject_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestSoak is the soak mode, run by hand: ELASTICTRAIN_SOAK_FAULTS=200 runs
// jobs with random schedules of every kind but the host cut (both proxies on, a private
// redis-server) until that many faults were applied, then prints the faults
// survived by kind, the invariant violations and the recovery times
// (median and max). ELASTICTRAIN_SOAK_KINDS restricts the kinds;
// ELASTICTRAIN_FAULT_SEED fixes the first run's seed (run i uses seed+i).
//
//	ELASTICTRAIN_SOAK_FAULTS=200 go test -run TestSoak -timeout 2h -v ./internal/faultinject
func TestSoak(t *testing.T) {
	want, _ := strconv.Atoi(os.Getenv(envSoak))
	if want <= 0 {
		t.Skipf("soak mode is off; set %s=<faults> to run it", envSoak)
	}
	kinds, err := faultinject.ParseKinds(os.Getenv(envSoakKinds))
	if err != nil {
		t.Fatal(err)
	}
	// A host cut needs workers on hosts of their own (Config.Hosts), which
	// the soak's peer proxies exclude: the harness would skip every one it
	// drew, and the header would list a kind the soak never applies. Host
	// cuts are TestCutHostIsLeftBehindAndRejoinsAsANewMember's.
	if os.Getenv(envSoakKinds) != "" && slices.Contains(kinds, faultinject.HostCut) {
		t.Fatalf("%s: %v needs hosts of its own, which the soak's peer proxies exclude (TestCutHostIsLeftBehindAndRejoinsAsANewMember applies it)", envSoakKinds, faultinject.HostCut)
	}
	kinds = slices.DeleteFunc(kinds, func(k faultinject.Kind) bool { return k == faultinject.HostCut })
	base := seed(t, uint64(time.Now().UnixNano()))
	t.Logf("soak of %d faults, kinds %v, seed %d (replay a run with %s=<its seed>)", want, kinds, base, envSeed)
	srv := testredis.Start(t)
	var stats faultinject.Stats
	const perRun = 8
	start := time.Now()
	for i := 0; ; i++ {
		if n, _ := stats.Injected(); n >= want {
			break
		}
		s := base + uint64(i)
		faults := faultinject.NewSchedule(s, faultinject.ScheduleConfig{Faults: perRun, Kinds: kinds,
			Workers: 4, MinLive: 3, MaxLive: 6, MaxDuration: 4 * time.Second})
		cfg := testConfig(t, srv.Addr())
		cfg.JobID = testredis.JobID(t) + "-" + strconv.Itoa(i)
		cfg.Dir = t.TempDir()
		cfg.Redis = srv
		cfg.ProxyRedis, cfg.ProxyPeers = true, true
		cfg.Workers, cfg.MaxWorkers = 4, 6
		cfg.StepDelay = 10 * time.Millisecond
		cfg.Epochs = perRun + 2
		cfg.Log = nil
		res := faultinject.Run(context.Background(), cfg, faults, faultinject.Bounds{})
		stats.Add(res)
		n, _ := stats.Injected()
		t.Logf("run %d (seed %d): %v, %d violations; %d faults so far, %v elapsed", i, s, res.Wall.Round(time.Millisecond), len(res.Violations), n, time.Since(start).Round(time.Second))
		if len(res.Violations) > 0 {
			for _, in := range res.Injections {
				t.Logf("  %v", in)
			}
			t.Errorf("seed %d: invariant violations:\n%s", s, strings.Join(res.Violations, "\n"))
		}
	}
	var b strings.Builder
	stats.Print(&b)
	t.Logf("soak done in %v\n%s", time.Since(start).Round(time.Second), b.String())
}
