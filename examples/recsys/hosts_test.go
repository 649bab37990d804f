package main

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/elastictrain/elastictrain/internal/netns"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/launch"
)

// Issue 30, Must show 3: hosts made of network namespaces
// (internal/netns), two hosts of two workers each and Redis on a third;
// the workers listen on 0.0.0.0 and advertise their host's address, so the
// parameter server places every shard's replica on the other host. Both
// workers of one host are SIGKILLed at once (-killhost): the survivors
// train again from the replicas' memory (restored_rows: some from peers,
// none from storage), and the audit is exact. Then, in a job with
// durable checkpoints (no shared directory: the shards are in the
// checkpoints), a host is lost the same way and then the whole job; the
// job started again on 3 workers resumes from the last durable checkpoint
// and the audit across both runs is exact. Like every namespace test it
// skips without root, except with CI=true, where it fails.
func TestTwoHostsOfTwoLoseAHostThenTheWholeJob(t *testing.T) {
	n := netns.ForTest(t, "redis", "h0", "h1")
	redisHost := n.Host("redis")
	srv := testredis.StartOn(t, redisHost.IP().String(), func(name string, args ...string) *exec.Cmd {
		return redisHost.Command(t.Context(), name, args...)
	})
	h0, h1 := n.Host("h0").Namespace(), n.Host("h1").Namespace()
	t.Setenv(launch.EnvNetns, strings.Join([]string{h0, h0, h1, h1}, ","))
	common := []string{"-epochs", "1", "-min", "2", "-detect", "3s", "-listen", "0.0.0.0:0", "-redis", srv.Addr()}

	t.Run("host lost, survivors from replicas", func(t *testing.T) {
		code, stdout, stderr := runCmd(t, append(common, "-workers", "4", "-killhost", "0@150", "-json", "-quiet")...)
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, stderr)
		}
		checkHostKilled(t, stderr)
		var r result
		lastJSON(t, stdout, stderr, &r)
		t.Logf("world sizes %v, restored rows %+v, recoveries %v s", r.WorldSizes, r.RestoredRows, r.RecoverySeconds)
		if ws := r.WorldSizes; len(ws) < 2 || ws[len(ws)-2] != 4 || ws[len(ws)-1] != 2 {
			t.Fatalf("world sizes %v; want 4, then 2", ws)
		}
		if r.RestoredRows.Peers == 0 || r.RestoredRows.Storage != 0 {
			t.Fatalf("restored rows %+v; want some from peers, none from storage", r.RestoredRows)
		}
		exactlyOnce(t, r, 1, false)
	})

	t.Run("then the whole job, restarted on 3 workers", func(t *testing.T) {
		dir := t.TempDir()
		args := append(common, "-checkpoint", dir, "-commit-every", "10")
		code, _, stderr := runCmd(t, append(args, "-workers", "4", "-killhost", "0@150", "-kill", "0@300", "-kill", "1@300", "-quiet")...)
		if code != 1 {
			t.Fatalf("the killed job exited %d, want 1 (no final report)\n%s", code, stderr)
		}
		checkHostKilled(t, stderr)
		if strings.Contains(stderr, "rolling every rank back") {
			t.Fatalf("the survivors of the host's loss fell back to a checkpoint; want them restored from replicas\n%s", stderr)
		}
		t.Setenv(launch.EnvNetns, strings.Join([]string{h0, h1, h1}, ","))
		r := mustRun(t, append(args, "-workers", "3")...)
		t.Logf("resumed from %s at step %d; world sizes %v; restored rows %+v; %v checkpoints blocked %.4f s, %v writes took %.4f s",
			r.StartSource, r.StartStep, r.WorldSizes, r.RestoredRows, r.Checkpoints, r.CheckpointBlocked, r.CheckpointWrites, r.CheckpointWrite)
		// Checkpoints every 50 steps; the one of step 300 is taken after
		// the kill was decided, the one of 250 may still have been in
		// flight (written in the background).
		if ws := r.WorldSizes; r.StartSource != "checkpoint" || (r.StartStep != 250 && r.StartStep != 200) || len(ws) == 0 || ws[len(ws)-1] != 3 {
			t.Fatalf("the second run started from %s at step %d with world sizes %v; want the checkpoint of step 250 (or 200) on 3 workers",
				r.StartSource, r.StartStep, r.WorldSizes)
		}
		if r.RestoredRows.Storage == 0 {
			t.Fatalf("restored rows %+v; want the tables from the checkpoint", r.RestoredRows)
		}
		exactlyOnce(t, r, 1, false)
	})
}

// checkHostKilled checks that the launcher SIGKILLed two workers of one
// host.
func checkHostKilled(t *testing.T, stderr string) {
	t.Helper()
	m := regexp.MustCompile(`SIGKILL host (\S+): rank \d+ \(worker \d+`).FindAllStringSubmatch(stderr, -1)
	if len(m) != 2 || m[0][1] != m[1][1] {
		t.Fatalf("host kills %v; want both workers of one host\n%s", m, stderr)
	}
}

// lastJSON decodes the last line of stdout into v.
func lastJSON(t *testing.T, stdout, stderr string, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), v); err != nil {
		t.Fatalf("last line %q: %v\n%s", lines[len(lines)-1], err, stderr)
	}
}
