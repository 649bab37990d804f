package testredis_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/elastictrain/elastictrain/internal/testredis"
)

// TestClusterSpreadsTagsOverEveryNode: the cluster is up on every node,
// TagOn finds a tag on each master, and a key with that tag is stored on
// that master and nowhere else (another node answers MOVED).
func TestClusterSpreadsTagsOverEveryNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := testredis.StartCluster(t)
	addrs := cl.Addrs()
	if len(addrs) != testredis.ClusterMasters {
		t.Fatalf("%d addresses, want %d", len(addrs), testredis.ClusterMasters)
	}
	for _, a := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: a})
		info, err := rc.ClusterInfo(ctx).Result()
		_ = rc.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			t.Fatalf("node %s: CLUSTER INFO %q, %v", a, info, err)
		}
	}
	cc := cl.Client(t)
	base := testredis.JobID(t)
	var slots []int
	for i, owner := range addrs {
		tag := cl.TagOn(t, base, i)
		key := "k:{" + tag + "}:v"
		slot, addr, err := cl.SlotOwner(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if addr != owner {
			t.Fatalf("TagOn(%d) = %q, but %s lives on %s", i, tag, key, addr)
		}
		slots = append(slots, slot)
		if err := cc.Set(ctx, key, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			rc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
			n, err := rc.Exists(ctx, key).Result()
			_ = rc.Close()
			switch {
			case a == owner && (err != nil || n != 1):
				t.Fatalf("%s not on its owner %s: %d, %v", key, a, n, err)
			case a != owner && (err == nil || !strings.HasPrefix(err.Error(), "MOVED")):
				t.Fatalf("%s on %s, not its owner: %d, %v (want MOVED)", key, a, n, err)
			}
		}
	}
	slices.Sort(slots)
	if len(slices.Compact(slots)) != len(addrs) {
		t.Fatalf("slots %v are not distinct", slots)
	}
}

const clusterHelperEnv = "TESTREDIS_CLUSTER_HELPER"

// TestClusterWithoutBinaries runs StartCluster with an empty PATH in a
// child process: it skips outside CI and fails with CI=true.
func TestClusterWithoutBinaries(t *testing.T) {
	if os.Getenv(clusterHelperEnv) == "1" {
		testredis.StartCluster(t)
		t.Fatal("StartCluster returned without redis-server on PATH")
	}
	t.Parallel()
	for _, tc := range []struct{ ci, want string }{{"", "--- SKIP"}, {"true", "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestClusterWithoutBinaries$", "-test.v")
		cmd.Env = append(os.Environ(), clusterHelperEnv+"=1", "PATH=", "CI="+tc.ci)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), tc.want) || !strings.Contains(string(out), "redis-server") {
			t.Fatalf("CI=%q: want %q naming redis-server, got:\n%s", tc.ci, tc.want, out)
		}
	}
}
