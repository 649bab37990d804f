package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/job"
)

// The control plane of this test binary, started once by TestMain: an
// embedded etcd, a kube-apiserver and the Job controller. Each test works
// in a namespace of its own.
var (
	restConfig *rest.Config         // the API server's loopback client (system:masters)
	client     kubernetes.Interface // its clientset
	workerBin  string               // the worker program (./worker), built once
	setupErr   error                // why the control plane is not up
)

func TestMain(m *testing.M) {
	code := func() int {
		tb := &mainTB{}
		defer tb.cleanup()
		dir, err := os.MkdirTemp("", "elastictrain-k8s-e2e")
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
		start := time.Now()
		if setupErr = startControlPlane(tb, dir); setupErr == nil {
			fmt.Fprintf(os.Stderr, "e2e: etcd, kube-apiserver and the Job controller up in %v\n", time.Since(start).Round(time.Millisecond))
			workerBin, setupErr = buildWorker(dir)
		}
		if setupErr != nil {
			fmt.Fprintln(os.Stderr, "e2e:", setupErr)
		}
		return m.Run()
	}()
	os.Exit(code)
}

// needControlPlane fails the test when TestMain could not start the control
// plane (never a skip: these tests are the point of this module).
func needControlPlane(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		t.Fatalf("the control plane is not up: %v", setupErr)
	}
}

// startControlPlane starts etcd, the API server and the Job controller,
// and registers their teardown with tb.
func startControlPlane(tb *mainTB, dir string) error {
	etcdURL, err := startEtcd(tb, filepath.Join(dir, "etcd"))
	if err != nil {
		return err
	}
	storage := storagebackend.NewDefaultConfig("/registry-e2e", nil)
	storage.Transport.ServerList = []string{etcdURL}
	opts := kubeapiservertesting.NewDefaultTestServerOptions()
	// StartTestServer rather than StartTestServerOrDie: TestMain has no
	// testing.T, and an error here fails every test rather than exiting.
	srv, err := kubeapiservertesting.StartTestServer(tb, opts, []string{
		"--endpoint-reconciler-type=none",
		// No ServiceAccount controller runs: the tests create the
		// accounts their Pods name, and the plugin that would add a
		// token volume and require "default" is off.
		"--disable-admission-plugins=ServiceAccount",
		// The workers call the API with their service account's token,
		// so the Role of the manifests is what they may do.
		"--authorization-mode=RBAC",
	}, storage)
	if err != nil {
		return fmt.Errorf("starting kube-apiserver: %w", err)
	}
	tb.Cleanup(srv.TearDownFn)
	restConfig = rest.CopyConfig(srv.ClientConfig)
	client, err = kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactory(client, 0)
	jc, err := job.NewController(ctx, client, factory.Core().V1().Pods(), factory.Batch().V1().Jobs(), nil, nil)
	if err != nil {
		cancel()
		return fmt.Errorf("the Job controller: %w", err)
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		jc.Run(ctx, 2)
	}()
	tb.Cleanup(func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	})
	return nil
}

// startEtcd starts an embedded etcd with its data in dir, on free loopback
// ports, and returns its client URL.
func startEtcd(tb *mainTB, dir string) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger, cfg.LogLevel = "zap", "error"
	client, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[0]))
	peer, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", ports[1]))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", fmt.Errorf("starting etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return "", fmt.Errorf("etcd was not ready within 60s")
	}
	tb.Cleanup(e.Close)
	return client.String(), nil
}

// freePorts returns n TCP ports on 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// buildWorker builds ./worker into dir.
func buildWorker(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(dir, "worker")
	cmd := exec.Command("go", "build", "-o", bin, "./worker")
	cmd.Dir = filepath.Dir(file)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the worker: %v: %s", err, out)
	}
	return bin, nil
}

// mainTB is the TB that the API server's test helper needs, for TestMain,
// which has no testing.T: it logs to stderr when E2E_VERBOSE is set, and
// runs its cleanups at the end, last first. A Fatal panics (StartTestServer
// reports its errors by return; it calls Fatal for none of them).
type mainTB struct {
	mu       sync.Mutex
	cleanups []func()
	failed   bool
}

func (tb *mainTB) Attr(key, value string)    {}
func (tb *mainTB) Chdir(dir string)          { panic("mainTB: Chdir") }
func (tb *mainTB) Setenv(key, value string)  { os.Setenv(key, value) }
func (tb *mainTB) Helper()                   {}
func (tb *mainTB) Name() string              { return "TestMain" }
func (tb *mainTB) Skipped() bool             { return false }
func (tb *mainTB) Skip(args ...any)          { panic("mainTB: Skip: " + fmt.Sprint(args...)) }
func (tb *mainTB) Skipf(f string, a ...any)  { panic("mainTB: Skip: " + fmt.Sprintf(f, a...)) }
func (tb *mainTB) SkipNow()                  { panic("mainTB: SkipNow") }
func (tb *mainTB) Fail()                     { tb.mu.Lock(); tb.failed = true; tb.mu.Unlock() }
func (tb *mainTB) FailNow()                  { tb.Fail(); panic("mainTB: FailNow") }
func (tb *mainTB) Failed() bool              { tb.mu.Lock(); defer tb.mu.Unlock(); return tb.failed }
func (tb *mainTB) Error(args ...any)         { tb.Log(args...); tb.Fail() }
func (tb *mainTB) Errorf(f string, a ...any) { tb.Logf(f, a...); tb.Fail() }
func (tb *mainTB) Fatal(args ...any)         { tb.Log(args...); tb.FailNow() }
func (tb *mainTB) Fatalf(f string, a ...any) { tb.Logf(f, a...); tb.FailNow() }
func (tb *mainTB) Log(args ...any) {
	if os.Getenv("E2E_VERBOSE") != "" {
		fmt.Fprintln(os.Stderr, args...)
	}
}
func (tb *mainTB) Logf(f string, a ...any) {
	if os.Getenv("E2E_VERBOSE") != "" {
		fmt.Fprintf(os.Stderr, strings.TrimSuffix(f, "\n")+"\n", a...)
	}
}
func (tb *mainTB) TempDir() string {
	d, err := os.MkdirTemp("", "elastictrain-k8s-e2e")
	if err != nil {
		panic(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}
func (tb *mainTB) Cleanup(f func()) {
	tb.mu.Lock()
	tb.cleanups = append(tb.cleanups, f)
	tb.mu.Unlock()
}

func (tb *mainTB) cleanup() {
	tb.mu.Lock()
	fs := tb.cleanups
	tb.cleanups = nil
	tb.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
