package trainer_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/elastictrain/elastictrain/elastic/store"
	. "github.com/elastictrain/elastictrain/trainer"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/dataloader"
	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/internal/testredis"
	"github.com/elastictrain/elastictrain/launch"
	"github.com/elastictrain/elastictrain/trainer/trainertest"
)

// Worker processes: the test binary re-executed with envWorker set runs one
// linear-regression worker and reports on stdout, one JSON object a line.
const (
	envWorker    = "ELASTICTRAIN_TRAINER_TEST_WORKER"
	envRedis     = "ELASTICTRAIN_TRAINER_TEST_REDIS"
	envJob       = "ELASTICTRAIN_TRAINER_TEST_JOB"
	envAudit     = "ELASTICTRAIN_TRAINER_TEST_AUDIT"
	envCkpt      = "ELASTICTRAIN_TRAINER_TEST_CKPT"
	envMin       = "ELASTICTRAIN_TRAINER_TEST_MIN"
	envEpochs    = "ELASTICTRAIN_TRAINER_TEST_EPOCHS"
	envCkptEvery = "ELASTICTRAIN_TRAINER_TEST_CKPT_EVERY"
	envDet       = "ELASTICTRAIN_TRAINER_TEST_DETERMINISTIC"
	// envLease, when set, gives the worker elastic's default LeaseTTL and
	// HeartbeatInterval (3 s, 500 ms) instead of the 1 s lease the fault
	// tests detect a death with.
	envLease = "ELASTICTRAIN_TRAINER_TEST_DEFAULT_LEASE"
	// envHold names a file: while it exists, every worker holds in OnStep
	// (at most holdBound), so a test can keep the job from ending before a
	// newcomer arrives.
	envHold = "ELASTICTRAIN_TRAINER_TEST_HOLD"
	// envStreams, when set, is the worker's Config.Sync.Streams.
	envStreams = "ELASTICTRAIN_TRAINER_TEST_STREAMS"
)

// Process-test problem: big enough that faults land mid-epoch.
const (
	procSamples = 1600
	procBatch   = 16
	procDim     = 8
	procSeed    = 11
	procDelay   = 4 * time.Millisecond
	procMicro   = 4
)

type report struct {
	Kind   string  `json:"kind"` // "round", "step", "final", "error"
	PID    int     `json:"pid"`
	Round  uint64  `json:"round,omitempty"`
	Rank   int     `json:"rank"`
	Size   int     `json:"size,omitempty"`
	Step   int64   `json:"step,omitempty"`
	Source string  `json:"source,omitempty"`
	SHA    string  `json:"sha,omitempty"`
	Loss   float64 `json:"loss,omitempty"`
	Err    string  `json:"err,omitempty"`
}

func paramsHash(ps []Param, opt Optimizer) string {
	h := sha256.New()
	for _, p := range ps {
		for _, v := range p.Value {
			h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
		}
	}
	h.Write(opt.AppendState(nil))
	return hex.EncodeToString(h.Sum(nil))
}

func workerMain() int {
	enc := json.NewEncoder(os.Stdout)
	emit := func(r report) { r.PID = os.Getpid(); enc.Encode(r) }
	fail := func(err error) int { emit(report{Kind: "error", Err: err.Error()}); return 1 }
	minW, _ := strconv.Atoi(os.Getenv(envMin))
	epochs, _ := strconv.Atoi(os.Getenv(envEpochs))
	prob := trainertest.NewProblem(procSamples, procDim, 0.05, procSeed)
	m := trainertest.NewModel(procDim)
	m.StepDelay = procDelay
	dcfg := dataloader.DefaultConfig()
	dcfg.GlobalBatch, dcfg.Seed = procBatch, procSeed
	det := os.Getenv(envDet) != ""
	if det {
		dcfg.MicroBatch = procMicro
	}
	loader, err := dataloader.New(prob.Dataset(), prob.Collate, dcfg)
	if err != nil {
		return fail(err)
	}
	defer loader.Close()
	client := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer client.Close()
	cfg := DefaultConfig()
	cfg.JobID, cfg.Epochs = os.Getenv(envJob), epochs
	cfg.Elastic.MinWorkers = minW
	cfg.Deterministic = det
	cfg.Sync.Secret = []byte("a test secret of 32 bytes length")
	cfg.Elastic.LeaseTTL = time.Second
	cfg.Elastic.HeartbeatInterval = 150 * time.Millisecond
	if os.Getenv(envLease) != "" {
		cfg.Elastic.LeaseTTL = elastic.DefaultLeaseTTL
		cfg.Elastic.HeartbeatInterval = elastic.DefaultHeartbeatInterval
	}
	cfg.Elastic.LastCall = 300 * time.Millisecond
	if v := os.Getenv(envStreams); v != "" {
		cfg.Sync.Streams, _ = strconv.Atoi(v)
	}
	cfg.CheckpointEvery = 20
	if v := os.Getenv(envCkptEvery); v != "" {
		cfg.CheckpointEvery, _ = strconv.Atoi(v)
	}
	audit, err := OpenFileAudit(os.Getenv(envAudit))
	if err != nil {
		return fail(err)
	}
	defer audit.Close()
	level := slog.LevelWarn
	if os.Getenv("ELASTICTRAIN_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("pid", os.Getpid())
	cfg.Elastic.Logger = logger
	opts := []Option{WithAudit(audit), WithLogger(logger), WithHooks(Hooks{
		OnRound: func(r RoundInfo) {
			emit(report{Kind: "round", Round: r.Round, Rank: r.Rank, Size: r.WorldSize, Step: r.Step, Source: r.Source})
		},
		OnStep: func(s StepInfo) {
			emit(report{Kind: "step", Round: s.Round, Rank: s.Rank, Size: s.WorldSize, Step: s.Step, Loss: s.Loss})
			holdWhile(os.Getenv(envHold))
		},
	})}
	if dir := os.Getenv(envCkpt); dir != "" {
		st, err := NewLocalDir(dir, 3)
		if err != nil {
			return fail(err)
		}
		opts = append(opts, WithCheckpointStore(st))
	}
	opt := NewMomentum(0.02, 0.9)
	var once stdsync.Once
	st := trainertest.NotifyPending(store.NewRedis(client), func() { once.Do(func() { emit(report{Kind: "pending"}) }) })
	tr, err := New(m.Params(), opt, loader, slowSteps(m.Step), st, cfg, opts...)
	if err != nil {
		return fail(err)
	}
	sigs := make(chan os.Signal, 1)
	signalNotify(sigs)
	go func() {
		if _, ok := <-sigs; ok {
			tr.Preempt()
		}
	}()
	res, err := tr.Run(context.Background())
	if err != nil {
		emit(report{Kind: "error", Err: err.Error()})
		if errors.Is(err, ErrSettingsMismatch) {
			return launch.ExitStatus(err) // refused or permanent, as a launched worker
		}
		if res.Step > 0 {
			return 143
		}
		return 1
	}
	emit(report{Kind: "final", Step: res.Step, SHA: paramsHash(m.Params(), opt), Loss: m.Loss(prob)})
	return 0
}

func signalNotify(c chan os.Signal) { signalNotifyTerm(c) }

// holdBound bounds a worker's hold in OnStep (holdWhile): well below
// elastic.DefaultProgressTimeout, so a hold never looks like a hang.
const holdBound = 10 * time.Second

// holdWhile returns once the file at path (none: at once) does not exist,
// or after holdBound. It polls: the file is the test's signal to another
// process.
func holdWhile(path string) {
	if path == "" {
		return
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(holdBound); time.Now().Before(end); <-tick.C {
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
}

// hold makes every worker hold at its next step until the returned func
// is called (or holdBound passed).
func (j *procJob) hold() (release func()) {
	require.NoError(j.t, os.WriteFile(j.holdFile, nil, 0o644))
	return func() { require.NoError(j.t, os.Remove(j.holdFile)) }
}

// waitPending waits until process p reports that it waits in the store to
// be taken in.
func (j *procJob) waitPending(p *proc) {
	j.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case r := <-j.merged:
			if r.Kind == "pending" && r.PID == p.cmd.Process.Pid {
				return
			}
		case <-deadline:
			j.t.Fatalf("pid %d never waited to be taken in", p.cmd.Process.Pid)
		}
	}
}

// proc is a worker process seen from the test.
type proc struct {
	cmd     *exec.Cmd
	reports chan report
	exited  chan struct{}
	final   *report
	last    report
	seen    []report
}

type procJob struct {
	t        *testing.T
	holdFile string
	env      []string
	audit    string
	procs    []*proc
	merged   chan report
}

func newProcJob(t *testing.T, minW, epochs int, ckpt string) *procJob {
	dir := t.TempDir()
	j := &procJob{t: t, audit: filepath.Join(dir, "audit.jsonl"), merged: make(chan report, 1<<16), holdFile: filepath.Join(dir, "hold")}
	j.env = append(os.Environ(), envHold+"="+j.holdFile, envWorker+"=1", envRedis+"="+testredis.Addr(t), envJob+"="+testredis.JobID(t),
		envAudit+"="+j.audit, envMin+"="+strconv.Itoa(minW), envEpochs+"="+strconv.Itoa(epochs), envCkpt+"="+ckpt)
	t.Cleanup(func() {
		for _, p := range j.procs {
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	return j
}

func (j *procJob) start() *proc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = j.env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(j.t, err)
	require.NoError(j.t, cmd.Start())
	p := &proc{cmd: cmd, reports: make(chan report, 1<<16), exited: make(chan struct{})}
	j.procs = append(j.procs, p)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r report
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				p.reports <- r
				j.merged <- r
			}
		}
		cmd.Wait()
		close(p.reports)
		close(p.exited)
	}()
	return p
}

// waitStep waits until some worker reports step >= s and returns the pid
// holding rank `rank` in the newest round seen.
func (j *procJob) waitStep(s int64) map[int]int {
	j.t.Helper()
	rankOf := map[int]int{}
	newest := map[int]uint64{}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case r := <-j.merged:
			if r.Kind == "round" && r.Round >= newest[r.PID] {
				rankOf[r.PID], newest[r.PID] = r.Rank, r.Round
			}
			if r.Kind == "step" && r.Step >= s {
				return rankOf
			}
			if r.Kind == "error" {
				j.t.Logf("worker %d: %s", r.PID, r.Err)
			}
		case <-deadline:
			j.t.Fatalf("no worker reached step %d", s)
		}
	}
}

func (j *procJob) waitAll() {
	deadline := time.After(120 * time.Second)
	for _, p := range j.procs {
		select {
		case <-p.exited:
		case <-deadline:
			j.t.Fatal("workers did not exit within 120 s")
		}
	}
	for _, p := range j.procs {
		for r := range p.reports {
			p.last = r
			p.seen = append(p.seen, r)
			if r.Kind == "final" {
				rr := r
				p.final = &rr
			}
		}
	}
}

func (j *procJob) verifyAudit(epochs int) AuditReport {
	f, err := os.Open(j.audit)
	require.NoError(j.t, err)
	defer f.Close()
	entries, err := ReadAuditLog(f)
	require.NoError(j.t, err)
	steps := procSamples / procBatch
	return VerifyAudit(entries, epochs, func(e int) []int {
		return dataloader.Order(procSeed, e, procSamples)[:steps*procBatch]
	})
}

// Must-show 1 of the trainer issue: 4 worker processes, real Redis; one is
// SIGKILLed at a random step, a new one joins later; the audit shows every
// sample of every epoch exactly once, all ranks end with identical
// parameters, and the loss reaches the known optimum.
func TestProcessesSurviveKillAndJoin(t *testing.T) {
	const epochs = 3
	j := newProcJob(t, 3, epochs, t.TempDir())
	for range 4 {
		j.start()
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	killAt := int64(20 + rng.IntN(60))
	rankOf := j.waitStep(killAt)
	victim := rng.IntN(4)
	var pid int
	for p, r := range rankOf {
		if r == victim {
			pid = p
		}
	}
	require.NotZero(t, pid, "some process holds rank %d", victim)
	t.Logf("SIGKILL rank %d (pid %d) at step >= %d", victim, pid, killAt)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	j.waitStep(killAt + 60)
	// The job holds until the newcomer waits in the store: under a CPU
	// hog, a process's start took longer than the steps left.
	release := j.hold()
	j.waitPending(j.start())
	release()
	j.waitAll()

	var finals []*report
	for _, p := range j.procs {
		if p.cmd.Process.Pid == pid {
			require.Nil(t, p.final)
			continue
		}
		require.NotNil(t, p.final, "pid %d ended with %+v", p.cmd.Process.Pid, p.last)
		finals = append(finals, p.final)
	}
	require.Len(t, finals, 4, "3 survivors and the newcomer finish")
	for _, f := range finals[1:] {
		require.Equal(t, finals[0].SHA, f.SHA, "identical parameters and optimizer state")
		require.Equal(t, finals[0].Step, f.Step)
	}
	require.EqualValues(t, epochs*(procSamples/procBatch), finals[0].Step)
	rep := j.verifyAudit(epochs)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)
	prob := trainertest.NewProblem(procSamples, procDim, 0.05, procSeed)
	require.InDelta(t, prob.OptimumLoss(), finals[0].Loss, 0.01)
}

// Must-show 3: SIGTERM makes a worker commit, checkpoint and leave within
// the grace period; the others go on; after a whole-job crash, a restart
// with the same job ID resumes from that checkpoint with no sample lost or
// repeated.
func TestSIGTERMThenWholeJobRestart(t *testing.T) {
	ctx := context.Background()
	const epochs = 2
	ckpt := t.TempDir()
	j := newProcJob(t, 2, epochs, ckpt)
	j.env = append(j.env, envCkptEvery+"=0") // only the preempted worker writes one
	for range 3 {
		j.start()
	}
	rankOf := j.waitStep(15)
	var termPID int
	for p, r := range rankOf {
		if r == 1 {
			termPID = p
		}
	}
	require.NotZero(t, termPID)
	require.NoError(t, syscall.Kill(termPID, syscall.SIGTERM))
	var termed *proc
	for _, p := range j.procs {
		if p.cmd.Process.Pid == termPID {
			termed = p
		}
	}
	select {
	case <-termed.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("preempted worker did not leave within its grace period")
	}
	require.Equal(t, 143, termed.cmd.ProcessState.ExitCode(), "documented exit status of a preempted worker")
	st, err := NewLocalDir(ckpt, 0)
	require.NoError(t, err)
	steps, err := st.List(ctx)
	require.NoError(t, err)
	require.Len(t, steps, 1, "the preempted worker's checkpoint")
	saved := steps[0]

	// The others go on without it; then the whole job crashes.
	j.waitStep(saved + 30)
	for _, p := range j.procs {
		if p != termed {
			p.cmd.Process.Kill()
			<-p.exited
		}
	}

	// Restart with the same job ID: it resumes from that checkpoint.
	for range 2 {
		j.start()
	}
	j.waitAll()
	var finals []*report
	for _, p := range j.procs[3:] {
		require.NotNil(t, p.final, "restarted worker ended with %+v", p.last)
		finals = append(finals, p.final)
	}
	require.Equal(t, finals[0].SHA, finals[1].SHA)
	require.EqualValues(t, epochs*(procSamples/procBatch), finals[0].Step)
	rep := j.verifyAudit(epochs)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)
	f, err := os.Open(j.audit)
	require.NoError(t, err)
	defer f.Close()
	entries, err := ReadAuditLog(f)
	require.NoError(t, err)
	restored := false
	for _, e := range entries {
		if e.Kind == "agreed" && e.Restored && e.Step == saved {
			restored = true
		}
	}
	require.True(t, restored, "the restart continued from the preempted worker's checkpoint at step %d", saved)
}

// runDeterministic runs one job of deterministic workers to the end and
// returns the final hash and the loss of every global step (checking that
// every report of a step, from any rank or any retry, agrees).
func runDeterministic(t *testing.T, workers int, faults func(j *procJob)) (string, map[int64]float64) {
	j := newProcJob(t, 1, 3, t.TempDir())
	j.env = append(j.env, envDet+"=1")
	for range workers {
		j.start()
	}
	if faults != nil {
		faults(j)
	}
	j.waitAll()
	losses := map[int64]float64{}
	sha := ""
	for _, p := range j.procs {
		for _, r := range p.seen {
			if r.Kind != "step" {
				continue
			}
			if l, ok := losses[r.Step]; ok && l != r.Loss {
				t.Fatalf("step %d reported with loss %v and %v", r.Step, l, r.Loss)
			}
			losses[r.Step] = r.Loss
		}
		if p.final != nil {
			if sha != "" && sha != p.final.SHA {
				t.Fatalf("ranks of one run disagree: %s vs %s", sha, p.final.SHA)
			}
			sha = p.final.SHA
		}
	}
	require.NotEmpty(t, sha, "some worker finished")
	return sha, losses
}

// Issue 9, must-show 1: run A (4 workers, no fault), run B (4 workers, one
// SIGKILLed, one joining later, then the whole job killed and resumed from
// its checkpoint) and run C (1 worker) end with the same SHA-256 of the
// parameters and optimizer state, and the same loss at every step.
func TestDeterministicAcrossWorldSizesAndFaults(t *testing.T) {
	shaA, lossA := runDeterministic(t, 4, nil)
	shaC, lossC := runDeterministic(t, 1, nil)
	shaB, lossB := runDeterministic(t, 4, func(j *procJob) {
		rankOf := j.waitStep(30)
		for pid, r := range rankOf {
			if r == 2 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		j.waitStep(60)
		j.start()
		j.waitStep(130)
		// The whole job dies; a new set of workers resumes from the checkpoint.
		for _, p := range j.procs {
			p.cmd.Process.Kill()
			<-p.exited
		}
		for range 2 {
			j.start()
		}
	})
	steps := int64(3 * procSamples / procBatch)
	require.Len(t, lossA, int(steps))
	require.Equal(t, shaA, shaC, "1 worker vs 4 workers")
	require.Equal(t, shaA, shaB, "with a kill, a join and a whole-job restart")
	for s := int64(1); s <= steps; s++ {
		require.Equal(t, lossA[s], lossC[s], "loss of step %d", s)
		require.Equal(t, lossA[s], lossB[s], "loss of step %d", s)
	}
}

// Must-show 5, second half: a hung rank (SIGSTOP) leads to a new round
// without it within the detection time (its lease, 1 s here, plus 1 s of
// slack); after SIGCONT it is fenced, rejoins as a new member, and the job
// still trains every sample exactly once.
func TestHungRankIsLeftBehind(t *testing.T) {
	const epochs = 2
	j := newProcJob(t, 2, epochs, t.TempDir())
	for range 3 {
		j.start()
	}
	rankOf := j.waitStep(25)
	var pid int
	for p, r := range rankOf {
		if r == 1 {
			pid = p
		}
	}
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	stopped := time.Now()
	deadline := time.After(30 * time.Second)
wait:
	for {
		select {
		case r := <-j.merged:
			if r.Kind == "round" && r.Size == 2 {
				break wait
			}
		case <-deadline:
			t.Fatal("no round without the hung rank")
		}
	}
	took := time.Since(stopped)
	t.Logf("new round without the hung rank after %v", took)
	require.Less(t, took, 2*time.Second, "within LeaseTTL (1 s) + 1 s")
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	j.waitAll()
	var sha string
	for _, p := range j.procs {
		require.NotNil(t, p.final, "pid %d ended with %+v", p.cmd.Process.Pid, p.last)
		if sha == "" {
			sha = p.final.SHA
		}
		require.Equal(t, sha, p.final.SHA)
	}
	rep := j.verifyAudit(epochs)
	require.Zero(t, rep.Missing)
	require.Zero(t, rep.Duplicates)
}
