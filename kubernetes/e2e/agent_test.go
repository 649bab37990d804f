package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// labelIndex is the label (and annotation) the Job controller puts on an
// Indexed Job's Pods: the completion index.
const labelIndex = "batch.kubernetes.io/job-completion-index"

// agent is the tests' node: there is no kubelet, so it runs each Pod of
// its namespace as a local process. A new Pod is bound to the node and
// started with the container's command and arguments and its environment
// (values, $(VAR) references, the downward API's fields and labels,
// JOB_COMPLETION_INDEX from the Pod's index label, secrets), its phase
// and container status reported as a kubelet would. A deleted Pod's
// process gets SIGTERM, and SIGKILL once its deletion grace period is
// over; then the Pod's final status is written and the object removed.
// A Pod for which hold says so stays Pending with PodScheduled=False,
// reason Unschedulable, until Let starts it.
//
// Each process gets a loopback address of its own as its Pod IP, and a
// kubeconfig holding a token of the Pod's service account ($KUBECONFIG),
// as the kubelet mounts one.
type agent struct {
	t    *testing.T
	ns   string
	node string
	dir  string

	mu     sync.Mutex
	procs  map[types.UID]*proc
	held   map[types.UID]bool
	hold   func(*corev1.Pod) bool
	let    map[string]bool // completion indexes Let allowed to start
	nextIP int
	events chan func() // work for the loop goroutine
}

// proc is one Pod's process.
type proc struct {
	pod     *corev1.Pod // as started
	n       int         // start order
	cmd     *exec.Cmd
	ip      string
	mu      sync.Mutex
	events  []Event  // its stdout, one JSON object a line
	other   []string // stdout lines that are not JSON
	exited  chan struct{}
	code    int
	termAt  time.Time // when SIGTERM was sent (zero: never)
	killed  bool      // SIGKILL was sent after the grace period
	deleted bool
}

// Event is one line of the worker's output (worker/main.go).
type Event struct {
	Ev         string `json:"ev"`
	Pod        string `json:"pod"`
	Index      string `json:"index"`
	Round      uint64 `json:"round"`
	Rank       int    `json:"rank"`
	WorldSize  int    `json:"world_size"`
	Step       int64  `json:"step"`
	Recovery   bool   `json:"recovery"`
	RolledBack int64  `json:"rolled_back"`
	From       int    `json:"from"`
	To         int    `json:"to"`
	Reason     string `json:"reason"`
	Status     int    `json:"status"`
	Preempted  bool   `json:"preempted"`
	Released   bool   `json:"released"`
	Finished   bool   `json:"finished"`
	Recoveries int    `json:"recoveries"`
	Err        string `json:"err"`
}

// startAgent starts the node agent of namespace ns; hold (nil: none) says
// which new Pods stay unschedulable until Let. The test's cleanup stops it
// and kills what it still runs.
func startAgent(t *testing.T, ns string, subnet int, hold func(*corev1.Pod) bool) *agent {
	t.Helper()
	a := &agent{t: t, ns: ns, node: "node-" + ns, dir: t.TempDir(), procs: map[types.UID]*proc{},
		held: map[types.UID]bool{}, hold: hold, let: map[string]bool{}, nextIP: subnet << 8,
		events: make(chan func(), 256)}
	ctx, cancel := context.WithCancel(context.Background())
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "pods", ns, fields.Everything())
	_, inf := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { a.post(ctx, func() { a.sync(ctx, o.(*corev1.Pod)) }) },
			UpdateFunc: func(_, o any) { a.post(ctx, func() { a.sync(ctx, o.(*corev1.Pod)) }) },
		},
	})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); inf.Run(ctx.Done()) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case f := <-a.events:
				f()
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		a.mu.Lock()
		ps := a.procs
		a.mu.Unlock()
		for _, p := range ps {
			_ = p.cmd.Process.Kill()
			<-p.exited
			if t.Failed() {
				p.mu.Lock()
				t.Logf("pod %s (%s, exit %d): last events %v; other lines %q", p.pod.Name, p.ip, p.code, lastN(p.events, 4), lastN(p.other, 10))
				p.mu.Unlock()
				if b, err := os.ReadFile(filepath.Join(a.dir, p.pod.Name+".log")); err == nil {
					t.Logf("pod %s's log, its last lines:\n%s", p.pod.Name, strings.Join(lastN(strings.Split(strings.TrimSpace(string(b)), "\n"), 25), "\n"))
				}
			}
		}
	})
	return a
}

func (a *agent) post(ctx context.Context, f func()) {
	select {
	case a.events <- f:
	case <-ctx.Done():
	}
}

// Let starts the held Pod of completion index (now, or when it comes).
func (a *agent) Let(ctx context.Context, index string) {
	a.mu.Lock()
	a.let[index] = true
	a.mu.Unlock()
	a.post(ctx, func() {
		pods, err := client.CoreV1().Pods(a.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			a.t.Errorf("agent: listing pods: %v", err)
			return
		}
		for i := range pods.Items {
			a.sync(ctx, &pods.Items[i])
		}
	})
}

// sync acts on one observed state of a Pod (the loop goroutine).
func (a *agent) sync(ctx context.Context, pod *corev1.Pod) {
	a.mu.Lock()
	p := a.procs[pod.UID]
	held := a.held[pod.UID]
	hold := a.hold != nil && a.hold(pod) && !a.let[pod.Labels[labelIndex]]
	a.mu.Unlock()
	switch {
	case p != nil:
		if pod.DeletionTimestamp != nil && !p.deleted {
			p.deleted = true
			a.terminate(ctx, p, pod)
		}
	case pod.DeletionTimestamp != nil:
		// Never started (a held Pod deleted): gone at once.
		if pod.Status.Phase == corev1.PodPending {
			a.finish(ctx, pod, nil)
		}
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
	case hold:
		if !held {
			a.markUnschedulable(ctx, pod)
			a.mu.Lock()
			a.held[pod.UID] = true
			a.mu.Unlock()
		}
	default:
		a.start(ctx, pod)
	}
}

func (a *agent) markUnschedulable(ctx context.Context, pod *corev1.Pod) {
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodPending
	setCondition(pod, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: the test holds this Pod."})
	if _, err := client.CoreV1().Pods(a.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && ctx.Err() == nil {
		a.t.Errorf("agent: marking %s unschedulable: %v", pod.Name, err)
	}
}

// start binds the Pod to the node and runs its container.
func (a *agent) start(ctx context.Context, pod *corev1.Pod) {
	err := client.CoreV1().Pods(a.ns).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: a.node},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsConflict(err) {
		if ctx.Err() == nil && !apierrors.IsNotFound(err) {
			a.t.Errorf("agent: binding %s: %v", pod.Name, err)
		}
		return
	}
	a.mu.Lock()
	a.nextIP++
	ip := fmt.Sprintf("127.1.%d.%d", a.nextIP>>8, a.nextIP&0xff)
	a.mu.Unlock()
	c := pod.Spec.Containers[0]
	env, err := a.env(ctx, pod, c, ip)
	if err != nil {
		a.t.Errorf("agent: the environment of %s: %v", pod.Name, err)
		return
	}
	var argv []string
	for _, s := range append(append([]string(nil), c.Command...), c.Args...) {
		argv = append(argv, expand(s, env))
	}
	if len(argv) == 0 {
		a.t.Errorf("agent: pod %s has no command", pod.Name)
		return
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + a.dir}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logf, err := os.Create(filepath.Join(a.dir, pod.Name+".log"))
	if err != nil {
		a.t.Errorf("agent: %v", err)
		return
	}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		a.t.Errorf("agent: %v", err)
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		a.t.Errorf("agent: starting %s: %v", pod.Name, err)
		return
	}
	a.mu.Lock()
	n := a.nextIP
	a.mu.Unlock()
	p := &proc{pod: pod, cmd: cmd, ip: ip, n: n, exited: make(chan struct{})}
	a.mu.Lock()
	a.procs[pod.UID] = p
	a.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e Event
			p.mu.Lock()
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				p.other = append(p.other, sc.Text())
			} else {
				p.events = append(p.events, e)
			}
			p.mu.Unlock()
		}
		_ = cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.code = cmd.ProcessState.ExitCode()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		p.mu.Unlock()
		close(p.exited)
		a.post(ctx, func() { a.exited(ctx, p) })
	}()
	now := metav1.Now()
	st := pod.DeepCopy()
	st.Spec.NodeName = a.node
	st.Status.Phase = corev1.PodRunning
	st.Status.PodIP, st.Status.HostIP = ip, "127.0.0.1"
	st.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	st.Status.StartTime = &now
	setCondition(st, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
	setCondition(st, corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue})
	setCondition(st, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue})
	setCondition(st, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	st.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, Ready: true, Started: ptr(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	a.writeStatus(ctx, st)
}

// terminate sends SIGTERM, and SIGKILL after the deletion's grace period
// unless the process exits first.
func (a *agent) terminate(ctx context.Context, p *proc, pod *corev1.Pod) {
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	p.mu.Lock()
	p.termAt = time.Now()
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	go func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.mu.Lock()
			p.killed = true
			p.mu.Unlock()
			_ = p.cmd.Process.Kill()
		case <-ctx.Done():
		}
	}()
}

// exited reports a process's end: the Pod's terminal phase and container
// state; a Pod being deleted is then removed.
func (a *agent) exited(ctx context.Context, p *proc) {
	pod, err := client.CoreV1().Pods(a.ns).Get(ctx, p.pod.Name, metav1.GetOptions{})
	if err != nil {
		return // already gone
	}
	a.finish(ctx, pod, p)
}

func (a *agent) finish(ctx context.Context, pod *corev1.Pod, p *proc) {
	st := pod.DeepCopy()
	if p != nil {
		p.mu.Lock()
		code := p.code
		p.mu.Unlock()
		now := metav1.Now()
		st.Status.Phase = corev1.PodFailed
		reason := "Error"
		if code == 0 {
			st.Status.Phase, reason = corev1.PodSucceeded, "Completed"
		}
		setCondition(st, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"})
		setCondition(st, corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"})
		c := pod.Spec.Containers[0]
		st.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Image: c.Image, Started: ptr(false),
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason,
				StartedAt: *pod.Status.StartTime, FinishedAt: now}}}}
	} else {
		st.Status.Phase = corev1.PodFailed
	}
	a.writeStatus(ctx, st)
	if pod.DeletionTimestamp != nil {
		err := client.CoreV1().Pods(a.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)),
			Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
			a.t.Errorf("agent: removing %s: %v", pod.Name, err)
		}
	}
}

// writeStatus writes st's status, reading the Pod again on a conflict.
func (a *agent) writeStatus(ctx context.Context, st *corev1.Pod) {
	for range 10 {
		_, err := client.CoreV1().Pods(a.ns).UpdateStatus(ctx, st, metav1.UpdateOptions{})
		if err == nil || apierrors.IsNotFound(err) || ctx.Err() != nil {
			return
		}
		if !apierrors.IsConflict(err) {
			a.t.Errorf("agent: status of %s: %v", st.Name, err)
			return
		}
		cur, err := client.CoreV1().Pods(a.ns).Get(ctx, st.Name, metav1.GetOptions{})
		if err != nil {
			return
		}
		status := st.Status
		st = cur.DeepCopy()
		st.Status = status
	}
	a.t.Errorf("agent: status of %s: conflicts on every try", st.Name)
}

// env resolves the container's environment for pod at ip, as the kubelet
// does, and adds KUBECONFIG.
func (a *agent) env(ctx context.Context, pod *corev1.Pod, c corev1.Container, ip string) (map[string]string, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath, ip)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
			env[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			s, err := client.CoreV1().Secrets(pod.Namespace).Get(ctx, e.ValueFrom.SecretKeyRef.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
			env[e.Name] = string(s.Data[e.ValueFrom.SecretKeyRef.Key])
		case e.ValueFrom.ResourceFieldRef != nil:
			q := c.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits."))]
			env[e.Name] = fmt.Sprint(q.Value())
		default:
			return nil, fmt.Errorf("%s: unsupported source", e.Name)
		}
	}
	if _, ok := env["JOB_COMPLETION_INDEX"]; !ok {
		env["JOB_COMPLETION_INDEX"] = pod.Labels[labelIndex]
	}
	kc, err := a.kubeconfig(ctx, pod)
	if err != nil {
		return nil, err
	}
	env["KUBECONFIG"] = kc
	return env, nil
}

// kubeconfig writes a kubeconfig for the Pod: the API server, and a token
// of the Pod's service account (TokenRequest, bound to the Pod).
func (a *agent) kubeconfig(ctx context.Context, pod *corev1.Pod) (string, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600)),
			BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token of service account %s: %w", sa, err)
	}
	cfg := clientcmdapi.NewConfig()
	tls := restConfig.TLSClientConfig
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: restConfig.Host, CertificateAuthorityData: tls.CAData,
		TLSServerName: tls.ServerName, InsecureSkipTLSVerify: tls.Insecure}
	cfg.AuthInfos["pod"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["pod"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "pod", Namespace: pod.Namespace}
	cfg.CurrentContext = "pod"
	path := filepath.Join(a.dir, pod.Name+".kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

var labelRef = regexp.MustCompile(`^metadata\.(labels|annotations)\['([^']+)'\]$`)

// fieldValue resolves a downward-API field path of pod at ip.
func fieldValue(pod *corev1.Pod, path, ip string) (string, error) {
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "status.podIP":
		return ip, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "spec.nodeName":
		return "node-" + pod.Namespace, nil
	}
	if m := labelRef.FindStringSubmatch(path); m != nil {
		if m[1] == "labels" {
			return pod.Labels[m[2]], nil
		}
		return pod.Annotations[m[2]], nil
	}
	return "", fmt.Errorf("field %q: not supported by the test's agent", path)
}

// expand replaces $(VAR) as the kubelet does, from env; an undefined
// reference stays as it is.
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func setCondition(pod *corev1.Pod, c corev1.PodCondition) {
	c.LastTransitionTime = metav1.Now()
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == c.Type {
			pod.Status.Conditions[i] = c
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, c)
}

func ptr[T any](v T) *T { return &v }

func lastN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// all returns every process the agent started, in start order.
func (a *agent) all() []*proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ps []*proc
	for _, p := range a.procs {
		ps = append(ps, p)
	}
	sortProcs(ps)
	return ps
}

// eventsOf returns a copy of p's events.
func (p *proc) eventsOf() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}
