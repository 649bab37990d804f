package e2e

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elastictrain/elastictrain/kubernetes/jobscale"
)

// The training run of the tests: 4000 samples, global batch 16 (250 steps
// an epoch), at least 20 ms a step.
const (
	samples = 4000
	batch   = 16
)

func trainArgs(epochs int, extra ...string) []string {
	return append([]string{"-samples", strconv.Itoa(samples), "-batch", strconv.Itoa(batch),
		"-epochs", strconv.Itoa(epochs), "-delay", "20ms"}, extra...)
}

// A 2-worker Job on the real control plane trains; its parallelism,
// patched as `kubectl patch job` does, goes to 3, then 1, then 2: the Job
// controller starts and deletes Pods, the new workers join at a step
// boundary and the deleted ones leave gracefully, so the training job's
// world sizes follow, no round is a recovery, and the audit is exact.
func TestKubectlScaleGrowsAndShrinksTheJob(t *testing.T) {
	ns := setup(t, nil)
	const epochs = 4
	ns.createJob(t, 2, 4, trainArgs(epochs, "-min", "1", "-max", "4")...)

	for _, n := range []int{2, 3, 1, 2} {
		if n != 2 || len(ns.rounds()) > 0 {
			ns.patchParallelism(t, n)
		}
		waitFor(t, 2*time.Minute, "a round of "+strconv.Itoa(n), func() bool { return ns.worldIs(n) })
		at := ns.lastStep()
		waitFor(t, time.Minute, "steps at world size "+strconv.Itoa(n), func() bool { return ns.lastStep() >= at+5 })
	}
	ns.waitComplete(t, 3*time.Minute)

	ws := ns.worldSizes()
	require.True(t, isSubsequence([]int{2, 3, 1, 2}, ws), "world sizes %v", ws)
	ns.requireNoRecovery(t)
	ns.requireExactAudit(t, samples, batch, epochs)
	finished, left := 0, 0
	for _, e := range ns.exits() {
		switch e.Status {
		case 0:
			require.True(t, e.Finished)
			finished++
		case 143:
			require.True(t, e.Preempted, "a deleted Pod's worker left gracefully: %+v", e)
			left++
		default:
			t.Fatalf("a worker exited %d: %+v", e.Status, e)
		}
	}
	require.GreaterOrEqual(t, left, 2, "the Job controller deleted two Pods when the parallelism went from 3 to 1")
	require.GreaterOrEqual(t, finished, 1)
	for _, p := range ns.agent.all() {
		require.False(t, p.killed, "pod %s needed SIGKILL", p.pod.Name)
	}
}

// Deleting a running worker's Pod (as an eviction or a preemption does)
// gives a graceful leave: SIGTERM, a commit at the leave step, exit 143
// within the grace period, which the Job's podFailurePolicy ignores; no
// round is a recovery; the Job controller's replacement Pod for the same
// index joins the running job.
func TestPodDeletionIsAGracefulLeave(t *testing.T) {
	ns := setup(t, nil)
	const epochs = 3
	ns.createJob(t, 3, 3, trainArgs(epochs, "-min", "1", "-max", "3")...)
	waitFor(t, 2*time.Minute, "a round of 3", func() bool { return ns.worldIs(3) })
	at := ns.lastStep()
	waitFor(t, time.Minute, "steps at world size 3", func() bool { return ns.lastStep() >= at+5 })

	var victim *proc
	for _, p := range ns.agent.all() {
		if p.pod.Labels[labelIndex] == "1" {
			victim = p
		}
	}
	require.NotNil(t, victim)
	require.NoError(t, client.CoreV1().Pods(ns.name).Delete(context.Background(), victim.pod.Name, metav1.DeleteOptions{}))
	select {
	case <-victim.exited:
	case <-time.After(2 * time.Minute):
		t.Fatal("the deleted Pod's worker did not exit")
	}
	require.Equal(t, 143, victim.code, "a graceful leave")
	require.False(t, victim.killed, "it left within the grace period, before any SIGKILL")
	var leave Event
	for _, e := range victim.eventsOf() {
		if e.Ev == "exit" {
			leave = e
		}
	}
	require.True(t, leave.Preempted, "%+v", leave)

	// The survivors' next round continues from the step the leaver
	// committed: nothing rolled back, no recovery.
	var last uint64 // the newest round the leaver was in
	for _, e := range victim.eventsOf() {
		if e.Ev == "round" {
			last = max(last, e.Round)
		}
	}
	after := func() *Event {
		for _, r := range ns.rounds() {
			if r.Round > last {
				return &r
			}
		}
		return nil
	}
	waitFor(t, time.Minute, "a round after the leave", func() bool { return after() != nil })
	require.Equal(t, 2, after().WorldSize, "the survivors went on without the leaver")
	require.Equal(t, leave.Step, after().Step, "the round after the leave starts at the leaver's commit")

	waitFor(t, 2*time.Minute, "the replacement of index 1 to join", func() bool {
		for _, p := range ns.agent.all() {
			if p != victim && p.pod.Labels[labelIndex] == "1" && ns.worldIs(3) {
				return true
			}
		}
		return false
	})
	ns.waitComplete(t, 3*time.Minute)
	ns.requireNoRecovery(t)
	ns.requireExactAudit(t, samples, batch, epochs)
	for _, e := range ns.exits() {
		require.Contains(t, []int{0, 143}, e.Status, "%+v", e)
	}
}

// A Job whose third Pod cannot be scheduled (Pending, PodScheduled=False,
// reason Unschedulable) trains with two; the scaler counts the pending Pod
// as capacity the cluster does not have; when the Pod starts, its worker
// joins and the capacity bound is gone.
func TestPendingPodsDoNotStallTheJob(t *testing.T) {
	ns := setup(t, func(p *corev1.Pod) bool { return p.Labels[labelIndex] == "2" })
	const epochs = 3
	ns.createJob(t, 3, 3, trainArgs(epochs, "-min", "2", "-max", "3")...)
	sc, err := jobscale.New(client, jobscale.Config{Namespace: ns.name, Job: ns.jobName})
	require.NoError(t, err)
	ctx := context.Background()

	waitFor(t, 2*time.Minute, "a round of 2", func() bool { return ns.worldIs(2) })
	at := ns.lastStep()
	waitFor(t, time.Minute, "steps at world size 2", func() bool { return ns.lastStep() >= at+20 })
	var pending *corev1.Pod
	for _, p := range ns.pods(t) {
		if p.Labels[labelIndex] == "2" {
			pending = &p
		}
	}
	require.NotNil(t, pending, "the Job controller created the third Pod")
	require.True(t, jobscale.Unschedulable(pending), "%+v", pending.Status)
	n, ok, err := sc.Capacity(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, n, "the unschedulable Pod is capacity the cluster does not have")

	ns.agent.Let(ctx, "2")
	waitFor(t, 2*time.Minute, "a round of 3", func() bool { return ns.worldIs(3) })
	_, ok, err = sc.Capacity(ctx)
	require.NoError(t, err)
	require.False(t, ok, "no Pod is unschedulable: no bound")
	ns.waitComplete(t, 3*time.Minute)
	require.Equal(t, []int{2, 3}, ns.worldSizes())
	ns.requireNoRecovery(t)
	ns.requireExactAudit(t, samples, batch, epochs)
}

// The resource-adjustment policy, with jobscale as its Platform, decides
// to grow a 1-worker job whose steps take longer with more samples per
// worker: rank 0's Resize patches the Job's parallelism through the API
// (with the service account of the manifests' Role), the Job controller
// starts the Pod, and the job's world size follows.
func TestAutoscalerSetsParallelism(t *testing.T) {
	ns := setup(t, nil)
	const epochs = 3
	ns.createJob(t, 1, 3, "-samples", strconv.Itoa(samples), "-batch", "32", "-epochs", strconv.Itoa(epochs),
		"-delay", "0s", "-per-sample", "2ms", "-min", "1", "-max", "2", "-autoscale",
		"-decision-interval", "5", "-warmup-steps", "3", "-measure-steps", "10", "-min-change", "10")

	waitFor(t, 2*time.Minute, "the policy's decision to grow", func() bool {
		for _, p := range ns.agent.all() {
			for _, e := range p.eventsOf() {
				if e.Ev == "scaling" && e.From == 1 && e.To == 2 {
					return true
				}
			}
		}
		return false
	})
	waitFor(t, time.Minute, "parallelism 2", func() bool { return *ns.getJob(t).Spec.Parallelism == 2 })
	waitFor(t, 2*time.Minute, "a round of 2", func() bool { return ns.worldIs(2) })
	ns.waitComplete(t, 3*time.Minute)
	ws := ns.worldSizes()
	require.Equal(t, 1, ws[0])
	require.True(t, slices.Contains(ws, 2), "%v", ws)
	ns.requireNoRecovery(t)
	ns.requireExactAudit(t, samples, 32, epochs)
}
