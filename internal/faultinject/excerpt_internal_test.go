package faultinject

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// envPanicChild makes TestLogExcerptQuotesAPanic's child process panic.
const envPanicChild = "ELASTICTRAIN_TEST_PANIC_CHILD"

// panicInAGoroutine panics the way a worker's bug does: in a goroutine of
// its own, after some log lines.
func panicInAGoroutine() {
	for i := range 60 {
		os.Stderr.WriteString(`{"level":"INFO","msg":"step","step":` + strings.Repeat("1", i%3+1) + "}\n")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var m map[string]int
		m["boom"]++ // assignment to entry in nil map
	}()
	<-done
}

// A violation quotes the worker's log, which the soak deletes with its
// run: for "panic:" the panic and the goroutine stacks after it, for an
// unexpected status the last lines. The log is a real Go panic's output,
// of this test binary run as a child.
func TestLogExcerptQuotesAPanic(t *testing.T) {
	if os.Getenv(envPanicChild) != "" {
		panicInAGoroutine()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLogExcerptQuotesAPanic$")
	cmd.Env = append(os.Environ(), envPanicChild+"=1")
	log, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("the child should have panicked (status 2): %v\n%s", err, log)
	}
	got := logExcerpt(log, "panic:")
	for _, want := range []string{"panic: assignment to entry in nil map", "goroutine ", "panicInAGoroutine"} {
		if !strings.Contains(got, want) {
			t.Fatalf("the excerpt lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, `"msg":"step"`) {
		t.Fatalf("the excerpt starts before the panic:\n%s", got)
	}
	tail := logExcerpt(log, "")
	if n := strings.Count(tail, "\n") + 1; n != logTailLines {
		t.Fatalf("the tail has %d lines, want %d:\n%s", n, logTailLines, tail)
	}
	if !strings.HasSuffix(tail, strings.TrimRight(string(log), "\n")[strings.LastIndex(strings.TrimRight(string(log), "\n"), "\n")+1:]) {
		t.Fatalf("the tail does not end with the log's last line:\n%s", tail)
	}
}
