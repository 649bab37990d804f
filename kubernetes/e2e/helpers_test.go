package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/trainer/audit"
)

// manifestDir holds the manifests users apply (examples/kubernetes).
func manifestDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "examples", "kubernetes", "manifests")
}

// yamlDocs returns the documents of a manifest file.
func yamlDocs(t *testing.T, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(manifestDir(), name))
	require.NoError(t, err)
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.Contains(d, "kind:") {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// testNS is a test's namespace, with the manifests' service account,
// Role and binding, and the Secret the Pod template names.
type testNS struct {
	name    string
	redis   string
	job     string // the training job's ID
	dir     string
	audit   string
	agent   *agent
	jobName string
}

var subnets = map[string]int{
	"TestKubectlScaleGrowsAndShrinksTheJob": 1,
	"TestPodDeletionIsAGracefulLeave":       2,
	"TestPendingPodsDoNotStallTheJob":       3,
	"TestAutoscalerSetsParallelism":         4,
}

func setup(t *testing.T, hold func(*corev1.Pod) bool) *testNS {
	t.Helper()
	needControlPlane(t)
	ctx := context.Background()
	raw := make([]byte, 4)
	_, _ = rand.Read(raw)
	ns := &testNS{name: "e2e-" + strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))[:12] + "-" + hex.EncodeToString(raw),
		redis: testredis.Addr(t), job: testredis.JobID(t), dir: t.TempDir(), jobName: "mnist"}
	ns.name = strings.ReplaceAll(ns.name, "_", "-")
	ns.audit = filepath.Join(ns.dir, "audit.jsonl")
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = client.CoreV1().Namespaces().Delete(context.Background(), ns.name, metav1.DeleteOptions{})
	})
	for _, doc := range yamlDocs(t, "rbac.yaml") {
		var tm metav1.TypeMeta
		require.NoError(t, yaml.Unmarshal(doc, &tm))
		switch tm.Kind {
		case "ServiceAccount":
			var o corev1.ServiceAccount
			require.NoError(t, yaml.UnmarshalStrict(doc, &o))
			_, err = client.CoreV1().ServiceAccounts(ns.name).Create(ctx, &o, metav1.CreateOptions{})
		case "Role":
			var o rbacv1.Role
			require.NoError(t, yaml.UnmarshalStrict(doc, &o))
			_, err = client.RbacV1().Roles(ns.name).Create(ctx, &o, metav1.CreateOptions{})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			require.NoError(t, yaml.UnmarshalStrict(doc, &o))
			for i := range o.Subjects {
				o.Subjects[i].Namespace = ns.name
			}
			_, err = client.RbacV1().RoleBindings(ns.name).Create(ctx, &o, metav1.CreateOptions{})
		default:
			t.Fatalf("rbac.yaml: unexpected kind %s", tm.Kind)
		}
		require.NoError(t, err)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	_, err = client.CoreV1().Secrets(ns.name).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "mnist-job"},
		StringData: map[string]string{"ELASTICTRAIN_SECRET": hex.EncodeToString(secret)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	ns.agent = startAgent(t, ns.name, subnets[t.Name()], hold)
	return ns
}

// createJob creates the manifests' Job (job.yaml) in the namespace with
// parallelism and completions set and the container running the test
// worker with args (the manifest's environment, grace period, failure and
// success policies and service account kept).
func (ns *testNS) createJob(t *testing.T, parallelism, completions int32, args ...string) *batchv1.Job {
	t.Helper()
	docs := yamlDocs(t, "job.yaml")
	require.Len(t, docs, 1)
	var job batchv1.Job
	require.NoError(t, yaml.UnmarshalStrict(docs[0], &job))
	job.Namespace = ns.name
	job.Spec.Parallelism, job.Spec.Completions = &parallelism, &completions
	c := &job.Spec.Template.Spec.Containers[0]
	c.Command = []string{workerBin}
	c.Args = append([]string{"-job", ns.job, "-redis", ns.redis, "-listen", "$(POD_IP):29500", "-audit", ns.audit}, args...)
	created, err := client.BatchV1().Jobs(ns.name).Create(context.Background(), &job, metav1.CreateOptions{})
	require.NoError(t, err)
	ns.jobName = created.Name
	return created
}

// patchParallelism sets the Job's parallelism with the JSON merge patch of
// `kubectl patch job NAME --type=merge -p '{"spec":{"parallelism":N}}'`.
func (ns *testNS) patchParallelism(t *testing.T, n int) {
	t.Helper()
	_, err := client.BatchV1().Jobs(ns.name).Patch(context.Background(), ns.jobName, types.MergePatchType,
		fmt.Appendf(nil, `{"spec":{"parallelism":%d}}`, n), metav1.PatchOptions{})
	require.NoError(t, err)
}

func (ns *testNS) getJob(t *testing.T) *batchv1.Job {
	t.Helper()
	j, err := client.BatchV1().Jobs(ns.name).Get(context.Background(), ns.jobName, metav1.GetOptions{})
	require.NoError(t, err)
	return j
}

// waitFor polls cond every 50 ms, on the test's goroutine (cond may use
// t), until it holds, or fails after d (a bound far above what the
// mechanism takes: the agent, the Job controller's reaction and a round
// change). A poll: the conditions read the API server and the agent's
// records, which have no event to wait on.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// rounds returns rank 0's round events of every process, by round.
func (ns *testNS) rounds() []Event {
	var rs []Event
	for _, p := range ns.agent.all() {
		for _, e := range p.eventsOf() {
			if e.Ev == "round" && e.Rank == 0 {
				rs = append(rs, e)
			}
		}
	}
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Round < rs[j].Round })
	return rs
}

// worldIs reports whether the newest round has world size n.
func (ns *testNS) worldIs(n int) bool {
	rs := ns.rounds()
	return len(rs) > 0 && rs[len(rs)-1].WorldSize == n
}

// lastStep is the newest step rank 0 reported.
func (ns *testNS) lastStep() int64 {
	var s int64
	for _, p := range ns.agent.all() {
		for _, e := range p.eventsOf() {
			if e.Ev == "step" && e.Step > s {
				s = e.Step
			}
		}
	}
	return s
}

// worldSizes is the sequence of the rounds' world sizes, repeats merged.
func (ns *testNS) worldSizes() []int {
	var ws []int
	for _, r := range ns.rounds() {
		if len(ws) == 0 || ws[len(ws)-1] != r.WorldSize {
			ws = append(ws, r.WorldSize)
		}
	}
	return ws
}

// jobComplete reports whether the Job has the condition Complete.
func (ns *testNS) jobDone(t *testing.T) (complete, failed bool) {
	j := ns.getJob(t)
	for _, c := range j.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			complete = complete || c.Type == batchv1.JobComplete
			failed = failed || c.Type == batchv1.JobFailed
		}
	}
	return complete, failed
}

// waitComplete waits for the Job to complete, failing at once when it fails.
func (ns *testNS) waitComplete(t *testing.T, d time.Duration) {
	t.Helper()
	waitFor(t, d, "the Job to complete", func() bool {
		c, f := ns.jobDone(t)
		require.False(t, f, "the Job failed: %+v", ns.getJob(t).Status)
		return c
	})
}

// requireExactAudit checks that every sample of every epoch was trained
// exactly once (samples and batch as the worker's flags).
func (ns *testNS) requireExactAudit(t *testing.T, samples, batch, epochs int) {
	t.Helper()
	f, err := os.Open(ns.audit)
	require.NoError(t, err)
	defer f.Close()
	entries, err := audit.ReadLog(f)
	require.NoError(t, err)
	steps := samples / batch
	rep := audit.Verify(entries, epochs, func(epoch int) []int {
		return dataloader.Order(7, epoch, samples)[:steps*batch]
	})
	require.Zero(t, rep.Missing, "audit: samples never trained")
	require.Zero(t, rep.Duplicates, "audit: samples trained twice")
	require.Equal(t, steps*epochs, rep.Steps)
}

// requireNoRecovery checks that no round began by a failure.
func (ns *testNS) requireNoRecovery(t *testing.T) {
	t.Helper()
	for _, r := range ns.rounds() {
		require.False(t, r.Recovery, "round %d began with a recovery", r.Round)
		require.Zero(t, r.RolledBack, "round %d rolled back steps", r.Round)
	}
}

// exits returns the exit events of every process.
func (ns *testNS) exits() []Event {
	var out []Event
	for _, p := range ns.agent.all() {
		for _, e := range p.eventsOf() {
			if e.Ev == "exit" {
				out = append(out, e)
			}
		}
	}
	return out
}

// pods lists the namespace's Pods.
func (ns *testNS) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	l, err := client.CoreV1().Pods(ns.name).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	return l.Items
}

// isSubsequence reports whether want appears in got in order.
func isSubsequence(want, got []int) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func sortProcs(ps []*proc) { slices.SortFunc(ps, func(a, b *proc) int { return a.n - b.n }) }
